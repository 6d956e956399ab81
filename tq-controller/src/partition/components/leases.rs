//! A task's outstanding leases, by slot and by deadline: a fetch expires the due ones by
//! taking them from the front of the deadline order, instead of looking at every lease (with a
//! thousand consumers each holding a batch, that was thousands of entries per fetch).

use std::collections::{BTreeSet, HashMap};
use std::time::Instant;
use tq_core::LeaseId;

/// Outstanding leases: slot → (lease, deadline), with the deadlines kept in order.
#[derive(Debug, Default)]
pub(crate) struct LeaseTable {
    by_slot: HashMap<u32, (LeaseId, Instant)>,
    by_deadline: BTreeSet<(Instant, u32)>,
}

impl LeaseTable {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Leases `slot` (replacing a lease it had).
    pub(crate) fn insert(&mut self, slot: u32, entry: (LeaseId, Instant)) {
        if let Some((_, old)) = self.by_slot.insert(slot, entry) {
            self.by_deadline.remove(&(old, slot));
        }
        self.by_deadline.insert((entry.1, slot));
    }

    pub(crate) fn remove(&mut self, slot: &u32) -> Option<(LeaseId, Instant)> {
        let entry = self.by_slot.remove(slot)?;
        self.by_deadline.remove(&(entry.1, *slot));
        Some(entry)
    }

    pub(crate) fn get(&self, slot: &u32) -> Option<&(LeaseId, Instant)> {
        self.by_slot.get(slot)
    }

    pub(crate) fn len(&self) -> usize {
        self.by_slot.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.by_slot.is_empty()
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&u32, &(LeaseId, Instant))> {
        self.by_slot.iter()
    }

    /// Removes the leases due at `now`, calling `expired` with each slot; returns the earliest
    /// deadline still pending. Costs the expired leases, not the outstanding ones.
    pub(crate) fn expire(&mut self, now: Instant, mut expired: impl FnMut(u32)) -> Option<Instant> {
        while let Some(&(deadline, slot)) = self.by_deadline.first() {
            if deadline > now {
                return Some(deadline);
            }
            self.by_deadline.pop_first();
            self.by_slot.remove(&slot);
            expired(slot);
        }
        None
    }
}
