//! [`Layered`]: a [`StorageUnit`] wrapped in a [`UnitLayer`] — the one place a unit's calls
//! are forwarded to the unit below. A layer says what it adds around an operation
//! ([`UnitLayer::around`], told which operation from the table in `ops.rs`); it does not
//! repeat the trait. The checkpoint gate and the request meter are layers.

use crate::api::{Fetched, StorageUnit, UnitPut, UnitStats, UnitUpdate, UnitUpdateReply};
use crate::ops::UnitOp;
use async_trait::async_trait;
use bytes::BytesMut;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tq_core::cells::{CaptureInfo, CellPage, FieldCells};
use tq_core::{FieldFilter, FieldName, MergeOp, Result, SampleId, Value};

/// A boxed future of one unit call.
pub type UnitCall<'a, T> = Pin<Box<dyn Future<Output = Result<T>> + Send + 'a>>;

/// What a wrapper adds to the unit below it.
pub trait UnitLayer: Send + Sync + 'static {
    /// Runs `call`, the operation `op` of the unit `unit` naming `rows` samples, with what this
    /// layer adds around it (a wait, a measurement). The default runs it as it is. (`call` is
    /// the unit's own boxed future; what a layer adds is not boxed again.)
    fn around<'a, T: Send + 'a>(
        &'a self,
        unit: &'a str,
        op: UnitOp,
        rows: u64,
        call: UnitCall<'a, T>,
    ) -> impl Future<Output = Result<T>> + Send + 'a {
        let _ = (unit, op, rows);
        call
    }

    /// The checkpoint steps, if this layer answers them itself instead of passing them to the
    /// unit below (the gate does).
    fn checkpoint_steps(&self) -> Option<&dyn CheckpointSteps> {
        None
    }

    /// The unit's stats on their way up (the meter adds the hosting process's memory).
    fn finish_stats(&self, stats: UnitStats) -> UnitStats {
        stats
    }
}

/// The checkpoint operations of [`StorageUnit`], answered by a layer over `unit`.
#[async_trait]
pub trait CheckpointSteps: Send + Sync {
    async fn hold_writes(&self, unit: &dyn StorageUnit, ttl: Duration) -> Result<()>;
    async fn capture_cells(&self, unit: &dyn StorageUnit) -> Result<CaptureInfo>;
    async fn capture_page(
        &self,
        unit: &dyn StorageUnit,
        capture: u64,
        offset: u64,
        max_bytes: u64,
    ) -> Result<CellPage>;
    async fn release_capture(&self, unit: &dyn StorageUnit, capture: Option<u64>) -> Result<()>;
}

/// The unit `inner` with `layer` around each of its operations.
pub struct Layered<L> {
    inner: Arc<dyn StorageUnit>,
    layer: L,
}

impl<L: UnitLayer> Layered<L> {
    pub fn with_layer(inner: Arc<dyn StorageUnit>, layer: L) -> Self {
        Layered { inner, layer }
    }

    /// The layer (for its own inspection methods).
    pub fn layer(&self) -> &L {
        &self.layer
    }

    fn run<'a, T: Send + 'a>(
        &'a self,
        op: UnitOp,
        rows: u64,
        call: UnitCall<'a, T>,
    ) -> impl Future<Output = Result<T>> + Send + 'a {
        self.layer.around(self.inner.id(), op, rows, call)
    }
}

#[async_trait]
impl<L: UnitLayer> StorageUnit for Layered<L> {
    fn id(&self) -> &str {
        self.inner.id()
    }

    async fn put(&self, req: UnitPut) -> Result<()> {
        let rows = req.samples.len() as u64;
        self.run(UnitOp::Put, rows, self.inner.put(req)).await
    }

    async fn get(&self, fields: &[FieldName], samples: &[SampleId]) -> Result<Vec<Vec<Value>>> {
        let rows = samples.len() as u64;
        self.run(UnitOp::Get, rows, self.inner.get(fields, samples))
            .await
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
        let call = self.inner.get_into(fields, samples, buffers);
        self.run(UnitOp::Get, rows, call).await
    }

    async fn update(&self, req: UnitUpdate, merge: &MergeOp) -> Result<UnitUpdateReply> {
        let rows = req.samples.len() as u64;
        self.run(UnitOp::Update, rows, self.inner.update(req, merge))
            .await
    }

    async fn clear(&self, samples: &[SampleId], fields: &FieldFilter) -> Result<()> {
        let rows = samples.len() as u64;
        self.run(UnitOp::Clear, rows, self.inner.clear(samples, fields))
            .await
    }

    async fn stats(&self) -> Result<UnitStats> {
        let stats = self.run(UnitOp::Stats, 0, self.inner.stats()).await?;
        Ok(self.layer.finish_stats(stats))
    }

    async fn all_cells(&self) -> Result<Vec<FieldCells>> {
        self.run(UnitOp::AllCells, 0, self.inner.all_cells()).await
    }

    async fn hold_writes(&self, ttl: Duration) -> Result<()> {
        let call = match self.layer.checkpoint_steps() {
            Some(steps) => steps.hold_writes(&*self.inner, ttl),
            None => self.inner.hold_writes(ttl),
        };
        self.run(UnitOp::Hold, 0, call).await
    }

    async fn capture_cells(&self) -> Result<CaptureInfo> {
        let call = match self.layer.checkpoint_steps() {
            Some(steps) => steps.capture_cells(&*self.inner),
            None => self.inner.capture_cells(),
        };
        self.run(UnitOp::Capture, 0, call).await
    }

    async fn capture_page(&self, capture: u64, offset: u64, max_bytes: u64) -> Result<CellPage> {
        let call = match self.layer.checkpoint_steps() {
            Some(steps) => steps.capture_page(&*self.inner, capture, offset, max_bytes),
            None => self.inner.capture_page(capture, offset, max_bytes),
        };
        self.run(UnitOp::Page, 0, call).await
    }

    async fn release_capture(&self, capture: Option<u64>) -> Result<()> {
        let call = match self.layer.checkpoint_steps() {
            Some(steps) => steps.release_capture(&*self.inner, capture),
            None => self.inner.release_capture(capture),
        };
        self.run(UnitOp::Release, 0, call).await
    }

    async fn enter_epoch(&self, epoch: u64) -> Result<()> {
        self.run(UnitOp::EnterEpoch, 0, self.inner.enter_epoch(epoch))
            .await
    }
}
