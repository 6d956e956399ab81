//! Shared-payload links (`kv_link`): destination cells that read a public sample's cell.

use super::*;

impl Partition {
    /// Whether any cell of this partition is a link (its release must update the links).
    pub fn holds_links(&self) -> bool {
        !self.links.is_empty()
    }

    /// Drops the link of field `name` of `id`, if any (the cell reads as never written).
    pub fn unlink_by_id(&mut self, id: SampleId, name: &str) -> Option<SampleId> {
        let slot = self.slots.slot_for(id)?;
        let f = self.fields.id(name)?;
        self.unlink(slot, f)
    }

    /// The public sample `slot`'s field `f` reads, if it is a link.
    pub fn link_of(&self, slot: u32, f: usize) -> Option<SampleId> {
        self.links.get(slot, f)
    }

    /// Drops a link: the cell reads as never written. Returns the source it pointed to.
    pub fn unlink(&mut self, slot: u32, f: usize) -> Option<SampleId> {
        let src = self.links.remove(slot, f)?;
        let field = self.fields.get_mut(f);
        field.remove(slot);
        field.normalize();
        Some(src)
    }

    /// Makes field `name` of `slot` read `source`'s payload, described by `schema` (one row).
    /// Returns the source it pointed to before, if it was already a link.
    pub fn link(
        &mut self,
        slot: u32,
        name: &str,
        source: SampleId,
        schema: &FieldMeta,
    ) -> Option<SampleId> {
        let f = self.fields.register(name);
        let previous = self.unlink(slot, f);
        self.fields.get_mut(f).add(&[slot], schema);
        self.links.insert(slot, f, source);
        previous
    }

    /// The one-row schema of field `name` of `id`, when produced (not counting links).
    pub fn produced_schema(&self, id: SampleId, name: &str) -> Option<FieldMeta> {
        let slot = self.slots.slot_for(id)?;
        let f = self.fields.id(name)?;
        if !self.slots.visible(slot) || !self.fields.produced(f, slot) {
            return None;
        }
        Some(self.fields.get(f).schema(&[slot]))
    }

    /// Checks that `schema` may be stored in field `name` of this partition (dtype and kind).
    pub fn check_field(&self, name: &str, schema: &FieldMeta) -> Result<()> {
        match self.fields.id(name) {
            Some(f) => self.fields.get(f).check(schema),
            None => Ok(()),
        }
    }

    /// True when field `name` of `id` holds a private (written, not linked) payload.
    pub fn has_private(&self, id: SampleId, name: &str) -> bool {
        let (Some(slot), Some(f)) = (self.slots.slot_for(id), self.fields.id(name)) else {
            return false;
        };
        self.fields.produced(f, slot) && self.link_of(slot, f).is_none()
    }

    /// Records that public sample `id` was linked (it may be swept once unlinked again).
    pub fn mark_ever_linked(&mut self, id: SampleId) {
        if let Some(s) = self.slots.slot_for(id) {
            self.links.mark_ever_linked(s);
        }
    }

    /// Visible keys (with their samples) starting with `prefix` that were linked at least once.
    pub fn swept_candidates(&self, prefix: &str) -> Vec<(String, SampleId)> {
        let mut out: Vec<(u64, String, SampleId)> = self
            .keys
            .iter()
            .filter(|&(k, s)| {
                k.starts_with(prefix) && self.slots.visible(s) && self.links.ever_linked(s)
            })
            .map(|(k, s)| (self.slots.seq(s), k.clone(), self.slots.id(s)))
            .collect();
        out.sort_unstable_by_key(|e| e.0);
        out.into_iter().map(|(_, k, id)| (k, id)).collect()
    }
}
