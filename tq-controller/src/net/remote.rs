//! [`RemoteControlPlane`]: the client side of the controller protocol — the same
//! [`ControlPlane`] as the in-process controller, over a pooled tq-net connection.

use super::*;

/// What a registration answers: the controller's epoch and the registration the unit holds
/// (see `net/registry.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Registration {
    pub epoch: u64,
    pub registration: u64,
}

/// The control plane of a remote controller.
#[derive(Clone)]
pub struct RemoteControlPlane {
    pool: Pool,
    endpoint: Endpoint,
    request_timeout: Duration,
    /// The controller's epoch, learned from its topology (0 until then); sent with every
    /// request, so a controller that restarted without its state refuses this client's
    /// metadata instead of applying it to its new samples.
    epoch: Arc<std::sync::atomic::AtomicU64>,
    /// Ids for the requests that must not be applied twice.
    tags: Arc<RequestTags>,
    /// Requests sent behind an answer ([`RemoteControlPlane::release_behind`]) and not yet
    /// answered; every other request waits for them.
    behind: Arc<Behind>,
}

/// The requests of a stub sent without waiting for their answer, counted so that the stub's
/// next request goes after them.
#[derive(Default)]
struct Behind {
    in_flight: std::sync::atomic::AtomicUsize,
    answered: tokio::sync::Notify,
}

/// One request of [`Behind`]; dropping it (answered, failed or abandoned) lets others go.
struct BehindGuard(Arc<Behind>);

impl Behind {
    fn enter(self: &Arc<Self>) -> BehindGuard {
        self.in_flight
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        BehindGuard(Arc::clone(self))
    }

    /// Returns once no request is in flight behind an answer. The common case, none, costs
    /// one atomic load (no registration with the `Notify`, which takes its lock).
    async fn settled(&self) {
        while self.in_flight.load(std::sync::atomic::Ordering::Acquire) != 0 {
            let answered = self.answered.notified();
            tokio::pin!(answered);
            // Registered before the second check, so an answer between the check and the
            // wait still wakes it.
            answered.as_mut().enable();
            if self.in_flight.load(std::sync::atomic::Ordering::Acquire) == 0 {
                return;
            }
            answered.await;
        }
    }
}

impl Drop for BehindGuard {
    fn drop(&mut self) {
        self.0
            .in_flight
            .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
        self.0.answered.notify_waiters();
    }
}

/// Hands out [`RequestId`]s: one client id per stub (and its clones), a sequence number per
/// request, and the lowest number still in flight, below which the controller may forget.
struct RequestTags {
    client: u64,
    next: std::sync::atomic::AtomicU64,
    in_flight: Mutex<std::collections::BTreeSet<u64>>,
}

/// A tagged request in flight; dropping it (answered, failed or abandoned) finishes it.
struct Tagged<'a> {
    tags: &'a RequestTags,
    seq: u64,
}

impl RequestTags {
    fn new() -> Self {
        RequestTags {
            client: tq_core::new_epoch(),
            next: std::sync::atomic::AtomicU64::new(1),
            in_flight: Mutex::new(Default::default()),
        }
    }

    fn start(&self) -> (RequestId, Tagged<'_>) {
        let seq = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut in_flight = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        in_flight.insert(seq);
        let done_below = in_flight.first().copied().unwrap_or(seq);
        let id = RequestId {
            client: self.client,
            seq,
            done_below,
        };
        (id, Tagged { tags: self, seq })
    }
}

impl Drop for Tagged<'_> {
    fn drop(&mut self) {
        let mut in_flight = self
            .tags
            .in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        in_flight.remove(&self.seq);
    }
}

impl RemoteControlPlane {
    /// A stub for the controller at `endpoint`. `request_timeout` bounds every call (a fetch
    /// that waits gets its wait on top).
    pub fn new(pool: Pool, endpoint: Endpoint, request_timeout: Duration) -> Self {
        RemoteControlPlane {
            pool,
            endpoint,
            request_timeout,
            epoch: Arc::new(std::sync::atomic::AtomicU64::new(0)),
            tags: Arc::new(RequestTags::new()),
            behind: Arc::default(),
        }
    }

    /// [`ControlPlane::release_behind`]: sends the release from a task of its own and returns;
    /// the stub's next requests wait for its answer. Outside a runtime it waits here.
    pub(crate) async fn release_behind(
        &self,
        partition: &str,
        samples: &[tq_core::SampleId],
    ) -> Result<()> {
        let request = ControlRequest::Release {
            partition: partition.to_owned(),
            samples: samples.to_vec(),
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return self.expect_done("release", request).await;
        };
        let guard = self.behind.enter();
        let stub = self.clone();
        let (partition, count) = (partition.to_owned(), samples.len());
        runtime.spawn(async move {
            let _guard = guard;
            if let Err(e) = stub.expect_done("release", request).await {
                tracing::warn!(
                    partition,
                    samples = count,
                    error = %e,
                    "the release of cleared samples sent behind the clear's answer failed; \
                     their cells are deleted and they stay hidden until the next put or clear \
                     of their keys, or a clear of the partition, releases them"
                );
            }
        });
        Ok(())
    }

    /// Waits until every request sent behind an answer has been answered or has failed.
    pub async fn settle(&self) {
        self.behind.settled().await;
    }

    /// Sends an idempotent request answered by `Done`, without waiting for requests sent
    /// behind an answer (it may be one of them).
    async fn expect_done(&self, what: &str, request: ControlRequest) -> Result<()> {
        let envelope = ControlEnvelope {
            epoch: self.epoch(),
            request,
            once: None,
        };
        match self
            .send_envelope_now(envelope, Vec::new(), true, Duration::ZERO)
            .await?
            .decode()?
        {
            ControlResponse::Done => Ok(()),
            other => Err(self.unexpected(what, other)),
        }
    }

    /// The controller's epoch as this stub knows it (0 before the first topology request).
    pub fn epoch(&self) -> u64 {
        self.epoch.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// Sends `request` in an envelope with `epoch` (0: none, for requests a stub must be able
    /// to make whatever the controller's epoch) and `frames` as body; returns the answer.
    async fn send(
        &self,
        epoch: u64,
        request: ControlRequest,
        frames: Vec<Bytes>,
        idempotent: bool,
        extra_wait: Duration,
    ) -> Result<Message> {
        let envelope = ControlEnvelope {
            epoch,
            request,
            once: None,
        };
        self.send_envelope(envelope, frames, idempotent, extra_wait)
            .await
    }

    /// Sends `envelope` once the requests sent behind an answer have been answered: what this
    /// client asks next sees what it did before.
    async fn send_envelope(
        &self,
        envelope: ControlEnvelope,
        frames: Vec<Bytes>,
        idempotent: bool,
        extra_wait: Duration,
    ) -> Result<Message> {
        self.behind.settled().await;
        self.send_envelope_now(envelope, frames, idempotent, extra_wait)
            .await
    }

    async fn send_envelope_now(
        &self,
        envelope: ControlEnvelope,
        frames: Vec<Bytes>,
        idempotent: bool,
        extra_wait: Duration,
    ) -> Result<Message> {
        let msg = Message::encode(&envelope, frames)?;
        self.pool
            .call(
                &self.endpoint,
                msg,
                CallOptions {
                    timeout: Some(self.request_timeout + extra_wait),
                    idempotent,
                },
            )
            .await
            .map_err(|e| e.context(format!("controller {}", self.endpoint)))
    }

    async fn call(
        &self,
        req: ControlRequest,
        idempotent: bool,
        extra_wait: Duration,
    ) -> Result<ControlResponse> {
        self.send(self.epoch(), req, Vec::new(), idempotent, extra_wait)
            .await?
            .decode()
    }

    /// Sends `request` with a request id, so that the controller applies it once however often
    /// it arrives; it is then safe to repeat after a lost answer.
    async fn send_tagged(
        &self,
        request: ControlRequest,
        wait: Duration,
    ) -> Result<ControlResponse> {
        let (id, _in_flight) = self.tags.start();
        let envelope = ControlEnvelope {
            epoch: self.epoch(),
            request,
            once: Some(id),
        };
        self.send_envelope(envelope, Vec::new(), true, wait)
            .await?
            .decode()
    }

    pub(crate) fn unexpected(&self, what: &str, got: ControlResponse) -> Error {
        Error::corrupted(format!(
            "controller {} answered {what} with {got:?}",
            self.endpoint
        ))
    }

    /// Sends a data-path request as its operation's [`crate::Resend`] rule says.
    pub(crate) async fn send_op(
        &self,
        request: ControlRequest,
        resend: crate::Resend,
        wait: Duration,
    ) -> Result<ControlResponse> {
        match resend {
            crate::Resend::Tagged => self.send_tagged(request, wait).await,
            crate::Resend::Freely => self.call(request, true, wait).await,
            crate::Resend::Never => self.call(request, false, wait).await,
        }
    }

    /// Registers `info` again every `every` until the controller refuses it: registering is
    /// idempotent, and a controller that restarted (and lost its unit table) is rejoined
    /// within one period. `on_registered` sees every answer (a unit whose controller
    /// restarted without its state drops the earlier epoch's cells). Failures that may pass
    /// (controller down) are logged and retried; a refusal (`Conflict`: another process took
    /// the id after this one stopped registering for too long) is returned, since this unit
    /// no longer holds its id and must stop serving. Run it beside the unit's server.
    pub async fn keep_registered(
        &self,
        mut info: UnitInfo,
        every: Duration,
        on_registered: impl Fn(Registration),
    ) -> Error {
        let mut was_ok = true;
        loop {
            tokio::time::sleep(every).await;
            match self.register_unit(info.clone()).await {
                Ok(r) => {
                    if !was_ok {
                        tracing::info!(unit = %info.id, controller = %self.endpoint, "registered with the controller again");
                        was_ok = true;
                    }
                    info.registration = r.registration;
                    on_registered(r);
                }
                Err(e) if e.kind() == &tq_core::ErrorKind::Conflict => return e,
                Err(e) => {
                    if was_ok {
                        tracing::warn!(unit = %info.id, error = %e, "controller unreachable; will register again when it is back");
                    }
                    was_ok = false;
                }
            }
        }
    }

    /// Registers a storage unit (used by `tq storage-unit`); returns the controller's epoch
    /// and the unit's registration. A unit does not send an epoch (it learns it here), so it
    /// can rejoin a controller that restarted.
    pub async fn register_unit(&self, info: UnitInfo) -> Result<Registration> {
        let request = ControlRequest::RegisterUnit(info);
        let reply = self
            .send(0, request, Vec::new(), true, Duration::ZERO)
            .await?;
        match reply.decode()? {
            ControlResponse::Registered {
                epoch,
                registration,
            } => Ok(Registration {
                epoch,
                registration,
            }),
            other => Err(self.unexpected("register_unit", other)),
        }
    }

    /// The topology, asked with no epoch (so it is answered whatever the controller's epoch).
    async fn topology_unchecked(&self) -> Result<Topology> {
        let request = ControlRequest::Topology;
        let reply = self
            .send(0, request, Vec::new(), true, Duration::ZERO)
            .await?;
        match reply.decode()? {
            ControlResponse::Topology(t) => Ok(t),
            other => Err(self.unexpected("topology", other)),
        }
    }

    /// The storage units in routing order. The first answer fixes this stub's epoch; a
    /// later request of a stub whose controller restarted without its state is refused.
    pub async fn topology(&self) -> Result<Topology> {
        match self
            .call(ControlRequest::Topology, true, Duration::ZERO)
            .await?
        {
            ControlResponse::Topology(t) => {
                let _ = self.epoch.compare_exchange(
                    0,
                    t.epoch,
                    std::sync::atomic::Ordering::Relaxed,
                    std::sync::atomic::Ordering::Relaxed,
                );
                Ok(t)
            }
            other => Err(self.unexpected("topology", other)),
        }
    }
}

/// The administrative operations (their data-path twins are generated from the operation
/// table, `ops.rs`): they carry the snapshot as a body frame, so each is written out.
#[async_trait]
impl ControlAdmin for RemoteControlPlane {
    async fn snapshot(&self) -> Result<(Vec<u8>, crate::SnapshotCounts)> {
        let request = ControlRequest::Snapshot;
        let reply = self
            .send(self.epoch(), request, Vec::new(), true, Duration::ZERO)
            .await?;
        match (reply.decode()?, reply.frames.as_slice()) {
            (ControlResponse::Snapshot(counts), [bytes]) => Ok((bytes.to_vec(), counts)),
            (other, _) => Err(self.unexpected("snapshot", other)),
        }
    }

    /// Not retried: a hold taken by a lost attempt would refuse the next one (it expires
    /// after `ttl`).
    async fn snapshot_holding_removals(
        &self,
        ttl: Duration,
    ) -> Result<(Vec<u8>, crate::SnapshotCounts, u64)> {
        let request = ControlRequest::SnapshotHoldingRemovals {
            ttl_ms: ttl.as_millis().try_into().unwrap_or(u64::MAX),
        };
        let reply = self
            .send(self.epoch(), request, Vec::new(), false, Duration::ZERO)
            .await?;
        match (reply.decode()?, reply.frames.as_slice()) {
            (ControlResponse::HeldSnapshot { counts, hold }, [bytes]) => {
                Ok((bytes.to_vec(), counts, hold))
            }
            (other, _) => Err(self.unexpected("snapshot_holding_removals", other)),
        }
    }

    async fn release_removals(&self, hold: u64) -> Result<()> {
        match self
            .call(
                ControlRequest::ReleaseRemovals { hold },
                true,
                Duration::ZERO,
            )
            .await?
        {
            ControlResponse::Done => Ok(()),
            other => Err(self.unexpected("release_removals", other)),
        }
    }

    /// Sent without an epoch: a status is useful whatever state the controller is in.
    async fn status(&self) -> Result<ControllerStatus> {
        let reply = self
            .send(0, ControlRequest::Status, Vec::new(), true, Duration::ZERO)
            .await?;
        match reply.decode()? {
            ControlResponse::Status(status) => Ok(status),
            other => Err(self.unexpected("status", other)),
        }
    }

    /// Not retried: a lost answer leaves it unknown whether the state was replaced (a second
    /// attempt would then be refused as a non-empty controller).
    async fn restore(&self, snapshot: Vec<u8>) -> Result<crate::SnapshotCounts> {
        let frames = vec![Bytes::from(snapshot)];
        let reply = self
            .send(
                self.epoch(),
                ControlRequest::Restore,
                frames,
                false,
                Duration::ZERO,
            )
            .await?;
        match reply.decode()? {
            ControlResponse::Snapshot(counts) => {
                // The controller is in the snapshot's epoch now: so is this stub.
                let t = self.topology_unchecked().await?;
                self.epoch
                    .store(t.epoch, std::sync::atomic::Ordering::Relaxed);
                Ok(counts)
            }
            other => Err(self.unexpected("restore", other)),
        }
    }
}
