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
            self.clearing.set(slot_u(s), true);
        }
        meta
    }

    /// The samples a clear of `ids` (or of everything) would touch.
    pub fn selected_samples(&self, ids: Option<&[SampleId]>) -> Vec<SampleId> {
        self.select(ids)
            .iter()
            .map(|&s| self.ids[slot_u(s)])
            .collect()
    }

    /// The slots a clear of `ids` (all live samples when `None`) touches. Samples already being
    /// cleared are included again, so a retried clear finds them; samples not owned are ignored.
    pub fn select(&self, ids: Option<&[SampleId]>) -> Vec<u32> {
        match ids {
            None => {
                let mut s: Vec<u32> = self.live.ones().map(|s| s as u32).collect();
                s.sort_unstable_by_key(|&s| self.seq[slot_u(s)]);
                s
            }
            Some(ids) => {
                let mut seen = HashSet::new();
                ids.iter()
                    .filter_map(|&id| self.slot_for(id))
                    .filter(|s| seen.insert(*s))
                    .collect()
            }
        }
    }

    /// Releases samples that were marked clearing; reports them and the links they held.
    pub fn release(&mut self, alloc: &mut IndexAllocator, ids: &[SampleId]) -> Released {
        let mut released = Released::default();
        for &id in ids {
            let Some(slot) = self.slot_for(id) else {
                continue;
            };
            let su = slot_u(slot);
            if !self.clearing.get(su) {
                tracing::warn!(partition = %self.name, sample = %id, "release of a sample that was not marked clearing; ignored");
                continue;
            }
            if let Some(links) = self.links.remove(&slot) {
                for (f, src) in links {
                    released.links.push((id, self.fields[f].name.clone(), src));
                }
            }
            self.ever_linked.set(su, false);
            for f in &mut self.fields {
                f.remove(slot);
            }
            for t in self.tasks.values_mut() {
                t.forget(slot);
            }
            self.clearing_cells.retain(|&(s, _)| s != slot);
            self.tags[su].clear();
            self.backend_meta[su].clear();
            if let Some(k) = self.slot_key[su].take() {
                self.keys.remove(&k);
            }
            self.live.set(su, false);
            self.clearing.set(su, false);
            self.slot_of.remove(&id.index);
            self.free_slots.push(slot);
            alloc.release(id, &mut self.unit_counts);
            released.samples.push(id);
        }
        if !released.samples.is_empty() {
            self.fields.iter_mut().for_each(FieldState::normalize);
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
        let fids: Vec<usize> = names
            .iter()
            .filter_map(|n| self.field_ids.get(n).copied())
            .collect();
        let mut seen = HashSet::new();
        let slots: Vec<u32> = ids
            .iter()
            .filter_map(|&id| self.slot_for(id))
            .filter(|&s| self.visible(s) && seen.insert(s))
            .filter(|&s| {
                fids.iter().any(|&f| {
                    self.fields[f].produced.get(slot_u(s)) || self.clearing_cells.contains(&(s, f))
                })
            })
            .collect();
        let meta = self.build_meta(&slots, &fids, Production::Computed);
        let mut dropped = Vec::new();
        for &s in &slots {
            for &f in &fids {
                if let Some(src) = self.unlink(s, f) {
                    dropped.push((self.ids[slot_u(s)], self.fields[f].name.clone(), src));
                } else if self.fields[f].remove(s) || self.clearing_cells.contains(&(s, f)) {
                    self.clearing_cells.insert((s, f));
                    self.backend_meta[slot_u(s)].remove(&self.fields[f].name);
                }
            }
        }
        for &f in &fids {
            self.fields[f].normalize();
        }
        (meta, dropped)
    }

    pub fn finish_clear_fields(&mut self, ids: &[SampleId], names: &[FieldName]) {
        let fids: Vec<usize> = names
            .iter()
            .filter_map(|n| self.field_ids.get(n).copied())
            .collect();
        for &id in ids {
            if let Some(s) = self.slot_for(id) {
                for &f in &fids {
                    self.clearing_cells.remove(&(s, f));
                }
            }
        }
    }
}
