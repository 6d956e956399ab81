//! The partition's samples in allocation order, kept as they are allocated, so that a fetch
//! takes its candidates from the front instead of collecting and sorting every ready sample:
//! a fetch then costs its batch (plus the samples it skips), not the partition.
//!
//! Entries of released slots stay until a scan meets them at the front or the list outgrows
//! the live samples, and are told apart by the slot's allocation number (a reused slot has a
//! newer one). Each task keeps a cursor below which every sample is consumed or gone, so that a
//! task does not walk again over what it consumed when consumed samples are not cleared.
//!
//! The order is not saved: after a restore it is built again on the first fetch.

use super::*;
use std::collections::VecDeque;

/// `(allocation number, slot)` in increasing allocation number.
#[derive(Debug, Default)]
pub(crate) struct AllocationOrder {
    entries: VecDeque<(u64, u32)>,
    built: bool,
}

impl Partition {
    /// Records a slot just allocated (after its allocation number was set).
    pub(super) fn order_allocated(&mut self, slot: u32) {
        if self.order.built {
            self.order.entries.push_back((self.slots.seq(slot), slot));
        }
    }

    /// Gets the order ready for [`Partition::ready_prefix`] by `task`: built if a restore left
    /// it empty, released entries at the front dropped (and all of them once they outnumber
    /// the live samples), and the task's cursor moved past what it consumed.
    pub fn prepare_scan(&mut self, task: &str) {
        if !self.order.built {
            let mut entries: Vec<(u64, u32)> = self
                .slots
                .live_slots()
                .map(|s| (self.slots.seq(s), s))
                .collect();
            entries.sort_unstable();
            self.order.entries = entries.into();
            self.order.built = true;
        }
        while let Some(&front) = self.order.entries.front() {
            if self.slots.still_allocated(front) {
                break;
            }
            self.order.entries.pop_front();
        }
        if self.order.entries.len() > 2 * self.slots.len() + 1024 {
            let entries = std::mem::take(&mut self.order.entries);
            self.order.entries = entries
                .into_iter()
                .filter(|&e| self.slots.still_allocated(e))
                .collect();
        }
        let Some(t) = self.tasks.get_mut(task) else {
            return;
        };
        let entries = &self.order.entries;
        let start = entries.partition_point(|&(seq, _)| seq < t.scan_from());
        for &(seq, slot) in entries.range(start..) {
            let gone = !self.slots.still_allocated((seq, slot));
            if !gone && !t.is_consumed(slot) {
                break;
            }
            t.scanned_past(seq);
        }
    }

    /// Up to `limit` samples produced for all of `fids`, visible, and neither consumed nor
    /// leased by `task`, in allocation order; and whether that is all of them. Call
    /// [`Partition::prepare_scan`] first (a restored partition has no order before it).
    pub fn ready_prefix(
        &self,
        fids: &[usize],
        task: &str,
        limit: usize,
    ) -> (Vec<Candidate<'_>>, bool) {
        let t = self.tasks.get(task);
        let entries = &self.order.entries;
        let start = t.map_or(0, |t| {
            entries.partition_point(|&(seq, _)| seq < t.scan_from())
        });
        let mut out = Vec::with_capacity(limit.min(1024));
        for &(seq, slot) in entries.range(start..) {
            if !self.slots.still_allocated((seq, slot)) || self.slots.is_clearing(slot) {
                continue;
            }
            if t.is_some_and(|t| t.is_consumed(slot) || t.is_leased(slot)) {
                continue;
            }
            if !fids.iter().all(|&f| self.fields.produced(f, slot)) {
                continue;
            }
            if out.len() == limit {
                return (out, false);
            }
            out.push(Candidate {
                id: self.slots.id(slot),
                seq,
                tags: self.slots.tags(slot),
            });
        }
        (out, true)
    }

    /// How many samples [`Partition::ready_prefix`] would give without a limit, counted a
    /// word of 64 slots at a time (no list is built).
    pub fn ready_count(&self, fids: &[usize], task: &str) -> usize {
        let t = self.tasks.get(task);
        (0..self.slots.num_words())
            .map(|w| {
                let mut word = self.slots.visible_word(w);
                if let Some(t) = t {
                    word &= !(t.consumed_word(w) | t.leased_word(w));
                }
                for &f in fids {
                    word &= self.fields.get(f).produced_word(w);
                }
                word.count_ones() as usize
            })
            .sum()
    }
}
