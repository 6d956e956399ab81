//! Global sample-index allocation with per-partition balancing across storage units.
//!
//! Indexes are unique across all partitions (storage units key cells by index), reused after a
//! clear, and carry a generation that is bumped on every release so that a stale holder of the
//! old [`SampleId`] can never touch the sample that reuses the index.
//!
//! SimpleStorage places index `i` on unit `(i / ROUTING_RUN) % U` ([`tq_core::routing`]). A
//! single global counter would put every row of one partition on one unit when two partitions
//! alternate single-row puts, so each allocation targets a unit where the partition owns as many
//! whole runs of rows as on its emptiest unit (reference §11.1): balanced to within a run. That
//! tolerance is what keeps a batch's fresh indexes consecutive: the allocator stays on a unit
//! until the partition's run there is full instead of switching units at every row (which, with
//! runs, would skip to the next unit's run and hand out `0, 16, 1, 17, ...`).

use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use tq_core::routing::{self, ROUTING_RUN};
use tq_core::{Error, Result, SampleId};

/// The allocator as snapshots and state-dir records hold it. The field order and types are the
/// format (postcard writes no names): never reorder, retype or remove one; a change is a new
/// snapshot format. [`IndexAllocator`] converts to and from it.
#[derive(Serialize, Deserialize)]
struct AllocatorRecord<Free = Vec<VecDeque<u32>>, Generation = Vec<u32>> {
    units: u32,
    next: u32,
    free: Free,
    generation: Generation,
}

#[derive(Debug)]
pub(crate) struct IndexAllocator {
    units: u32,
    /// Next never-used index.
    next: u32,
    /// Released indexes, one FIFO per unit (the unit of [`routing::unit_of`]).
    free: Vec<VecDeque<u32>>,
    /// Current generation of every index ever handed out.
    generation: Vec<u32>,
    /// Indexes that may be in use at once (`controller.max_samples`). A setting of the
    /// controller, not state: records do not hold it, and the controller applies it again to
    /// an allocator a restore brings.
    limit: Option<u64>,
}

impl IndexAllocator {
    pub fn new(units: u32) -> Self {
        let units = units.max(1);
        IndexAllocator {
            units,
            next: 0,
            free: (0..units).map(|_| VecDeque::new()).collect(),
            generation: Vec::new(),
            limit: None,
        }
    }

    /// At most `limit` indexes in use at once from now on (`None`: the index space).
    pub fn set_limit(&mut self, limit: Option<u64>) {
        self.limit = limit;
    }

    /// What a refusal for want of indexes should add: the limit that caused it, if one did.
    pub fn limit_note(&self) -> String {
        match self.limit {
            Some(l) if l.saturating_sub(self.in_use() as u64) < self.index_space_left() => {
                format!(" (controller.max_samples = {l})")
            }
            _ => String::new(),
        }
    }

    pub fn units(&self) -> u32 {
        self.units
    }

    /// Checks what a decoded allocator must hold for allocation to work on it, so that a
    /// snapshot that decodes but describes an impossible allocator is refused by name instead
    /// of failing in a later allocation: `units` storage units, one free list per unit holding
    /// only indexes of that unit that were handed out, and a generation for every index handed
    /// out.
    pub fn check_restored(&self, units: u32) -> Result<()> {
        let bad = |why: String| {
            Err(Error::corrupted(format!(
                "controller state: index allocator: {why}"
            )))
        };
        if self.units != units.max(1) || self.free.len() != self.units as usize {
            return bad(format!(
                "{} units and {} free lists for {units} storage units",
                self.units,
                self.free.len()
            ));
        }
        if self.generation.len() != self.next as usize {
            return bad(format!(
                "{} generations for {} indexes handed out",
                self.generation.len(),
                self.next
            ));
        }
        for (u, free) in self.free.iter().enumerate() {
            if let Some(i) = free
                .iter()
                .find(|&&i| i >= self.next || self.unit_of(i) != u)
            {
                return bad(format!("free list {u} holds index {i}, which it cannot"));
            }
        }
        Ok(())
    }

    /// How many more indexes can be handed out: never more than the limit less the indexes in
    /// use, and keeping in reserve the values `allocate` may skip while it looks for an index
    /// on the unit it targets (a run on every other unit). A request is checked against this
    /// before anything is allocated, so it never fails half-way.
    pub fn available(&self) -> u64 {
        let space = self.index_space_left();
        match self.limit {
            Some(l) => space.min(l.saturating_sub(self.in_use() as u64)),
            None => space,
        }
    }

    fn index_space_left(&self) -> u64 {
        let never_used = u64::from(u32::MAX - self.next);
        let released: u64 = self.free.iter().map(|f| f.len() as u64).sum();
        (never_used + released).saturating_sub(u64::from(self.units) * u64::from(ROUTING_RUN))
    }

    pub fn unit_of(&self, index: u32) -> usize {
        routing::unit_of(index, self.units)
    }

    /// Allocates one index for a partition whose rows per unit are `owned` (one count per
    /// unit), and counts it there. The caller checked [`IndexAllocator::available`] first.
    ///
    /// The unit is one where the partition's rows, counted in whole runs, are as few as on
    /// its emptiest unit (so partitions stay balanced to within a run, and a unit is filled a
    /// run at a time), preferring a released index, then the next fresh one if it falls on
    /// such a unit, then the emptiest unit.
    #[allow(clippy::expect_used)] // the invariants named in each message; see `available`
    pub fn allocate(&mut self, owned: &mut [u32]) -> SampleId {
        let fewest = *owned.iter().min().expect("one count per unit");
        // Runs of rows per unit: a unit stays open until its row count reaches the next
        // multiple of a run above the emptiest unit's, so the allocator finishes a run before
        // it changes units.
        let within_a_run = |u: usize| owned[u] / ROUTING_RUN <= fewest / ROUTING_RUN;
        let units = self.units as usize;
        let target = (0..units)
            .find(|&u| within_a_run(u) && !self.free[u].is_empty())
            .or_else(|| Some(self.unit_of(self.next)).filter(|&u| within_a_run(u)))
            .or_else(|| (0..units).find(|&u| owned[u] == fewest))
            .expect("some unit has the minimum");
        let index = match self.free[target].pop_front() {
            Some(i) => i,
            None => {
                // Advance the counter to the next value on `target`, keeping skipped values.
                while self.unit_of(self.next) != target {
                    let skipped = self.fresh();
                    let u = self.unit_of(skipped);
                    self.free[u].push_back(skipped);
                }
                self.fresh()
            }
        };
        owned[target] += 1;
        SampleId::new(index, self.generation[index as usize])
    }

    #[allow(clippy::expect_used)] // `available` keeps callers below u32::MAX
    fn fresh(&mut self) -> u32 {
        let i = self.next;
        self.next = self
            .next
            .checked_add(1)
            .expect("more than u32::MAX sample indexes in use");
        self.generation.push(0);
        i
    }

    /// Puts every released index on the free list of the unit [`routing::unit_of`] gives it,
    /// keeping their order. A record written before routing by runs (snapshot formats 1-4)
    /// bucketed them by `index % units`; a record of this rule comes out unchanged. A record
    /// whose unit count cannot be right keeps its lists for [`IndexAllocator::check_restored`]
    /// to refuse.
    fn sort_free_lists_by_unit(&mut self) {
        if self.units == 0 || self.free.len() != self.units as usize {
            return;
        }
        let mut sorted: Vec<VecDeque<u32>> = (0..self.units).map(|_| VecDeque::new()).collect();
        for i in self.free.drain(..).flatten() {
            sorted[routing::unit_of(i, self.units)].push_back(i);
        }
        self.free = sorted;
    }

    /// Returns an index to the pool; its next holder gets the next generation.
    pub fn release(&mut self, id: SampleId, owned: &mut [u32]) {
        let g = &mut self.generation[id.index as usize];
        debug_assert_eq!(*g, id.generation, "released a stale sample id");
        *g = g.wrapping_add(1);
        let u = self.unit_of(id.index);
        owned[u] = owned[u].saturating_sub(1);
        self.free[u].push_back(id.index);
    }

    /// Released indexes waiting to be handed out again.
    pub fn reusable(&self) -> usize {
        self.free.iter().map(VecDeque::len).sum()
    }

    /// Indexes handed out and not released.
    pub fn in_use(&self) -> usize {
        self.next as usize - self.free.iter().map(VecDeque::len).sum::<usize>()
    }
}

impl Serialize for IndexAllocator {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        AllocatorRecord {
            units: self.units,
            next: self.next,
            free: &self.free,
            generation: &self.generation,
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for IndexAllocator {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let r = AllocatorRecord::<Vec<VecDeque<u32>>, Vec<u32>>::deserialize(d)?;
        let mut alloc = IndexAllocator {
            units: r.units,
            next: r.next,
            free: r.free,
            generation: r.generation,
            limit: None,
        };
        alloc.sort_free_lists_by_unit();
        Ok(alloc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn indexes(ids: &[SampleId]) -> Vec<u32> {
        ids.iter().map(|i| i.index).collect()
    }

    #[test]
    fn a_saved_allocator_loads_and_an_impossible_one_is_refused_by_name() {
        let mut a = IndexAllocator::new(2);
        let mut owned = vec![0u32; 2];
        let ids: Vec<_> = (0..20).map(|_| a.allocate(&mut owned)).collect();
        a.release(ids[1], &mut owned);
        let bytes = postcard::to_allocvec(&a).unwrap();
        let back: IndexAllocator = postcard::from_bytes(&bytes).unwrap();
        back.check_restored(2).unwrap();
        assert_eq!((back.next, back.reusable(), back.in_use()), (20, 1, 19));
        assert!(back.check_restored(3).is_err());
        let mut stray = postcard::from_bytes::<IndexAllocator>(&bytes).unwrap();
        stray.free[0].push_back(17); // an index of unit 1 in unit 0's list
        let e = stray.check_restored(2).unwrap_err();
        assert!(e.message().contains("free list 0 holds index 17"), "{e}");
        let mut short = postcard::from_bytes::<IndexAllocator>(&bytes).unwrap();
        short.generation.pop();
        assert!(short.check_restored(2).is_err());
    }

    #[test]
    fn a_record_bucketed_index_by_index_loads_bucketed_by_runs() {
        // What snapshot formats 1-4 hold: free lists by `index % units`.
        let old = AllocatorRecord {
            units: 2,
            next: 20,
            free: vec![
                VecDeque::<u32>::from([0, 2, 18]),
                VecDeque::from([1, 17, 3]),
            ],
            generation: vec![1u32; 20],
        };
        let bytes = postcard::to_allocvec(&old).unwrap();
        let back: IndexAllocator = postcard::from_bytes(&bytes).unwrap();
        back.check_restored(2).unwrap();
        assert_eq!(back.free[0], VecDeque::from([0, 2, 1, 3]), "order kept");
        assert_eq!(back.free[1], VecDeque::from([18, 17]));
        assert_eq!(back.reusable(), 6);
    }

    #[test]
    fn a_fresh_batch_gets_consecutive_indexes_in_runs_and_gets_them_again_after_a_clear() {
        let mut a = IndexAllocator::new(2);
        let mut p = vec![0u32; 2];
        let ids: Vec<_> = (0..40).map(|_| a.allocate(&mut p)).collect();
        assert_eq!(indexes(&ids), (0..40).collect::<Vec<_>>());
        assert_eq!(p, vec![24, 16]);
        for id in &ids {
            a.release(*id, &mut p);
        }
        let again: Vec<_> = (0..40).map(|_| a.allocate(&mut p)).collect();
        assert_eq!(indexes(&again), (0..40).collect::<Vec<_>>());
        assert!(again.iter().all(|id| id.generation == 1));
    }

    #[test]
    fn alternating_partitions_spread_over_units_within_a_run() {
        let mut a = IndexAllocator::new(2);
        let (mut p, mut q) = (vec![0u32; 2], vec![0u32; 2]);
        let mut p_units = vec![];
        for round in 0..200 {
            let id = a.allocate(&mut p);
            p_units.push(a.unit_of(id.index));
            if round % 3 != 0 {
                a.allocate(&mut q); // q puts twice as often as p
            }
            for owned in [&p, &q] {
                assert!(owned[0].abs_diff(owned[1]) <= ROUTING_RUN, "{owned:?}");
            }
        }
        assert_eq!(p.iter().sum::<u32>(), 200);
        assert_eq!(a.in_use(), 200 + q.iter().sum::<u32>() as usize);
        assert!(p_units.contains(&0) && p_units.contains(&1));
    }

    #[test]
    fn available_counts_unused_and_released_indexes_minus_a_reserve() {
        let mut a = IndexAllocator::new(2);
        let reserve = 2 * u64::from(ROUTING_RUN);
        assert_eq!(a.available(), u64::from(u32::MAX) - reserve);
        let mut p = vec![0u32; 2];
        let ids: Vec<_> = (0..3).map(|_| a.allocate(&mut p)).collect();
        assert_eq!(a.available(), u64::from(u32::MAX) - 3 - reserve);
        a.release(ids[0], &mut p);
        assert_eq!(a.available(), u64::from(u32::MAX) - 3 + 1 - reserve);
    }

    #[test]
    fn reuse_bumps_generation_and_loses_nothing() {
        let mut a = IndexAllocator::new(1);
        let mut p = vec![0u32; 1];
        let ids: Vec<_> = (0..3).map(|_| a.allocate(&mut p)).collect();
        assert_eq!(indexes(&ids), vec![0, 1, 2]);
        a.release(ids[1], &mut p);
        let again = a.allocate(&mut p);
        assert_eq!(again, SampleId::new(1, 1));
        assert_eq!(a.allocate(&mut p), SampleId::new(3, 0));
    }
}
