//! The cells storage holds for a partition, as its backend meta names them: what an overwrite
//! replaces, and what a checkpoint that copies payloads reads.

use super::{slot_u, Partition};
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
            self.slot_for(id).is_some_and(|s| {
                let stored = &self.backend_meta[slot_u(s)];
                row.iter()
                    .any(|(k, v)| stored.get(k).is_some_and(|old| old != v))
            })
        })
    }

    /// Every visible sample that stores cells, with their backend meta (one entry per stored
    /// cell; linked fields store none), in slot order. Samples being cleared are left out:
    /// their cells may be half deleted, and nothing reads them.
    pub fn stored_cells(&self) -> Vec<(SampleId, BackendMeta)> {
        self.visible_slots()
            .into_iter()
            .filter(|&s| !self.backend_meta[slot_u(s)].is_empty())
            .map(|s| (self.ids[slot_u(s)], self.backend_meta[slot_u(s)].clone()))
            .collect()
    }
}
