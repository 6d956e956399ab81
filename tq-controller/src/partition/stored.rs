//! The cells storage holds for a partition, as its backend meta names them: what an overwrite
//! replaces, and what a checkpoint that copies payloads reads.

use super::Partition;
use crate::api::ProductionNotice;
use tq_core::{BackendMeta, SampleId};

impl Partition {
    /// Whether `n` would replace backend meta of cells already stored (an overwrite, whose
    /// writer then retires the old cells).
    pub fn replaces_cells(&self, n: &ProductionNotice) -> bool {
        let Some(rows) = &n.backend_meta else {
            return false;
        };
        n.samples.iter().zip(rows).any(|(&id, row)| {
            self.slots.slot_for(id).is_some_and(|s| {
                let stored = self.slots.backend_meta(s);
                row.iter()
                    .any(|(k, v)| stored.get(k).is_some_and(|old| old != v))
            })
        })
    }

    /// Every visible sample that stores cells, with their backend meta (one entry per stored
    /// cell; linked fields store none), in slot order. Samples being cleared are left out:
    /// their cells may be half deleted, and nothing reads them; so are the cells a field-level
    /// clear is deleting.
    pub fn stored_cells(&self) -> Vec<(SampleId, BackendMeta)> {
        self.slots
            .visible_in_order()
            .into_iter()
            .map(|s| (self.slots.id(s), self.settled_backend_meta(s)))
            .filter(|(_, meta)| !meta.is_empty())
            .collect()
    }

    /// `slot`'s backend meta without the cells a field-level clear is deleting (their entries
    /// stay until the clear finishes, so that a repeated clear names the same cells).
    pub(super) fn settled_backend_meta(&self, slot: u32) -> BackendMeta {
        let mut meta = self.slots.backend_meta(slot).clone();
        if !self.fields.any_clearing_cell() {
            return meta;
        }
        meta.retain(|name, _| {
            !self
                .fields
                .id(name)
                .is_some_and(|f| self.fields.is_clearing_cell(slot, f))
        });
        meta
    }
}
