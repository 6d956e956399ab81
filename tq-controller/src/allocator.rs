//! Global sample-index allocation with per-partition balancing across storage units.
//!
//! Indexes are unique across all partitions (storage units key cells by index), reused after a
//! clear, and carry a generation that is bumped on every release so that a stale holder of the
//! old [`SampleId`] can never touch the sample that reuses the index.
//!
//! SimpleStorage places index `i` on unit `i % U`. A single global counter would put every row of
//! one partition on one unit when two partitions alternate single-row puts, so each allocation
//! targets the unit where the partition currently owns the fewest rows (reference §11.1).

use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
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
        Ok(IndexAllocator {
            units: r.units,
            next: r.next,
            free: r.free,
            generation: r.generation,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_saved_allocator_loads_and_an_impossible_one_is_refused_by_name() {
        let mut a = IndexAllocator::new(2);
        let mut owned = vec![0u32; 2];
        let ids: Vec<_> = (0..5).map(|_| a.allocate(&mut owned)).collect();
        a.release(ids[1], &mut owned);
        let bytes = postcard::to_allocvec(&a).unwrap();
        let back: IndexAllocator = postcard::from_bytes(&bytes).unwrap();
        back.check_restored(2).unwrap();
        assert_eq!((back.next, back.reusable(), back.in_use()), (5, 1, 4));
        assert!(back.check_restored(3).is_err());
        let mut stray = postcard::from_bytes::<IndexAllocator>(&bytes).unwrap();
        stray.free[0].push_back(1); // an index of unit 1 in unit 0's list
        let e = stray.check_restored(2).unwrap_err();
        assert!(e.message().contains("free list 0 holds index 1"), "{e}");
        let mut short = postcard::from_bytes::<IndexAllocator>(&bytes).unwrap();
        short.generation.pop();
        assert!(short.check_restored(2).is_err());
    }

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
