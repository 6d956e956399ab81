//! What each task consumed: fetch candidates, consumption, leases and their expiry.

use super::*;

impl Partition {
    pub fn mark_consumed(&mut self, task: &str, ids: &[SampleId]) {
        let t = self.tasks.entry(task);
        for &id in ids {
            if let Some(s) = self.slots.slot_of_index(id) {
                t.consume(s);
            }
        }
    }

    /// Leases samples to `task` until `expiry`, skipping those already consumed or leased.
    pub fn lease(&mut self, task: &str, ids: &[SampleId], lease: LeaseId, expiry: Instant) {
        let t = self.tasks.entry(task);
        for &id in ids {
            if let Some(s) = self.slots.slot_of_index(id) {
                t.lease(s, lease, expiry);
            }
        }
    }

    /// The lease `task` holds on `id`, if any.
    pub fn lease_of(&self, task: &str, id: SampleId) -> Option<LeaseId> {
        let s = self.slots.slot_for(id)?;
        self.tasks.get(task)?.lease_on(s)
    }

    /// Slots of those of `ids` this partition owns, each once, in slot order.
    fn owned_slots_once(&self, ids: &[SampleId]) -> Vec<u32> {
        let mut slots: Vec<u32> = ids
            .iter()
            .filter_map(|&id| self.slots.slot_for(id))
            .collect();
        slots.sort_unstable();
        slots.dedup();
        slots
    }

    /// Gives back samples a fetch handed to `task` whose caller never received them: with
    /// `lease`, the samples still held under exactly that lease are released; without, the
    /// at-most-once consumption is undone. Returns how many came back.
    pub fn return_fetched(
        &mut self,
        task: &str,
        lease: Option<LeaseId>,
        ids: &[SampleId],
    ) -> usize {
        let slots: Vec<u32> = ids
            .iter()
            .filter_map(|&id| self.slots.slot_for(id))
            .collect();
        let Some(t) = self.tasks.get_mut(task) else {
            return 0;
        };
        slots
            .into_iter()
            .filter(|&s| match lease {
                Some(lease) => t.return_leased(s, lease),
                None => t.unconsume(s, self.slots.seq(s)),
            })
            .count()
    }

    /// Consumes the samples `task` holds under `lease`; returns how many are now consumed
    /// under it. Idempotent: a sample this lease acknowledged before counts again (a retry
    /// whose first answer was lost). Samples whose lease expired (and may have been handed to
    /// someone else) are left alone. A sample named twice in one call counts once.
    pub fn ack(&mut self, task: &str, lease: LeaseId, ids: &[SampleId]) -> usize {
        let slots = self.owned_slots_once(ids);
        let Some(t) = self.tasks.get_mut(task) else {
            return 0;
        };
        slots.into_iter().filter(|&s| t.ack(s, lease)).count()
    }

    /// Moves the deadline of the samples `task` holds under `lease` to `until`; returns how
    /// many it held. Samples under another lease, acknowledged or not leased are left alone.
    pub fn renew_lease(
        &mut self,
        task: &str,
        lease: LeaseId,
        ids: &[SampleId],
        until: Instant,
    ) -> usize {
        let slots = self.owned_slots_once(ids);
        let Some(t) = self.tasks.get_mut(task) else {
            return 0;
        };
        slots
            .into_iter()
            .filter(|&s| t.renew(s, lease, until))
            .count()
    }

    /// Returns expired leases to the ready set; gives the earliest expiry still pending and
    /// how many samples' leases expired.
    pub fn expire_leases(&mut self, now: Instant) -> (Option<Instant>, u64) {
        let mut next: Option<Instant> = None;
        let mut expired = 0;
        for t in self.tasks.iter_mut() {
            let (pending, n) = t.expire(now);
            expired += n;
            if let Some(p) = pending {
                next = Some(next.map_or(p, |n| n.min(p)));
            }
        }
        (next, expired)
    }

    /// Live samples `task` has not consumed (leased ones included).
    pub fn unconsumed(&self, task: &str) -> usize {
        let t = self.tasks.get(task);
        (0..self.slots.num_words())
            .map(|w| {
                let mut word = self.slots.visible_word(w);
                if let Some(t) = t {
                    word &= !t.consumed_word(w);
                }
                word.count_ones() as usize
            })
            .sum()
    }

    /// True when the partition is complete and `task` has consumed every live sample (leased
    /// samples are not consumed yet).
    pub fn finished_for(&self, task: &str) -> bool {
        if !self.complete {
            return false;
        }
        let Some(t) = self.tasks.get(task) else {
            return self.slots.live_count() == 0;
        };
        (0..self.slots.num_words()).all(|w| self.slots.visible_word(w) & !t.consumed_word(w) == 0)
    }

    /// Forgets what `task` (or every task) consumed or holds leased.
    pub fn reset_consumption(&mut self, task: Option<&str>) {
        self.tasks.reset(task);
    }

    pub fn consumption_status(&self, task: &str) -> ConsumptionStatus {
        let slots = self.slots.visible_in_order();
        let t = self.tasks.get(task);
        ConsumptionStatus {
            samples: slots.iter().map(|&s| self.slots.id(s)).collect(),
            consumed: slots
                .iter()
                .map(|&s| t.is_some_and(|t| t.is_consumed(s)))
                .collect(),
            leased: slots
                .iter()
                .map(|&s| t.is_some_and(|t| t.is_leased(s)))
                .collect(),
        }
    }
}
