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
    /// their cells may be half deleted, and nothing reads them.
    pub fn stored_cells(&self) -> Vec<(SampleId, BackendMeta)> {
        self.slots
            .visible_in_order()
            .into_iter()
            .filter(|&s| !self.slots.backend_meta(s).is_empty())
            .map(|s| (self.slots.id(s), self.slots.backend_meta(s).clone()))
            .collect()
    }
}
