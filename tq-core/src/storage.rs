//! The data-plane trait every storage backend implements, and the merge operations of `update`.

use crate::{BackendMeta, Batch, BatchMeta, FieldMeta, FieldName, Result};
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;

/// What a backend can do beyond put/get/clear. The client checks these before calling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Capabilities {
    /// `update` merges values where they are stored.
    pub update: bool,
    /// `expire` is cheaper than `clear` (deferred reclamation, e.g. a TTL).
    pub native_expire: bool,
    /// The backend resolves shared-payload links.
    pub links: bool,
}

/// Which cells of the selected samples a clear removes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum FieldFilter {
    /// Whole samples: every cell.
    All,
    /// Only these fields' cells; the samples and their other fields stay.
    Only(Vec<FieldName>),
}

impl FieldFilter {
    pub fn includes(&self, field: &str) -> bool {
        match self {
            FieldFilter::All => true,
            FieldFilter::Only(f) => f.iter().any(|x| x == field),
        }
    }
}

/// What storage reports after writing: the schema of every written field (aligned with the batch
/// rows) and, for backends that need it, per-row backend metadata to keep in the controller.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct PutReceipt {
    pub schemas: BTreeMap<FieldName, FieldMeta>,
    pub backend_meta: Option<Vec<BackendMeta>>,
}

/// A merge function: `(stored, incoming) -> result`.
pub type MergeFn =
    Arc<dyn Fn(&crate::Value, &crate::Value) -> Result<crate::Value> + Send + Sync + 'static>;

/// How `update` combines a stored cell with an incoming one.
///
/// Built-ins and named functions work in every deployment; closures only in-process.
#[derive(Clone)]
#[non_exhaustive]
pub enum MergeOp {
    /// Keep the incoming value.
    Replace,
    /// Element-wise sum (same dtype and shape).
    Add,
    /// Element-wise maximum (same dtype and shape).
    Max,
    /// Concatenate tensors along `dim` (other dimensions equal); objects are byte-concatenated.
    Concat { dim: usize },
    /// A merge function registered on the storage side under this name.
    Named(String),
    /// A closure (embedded deployments only).
    Custom(MergeFn),
}

impl std::fmt::Debug for MergeOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MergeOp::Replace => f.write_str("Replace"),
            MergeOp::Add => f.write_str("Add"),
            MergeOp::Max => f.write_str("Max"),
            MergeOp::Concat { dim } => write!(f, "Concat {{ dim: {dim} }}"),
            MergeOp::Named(n) => write!(f, "Named({n:?})"),
            MergeOp::Custom(_) => f.write_str("Custom(..)"),
        }
    }
}

/// How long a controller's claim on an epoch of shared storage lasts without renewal
/// ([`StorageManager::claim_epoch`]): another controller can take over a dead one's epoch this
/// long after it stopped.
pub const EPOCH_CLAIM_LEASE: std::time::Duration = std::time::Duration::from_secs(5);

/// Words in the `Conflict` of a refused epoch claim, for callers that wait for a dead owner's
/// claim to lapse.
pub const EPOCH_CLAIMED: &str = "is owned by another live controller";

/// Runs `attempt` until it is not refused by another owner's epoch claim ([`EPOCH_CLAIMED`]),
/// for at most one [`EPOCH_CLAIM_LEASE`] and a second: a dead owner's claim lapses by then, and
/// a claim still held after it belongs to a live controller, whose refusal is returned. For a
/// controller starting in an epoch and a checkpoint load restoring one.
pub async fn waiting_out_claims<T, F, Fut>(mut attempt: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let deadline =
        tokio::time::Instant::now() + EPOCH_CLAIM_LEASE + std::time::Duration::from_secs(1);
    loop {
        match attempt().await {
            Err(e)
                if e.message().contains(EPOCH_CLAIMED)
                    && tokio::time::Instant::now() < deadline =>
            {
                tracing::info!(error = %e, "epoch claimed; waiting for a dead owner's claim to lapse");
                tokio::time::sleep(std::time::Duration::from_millis(250)).await;
            }
            other => return other,
        }
    }
}

/// The data plane. Implemented by SimpleStorage, the KV adapter and any third-party backend, and
/// checked by [`crate::testkit`] (feature `testkit`).
///
/// Every operation addresses cells by the [`crate::SampleId`]s of `meta`, generation included:
/// a stale generation must never overwrite, read or delete a newer one.
#[async_trait]
pub trait StorageManager: Send + Sync + 'static {
    /// A short name for messages (`"simple"`, `"redis"`).
    fn name(&self) -> &str;

    fn capabilities(&self) -> Capabilities;

    /// Writes every cell of `batch` (rows aligned with `meta`'s samples). All-or-nothing per
    /// storage unit: a failed unit keeps its previous values.
    async fn put(&self, meta: &BatchMeta, batch: &Batch) -> Result<PutReceipt>;

    /// Reads the fields of `meta` for its samples, in sample order. A cell that is not stored is
    /// `NotFound` or `DataLost`, never empty data.
    async fn get(&self, meta: &BatchMeta) -> Result<Batch>;

    /// Merges `batch` into the stored cells where they live. Never retried by callers.
    async fn update(&self, meta: &BatchMeta, batch: &Batch, merge: &MergeOp) -> Result<PutReceipt>;

    /// Removes cells. Idempotent: clearing what is not stored succeeds.
    async fn clear(&self, meta: &BatchMeta, fields: &FieldFilter) -> Result<()>;

    /// Marks cells for deferred reclamation. Backends without a cheaper mechanism clear.
    async fn expire(&self, meta: &BatchMeta, fields: &FieldFilter) -> Result<()> {
        self.clear(meta, fields).await
    }

    /// Reclaims cells the controller no longer describes, for backends that write beside the
    /// cells they replace instead of over them (so that a failed write leaves the old cells
    /// whole; the KV adapter does). `replaced` names the cells through its backend meta: every
    /// entry of it (field → backend meta) is one cell to reclaim; fields without an entry stay.
    ///
    /// The client calls it after a write is published, with the backend meta the controller
    /// answered it replaced, and after a write the controller certainly refused, with the
    /// cells the write put beside the old ones. Failures are logged, not returned to the
    /// writer. Backends that write in place have nothing to do: the default.
    async fn retire_replaced(&self, replaced: &BatchMeta) -> Result<()> {
        let _ = replaced;
        Ok(())
    }

    /// The controller's epoch changed to `epoch` (a checkpoint was loaded into it): storage
    /// that keys its data by epoch (the KV adapter) follows, so it finds the checkpoint's data.
    /// Others have nothing to do: the default.
    fn adopt_epoch(&self, epoch: u64) {
        let _ = epoch;
    }

    /// The copy of this backend's own payloads that a checkpoint takes, for backends that
    /// keep them in units of their own (in memory, on a local SSD) which die with their
    /// processes. `None` (the default) for storage that outlives the job (a KV store): a
    /// checkpoint then records only the controller state, and the data stays where it is.
    fn payload_checkpoint(&self) -> Option<&dyn crate::cells::PayloadCheckpoint> {
        None
    }

    /// For storage whose payloads stay in a shared store (a KV store): the copy a checkpoint
    /// takes when asked to copy payloads instead of only reattaching to them. `None` (the
    /// default) when the backend cannot copy them.
    fn payload_copy(&self) -> Option<&dyn crate::cells::PayloadCopy> {
        None
    }

    /// Claims controller epoch `epoch` of this storage for the controller `owner` (a number it
    /// keeps for its life, and across restarts on its state dir) for [`EPOCH_CLAIM_LEASE`].
    /// Storage every process shares (a KV store) holds one owner per epoch: two controllers
    /// in one epoch — a checkpoint loaded next to the live controller it came from, a copied
    /// state dir — would hand out the same indexes and generations and overwrite each other's
    /// cells. `Conflict` naming [`EPOCH_CLAIMED`] while another owner's claim is unexpired; a
    /// controller renews its claim well within the lease. Default (storage a controller does
    /// not share, whose units follow one controller's epoch): nothing to claim.
    async fn claim_epoch(&self, epoch: u64, owner: u64) -> Result<()> {
        let _ = (epoch, owner);
        Ok(())
    }

    /// Checks that the storage can serve: every store or unit it writes to answers a cheap
    /// probe (a KV store: a read of a key nobody writes). For `tq health` and `/healthz`; the
    /// error names the part that is down. Bound it with a deadline of your own. Default:
    /// nothing to check.
    async fn check_health(&self) -> Result<()> {
        Ok(())
    }

    /// What each storage unit holds, for `tq stats` and the `tq_storage_*` gauges. Backends
    /// without units of their own (a KV store, which has its own monitoring) report none: the
    /// default.
    async fn status(&self) -> Result<Vec<crate::telemetry::UnitStatus>> {
        Ok(Vec::new())
    }
}
