//! Checks made *before* a storage write, and the queries that decide what a failed write or
//! read means.
//!
//! Storage is written before the controller is told (rule 1), so every reason the controller
//! would refuse a write must be checked first: a refused write that already reached storage
//! would have overwritten the cells of a live sample (same generation, same storage key) while
//! the metadata still describes the old value. The production notice checks the same things
//! again under the lock, which catches what changed in between.

use super::{check_unique_ids, Partition, Production};
use std::collections::{BTreeMap, HashSet};
use tq_core::{BatchMeta, Error, FieldMeta, FieldName, Result, SampleId};

impl Partition {
    /// Refuses a write of `fields` (dtype and kind per field) to `ids` unless the notice that
    /// follows it would be accepted as things stand: every sample owned at that generation and
    /// not being cleared, no written cell linked or under a field-level clear, and every field's
    /// dtype and kind compatible with the partition's. Returns the slots, in `ids` order.
    pub fn check_write(
        &self,
        ids: &[SampleId],
        fields: &BTreeMap<FieldName, FieldMeta>,
    ) -> Result<Vec<u32>> {
        check_unique_ids(&self.name, ids)?;
        let slots = self.slots_of(ids)?;
        self.check_cells_writable(&slots, fields)?;
        Ok(slots)
    }

    /// The per-cell half of [`Partition::check_write`], shared with the production notice.
    pub(super) fn check_cells_writable(
        &self,
        slots: &[u32],
        fields: &BTreeMap<FieldName, FieldMeta>,
    ) -> Result<()> {
        for (name, schema) in fields {
            let Some(f) = self.fields.id(name) else {
                continue;
            };
            if let Some(&s) = slots.iter().find(|&&s| self.link_of(s, f).is_some()) {
                return Err(Error::conflict(format!(
                    "partition `{}`: field `{name}` of sample {} is linked to a shared payload; \
                     unlink it before writing it",
                    self.name,
                    self.slots.id(s)
                )));
            }
            self.fields
                .get(f)
                .check(schema)
                .map_err(|e| e.context(format!("partition `{}`", self.name)))?;
            if let Some(&s) = slots.iter().find(|&&s| self.fields.is_clearing_cell(s, f)) {
                return Err(Error::conflict(format!(
                    "partition `{}`: field `{name}` of sample {} is being cleared",
                    self.name,
                    self.slots.id(s)
                )));
            }
        }
        Ok(())
    }

    /// What storage is handed with a write to `slots`: the fields every row holds, tags, and
    /// the backend meta of *every* field of each row (not only the common ones), so a backend
    /// can find a sample's other cells (the KV adapter re-arms their TTL).
    #[allow(clippy::expect_used)] // one backend meta per slot, by construction
    pub fn write_meta(&self, slots: &[u32]) -> BatchMeta {
        let fids = self.common_fields(slots);
        let full = slots
            .iter()
            .map(|&s| self.settled_backend_meta(s))
            .collect();
        self.build_meta(slots, &fids, Production::Computed)
            .with_backend_meta(full)
            .expect("one backend meta per slot")
    }

    /// The slots of `keys` that a whole-key clear touches: visible ones and those already being
    /// cleared (so a clear whose storage step failed is finished by the next one). Unknown
    /// keys are skipped; each slot appears once.
    pub fn key_slots_for_clear(&self, keys: &[String]) -> Vec<u32> {
        let mut seen = HashSet::new();
        keys.iter()
            .filter_map(|k| self.keys.get(k.as_str()))
            .filter(|s| seen.insert(*s))
            .collect()
    }

    /// Per sample of `ids`: owned at that generation, not being cleared, and holding every
    /// one of `names` (produced or linked).
    pub fn holds(&self, ids: &[SampleId], names: &[FieldName]) -> Vec<bool> {
        let fids = self.fields.known(names);
        ids.iter()
            .map(|&id| {
                let (Some(slot), Some(fids)) = (self.slots.slot_for(id), fids.as_ref()) else {
                    return false;
                };
                self.slots.visible(slot)
                    && fids
                        .iter()
                        .all(|&f| self.fields.produced(f, slot) || self.link_of(slot, f).is_some())
            })
            .collect()
    }
}
