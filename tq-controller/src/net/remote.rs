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

    async fn send_envelope(
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

    fn unexpected(&self, what: &str, got: ControlResponse) -> Error {
        Error::corrupted(format!(
            "controller {} answered {what} with {got:?}",
            self.endpoint
        ))
    }

    async fn done(&self, what: &str, req: ControlRequest, idempotent: bool) -> Result<()> {
        match self.call(req, idempotent, Duration::ZERO).await? {
            ControlResponse::Done => Ok(()),
            other => Err(self.unexpected(what, other)),
        }
    }

    async fn meta(
        &self,
        what: &str,
        req: ControlRequest,
        idempotent: bool,
        wait: Duration,
    ) -> Result<BatchMeta> {
        match self.call(req, idempotent, wait).await? {
            ControlResponse::Meta(m) => Ok(m),
            other => Err(self.unexpected(what, other)),
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

#[async_trait]
impl ControlPlane for RemoteControlPlane {
    fn epoch(&self) -> u64 {
        RemoteControlPlane::epoch(self)
    }

    async fn get_meta(&self, req: GetMetaRequest) -> Result<BatchMeta> {
        // An at-most-once fetch marks samples consumed and an insert allocates: replaying either
        // after a lost answer would lose or leak samples, so they carry a request id, and the
        // controller answers a replay with the first answer. A fetch in acknowledged mode may be
        // replayed as it is: what a lost answer leased comes back when its lease expires, so
        // nothing is lost or consumed twice (the replay hands out other samples).
        let (idempotent, wait) = match &req.mode {
            GetMetaMode::Fetch { wait, lease, .. } => (
                lease.is_some(),
                match wait {
                    Wait::For(d) => *d,
                    _ => Duration::ZERO,
                },
            ),
            GetMetaMode::Insert { .. } => (false, Duration::ZERO),
            GetMetaMode::Force => (true, Duration::ZERO),
        };
        if idempotent {
            return self
                .meta("get_meta", ControlRequest::GetMeta(req), true, wait)
                .await;
        }
        match self.send_tagged(ControlRequest::GetMeta(req), wait).await? {
            ControlResponse::Meta(m) => Ok(m),
            other => Err(self.unexpected("get_meta", other)),
        }
    }

    /// Tagged: a notice whose answer was lost may find its samples consumed and cleared by
    /// the time it comes again (and be refused as stale); with an id it gets its first answer.
    async fn notify_production(&self, notice: ProductionNotice) -> Result<Vec<BackendMeta>> {
        match self
            .send_tagged(ControlRequest::Notify(notice), Duration::ZERO)
            .await?
        {
            ControlResponse::Replaced(r) => Ok(r),
            other => Err(self.unexpected("notify_production", other)),
        }
    }

    async fn set_tags(&self, partition: &str, samples: &[SampleId], tags: Vec<Tags>) -> Result<()> {
        let req = ControlRequest::SetTags {
            partition: partition.into(),
            samples: samples.to_vec(),
            tags,
        };
        self.done("set_tags", req, true).await
    }

    async fn mark_clearing(
        &self,
        partition: &str,
        samples: Option<&[SampleId]>,
    ) -> Result<BatchMeta> {
        let req = ControlRequest::MarkClearing {
            partition: partition.into(),
            samples: samples.map(<[SampleId]>::to_vec),
        };
        self.meta("mark_clearing", req, true, Duration::ZERO).await
    }

    async fn release(&self, partition: &str, samples: &[SampleId]) -> Result<()> {
        let req = ControlRequest::Release {
            partition: partition.into(),
            samples: samples.to_vec(),
        };
        self.done("release", req, true).await
    }

    async fn begin_clear_fields(
        &self,
        partition: &str,
        samples: &[SampleId],
        fields: &[FieldName],
    ) -> Result<BatchMeta> {
        let req = ControlRequest::BeginClearFields {
            partition: partition.into(),
            samples: samples.to_vec(),
            fields: fields.to_vec(),
        };
        self.meta("begin_clear_fields", req, true, Duration::ZERO)
            .await
    }

    async fn finish_clear_fields(
        &self,
        partition: &str,
        samples: &[SampleId],
        fields: &[FieldName],
    ) -> Result<()> {
        let req = ControlRequest::FinishClearFields {
            partition: partition.into(),
            samples: samples.to_vec(),
            fields: fields.to_vec(),
        };
        self.done("finish_clear_fields", req, true).await
    }

    async fn kv_retrieve_meta(
        &self,
        partition: &str,
        keys: &[String],
        create: bool,
    ) -> Result<KvMeta> {
        let req = ControlRequest::KvRetrieveMeta {
            partition: partition.into(),
            keys: keys.to_vec(),
            create,
        };
        // Retrying resolves the same keys to the same samples (created ones included).
        match self.call(req, true, Duration::ZERO).await? {
            ControlResponse::KvMeta(m) => Ok(m),
            other => Err(self.unexpected("kv_retrieve_meta", other)),
        }
    }

    async fn kv_list(&self, partition: Option<&str>) -> Result<Vec<KeyListing>> {
        let req = ControlRequest::KvList {
            partition: partition.map(str::to_string),
        };
        match self.call(req, true, Duration::ZERO).await? {
            ControlResponse::KvList(l) => Ok(l),
            other => Err(self.unexpected("kv_list", other)),
        }
    }

    async fn production_status(
        &self,
        partition: &str,
        fields: &[FieldName],
    ) -> Result<ProductionStatus> {
        let req = ControlRequest::ProductionStatus {
            partition: partition.into(),
            fields: fields.to_vec(),
        };
        match self.call(req, true, Duration::ZERO).await? {
            ControlResponse::Production(p) => Ok(p),
            other => Err(self.unexpected("production_status", other)),
        }
    }

    async fn consumption_status(&self, partition: &str, task: &str) -> Result<ConsumptionStatus> {
        let req = ControlRequest::ConsumptionStatus {
            partition: partition.into(),
            task: task.into(),
        };
        match self.call(req, true, Duration::ZERO).await? {
            ControlResponse::Consumption(c) => Ok(c),
            other => Err(self.unexpected("consumption_status", other)),
        }
    }

    async fn reset_consumption(&self, partition: &str, task: Option<&str>) -> Result<()> {
        let req = ControlRequest::ResetConsumption {
            partition: partition.into(),
            task: task.map(str::to_string),
        };
        self.done("reset_consumption", req, true).await
    }

    async fn list_partitions(&self) -> Result<Vec<String>> {
        match self
            .call(ControlRequest::ListPartitions, true, Duration::ZERO)
            .await?
        {
            ControlResponse::Partitions(p) => Ok(p),
            other => Err(self.unexpected("list_partitions", other)),
        }
    }

    /// Idempotent: acknowledging again with the same lease consumes nothing more and answers
    /// the same count (the controller remembers which lease acknowledged each sample).
    async fn ack(
        &self,
        partition: &str,
        task: &str,
        lease: LeaseId,
        samples: &[SampleId],
    ) -> Result<usize> {
        let req = ControlRequest::Ack {
            partition: partition.into(),
            task: task.into(),
            lease,
            samples: samples.to_vec(),
        };
        match self.call(req, true, Duration::ZERO).await? {
            ControlResponse::Acked(n) => Ok(n),
            other => Err(self.unexpected("ack", other)),
        }
    }

    /// Not retried: undoing an at-most-once consumption twice could hand samples out again
    /// that another consumer took in between.
    async fn return_fetched(
        &self,
        partition: &str,
        task: &str,
        lease: Option<LeaseId>,
        samples: &[SampleId],
    ) -> Result<usize> {
        let req = ControlRequest::ReturnFetched {
            partition: partition.into(),
            task: task.into(),
            lease,
            samples: samples.to_vec(),
        };
        match self.call(req, false, Duration::ZERO).await? {
            ControlResponse::Acked(n) => Ok(n),
            other => Err(self.unexpected("return_fetched", other)),
        }
    }

    async fn mark_complete(&self, partition: &str) -> Result<()> {
        let req = ControlRequest::MarkComplete {
            partition: partition.into(),
        };
        self.done("mark_complete", req, true).await
    }

    async fn drop_partition(&self, partition: &str) -> Result<()> {
        let req = ControlRequest::DropPartition {
            partition: partition.into(),
        };
        self.done("drop_partition", req, true).await
    }

    /// Idempotent: linking the same cells to the same sources again changes nothing.
    async fn kv_link(&self, req: LinkRequest) -> Result<KvMeta> {
        match self
            .call(ControlRequest::KvLink(req), true, Duration::ZERO)
            .await?
        {
            ControlResponse::KvMeta(m) => Ok(m),
            other => Err(self.unexpected("kv_link", other)),
        }
    }

    async fn kv_unlink(
        &self,
        partition: &str,
        keys: &[String],
        fields: &[FieldName],
    ) -> Result<usize> {
        let req = ControlRequest::KvUnlink {
            partition: partition.into(),
            keys: keys.to_vec(),
            fields: fields.to_vec(),
        };
        match self.call(req, true, Duration::ZERO).await? {
            ControlResponse::Acked(n) => Ok(n),
            other => Err(self.unexpected("kv_unlink", other)),
        }
    }

    async fn mark_unlinked_public(&self, public_partition: &str, prefix: &str) -> Result<KvMeta> {
        let req = ControlRequest::MarkUnlinkedPublic {
            partition: public_partition.into(),
            prefix: prefix.into(),
        };
        match self.call(req, true, Duration::ZERO).await? {
            ControlResponse::KvMeta(m) => Ok(m),
            other => Err(self.unexpected("mark_unlinked_public", other)),
        }
    }

    async fn prepare_write(
        &self,
        partition: &str,
        samples: &[SampleId],
        fields: &BTreeMap<FieldName, FieldMeta>,
    ) -> Result<BatchMeta> {
        let req = ControlRequest::PrepareWrite {
            partition: partition.into(),
            samples: samples.to_vec(),
            fields: fields.clone(),
        };
        self.meta("prepare_write", req, true, Duration::ZERO).await
    }

    async fn kv_prepare_put(
        &self,
        partition: &str,
        keys: &[String],
        fields: &BTreeMap<FieldName, FieldMeta>,
    ) -> Result<KvMeta> {
        let req = ControlRequest::KvPreparePut {
            partition: partition.into(),
            keys: keys.to_vec(),
            fields: fields.clone(),
        };
        // Retrying resolves the same keys to the same samples (created ones included).
        match self.call(req, true, Duration::ZERO).await? {
            ControlResponse::KvMeta(m) => Ok(m),
            other => Err(self.unexpected("kv_prepare_put", other)),
        }
    }

    async fn kv_mark_clearing(&self, partition: &str, keys: &[String]) -> Result<BatchMeta> {
        let req = ControlRequest::KvMarkClearing {
            partition: partition.into(),
            keys: keys.to_vec(),
        };
        self.meta("kv_mark_clearing", req, true, Duration::ZERO)
            .await
    }

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

    async fn still_hold(
        &self,
        partition: &str,
        samples: &[SampleId],
        fields: &[FieldName],
    ) -> Result<Vec<bool>> {
        let req = ControlRequest::StillHold {
            partition: partition.into(),
            samples: samples.to_vec(),
            fields: fields.to_vec(),
        };
        match self.call(req, true, Duration::ZERO).await? {
            ControlResponse::Holds(h) if h.len() == samples.len() => Ok(h),
            other => Err(self.unexpected("still_hold", other)),
        }
    }
}
