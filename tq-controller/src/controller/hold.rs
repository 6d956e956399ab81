//! Holding removals while a checkpoint copies payloads out of a shared store.
//!
//! A checkpoint that copies KV payloads reads, after the snapshot, every cell the snapshot
//! names. Writers in other processes write the store directly, so the store cannot hold them;
//! but nothing leaves the store without the controller's say: a clear starts by marking its
//! samples here, and an overwrite's old cells are retired only after its production notice is
//! answered with them. So the controller holds exactly those steps, from the snapshot (taken
//! under the same lock as the hold, so no clear slips between) until the copy is done. Puts of
//! new cells, reads, fetches and acknowledgements go on.
//!
//! A hold lifts itself after its time to live, so a checkpoint that dies never stalls clears
//! for longer than that.

use super::*;
use crate::checkpoint::SnapshotCounts;
use std::sync::atomic::{AtomicU64, Ordering};

/// The hold in place, if any.
#[derive(Default)]
pub(super) struct RemovalHold {
    current: Mutex<Option<(u64, tokio::time::Instant)>>,
    lifted: Notify,
    last_token: AtomicU64,
}

impl RemovalHold {
    fn slot(&self) -> MutexGuard<'_, Option<(u64, tokio::time::Instant)>> {
        self.current.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The deadline of the hold in place; an expired hold is dropped here.
    fn deadline(&self) -> Option<tokio::time::Instant> {
        let mut slot = self.slot();
        match *slot {
            Some((token, deadline)) if deadline <= tokio::time::Instant::now() => {
                tracing::warn!(
                    hold = token,
                    "a checkpoint's hold on clears expired before it was released; clears go on"
                );
                *slot = None;
                None
            }
            Some((_, deadline)) => Some(deadline),
            None => None,
        }
    }

    pub(super) fn is_held(&self) -> bool {
        self.deadline().is_some()
    }

    fn take(&self, ttl: Duration) -> Result<u64> {
        if self.is_held() {
            return Err(Error::unavailable(
                "another checkpoint is copying payloads (clears are held for it); try again \
                 when it is done",
            ));
        }
        let token = self.last_token.fetch_add(1, Ordering::Relaxed) + 1;
        *self.slot() = Some((token, tokio::time::Instant::now() + ttl));
        Ok(token)
    }

    /// Lifts hold `token`; a later hold (this one expired meanwhile) stays.
    fn lift(&self, token: u64) {
        let mut slot = self.slot();
        if slot.is_some_and(|(t, _)| t == token) {
            *slot = None;
            drop(slot);
            self.lifted.notify_waiters();
        }
    }

    /// Waits until the hold in place is lifted or expires (at once if there is none). The
    /// caller checks again under the state lock: a new hold may have come meanwhile.
    async fn wait(&self) {
        let lifted = self.lifted.notified();
        tokio::pin!(lifted);
        // Registered before the check, so a lift between the check and the wait is not missed.
        lifted.as_mut().enable();
        if let Some(deadline) = self.deadline() {
            let _ = tokio::time::timeout_at(deadline, lifted).await;
        }
    }
}

impl Controller {
    /// The whole state (as [`Controller::snapshot`]) and, from the same instant, a hold on
    /// every step that removes stored cells: marking samples for a clear and field clears
    /// wait, and so do production notices that replace cells (whose old cells the writer would
    /// retire). Returns the hold's token for [`Controller::release_removals`]; the hold lifts
    /// itself after `ttl`. One hold at a time: a second one is `Unavailable`.
    pub fn snapshot_holding_removals(
        &self,
        ttl: Duration,
    ) -> Result<(Vec<u8>, SnapshotCounts, u64)> {
        let st = self.exclusive();
        let samplers = self.sampler_states()?;
        let (bytes, counts) = self.encode_snapshot(&st, &samplers)?;
        let token = self.removals.take(ttl)?;
        tracing::info!(
            hold = token,
            ttl_s = ttl.as_secs_f64(),
            "controller snapshot taken; clears and overwrites wait until the copy is done"
        );
        Ok((bytes, counts, token))
    }

    /// Lifts the hold `token` of [`Controller::snapshot_holding_removals`]: waiting clears and
    /// overwrites go on. A hold that expired already is fine.
    pub fn release_removals(&self, token: u64) {
        self.removals.lift(token);
    }

    /// Runs `step` under the state lock once it may: `step` answers `None` to wait for the
    /// hold on removals to lift (it is told whether one is in place), then runs again.
    pub(super) async fn unless_held<T>(
        &self,
        mut step: impl FnMut(&mut State, bool) -> Option<Result<T>>,
    ) -> Result<T> {
        loop {
            {
                let mut st = self.exclusive();
                if let Some(done) = step(&mut st, self.removals.is_held()) {
                    return done;
                }
            }
            self.removals.wait().await;
        }
    }

    /// [`Controller::unless_held`] for a step that changes one partition: under the shared
    /// state lock (the hold is taken under the exclusive one, so it cannot slip in between
    /// the step's check and its change).
    pub(super) async fn unless_held_shared<T>(
        &self,
        mut step: impl FnMut(&State, bool) -> Option<Result<T>>,
    ) -> Result<T> {
        loop {
            {
                let st = self.shared();
                if let Some(done) = step(&st, self.removals.is_held()) {
                    return done;
                }
            }
            self.removals.wait().await;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_hold_is_unique_lifts_by_token_and_expires() {
        let hold = RemovalHold::default();
        let first = hold.take(Duration::from_secs(5)).unwrap();
        let e = hold.take(Duration::from_secs(5)).unwrap_err();
        assert_eq!(e.kind(), &tq_core::ErrorKind::Unavailable, "{e}");
        hold.lift(first + 1);
        assert!(hold.is_held(), "another token does not lift it");
        hold.lift(first);
        assert!(!hold.is_held());
        // An expired hold stops holding, and a waiter wakes by its deadline.
        let _second = hold.take(Duration::from_secs(5)).unwrap();
        let started = tokio::time::Instant::now();
        hold.wait().await;
        assert_eq!(started.elapsed(), Duration::from_secs(5));
        assert!(!hold.is_held());
    }
}
