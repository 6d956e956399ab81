//! Which storage unit holds a sample: the one rule the controller allocates by and every
//! client routes by.
//!
//! Sample index `i` lives on unit `(i / ROUTING_RUN) % units`: runs of [`ROUTING_RUN`]
//! consecutive indexes share a unit. The controller hands a fresh batch consecutive indexes
//! (`tq-controller`'s allocator fills a run before it moves on), so a batch's rows lie on each
//! unit in runs, written back to back. A read of the batch then finds each run in one place:
//! over same-host shared memory its rows join into one mapping instead of being copied row by
//! row (docs/decisions/0052-samples-are-routed-in-runs.md). Index-by-index routing
//! (`i % units`) gave every other row of a batch to the other unit.
//!
//! The rule is part of the protocol: processes that route by different rules would read
//! samples where they are not, so a change of it is a new `tq_net::PROTOCOL_VERSION` (which
//! makes every process of one deployment the same build), and the controller's snapshots
//! re-derive what depends on it when they load (`tq-controller`'s allocator and slot table).

/// Consecutive sample indexes that share a storage unit. 16 rows of 4 KiB make 64 KiB, the
/// smallest run a same-host read joins into one mapping instead of copying.
pub const ROUTING_RUN: u32 = 16;

/// The position of the unit, among `units`, that holds sample index `index`. `units` must be
/// at least 1.
#[inline]
pub fn unit_of(index: u32, units: u32) -> usize {
    ((index / ROUTING_RUN) % units.max(1)) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_of_consecutive_indexes_share_a_unit_and_units_take_turns() {
        let units: Vec<usize> = (0..64).map(|i| unit_of(i, 2)).collect();
        assert!(units[..16].iter().all(|&u| u == 0));
        assert!(units[16..32].iter().all(|&u| u == 1));
        assert!(units[32..48].iter().all(|&u| u == 0));
        assert_eq!(unit_of(48, 3), 0);
        assert_eq!(unit_of(47, 3), 2);
        assert_eq!(unit_of(u32::MAX, 1), 0);
        assert_eq!(unit_of(5, 0), 0, "no units is taken as one");
    }
}
