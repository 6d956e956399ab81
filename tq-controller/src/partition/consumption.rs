//! What each task consumed: fetch candidates, consumption, leases and their expiry.

use super::*;

impl Partition {
    pub fn mark_consumed(&mut self, task: &str, ids: &[SampleId]) {
        let t = self.tasks.entry(task.to_string()).or_default();
        for id in ids {
            if let Some(&s) = self.slot_of.get(&id.index) {
                t.consumed.set(slot_u(s), true);
                t.leased.set(slot_u(s), false);
                t.leases.remove(&s);
                t.acked_by.remove(&s);
            }
        }
    }

    /// Leases samples to `task` until `expiry`, skipping those already consumed or leased.
    pub fn lease(&mut self, task: &str, ids: &[SampleId], lease: LeaseId, expiry: Instant) {
        let t = self.tasks.entry(task.to_string()).or_default();
        for id in ids {
            if let Some(&s) = self.slot_of.get(&id.index) {
                if !t.consumed.get(slot_u(s)) && !t.leased.get(slot_u(s)) {
                    t.leased.set(slot_u(s), true);
                    t.leases.insert(s, (lease, expiry));
                }
            }
        }
    }

    /// The lease `task` holds on `id`, if any.
    pub fn lease_of(&self, task: &str, id: SampleId) -> Option<LeaseId> {
        let s = self.slot_for(id)?;
        self.tasks.get(task)?.leases.get(&s).map(|(l, _)| *l)
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
        let slots: Vec<u32> = ids.iter().filter_map(|&id| self.slot_for(id)).collect();
        let Some(t) = self.tasks.get_mut(task) else {
            return 0;
        };
        let mut returned = 0;
        for s in slots {
            let back = match lease {
                Some(lease) => {
                    let held = t.leases.get(&s).is_some_and(|(l, _)| *l == lease);
                    if held {
                        t.leases.remove(&s);
                        t.leased.set(slot_u(s), false);
                    }
                    held
                }
                None => {
                    let consumed = t.consumed.get(slot_u(s));
                    t.consumed.set(slot_u(s), false);
                    t.acked_by.remove(&s);
                    // Unconsumed again: the task's scans must reach it.
                    t.scan_from = t.scan_from.min(self.seq[slot_u(s)]);
                    consumed
                }
            };
            returned += usize::from(back);
        }
        returned
    }

    /// Consumes the samples `task` holds under `lease`; returns how many are now consumed
    /// under it. Idempotent: a sample this lease acknowledged before counts again (a retry
    /// whose first answer was lost). Samples whose lease expired (and may have been handed to
    /// someone else) are left alone.
    pub fn ack(&mut self, task: &str, lease: LeaseId, ids: &[SampleId]) -> usize {
        let mut slots: Vec<u32> = ids.iter().filter_map(|&id| self.slot_for(id)).collect();
        // A sample named twice in one call counts once.
        slots.sort_unstable();
        slots.dedup();
        let Some(t) = self.tasks.get_mut(task) else {
            return 0;
        };
        let mut acked = 0;
        for s in slots {
            if t.leases.get(&s).is_some_and(|(l, _)| *l == lease) {
                t.leases.remove(&s);
                t.leased.set(slot_u(s), false);
                t.consumed.set(slot_u(s), true);
                t.acked_by.insert(s, lease);
                acked += 1;
            } else if t.consumed.get(slot_u(s)) && t.acked_by.get(&s) == Some(&lease) {
                acked += 1;
            }
        }
        acked
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
        let mut slots: Vec<u32> = ids.iter().filter_map(|&id| self.slot_for(id)).collect();
        slots.sort_unstable();
        slots.dedup();
        let Some(t) = self.tasks.get_mut(task) else {
            return 0;
        };
        let mut renewed = 0;
        for s in slots {
            if t.leases.get(&s).is_some_and(|(l, _)| *l == lease) {
                t.leases.insert(s, (lease, until));
                renewed += 1;
            }
        }
        renewed
    }

    /// Returns expired leases to the ready set; gives the earliest expiry still pending and
    /// how many samples' leases expired.
    pub fn expire_leases(&mut self, now: Instant) -> (Option<Instant>, u64) {
        let mut next: Option<Instant> = None;
        let mut expired = 0;
        for t in self.tasks.values_mut() {
            if t.leases.is_empty() {
                continue;
            }
            let leased = &mut t.leased;
            let pending = t.leases.expire(now, |s| {
                leased.set(slot_u(s), false);
                expired += 1;
            });
            if let Some(p) = pending {
                next = Some(next.map_or(p, |n| n.min(p)));
            }
        }
        (next, expired)
    }

    /// Live samples `task` has not consumed (leased ones included).
    pub fn unconsumed(&self, task: &str) -> usize {
        let t = self.tasks.get(task);
        (0..self.live.num_words())
            .map(|w| {
                let mut word = self.live.word(w) & !self.clearing.word(w);
                if let Some(t) = t {
                    word &= !t.consumed.word(w);
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
            return self.live.count_ones() == 0;
        };
        (0..self.live.num_words())
            .all(|w| self.live.word(w) & !self.clearing.word(w) & !t.consumed.word(w) == 0)
    }

    /// Forgets what `task` (or every task) consumed or holds leased.
    pub fn reset_consumption(&mut self, task: Option<&str>) {
        match task {
            Some(t) => {
                self.tasks.remove(t);
            }
            None => self.tasks.clear(),
        }
    }

    pub fn consumption_status(&self, task: &str) -> ConsumptionStatus {
        let slots = self.visible_slots();
        let t = self.tasks.get(task);
        let bit = |s: u32, f: fn(&TaskState) -> &Bitmap| t.is_some_and(|t| f(t).get(slot_u(s)));
        ConsumptionStatus {
            samples: slots.iter().map(|&s| self.ids[slot_u(s)]).collect(),
            consumed: slots.iter().map(|&s| bit(s, |t| &t.consumed)).collect(),
            leased: slots.iter().map(|&s| bit(s, |t| &t.leased)).collect(),
        }
    }
}
