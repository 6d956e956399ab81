//! [`MeteredUnit`]: the storage role's request metrics (`tq_storage_request_*{op_type}`) around
//! any [`StorageUnit`], recorded where the unit runs (in a storage-unit server, or in the process
//! of an embedded client), never by a remote caller, so a request is counted once.

use crate::api::{Fetched, StorageUnit, UnitPut, UnitStats, UnitUpdate, UnitUpdateReply};
use async_trait::async_trait;
use bytes::BytesMut;
use std::sync::Arc;
use std::time::Duration;
use tq_core::cells::{CaptureInfo, CellPage, FieldCells};
use tq_core::telemetry::{RequestMeter, UnitStatus};
use tq_core::{FieldFilter, FieldName, MergeOp, Result, SampleId, Value};

/// The storage role's operation types, as the `op_type` label spells them (the original's
/// PUT_DATA, GET_DATA and CLEAR_DATA, plus tq's in-place merge).
const OPS: [&str; 4] = ["PUT_DATA", "GET_DATA", "UPDATE_DATA", "CLEAR_DATA"];
const PUT: usize = 0;
const GET: usize = 1;
const UPDATE: usize = 2;
const CLEAR: usize = 3;

/// A [`StorageUnit`] that records `tq_storage_request_total`, `_duration_seconds`,
/// `_errors_total` and `_samples_total` (rows) for every call it forwards. Stats are not
/// metered.
pub struct MeteredUnit {
    inner: Arc<dyn StorageUnit>,
    meter: RequestMeter,
}

impl MeteredUnit {
    /// Meters `unit` with handles of the recorder installed now.
    pub fn new(unit: Arc<dyn StorageUnit>) -> Self {
        MeteredUnit {
            inner: unit,
            meter: RequestMeter::new("storage", &OPS),
        }
    }

    /// `unit` behind its meter, as a unit again.
    pub fn wrap(unit: Arc<dyn StorageUnit>) -> Arc<dyn StorageUnit> {
        Arc::new(MeteredUnit::new(unit))
    }
}

#[async_trait]
impl StorageUnit for MeteredUnit {
    fn id(&self) -> &str {
        self.inner.id()
    }

    async fn put(&self, req: UnitPut) -> Result<()> {
        let rows = req.samples.len() as u64;
        let work = self.inner.put(req);
        self.meter.measure(PUT, |_| rows, work).await
    }

    async fn get(&self, fields: &[FieldName], samples: &[SampleId]) -> Result<Vec<Vec<Value>>> {
        let rows = samples.len() as u64;
        let work = self.inner.get(fields, samples);
        self.meter.measure(GET, |_| rows, work).await
    }

    fn reads_into_buffers(&self) -> bool {
        self.inner.reads_into_buffers()
    }

    async fn get_into(
        &self,
        fields: &[FieldName],
        samples: &[SampleId],
        buffers: Vec<Vec<Option<BytesMut>>>,
    ) -> Result<Vec<Vec<Fetched>>> {
        let rows = samples.len() as u64;
        let work = self.inner.get_into(fields, samples, buffers);
        self.meter.measure(GET, |_| rows, work).await
    }

    async fn update(&self, req: UnitUpdate, merge: &MergeOp) -> Result<UnitUpdateReply> {
        let rows = req.samples.len() as u64;
        let work = self.inner.update(req, merge);
        self.meter.measure(UPDATE, |_| rows, work).await
    }

    async fn clear(&self, samples: &[SampleId], fields: &FieldFilter) -> Result<()> {
        let rows = samples.len() as u64;
        let work = self.inner.clear(samples, fields);
        self.meter.measure(CLEAR, |_| rows, work).await
    }

    async fn all_cells(&self) -> Result<Vec<FieldCells>> {
        self.inner.all_cells().await
    }

    async fn hold_writes(&self, ttl: Duration) -> Result<()> {
        self.inner.hold_writes(ttl).await
    }

    async fn capture_cells(&self) -> Result<CaptureInfo> {
        self.inner.capture_cells().await
    }

    async fn capture_page(&self, capture: u64, offset: u64, max_bytes: u64) -> Result<CellPage> {
        self.inner.capture_page(capture, offset, max_bytes).await
    }

    async fn release_capture(&self, capture: Option<u64>) -> Result<()> {
        self.inner.release_capture(capture).await
    }

    async fn enter_epoch(&self, epoch: u64) -> Result<()> {
        self.inner.enter_epoch(epoch).await
    }

    /// The unit's stats, with the resident memory of this process (the one hosting the unit).
    async fn stats(&self) -> Result<UnitStats> {
        let mut stats = self.inner.stats().await?;
        stats.memory_rss_bytes = tq_core::telemetry::process_rss_bytes();
        Ok(stats)
    }
}

impl UnitStats {
    /// The backend-neutral part, as `tq stats` and the `tq_storage_*` gauges show it.
    pub fn to_status(&self) -> UnitStatus {
        UnitStatus {
            id: self.unit_id.clone(),
            rows: self.rows as u64,
            cells: self.cells as u64,
            bytes: self.live_bytes,
            capacity: self.capacity.map(|c| c as u64),
            offloaded_bytes: self.offloaded_bytes,
            counters: self.counters.clone(),
            memory_rss_bytes: self.memory_rss_bytes,
            down: None,
        }
    }
}
