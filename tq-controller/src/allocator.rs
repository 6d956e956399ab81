//! Global sample-index allocation with per-partition balancing across storage units.
//!
//! Indexes are unique across all partitions (storage units key cells by index), reused after a
//! clear, and carry a generation that is bumped on every release so that a stale holder of the
//! old [`SampleId`] can never touch the sample that reuses the index.
//!
//! SimpleStorage places index `i` on unit `i % U`. A single global counter would put every row of
//! one partition on one unit when two partitions alternate single-row puts, so each allocation
//! targets the unit where the partition currently owns the fewest rows (reference §11.1).

use std::collections::VecDeque;
use tq_core::SampleId;

#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct IndexAllocator {
    units: u32,
    /// Next never-used index.
    next: u32,
    /// Released indexes, one FIFO per unit (`index % units`).
    free: Vec<VecDeque<u32>>,
    /// Current generation of every index ever handed out.
    generation: Vec<u32>,
}

impl IndexAllocator {
    pub fn new(units: u32) -> Self {
        let units = units.max(1);
        IndexAllocator {
            units,
            next: 0,
            free: (0..units).map(|_| VecDeque::new()).collect(),
            generation: Vec::new(),
        }
    }

    pub fn units(&self) -> u32 {
        self.units
    }

    /// How many more indexes can be handed out, keeping one unit's worth in reserve for the
    /// values `allocate` skips while it looks for an index on the unit it targets. A request is
    /// checked against this before anything is allocated, so it never fails half-way.
    pub fn available(&self) -> u64 {
        let never_used = u64::from(u32::MAX - self.next);
        let released: u64 = self.free.iter().map(|f| f.len() as u64).sum();
        (never_used + released).saturating_sub(u64::from(self.units))
    }

    pub fn unit_of(&self, index: u32) -> usize {
        (index % self.units) as usize
    }

    /// Allocates one index for a partition whose rows per unit are `owned` (one count per
    /// unit), and counts it there. The caller checked [`IndexAllocator::available`] first.
    #[allow(clippy::expect_used)] // the invariants named in each message; see `available`
    pub fn allocate(&mut self, owned: &mut [u32]) -> SampleId {
        let fewest = *owned.iter().min().expect("one count per unit");
        let tied = |u: usize| owned[u] == fewest;
        let units = self.units as usize;
        let target = (0..units)
            .find(|&u| tied(u) && !self.free[u].is_empty())
            .or_else(|| Some(self.unit_of(self.next)).filter(|&u| tied(u)))
            .or_else(|| (0..units).find(|&u| tied(u)))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alternating_partitions_spread_over_units() {
        let mut a = IndexAllocator::new(2);
        let (mut p, mut q) = (vec![0u32; 2], vec![0u32; 2]);
        let mut p_units = vec![];
        for _ in 0..4 {
            let id = a.allocate(&mut p);
            p_units.push(a.unit_of(id.index));
            a.allocate(&mut q);
        }
        assert_eq!(p, vec![2, 2]);
        assert_eq!(q, vec![2, 2]);
        assert_eq!(a.in_use(), 8);
        assert!(p_units.contains(&0) && p_units.contains(&1));
    }

    #[test]
    fn available_counts_unused_and_released_indexes_minus_a_reserve() {
        let mut a = IndexAllocator::new(2);
        let reserve = 2;
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
        assert_eq!(
            ids.iter().map(|i| i.index).collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
        a.release(ids[1], &mut p);
        let again = a.allocate(&mut p);
        assert_eq!(again, SampleId::new(1, 1));
        assert_eq!(a.allocate(&mut p), SampleId::new(3, 0));
    }
}
