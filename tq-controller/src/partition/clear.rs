//! Clears: hiding samples (mark), releasing their indexes, and field-level clears.

use super::*;

impl Partition {
    /// Hides the samples in `slots` (from [`Partition::select`]) and returns their metadata
    /// with every field any of them holds.
    pub fn mark_clearing(&mut self, slots: &[u32]) -> BatchMeta {
        // Every field the partition knows, not only those produced for `slots`: a writer that
        // died between its storage write and its production notice left cells of fields that
        // were never produced for these samples, and a KV backend finds cells by field name.
        // Deleting a cell that does not exist costs a key in the store's delete call; leaving
        // one leaks it for good (`tq soak` found 32 such keys in Redis after a writer kill).
        let fids: Vec<usize> = (0..self.fields.len()).collect();
        let meta = self.build_meta(slots, &fids, Production::Computed);
        for &s in slots {
            self.slots.set_clearing(s);
        }
        meta
    }

    /// The samples a clear of `ids` (or of everything) would touch.
    pub fn selected_samples(&self, ids: Option<&[SampleId]>) -> Vec<SampleId> {
        self.select(ids).iter().map(|&s| self.slots.id(s)).collect()
    }

    /// The slots a clear of `ids` (all live samples when `None`) touches. Samples already being
    /// cleared are included again, so a retried clear finds them; samples not owned are ignored.
    pub fn select(&self, ids: Option<&[SampleId]>) -> Vec<u32> {
        match ids {
            None => self.slots.live_in_order(),
            Some(ids) => {
                let mut seen = HashSet::new();
                ids.iter()
                    .filter_map(|&id| self.slots.slot_for(id))
                    .filter(|s| seen.insert(*s))
                    .collect()
            }
        }
    }

    /// Releases samples that were marked clearing; reports them and the links they held.
    pub fn release(&mut self, alloc: &mut IndexAllocator, ids: &[SampleId]) -> Released {
        let mut released = Released::default();
        for &id in ids {
            let Some(slot) = self.slots.slot_for(id) else {
                continue;
            };
            if !self.slots.is_clearing(slot) {
                tracing::warn!(partition = %self.name, sample = %id, "release of a sample that was not marked clearing; ignored");
                continue;
            }
            if let Some(links) = self.links.take_slot(slot) {
                for (f, src) in links {
                    released.links.push((id, self.fields.name(f).clone(), src));
                }
            }
            self.fields.forget_slot(slot);
            self.tasks.forget_slot(slot);
            self.keys.unbind_slot(slot);
            self.slots.release(alloc, slot, id);
            released.samples.push(id);
        }
        if !released.samples.is_empty() {
            self.fields.normalize_all();
        }
        released
    }

    /// Removes the given fields' cells of the given samples from the metadata and blocks writes
    /// to them until `finish_clear_fields`. Returns the affected samples' metadata.
    /// Linked cells only lose their link (no storage cell to delete); those links are returned.
    pub fn begin_clear_fields(
        &mut self,
        ids: &[SampleId],
        names: &[FieldName],
    ) -> (BatchMeta, Vec<LinkRecord>) {
        let fids = self.fields.ids_of(names);
        let mut seen = HashSet::new();
        let slots: Vec<u32> = ids
            .iter()
            .filter_map(|&id| self.slots.slot_for(id))
            .filter(|&s| self.slots.visible(s) && seen.insert(s))
            .filter(|&s| {
                fids.iter()
                    .any(|&f| self.fields.produced(f, s) || self.fields.is_clearing_cell(s, f))
            })
            .collect();
        let meta = self.build_meta(&slots, &fids, Production::Computed);
        let mut dropped = Vec::new();
        for &s in &slots {
            for &f in &fids {
                if let Some(src) = self.unlink(s, f) {
                    dropped.push((self.slots.id(s), self.fields.name(f).clone(), src));
                } else if self.fields.get_mut(f).remove(s) || self.fields.is_clearing_cell(s, f) {
                    // The cell's backend meta (where storage put it, e.g. a KV write version)
                    // stays until the clear finishes: a clear repeated because this answer was
                    // lost must name the same cells, or an overwritten cell leaks in storage.
                    self.fields.begin_clearing_cell(s, f);
                }
            }
        }
        for &f in &fids {
            self.fields.get_mut(f).normalize();
        }
        (meta, dropped)
    }

    /// Step 3 of a field-level clear: the cells are gone from storage, so their backend meta
    /// goes too and they may be written again.
    pub fn finish_clear_fields(&mut self, ids: &[SampleId], names: &[FieldName]) {
        let fids = self.fields.ids_of(names);
        for &id in ids {
            if let Some(s) = self.slots.slot_for(id) {
                for &f in &fids {
                    if self.fields.end_clearing_cell(s, f) {
                        let name = self.fields.name(f).clone();
                        self.slots.backend_meta_mut(s).remove(&name);
                    }
                }
            }
        }
    }
}
