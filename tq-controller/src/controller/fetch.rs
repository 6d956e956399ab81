//! Fetches: one attempt under the partition's lock ([`Controller::try_fetch`]: expire leases,
//! offer the sampler the oldest candidates, reserve what it picked), and the loop that waits for
//! enough ready samples on the partition's `Notify`, up to the fetch's deadline.

use super::*;

impl Controller {
    /// One attempt at a fetch.
    pub(super) fn try_fetch(
        &self,
        req: &GetMetaRequest,
        task: &str,
        batch_size: usize,
        lease: Option<Duration>,
        sampler: &dyn Sampler,
        once: Option<&RequestId>,
    ) -> Result<Attempt> {
        let st = self.shared();
        let Some(mut p) = st.partitions.lock_mut(&req.partition) else {
            return Ok(Attempt::NotReady { next_expiry: None });
        };
        let p = &mut *p;
        // Leases run on tokio's clock: the runtime's time, which tests pause and advance (the
        // same clock as the waits), and the system's otherwise.
        let now = tokio::time::Instant::now().into_std();
        let (next_expiry, expired) = p.expire_leases(now);
        if expired > 0 {
            self.telemetry
                .leases_expired
                .fetch_add(expired, std::sync::atomic::Ordering::Relaxed);
        }
        let Some(fids) = p.known_fields(&req.fields) else {
            return Ok(Attempt::not_ready(p, task, next_expiry));
        };
        let mut ctx = SamplerContext {
            partition: &req.partition,
            task,
            dp_rank: req.dp_rank,
            batch_index: req.batch_index,
            args: req.sampler_args.as_deref(),
            draining: false,
        };
        let cached = sampler.has_cached(&ctx);
        // The candidates, oldest first: only as many as the sampler needs when it takes the
        // oldest (a fetch then costs its batch, not the partition), all of them otherwise.
        p.prepare_scan(task);
        let mut limit = if sampler.takes_oldest() {
            batch_size
        } else {
            usize::MAX
        };
        let (ready, picked) = loop {
            let (ready, all) = p.ready_prefix(&fids, task, limit);
            // Given everything that is ready, and nothing else can become ready for this task
            // (complete, the rest consumed): the last, smaller batch may go out. Counted only
            // then, so a fetch with plenty ready scans no bitmap.
            let draining =
                all && p.complete && !ready.is_empty() && p.unconsumed(task) == ready.len();
            let mut want = batch_size;
            // (Fewer than a batch means the list is everything: `limit` is at least a batch.)
            if ready.len() < batch_size && !cached {
                if !draining {
                    return Ok(Attempt::not_ready(p, task, next_expiry));
                }
                want = ready.len();
            }
            ctx.draining = draining;
            let picked = match sampler.sample(&ready, want, &ctx) {
                Ok(picked) => picked,
                // A sampler that cannot use the remainder (an incomplete group) leaves it.
                Err(_) if want < batch_size => return Ok(Attempt::not_ready(p, task, next_expiry)),
                Err(e) => return Err(e),
            };
            // An empty answer from the oldest candidates may still find a batch further on.
            if all || !picked.sampled.is_empty() || !picked.consumed.is_empty() {
                break (ready, picked);
            }
            limit = limit.saturating_mul(4);
        };
        let ready_ids: HashSet<SampleId> = ready.iter().map(|c| c.id).collect();
        // A fresh answer may only hand out ready samples; a cached one (rank-aware sampling)
        // names samples another rank of the group already took.
        if !cached {
            if let Some(bad) = picked.sampled.iter().find(|id| !ready_ids.contains(id)) {
                return Err(Error::internal(format!(
                    "partition `{}`: sampler handed out sample {bad}, which is not ready",
                    req.partition
                )));
            }
        }
        if let Some(bad) = picked
            .consumed
            .iter()
            .find(|id| !ready_ids.contains(id) && !picked.sampled.contains(id))
        {
            return Err(Error::internal(format!(
                "partition `{}`: sampler marked sample {bad} consumed, which was not ready",
                req.partition
            )));
        }
        if picked.sampled.is_empty() {
            // A rank whose share of a partition's last batch is empty (seqlen-balanced): the
            // other ranks' shares are reserved all the same, as on any first call, so that no
            // other batch takes them; this rank has nothing (and is finished when they are).
            if !cached && !picked.consumed.is_empty() {
                reserve(p, &st.next_lease, task, &picked, lease, now);
            }
            return Ok(Attempt::not_ready(p, task, next_expiry));
        }
        let slots = match p.slots_of(&picked.sampled) {
            Ok(s) => s,
            // A cached answer may name samples cleared since; treat as not ready.
            Err(_) => return Ok(Attempt::NotReady { next_expiry }),
        };
        let lease_id = reserve(p, &st.next_lease, task, &picked, lease, now);
        let meta = p
            .build_meta(&slots, &fids, Production::AllReady)
            .with_lease(lease_id);
        if let Some(id) = once {
            st.answers()
                .remember(id, answers::Answer::Meta(meta.clone()));
        }
        Ok(Attempt::Got(meta))
    }

    pub(super) async fn fetch(
        &self,
        req: &GetMetaRequest,
        task: &str,
        batch_size: usize,
        wait: Wait,
        lease: Option<Duration>,
        once: Option<&RequestId>,
    ) -> Result<BatchMeta> {
        if batch_size == 0 {
            return Err(Error::invalid("fetch batch size must be at least 1"));
        }
        if req.fields.is_empty() {
            return Err(Error::invalid(format!(
                "partition `{}`: a fetch needs at least one field",
                req.partition
            )));
        }
        if task.is_empty() {
            return Err(Error::invalid("a fetch needs a task name"));
        }
        if lease.is_some_and(|d| d.is_zero()) {
            return Err(Error::invalid("a lease must last longer than zero"));
        }
        let sampler = self.sampler(req.sampler.as_deref())?;
        if req.sampler_args.is_some() && !sampler.takes_args() {
            return Err(Error::invalid(format!(
                "partition `{}`: the fetch brings inputs for its sampler, and sampler `{}` takes \
                 none (only samplers written in Python do)",
                req.partition,
                req.sampler.as_deref().unwrap_or("(the default)")
            )));
        }
        let deadline = match wait {
            Wait::NoWait => None,
            Wait::For(d) => Some(tokio::time::Instant::now() + d),
        };
        let notify = self.waiter(&req.partition);
        loop {
            // Register interest before checking, so a notify between check and wait is not lost.
            let notified = notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let next_expiry =
                match self.try_fetch(req, task, batch_size, lease, sampler.as_ref(), once)? {
                    Attempt::Got(meta) => return Ok(meta),
                    Attempt::Finished => {
                        return Err(Error::closed(format!(
                            "partition `{}` is complete and task `{task}` has consumed all of it",
                            req.partition
                        )))
                    }
                    Attempt::NotReady { next_expiry } => next_expiry,
                };
            let Some(deadline) = deadline else {
                return Ok(BatchMeta::empty(req.partition.clone()));
            };
            let _waiting = Waiting::new(&self.telemetry.waiting_fetches);
            // Wake at the deadline, or earlier when a lease expires and samples return.
            let wake = next_expiry
                .map(|e| tokio::time::Instant::from_std(e).min(deadline))
                .unwrap_or(deadline);
            if tokio::time::timeout_at(wake, notified).await.is_err()
                && tokio::time::Instant::now() >= deadline
            {
                let ready = {
                    let st = self.shared();
                    st.partitions
                        .get(&req.partition)
                        .and_then(|p| p.known_fields(&req.fields).map(|f| p.ready_count(&f, task)))
                        .unwrap_or(0)
                };
                // The controller took nothing: asking again is safe, unlike a request whose
                // answer never came (which the transport reports as outcome unknown).
                return Err(Error::timeout(format!(
                    "partition `{}`: fetch of {batch_size} samples with fields {:?} for task `{task}` \
                     timed out ({ready} ready)",
                    req.partition, req.fields
                ))
                .with_retry(tq_core::Retry::Safe));
            }
        }
    }
}

/// Takes `picked.consumed` for `task`: marks it consumed, or leases it until `now + lease`.
/// Ranks of one group share the lease of the first hand-out of a cached batch; otherwise the
/// lease is new. Returns the lease.
pub(super) fn reserve(
    p: &mut Partition,
    next_lease: &AtomicU64,
    task: &str,
    picked: &Sampled,
    lease: Option<Duration>,
    now: Instant,
) -> Option<LeaseId> {
    let Some(d) = lease else {
        p.mark_consumed(task, &picked.consumed);
        return None;
    };
    let id = picked
        .sampled
        .first()
        .and_then(|&s| p.lease_of(task, s))
        .unwrap_or_else(|| next_lease.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1);
    p.lease(task, &picked.consumed, id, now + d);
    Some(id)
}

/// The outcome of one fetch attempt.
pub(super) enum Attempt {
    Got(BatchMeta),
    /// Not enough ready; leases may expire at `next_expiry` and bring samples back.
    NotReady {
        next_expiry: Option<Instant>,
    },
    /// The partition is complete and the task consumed all of it.
    Finished,
}

impl Attempt {
    pub(super) fn not_ready(p: &Partition, task: &str, next_expiry: Option<Instant>) -> Attempt {
        if p.finished_for(task) {
            Attempt::Finished
        } else {
            Attempt::NotReady { next_expiry }
        }
    }
}
