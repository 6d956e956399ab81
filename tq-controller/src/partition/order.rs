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
    /// Whether `(seq, slot)` still names the sample allocated then.
    fn still_allocated(&self, (seq, slot): (u64, u32)) -> bool {
        self.live.get(slot_u(slot)) && self.seq[slot_u(slot)] == seq
    }

    /// Records a slot just allocated (after its allocation number was set).
    pub(super) fn order_allocated(&mut self, slot: u32) {
        if self.order.built {
            self.order.entries.push_back((self.seq[slot_u(slot)], slot));
        }
    }

    /// Gets the order ready for [`Partition::ready_prefix`] by `task`: built if a restore left
    /// it empty, released entries at the front dropped (and all of them once they outnumber
    /// the live samples), and the task's cursor moved past what it consumed.
    pub fn prepare_scan(&mut self, task: &str) {
        if !self.order.built {
            let mut entries: Vec<(u64, u32)> = self
                .slot_of
                .values()
                .map(|&s| (self.seq[slot_u(s)], s))
                .collect();
            entries.sort_unstable();
            self.order.entries = entries.into();
            self.order.built = true;
        }
        while let Some(&front) = self.order.entries.front() {
            if self.still_allocated(front) {
                break;
            }
            self.order.entries.pop_front();
        }
        if self.order.entries.len() > 2 * self.slot_of.len() + 1024 {
            let entries = std::mem::take(&mut self.order.entries);
            self.order.entries = entries
                .into_iter()
                .filter(|&e| self.still_allocated(e))
                .collect();
        }
        let Some(t) = self.tasks.get_mut(task) else {
            return;
        };
        let entries = &self.order.entries;
        let start = entries.partition_point(|&(seq, _)| seq < t.scan_from);
        for &(seq, slot) in entries.range(start..) {
            let s = slot_u(slot);
            let gone = !(self.live.get(s) && self.seq[s] == seq);
            if !gone && !t.consumed.get(s) {
                break;
            }
            t.scan_from = seq + 1;
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
            entries.partition_point(|&(seq, _)| seq < t.scan_from)
        });
        let mut out = Vec::with_capacity(limit.min(1024));
        for &(seq, slot) in entries.range(start..) {
            let s = slot_u(slot);
            if !self.live.get(s) || self.seq[s] != seq || self.clearing.get(s) {
                continue;
            }
            if t.is_some_and(|t| t.consumed.get(s) || t.leased.get(s)) {
                continue;
            }
            if !fids.iter().all(|&f| self.fields[f].produced.get(s)) {
                continue;
            }
            if out.len() == limit {
                return (out, false);
            }
            out.push(Candidate {
                id: self.ids[s],
                seq,
                tags: &self.tags[s],
            });
        }
        (out, true)
    }

    /// How many samples [`Partition::ready_prefix`] would give without a limit, counted a
    /// word of 64 slots at a time (no list is built).
    pub fn ready_count(&self, fids: &[usize], task: &str) -> usize {
        let t = self.tasks.get(task);
        (0..self.live.num_words())
            .map(|w| {
                let mut word = self.live.word(w) & !self.clearing.word(w);
                if let Some(t) = t {
                    word &= !(t.consumed.word(w) | t.leased.word(w));
                }
                for &f in fids {
                    word &= self.fields[f].produced.word(w);
                }
                word.count_ones() as usize
            })
            .sum()
    }
}
