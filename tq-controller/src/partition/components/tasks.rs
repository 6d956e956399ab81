//! What each task has taken from a partition: consumed samples, outstanding leases with their
//! deadlines, which lease acknowledged what, and where its next scan starts.
//!
//! Invariants: a slot is consumed or leased by a task, never both; a leased slot has exactly
//! one entry in the task's lease table; `acked_by` names only consumed slots; every sample
//! allocated before `scan_from` is consumed by the task or gone.

use super::leases::LeaseTable;
use crate::bitmap::Bitmap;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::time::Instant;
use tq_core::LeaseId;

/// Every task's state in one partition, by task name.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub(in crate::partition) struct TaskTable {
    tasks: HashMap<String, TaskState>,
}

impl TaskTable {
    pub fn get(&self, task: &str) -> Option<&TaskState> {
        self.tasks.get(task)
    }

    pub fn get_mut(&mut self, task: &str) -> Option<&mut TaskState> {
        self.tasks.get_mut(task)
    }

    /// The state of `task`, created empty on its first use.
    pub fn entry(&mut self, task: &str) -> &mut TaskState {
        self.tasks.entry(task.to_string()).or_default()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&String, &TaskState)> {
        self.tasks.iter()
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut TaskState> {
        self.tasks.values_mut()
    }

    /// Outstanding leases over every task.
    pub fn lease_count(&self) -> usize {
        self.tasks.values().map(|t| t.leases.len()).sum()
    }

    /// Forgets `slot` in every task (its sample is released).
    pub fn forget_slot(&mut self, slot: u32) {
        for t in self.tasks.values_mut() {
            t.forget(slot);
        }
    }

    /// Forgets what `task` (or every task) consumed or holds leased.
    pub fn reset(&mut self, task: Option<&str>) {
        match task {
            Some(t) => {
                self.tasks.remove(t);
            }
            None => self.tasks.clear(),
        }
    }
}

/// What one task has taken from a partition.
///
/// Saved as consumed, leased, then one list of `(slot, lease, ms)`: the outstanding leases
/// with the time each had left, and (format 3 on) the acknowledged ones with `ms` =
/// [`crate::checkpoint::deadlines::ACKNOWLEDGED`].
#[derive(Debug, Default)]
pub(in crate::partition) struct TaskState {
    /// Consumed for good (at-most-once fetches, or acknowledged leases).
    consumed: Bitmap,
    /// Handed out under a lease that has not been acknowledged or expired yet.
    leased: Bitmap,
    /// Deadlines are saved as the time left, and restored from the time of loading.
    leases: LeaseTable,
    /// The lease that acknowledged each consumed slot, so that a retried acknowledgement
    /// (its first answer lost, say to a controller restart) answers as acknowledged again
    /// instead of 0. Kept until the slot is released or its consumption undone.
    acked_by: HashMap<u32, LeaseId>,
    /// Every sample allocated before this number is consumed by the task or gone, so a fetch
    /// starts its scan there (`order.rs`; not saved: 0 after a restore, moved on by the first
    /// fetch).
    scan_from: u64,
}

impl Serialize for TaskState {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        let leases = crate::checkpoint::deadlines::encode(&self.leases, &self.acked_by);
        (&self.consumed, &self.leased, leases).serialize(s)
    }
}

impl<'de> Deserialize<'de> for TaskState {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let (consumed, leased, saved) = <(Bitmap, Bitmap, _)>::deserialize(d)?;
        let (leases, acked_by) = crate::checkpoint::deadlines::decode(saved);
        Ok(TaskState {
            consumed,
            leased,
            leases,
            acked_by,
            scan_from: 0,
        })
    }
}

fn su(slot: u32) -> usize {
    slot as usize
}

impl TaskState {
    pub fn is_consumed(&self, slot: u32) -> bool {
        self.consumed.get(su(slot))
    }

    pub fn is_leased(&self, slot: u32) -> bool {
        self.leased.get(su(slot))
    }

    pub fn consumed_word(&self, w: usize) -> u64 {
        self.consumed.word(w)
    }

    pub fn leased_word(&self, w: usize) -> u64 {
        self.leased.word(w)
    }

    /// Outstanding leases.
    pub fn lease_count(&self) -> usize {
        self.leases.len()
    }

    /// The lease held on `slot`, if any.
    pub fn lease_on(&self, slot: u32) -> Option<LeaseId> {
        self.leases.get(&slot).map(|(l, _)| *l)
    }

    fn held_under(&self, slot: u32, lease: LeaseId) -> bool {
        self.lease_on(slot) == Some(lease)
    }

    /// Consumes `slot` for good, dropping any lease on it.
    pub fn consume(&mut self, slot: u32) {
        self.consumed.set(su(slot), true);
        self.leased.set(su(slot), false);
        self.leases.remove(&slot);
        self.acked_by.remove(&slot);
    }

    /// Leases `slot` until `expiry` unless it is consumed or leased already.
    pub fn lease(&mut self, slot: u32, lease: LeaseId, expiry: Instant) {
        if !self.is_consumed(slot) && !self.is_leased(slot) {
            self.leased.set(su(slot), true);
            self.leases.insert(slot, (lease, expiry));
        }
    }

    /// Gives back `slot` if it is held under exactly `lease`; returns whether it was.
    pub fn return_leased(&mut self, slot: u32, lease: LeaseId) -> bool {
        let held = self.held_under(slot, lease);
        if held {
            self.leases.remove(&slot);
            self.leased.set(su(slot), false);
        }
        held
    }

    /// Undoes an at-most-once consumption of `slot`, allocated as number `seq`; returns
    /// whether it was consumed.
    pub fn unconsume(&mut self, slot: u32, seq: u64) -> bool {
        let consumed = self.is_consumed(slot);
        self.consumed.set(su(slot), false);
        self.acked_by.remove(&slot);
        // Unconsumed again: the task's scans must reach it.
        self.scan_from = self.scan_from.min(seq);
        consumed
    }

    /// Acknowledges `slot` under `lease`; true if it is now consumed under that lease (also
    /// when it was acknowledged by it before: a retry whose first answer was lost).
    pub fn ack(&mut self, slot: u32, lease: LeaseId) -> bool {
        if self.held_under(slot, lease) {
            self.leases.remove(&slot);
            self.leased.set(su(slot), false);
            self.consumed.set(su(slot), true);
            self.acked_by.insert(slot, lease);
            true
        } else {
            self.is_consumed(slot) && self.acked_by.get(&slot) == Some(&lease)
        }
    }

    /// Moves the deadline of `slot` to `until` if it is held under `lease`.
    pub fn renew(&mut self, slot: u32, lease: LeaseId, until: Instant) -> bool {
        let held = self.held_under(slot, lease);
        if held {
            self.leases.insert(slot, (lease, until));
        }
        held
    }

    /// Returns the leases due at `now` to the ready set; gives the earliest deadline still
    /// pending and how many expired.
    pub fn expire(&mut self, now: Instant) -> (Option<Instant>, u64) {
        if self.leases.is_empty() {
            return (None, 0);
        }
        let mut expired = 0;
        let leased = &mut self.leased;
        let pending = self.leases.expire(now, |s| {
            leased.set(su(s), false);
            expired += 1;
        });
        (pending, expired)
    }

    /// Where the task's next scan of the allocation order starts.
    pub fn scan_from(&self) -> u64 {
        self.scan_from
    }

    /// Every sample allocated before `seq` is consumed by the task or gone.
    pub fn scanned_past(&mut self, seq: u64) {
        self.scan_from = seq + 1;
    }

    fn forget(&mut self, slot: u32) {
        self.consumed.set(su(slot), false);
        self.leased.set(su(slot), false);
        self.leases.remove(&slot);
        self.acked_by.remove(&slot);
    }
}
