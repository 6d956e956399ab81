//! The [`StorageUnit`] interface and the plain data its requests and replies carry.

use async_trait::async_trait;
use bytes::BytesMut;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;
use tq_core::cells::{CaptureInfo, CellPage, FieldCells};
use tq_core::{
    DType, Error, FieldFilter, FieldName, MergeOp, MergeRegistry, Result, SampleId, Tensor, Value,
};

/// The live fraction below which a shared allocation is compacted, unless configured otherwise.
pub const DEFAULT_COMPACTION_THRESHOLD: f64 = 0.5;

/// The rows of one field in a unit request.
#[derive(Debug, Clone, PartialEq)]
pub struct UnitRows {
    /// One value per sample of the request, in request order.
    pub values: Vec<Value>,
    /// True when every value is a slice of one allocation (the rows of a dense column, or one
    /// received frame). The unit then tracks the values as one block so that it can decide when
    /// to copy survivors out and let the allocation go (see the crate docs). False when each
    /// value owns its own buffer.
    pub shared_allocation: bool,
}

impl UnitRows {
    /// Rows that are slices of one allocation.
    pub fn shared(values: Vec<Value>) -> Self {
        UnitRows {
            values,
            shared_allocation: true,
        }
    }

    /// Rows that each own their buffer.
    pub fn separate(values: Vec<Value>) -> Self {
        UnitRows {
            values,
            shared_allocation: false,
        }
    }
}

/// A write of some fields of some samples to one unit.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct UnitPut {
    /// The samples written, index and generation. Indexes must be distinct.
    pub samples: Vec<SampleId>,
    /// Per field, one row per sample.
    pub fields: BTreeMap<FieldName, UnitRows>,
}

/// A merge of incoming rows into stored cells of one unit.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct UnitUpdate {
    /// The samples updated, index and generation. Indexes must be distinct.
    pub samples: Vec<SampleId>,
    /// Per field, one incoming row per sample.
    pub fields: BTreeMap<FieldName, UnitRows>,
}

/// What a stored cell looks like, reported after an update so that the caller can describe the
/// merged field without reading it back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CellShape {
    Tensor { dtype: DType, shape: Vec<usize> },
    Object,
}

impl CellShape {
    /// The shape of `value`.
    pub fn of(value: &Value) -> Self {
        match value {
            Value::Tensor(t) => CellShape::Tensor {
                dtype: t.dtype(),
                shape: t.shape().to_vec(),
            },
            Value::Object(_) => CellShape::Object,
        }
    }
}

/// The answer to a [`UnitUpdate`]: per field, the shape of every stored result in request order.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct UnitUpdateReply {
    pub fields: BTreeMap<FieldName, Vec<CellShape>>,
}

/// Counters of one unit. Byte counts are payload bytes (tensor data and object bytes); map and
/// bookkeeping overhead is not included.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct UnitStats {
    pub unit_id: String,
    /// Distinct sample indexes holding at least one cell (what capacity counts).
    pub rows: usize,
    /// Stored cells (sample, field).
    pub cells: usize,
    /// Payload bytes of all stored cells, in memory or on disk.
    pub live_bytes: u64,
    /// Shared allocations currently tracked (not yet compacted or emptied).
    pub shared_blocks: usize,
    /// Bytes those shared allocations keep alive, including rows no cell refers to anymore.
    pub shared_retained_bytes: u64,
    /// Payload bytes of stored cells that are slices of a tracked shared allocation.
    pub shared_live_bytes: u64,
    /// Compactions run so far.
    pub compactions: u64,
    /// Bytes copied by those compactions.
    pub compacted_bytes: u64,
    /// Capacity in samples (distinct indexes), if limited.
    pub capacity: Option<usize>,
    /// Cells an offloading unit keeps outside memory (the SSD unit: on disk); 0 for in-memory
    /// units.
    #[serde(default)]
    pub offloaded_cells: usize,
    /// Payload bytes of those cells (logical bytes, not file-system usage). Included in
    /// `live_bytes`.
    #[serde(default)]
    pub offloaded_bytes: u64,
    /// Figures particular to one kind of unit, by metric name (the SSD unit reports
    /// `ssd_fallback_values_total` here, a memory unit the bytes its clears freed, see
    /// [`crate::reclaim`]). The generic fields above mean the same for every
    /// unit; these let a unit report more without this type knowing about it.
    #[serde(default)]
    pub counters: BTreeMap<String, u64>,
    /// Resident memory of the process the unit runs in, where known (filled in by the
    /// process that hosts the unit, see `MeteredUnit`).
    #[serde(default)]
    pub memory_rss_bytes: Option<u64>,
}

impl UnitStats {
    /// The payload memory the unit keeps alive: cells that own their buffers plus every shared
    /// allocation in full. Equals `live_bytes - offloaded_bytes` when nothing is retained for dead
    /// rows.
    pub fn retained_bytes(&self) -> u64 {
        self.live_bytes - self.offloaded_bytes - self.shared_live_bytes + self.shared_retained_bytes
    }
}

/// One cell of a [`StorageUnit::get_into`].
#[derive(Debug)]
pub enum Fetched {
    /// The cell, as `get` returns it.
    Value(Value),
    /// A tensor cell whose bytes were written into the buffer the caller offered for it.
    Placed {
        dtype: DType,
        shape: Vec<usize>,
        bytes: BytesMut,
    },
}

impl Fetched {
    /// The cell as a value (a placed buffer becomes the tensor's storage, no copy).
    pub fn into_value(self) -> Result<Value> {
        match self {
            Fetched::Value(v) => Ok(v),
            Fetched::Placed {
                dtype,
                shape,
                bytes,
            } => Ok(Value::Tensor(Tensor::new(dtype, shape, bytes.freeze())?)),
        }
    }
}

/// The one interface through which a manager (the in-memory backend's `SimpleStorage`) talks
/// to a storage unit, in process ([`crate::MemoryUnit`], the SSD unit) or over the network (a
/// remote stub).
///
/// Requests and replies are plain data so that a stub can serialize them. Contract for every
/// implementation:
/// - every request is all-or-nothing: an error means the unit changed nothing;
/// - generations are honoured: a stale generation never overwrites, reads or deletes a newer one;
/// - error messages name the unit (its [`StorageUnit::id`]), and the field and sample involved.
#[async_trait]
pub trait StorageUnit: Send + Sync + 'static {
    /// A stable name for messages and stats.
    fn id(&self) -> &str;

    /// Stores the rows. A newer generation of an index replaces every cell of the older one;
    /// an older generation than the stored one is `Conflict`; exceeding the capacity is
    /// `CapacityExceeded`.
    async fn put(&self, req: UnitPut) -> Result<()>;

    /// Reads `fields` of `samples`: one vector per field, rows in request order (duplicates
    /// allowed). Every cell must be stored with exactly the requested generation, else
    /// `NotFound`; there are no partial results.
    async fn get(&self, fields: &[FieldName], samples: &[SampleId]) -> Result<Vec<Vec<Value>>>;

    /// Whether [`StorageUnit::get_into`] can put cells straight into caller buffers. A remote
    /// unit can (the bytes come off the socket anyway, so landing them in their final place
    /// saves the copy that assembling a column would make); an in-process unit cannot, since
    /// its cells already exist and writing them into buffers would itself be that copy.
    fn reads_into_buffers(&self) -> bool {
        false
    }

    /// [`StorageUnit::get`], offering `buffers[f][r]` as the destination of cell (field `f`,
    /// row `r`). A unit that [reads into buffers](StorageUnit::reads_into_buffers) fills the
    /// ones that exactly fit their cell and returns them as [`Fetched::Placed`]; every other
    /// cell comes back as a [`Fetched::Value`]. Same contract as `get` otherwise.
    async fn get_into(
        &self,
        fields: &[FieldName],
        samples: &[SampleId],
        buffers: Vec<Vec<Option<BytesMut>>>,
    ) -> Result<Vec<Vec<Fetched>>> {
        drop(buffers);
        let columns = self.get(fields, samples).await?;
        Ok(columns
            .into_iter()
            .map(|c| c.into_iter().map(Fetched::Value).collect())
            .collect())
    }

    /// Merges the incoming rows into the stored cells (`merge(stored, incoming)`), replacing
    /// them with the results. Every cell must exist with the requested generation.
    async fn update(&self, req: UnitUpdate, merge: &MergeOp) -> Result<UnitUpdateReply>;

    /// Removes the cells selected by `fields` of the samples whose stored generation is at most
    /// the requested one. Idempotent; unknown samples and fields are ignored.
    async fn clear(&self, samples: &[SampleId], fields: &FieldFilter) -> Result<()>;

    /// The unit's counters.
    async fn stats(&self) -> Result<UnitStats>;

    /// Every cell, in (field, sample index) order, for a checkpoint's capture. In-memory cells
    /// are reference-counted, so this need not copy payloads. Units that cannot list their
    /// cells answer `Unsupported` (the default).
    async fn all_cells(&self) -> Result<Vec<FieldCells>> {
        Err(Error::unsupported(
            "copying cells into a checkpoint",
            self.id(),
        ))
    }

    /// Checkpoint step 1 (see [`tq_core::cells`]): new puts and clears wait until the capture,
    /// or for `ttl`. Answered by a [`crate::GatedUnit`] and forwarded to one by wrappers and
    /// remote stubs; `Unsupported` elsewhere (the default).
    async fn hold_writes(&self, ttl: Duration) -> Result<()> {
        let _ = ttl;
        Err(not_gated(self.id()))
    }

    /// Checkpoint step 2: captures every cell and lifts the hold.
    async fn capture_cells(&self) -> Result<CaptureInfo> {
        Err(not_gated(self.id()))
    }

    /// Checkpoint step 3: cells of capture `capture` from cell `offset` on, about `max_bytes`.
    async fn capture_page(&self, capture: u64, offset: u64, max_bytes: u64) -> Result<CellPage> {
        let _ = (capture, offset, max_bytes);
        Err(not_gated(self.id()))
    }

    /// Forgets capture `capture` (`None`: lifts a hold not followed by a capture).
    async fn release_capture(&self, capture: Option<u64>) -> Result<()> {
        let _ = capture;
        Err(not_gated(self.id()))
    }

    /// The controller moved to `epoch` (a checkpoint was loaded into it). A unit in another
    /// process follows, so that it accepts the checkpoint's cells and requests of that epoch;
    /// in-process units do not check epochs: nothing to do (the default).
    async fn enter_epoch(&self, epoch: u64) -> Result<()> {
        let _ = epoch;
        Ok(())
    }
}

fn not_gated(unit: &str) -> Error {
    Error::unsupported(
        "checkpoint holds and captures (the unit is not wrapped in a GatedUnit)",
        unit,
    )
}

/// Configuration of a [`crate::MemoryUnit`].
#[derive(Debug, Clone)]
pub struct UnitConfig {
    /// Maximum number of distinct sample indexes held; `None` is unlimited.
    pub capacity: Option<usize>,
    /// Live fraction (0..=1) of a shared allocation below which its survivors are copied out.
    /// 0 never compacts; 1 compacts as soon as any row of the allocation goes away.
    pub compaction_threshold: f64,
    /// Functions available to [`MergeOp::Named`].
    pub merge_registry: MergeRegistry,
}

impl Default for UnitConfig {
    fn default() -> Self {
        UnitConfig {
            capacity: None,
            compaction_threshold: DEFAULT_COMPACTION_THRESHOLD,
            merge_registry: MergeRegistry::default(),
        }
    }
}

/// Checks a compaction threshold: a fraction in `0..=1`.
pub fn check_threshold(threshold: f64) -> Result<()> {
    if !(0.0..=1.0).contains(&threshold) {
        return Err(Error::invalid(format!(
            "compaction threshold must be a fraction between 0 and 1, got {threshold}"
        )));
    }
    Ok(())
}
