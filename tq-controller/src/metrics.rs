//! The controller's request metrics (`tq_controller_request_*{op_type}`): [`MeteredPlane`]
//! wraps any [`ControlPlane`] and records every operation under the original system's
//! `op_type` names, so the embedded controller and a controller server are measured the same
//! way. Snapshots, restores and status requests are not metered (as in the original, where
//! checkpoint requests are not).

use crate::api::*;
use async_trait::async_trait;
use std::collections::BTreeMap;
use std::sync::Arc;
use tq_core::telemetry::RequestMeter;
use tq_core::{BatchMeta, FieldMeta, FieldName, LeaseId, Result, SampleId, Tags};

/// The controller's operation types, as the `op_type` label spells them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ControllerOp {
    /// Fetches and inserts.
    GetMeta,
    /// Metadata of every sample of a partition (a forced fetch).
    GetPartitionMeta,
    NotifyDataUpdate,
    SetCustomMeta,
    MarkClearing,
    /// Step 3 of a clear: samples counts the rows released.
    ClearMeta,
    MarkClearingFields,
    ClearFields,
    KvRetrieveMeta,
    KvList,
    GetProduction,
    GetConsumption,
    ResetConsumption,
    GetListPartitions,
    Ack,
    /// Samples a fetch handed out and its caller never received, given back.
    ReturnFetched,
    MarkComplete,
    ClearPartition,
    KvLink,
    KvUnlink,
    MarkUnlinkedPublic,
    PrepareWrite,
    KvPreparePut,
    KvMarkClearing,
    StillHold,
    /// Server-level requests: a unit registering, a client asking for the topology.
    RegisterUnit,
    GetTopology,
    /// Checkpoint snapshot and restore, and status: counted only when refused.
    Checkpoint,
    Status,
    /// A request that could not be decoded.
    Undecodable,
}

impl ControllerOp {
    /// Every operation type, in the order [`ControllerOp::index`] numbers them.
    pub const ALL: [ControllerOp; 30] = [
        ControllerOp::GetMeta,
        ControllerOp::GetPartitionMeta,
        ControllerOp::NotifyDataUpdate,
        ControllerOp::SetCustomMeta,
        ControllerOp::MarkClearing,
        ControllerOp::ClearMeta,
        ControllerOp::MarkClearingFields,
        ControllerOp::ClearFields,
        ControllerOp::KvRetrieveMeta,
        ControllerOp::KvList,
        ControllerOp::GetProduction,
        ControllerOp::GetConsumption,
        ControllerOp::ResetConsumption,
        ControllerOp::GetListPartitions,
        ControllerOp::Ack,
        ControllerOp::ReturnFetched,
        ControllerOp::MarkComplete,
        ControllerOp::ClearPartition,
        ControllerOp::KvLink,
        ControllerOp::KvUnlink,
        ControllerOp::MarkUnlinkedPublic,
        ControllerOp::PrepareWrite,
        ControllerOp::KvPreparePut,
        ControllerOp::KvMarkClearing,
        ControllerOp::StillHold,
        ControllerOp::RegisterUnit,
        ControllerOp::GetTopology,
        ControllerOp::Checkpoint,
        ControllerOp::Status,
        ControllerOp::Undecodable,
    ];

    /// The `op_type` label value.
    pub fn name(self) -> &'static str {
        match self {
            ControllerOp::GetMeta => "GET_META",
            ControllerOp::GetPartitionMeta => "GET_PARTITION_META",
            ControllerOp::NotifyDataUpdate => "NOTIFY_DATA_UPDATE",
            ControllerOp::SetCustomMeta => "SET_CUSTOM_META",
            ControllerOp::MarkClearing => "MARK_CLEARING",
            ControllerOp::ClearMeta => "CLEAR_META",
            ControllerOp::MarkClearingFields => "MARK_CLEARING_FIELDS",
            ControllerOp::ClearFields => "CLEAR_FIELDS",
            ControllerOp::KvRetrieveMeta => "KV_RETRIEVE_META",
            ControllerOp::KvList => "KV_LIST",
            ControllerOp::GetProduction => "GET_PRODUCTION",
            ControllerOp::GetConsumption => "GET_CONSUMPTION",
            ControllerOp::ResetConsumption => "RESET_CONSUMPTION",
            ControllerOp::GetListPartitions => "GET_LIST_PARTITIONS",
            ControllerOp::Ack => "ACK",
            ControllerOp::ReturnFetched => "RETURN_FETCHED",
            ControllerOp::MarkComplete => "MARK_COMPLETE",
            ControllerOp::ClearPartition => "CLEAR_PARTITION",
            ControllerOp::KvLink => "KV_LINK",
            ControllerOp::KvUnlink => "KV_UNLINK",
            ControllerOp::MarkUnlinkedPublic => "MARK_UNLINKED_PUBLIC",
            ControllerOp::PrepareWrite => "PREPARE_WRITE",
            ControllerOp::KvPreparePut => "KV_PREPARE_PUT",
            ControllerOp::KvMarkClearing => "KV_MARK_CLEARING",
            ControllerOp::StillHold => "STILL_HOLD",
            ControllerOp::RegisterUnit => "REGISTER_UNIT",
            ControllerOp::GetTopology => "GET_TOPOLOGY",
            ControllerOp::Checkpoint => "CHECKPOINT",
            ControllerOp::Status => "STATUS",
            ControllerOp::Undecodable => "UNDECODABLE",
        }
    }

    /// Position in [`ControllerOp::ALL`] (the discriminant: `ALL` lists them in order).
    pub fn index(self) -> usize {
        self as usize
    }

    /// The request meter of the controller role, with every operation type registered.
    pub fn meter() -> RequestMeter {
        let names: Vec<&'static str> = ControllerOp::ALL.iter().map(|op| op.name()).collect();
        RequestMeter::new("controller", &names)
    }
}

/// A [`ControlPlane`] that records `tq_controller_request_*` for every call it forwards.
pub struct MeteredPlane<P: ?Sized> {
    inner: Arc<P>,
    meter: RequestMeter,
}

impl<P: ControlPlane + ?Sized> MeteredPlane<P> {
    /// Meters `inner` with handles of the recorder installed now.
    pub fn new(inner: Arc<P>) -> Self {
        MeteredPlane {
            inner,
            meter: ControllerOp::meter(),
        }
    }

    /// The plane being metered.
    pub fn inner(&self) -> &Arc<P> {
        &self.inner
    }

    /// The meter, for requests refused before they reach the plane.
    pub fn meter(&self) -> &RequestMeter {
        &self.meter
    }
}

impl MeteredPlane<crate::Controller> {
    /// [`crate::Controller::get_meta_once`], metered as a `get_meta`.
    pub async fn get_meta_once(
        &self,
        req: GetMetaRequest,
        id: crate::RequestId,
    ) -> Result<BatchMeta> {
        let op = get_meta_op(&req);
        let work = self.inner.get_meta_once(req, id);
        measure_get_meta(&self.meter, op, work).await
    }
}

impl MeteredPlane<crate::Controller> {
    /// [`crate::Controller::notify_once`], metered as a production notice.
    pub async fn notify_once(
        &self,
        notice: ProductionNotice,
        id: crate::RequestId,
    ) -> Result<Vec<tq_core::BackendMeta>> {
        let rows = notice.samples.len() as u64;
        let op = ControllerOp::NotifyDataUpdate.index();
        let work = self.inner.notify_once(notice, id);
        self.meter.measure(op, |_| rows, work).await
    }
}

fn get_meta_op(req: &GetMetaRequest) -> ControllerOp {
    match req.mode {
        GetMetaMode::Force => ControllerOp::GetPartitionMeta,
        _ => ControllerOp::GetMeta,
    }
}

async fn measure_get_meta(
    meter: &RequestMeter,
    op: ControllerOp,
    work: impl std::future::Future<Output = Result<BatchMeta>>,
) -> Result<BatchMeta> {
    let rows = |m: &BatchMeta| m.len() as u64;
    // `Closed` is the normal end of a stream (the partition is complete and the task has
    // consumed it), not a failed request.
    let failed = |e: &tq_core::Error| e.kind() != &tq_core::ErrorKind::Closed;
    meter.measure_with(op.index(), rows, failed, work).await
}

fn none<T>(_: &T) -> u64 {
    0
}

#[async_trait]
impl<P: ControlPlane + ?Sized> ControlPlane for MeteredPlane<P> {
    fn epoch(&self) -> u64 {
        self.inner.epoch()
    }

    async fn get_meta(&self, req: GetMetaRequest) -> Result<BatchMeta> {
        let op = get_meta_op(&req);
        let work = self.inner.get_meta(req);
        measure_get_meta(&self.meter, op, work).await
    }

    async fn notify_production(
        &self,
        notice: ProductionNotice,
    ) -> Result<Vec<tq_core::BackendMeta>> {
        let rows = notice.samples.len() as u64;
        let op = ControllerOp::NotifyDataUpdate.index();
        let work = self.inner.notify_production(notice);
        self.meter.measure(op, |_| rows, work).await
    }

    async fn set_tags(&self, partition: &str, samples: &[SampleId], tags: Vec<Tags>) -> Result<()> {
        let work = self.inner.set_tags(partition, samples, tags);
        let op = ControllerOp::SetCustomMeta.index();
        self.meter.measure(op, none, work).await
    }

    async fn mark_clearing(
        &self,
        partition: &str,
        samples: Option<&[SampleId]>,
    ) -> Result<BatchMeta> {
        let work = self.inner.mark_clearing(partition, samples);
        let op = ControllerOp::MarkClearing.index();
        self.meter.measure(op, none, work).await
    }

    async fn release(&self, partition: &str, samples: &[SampleId]) -> Result<()> {
        let rows = samples.len() as u64;
        let work = self.inner.release(partition, samples);
        let op = ControllerOp::ClearMeta.index();
        self.meter.measure(op, |_| rows, work).await
    }

    async fn begin_clear_fields(
        &self,
        partition: &str,
        samples: &[SampleId],
        fields: &[FieldName],
    ) -> Result<BatchMeta> {
        let work = self.inner.begin_clear_fields(partition, samples, fields);
        let op = ControllerOp::MarkClearingFields.index();
        self.meter.measure(op, none, work).await
    }

    async fn finish_clear_fields(
        &self,
        partition: &str,
        samples: &[SampleId],
        fields: &[FieldName],
    ) -> Result<()> {
        let rows = samples.len() as u64;
        let work = self.inner.finish_clear_fields(partition, samples, fields);
        let op = ControllerOp::ClearFields.index();
        self.meter.measure(op, |_| rows, work).await
    }

    async fn kv_retrieve_meta(
        &self,
        partition: &str,
        keys: &[String],
        create: bool,
    ) -> Result<KvMeta> {
        let work = self.inner.kv_retrieve_meta(partition, keys, create);
        let op = ControllerOp::KvRetrieveMeta.index();
        self.meter.measure(op, none, work).await
    }

    async fn kv_list(&self, partition: Option<&str>) -> Result<Vec<KeyListing>> {
        let work = self.inner.kv_list(partition);
        self.meter
            .measure(ControllerOp::KvList.index(), none, work)
            .await
    }

    async fn production_status(
        &self,
        partition: &str,
        fields: &[FieldName],
    ) -> Result<ProductionStatus> {
        let work = self.inner.production_status(partition, fields);
        let op = ControllerOp::GetProduction.index();
        self.meter.measure(op, none, work).await
    }

    async fn consumption_status(&self, partition: &str, task: &str) -> Result<ConsumptionStatus> {
        let work = self.inner.consumption_status(partition, task);
        let op = ControllerOp::GetConsumption.index();
        self.meter.measure(op, none, work).await
    }

    async fn reset_consumption(&self, partition: &str, task: Option<&str>) -> Result<()> {
        let work = self.inner.reset_consumption(partition, task);
        let op = ControllerOp::ResetConsumption.index();
        self.meter.measure(op, none, work).await
    }

    async fn list_partitions(&self) -> Result<Vec<String>> {
        let work = self.inner.list_partitions();
        let op = ControllerOp::GetListPartitions.index();
        self.meter.measure(op, none, work).await
    }

    async fn ack(
        &self,
        partition: &str,
        task: &str,
        lease: LeaseId,
        samples: &[SampleId],
    ) -> Result<usize> {
        let work = self.inner.ack(partition, task, lease, samples);
        let acked = |n: &usize| *n as u64;
        self.meter
            .measure(ControllerOp::Ack.index(), acked, work)
            .await
    }

    async fn return_fetched(
        &self,
        partition: &str,
        task: &str,
        lease: Option<LeaseId>,
        samples: &[SampleId],
    ) -> Result<usize> {
        let work = self.inner.return_fetched(partition, task, lease, samples);
        let op = ControllerOp::ReturnFetched.index();
        self.meter.measure(op, |n| *n as u64, work).await
    }

    async fn mark_complete(&self, partition: &str) -> Result<()> {
        let work = self.inner.mark_complete(partition);
        let op = ControllerOp::MarkComplete.index();
        self.meter.measure(op, none, work).await
    }

    async fn drop_partition(&self, partition: &str) -> Result<()> {
        let work = self.inner.drop_partition(partition);
        let op = ControllerOp::ClearPartition.index();
        self.meter.measure(op, none, work).await
    }

    async fn kv_link(&self, req: LinkRequest) -> Result<KvMeta> {
        let rows = req.keys.len() as u64;
        let work = self.inner.kv_link(req);
        let op = ControllerOp::KvLink.index();
        self.meter.measure(op, |_| rows, work).await
    }

    async fn kv_unlink(
        &self,
        partition: &str,
        keys: &[String],
        fields: &[FieldName],
    ) -> Result<usize> {
        let work = self.inner.kv_unlink(partition, keys, fields);
        let op = ControllerOp::KvUnlink.index();
        self.meter.measure(op, |n| *n as u64, work).await
    }

    async fn mark_unlinked_public(&self, public_partition: &str, prefix: &str) -> Result<KvMeta> {
        let work = self.inner.mark_unlinked_public(public_partition, prefix);
        let op = ControllerOp::MarkUnlinkedPublic.index();
        self.meter.measure(op, none, work).await
    }

    async fn prepare_write(
        &self,
        partition: &str,
        samples: &[SampleId],
        fields: &BTreeMap<FieldName, FieldMeta>,
    ) -> Result<BatchMeta> {
        let work = self.inner.prepare_write(partition, samples, fields);
        let op = ControllerOp::PrepareWrite.index();
        self.meter.measure(op, none, work).await
    }

    async fn kv_prepare_put(
        &self,
        partition: &str,
        keys: &[String],
        fields: &BTreeMap<FieldName, FieldMeta>,
    ) -> Result<KvMeta> {
        let work = self.inner.kv_prepare_put(partition, keys, fields);
        let op = ControllerOp::KvPreparePut.index();
        self.meter.measure(op, none, work).await
    }

    async fn kv_mark_clearing(&self, partition: &str, keys: &[String]) -> Result<BatchMeta> {
        let work = self.inner.kv_mark_clearing(partition, keys);
        let op = ControllerOp::KvMarkClearing.index();
        self.meter.measure(op, none, work).await
    }

    async fn snapshot(&self) -> Result<(Vec<u8>, crate::SnapshotCounts)> {
        self.inner.snapshot().await
    }

    async fn restore(&self, snapshot: Vec<u8>) -> Result<crate::SnapshotCounts> {
        self.inner.restore(snapshot).await
    }

    async fn snapshot_holding_removals(
        &self,
        ttl: std::time::Duration,
    ) -> Result<(Vec<u8>, crate::SnapshotCounts, u64)> {
        self.inner.snapshot_holding_removals(ttl).await
    }

    async fn release_removals(&self, hold: u64) -> Result<()> {
        self.inner.release_removals(hold).await
    }

    async fn status(&self) -> Result<ControllerStatus> {
        self.inner.status().await
    }

    async fn still_hold(
        &self,
        partition: &str,
        samples: &[SampleId],
        fields: &[FieldName],
    ) -> Result<Vec<bool>> {
        let work = self.inner.still_hold(partition, samples, fields);
        let op = ControllerOp::StillHold.index();
        self.meter.measure(op, none, work).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_operation_type_has_its_own_index_and_name() {
        let mut names = std::collections::HashSet::new();
        for (i, op) in ControllerOp::ALL.iter().enumerate() {
            assert_eq!(op.index(), i, "{op:?}");
            assert!(names.insert(op.name()), "{op:?}");
        }
    }
}
