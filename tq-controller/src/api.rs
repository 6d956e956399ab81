//! The control-plane interface clients use, embedded or (later) remote, and its message types.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;
use tq_core::{BackendMeta, BatchMeta, FieldMeta, FieldName, LeaseId, Result, SampleId, Tags};

/// How long a fetch waits for enough ready samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Wait {
    /// Answer at once; an empty batch means "not enough ready yet" (polling mode).
    NoWait,
    /// Park the request until enough samples are ready or the duration passes (then `Timeout`).
    /// Waiting never holds up other requests.
    For(Duration),
}

/// What `get_meta` should do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum GetMetaMode {
    /// Samples produced for every requested field and not yet consumed by `task`; the sampler
    /// picks, and the picked samples are marked consumed by `task` before the answer is sent.
    Fetch {
        task: String,
        batch_size: usize,
        wait: Wait,
        /// `None`: at-most-once, the samples are consumed when handed out. `Some(d)`:
        /// acknowledged mode, they are leased for `d` and consumed by [`ControlPlane::ack`];
        /// an unacknowledged lease expires and the samples become ready again.
        lease: Option<Duration>,
    },
    /// Allocates `count` new samples in the partition (created on first use). The request's
    /// `fields` name what the inserter will write, so that a clear of the new samples finds
    /// those cells even if the writer dies before publishing them.
    Insert { count: usize },
    /// Every live sample of the partition, with per-sample production for the requested fields.
    /// Consumption is not touched.
    Force,
}

/// Names one request of one remote client, so that the controller applies it once however
/// often it arrives (a retry after a lost answer gets the first answer; see
/// `Controller::get_meta_once`). The remote stub tags inserts and at-most-once fetches with
/// one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestId {
    /// Drawn at random by the client when it starts.
    pub client: u64,
    /// Grows with each tagged request of the client.
    pub seq: u64,
    /// Every tagged request of the client below this number is finished (answered, or given
    /// up on): the controller may forget their answers.
    pub done_below: u64,
}

/// A `get_meta` request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GetMetaRequest {
    pub partition: String,
    pub fields: Vec<FieldName>,
    pub mode: GetMetaMode,
    /// Name of a sampler registered on the controller; `None` uses the default.
    pub sampler: Option<String>,
    pub dp_rank: Option<u32>,
    pub batch_index: Option<u64>,
    /// Inputs for this call's sampler (the original's per-call `sampling_config` entries, such
    /// as priority scores), opaque to the controller. Only a sampler that says it takes them
    /// ([`crate::Sampler::takes_args`]: one written in Python) gets them; any other refuses
    /// the fetch, so that inputs are never dropped without a word.
    pub sampler_args: Option<Vec<u8>>,
}

impl GetMetaRequest {
    /// A fetch of `batch_size` samples with `fields` for `task`.
    pub fn fetch(
        partition: impl Into<String>,
        fields: &[&str],
        task: impl Into<String>,
        batch_size: usize,
        wait: Wait,
    ) -> Self {
        GetMetaRequest {
            partition: partition.into(),
            fields: fields.iter().map(|s| s.to_string()).collect(),
            mode: GetMetaMode::Fetch {
                task: task.into(),
                batch_size,
                wait,
                lease: None,
            },
            sampler: None,
            dp_rank: None,
            batch_index: None,
            sampler_args: None,
        }
    }

    /// Uses the sampler registered under `name`.
    pub fn with_sampler(mut self, name: impl Into<String>) -> Self {
        self.sampler = Some(name.into());
        self
    }

    /// Acknowledged mode for a fetch: lease the samples for `lease` instead of consuming them.
    pub fn with_lease(mut self, lease: Duration) -> Self {
        if let GetMetaMode::Fetch { lease: l, .. } = &mut self.mode {
            *l = Some(lease);
        }
        self
    }

    /// Inputs for this call's sampler (see [`GetMetaRequest::sampler_args`]).
    pub fn with_sampler_args(mut self, args: Vec<u8>) -> Self {
        self.sampler_args = Some(args);
        self
    }

    /// Data-parallel rank and batch index, for samplers that keep per-rank state.
    pub fn with_rank(mut self, dp_rank: u32, batch_index: u64) -> Self {
        self.dp_rank = Some(dp_rank);
        self.batch_index = Some(batch_index);
        self
    }
}

/// "These cells are now in storage": sent after a successful storage write. Tags travel in the
/// same message, so a consumer never sees a ready sample without its tags.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProductionNotice {
    pub partition: String,
    pub samples: Vec<SampleId>,
    /// Schema of each written field, aligned with `samples`.
    pub schemas: BTreeMap<FieldName, FieldMeta>,
    /// Tags to merge into each sample's tags (aligned with `samples`).
    pub tags: Option<Vec<Tags>>,
    /// Backend metadata to merge per sample (aligned with `samples`).
    pub backend_meta: Option<Vec<BackendMeta>>,
}

/// Result of resolving keys.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KvMeta {
    /// Rows for the found (or created) keys, in request order; its fields are the fields
    /// produced for every one of those rows.
    pub meta: BatchMeta,
    /// The key of each row of `meta`.
    pub keys: Vec<String>,
    /// Requested keys that did not exist: left out of `meta` without `create`, created (and
    /// included in `meta`) with it.
    pub missing: Vec<String>,
    /// From [`ControlPlane::kv_prepare_put`] only: requested keys whose sample is being cleared.
    /// When not empty, nothing was created and `meta` is empty.
    #[serde(default)]
    pub clearing: Vec<String>,
}

/// Per-sample production of some fields.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProductionStatus {
    pub samples: Vec<SampleId>,
    pub fields: Vec<FieldName>,
    /// Row-major: `produced[row * fields.len() + f]`.
    pub produced: Vec<bool>,
}

impl ProductionStatus {
    /// True when there is at least one sample and every cell is produced.
    pub fn all_produced(&self) -> bool {
        !self.samples.is_empty() && self.produced.iter().all(|&p| p)
    }
}

/// Per-sample consumption by one task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsumptionStatus {
    pub samples: Vec<SampleId>,
    pub consumed: Vec<bool>,
    /// Handed out under a lease not yet acknowledged (acknowledged mode).
    pub leased: Vec<bool>,
}

impl ConsumptionStatus {
    /// True when there is at least one sample and all are consumed.
    pub fn all_consumed(&self) -> bool {
        !self.samples.is_empty() && self.consumed.iter().all(|&c| c)
    }
}

/// One partition's keys and tags, in insertion order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeyListing {
    pub partition: String,
    pub entries: Vec<(String, Tags)>,
}

impl KeyListing {
    /// No key listed.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// The control plane as clients see it. The in-process [`crate::Controller`] implements it;
/// a remote stub will implement the same trait, so client code has one path.
#[async_trait]
pub trait ControlPlane: Send + Sync + 'static {
    /// The epoch of the controller's state (see `tq_core::new_epoch`); 0 for a remote stub
    /// that has not asked for the topology yet.
    fn epoch(&self) -> u64;

    /// Metadata for a batch: fetch, insert (allocate) or force mode.
    async fn get_meta(&self, req: GetMetaRequest) -> Result<BatchMeta>;

    /// Marks cells produced. Rejected (`Conflict`, nothing changed) for samples that are being
    /// cleared or not owned by the partition any more.
    ///
    /// Returns the backend meta the notice replaced: per sample, the previous value of each
    /// entry it changed (empty when nothing was replaced, the common case). A backend that
    /// writes overwrites beside the old cells reclaims those ([`tq_core::StorageManager::retire_replaced`]);
    /// only the controller knows them for sure when writers race.
    async fn notify_production(&self, notice: ProductionNotice) -> Result<Vec<BackendMeta>>;

    /// Merges tags into samples without writing data.
    async fn set_tags(&self, partition: &str, samples: &[SampleId], tags: Vec<Tags>) -> Result<()>;

    /// Step 1 of a clear: hides the samples at once and returns their metadata (every produced
    /// field, backend meta) for the storage clear. `None` selects the whole partition. Samples
    /// not owned are ignored, so a retried clear is harmless.
    async fn mark_clearing(
        &self,
        partition: &str,
        samples: Option<&[SampleId]>,
    ) -> Result<BatchMeta>;

    /// Step 3 of a clear, after storage is clear: releases the samples' indexes for reuse. An
    /// empty partition is removed.
    async fn release(&self, partition: &str, samples: &[SampleId]) -> Result<()>;

    /// Step 1 of a field-level clear: the cells read as never written from now on and cannot be
    /// written again until [`ControlPlane::finish_clear_fields`]. Returns the metadata of the
    /// samples that held any of the fields.
    async fn begin_clear_fields(
        &self,
        partition: &str,
        samples: &[SampleId],
        fields: &[FieldName],
    ) -> Result<BatchMeta>;

    /// Step 3 of a field-level clear: the cells may be written again.
    async fn finish_clear_fields(
        &self,
        partition: &str,
        samples: &[SampleId],
        fields: &[FieldName],
    ) -> Result<()>;

    /// Resolves keys to samples; with `create`, unknown keys get new samples (and the partition
    /// is created). Duplicate or empty keys are `Invalid`.
    async fn kv_retrieve_meta(
        &self,
        partition: &str,
        keys: &[String],
        create: bool,
    ) -> Result<KvMeta>;

    /// Keys and tags of one partition, or of every partition.
    async fn kv_list(&self, partition: Option<&str>) -> Result<Vec<KeyListing>>;

    async fn production_status(
        &self,
        partition: &str,
        fields: &[FieldName],
    ) -> Result<ProductionStatus>;

    async fn consumption_status(&self, partition: &str, task: &str) -> Result<ConsumptionStatus>;

    /// Forgets what `task` (or every task) consumed, so samples can be fetched again.
    async fn reset_consumption(&self, partition: &str, task: Option<&str>) -> Result<()>;

    /// Partition names in creation order.
    async fn list_partitions(&self) -> Result<Vec<String>>;

    /// Consumes samples handed out under `lease` (acknowledged mode); returns how many are
    /// consumed under that lease. Idempotent: samples this lease acknowledged before count
    /// again, so a retry whose first answer was lost (a controller restart) gets the same
    /// answer. Samples whose lease expired meanwhile are not consumed (they may be with
    /// another consumer) and do not count.
    async fn ack(
        &self,
        partition: &str,
        task: &str,
        lease: LeaseId,
        samples: &[SampleId],
    ) -> Result<usize>;

    /// Gives back samples a fetch of `task` handed out but its caller never received (a
    /// stream dropped while its fetch was completing): with `lease` (acknowledged mode) the
    /// samples still held under that lease are released at once instead of at its expiry;
    /// without (at-most-once) their consumption is undone, so they are not lost. Returns how
    /// many came back; samples no longer held that way are left alone.
    async fn return_fetched(
        &self,
        partition: &str,
        task: &str,
        lease: Option<LeaseId>,
        samples: &[SampleId],
    ) -> Result<usize>;

    /// Declares that no more samples will be added to `partition` (created if missing): a
    /// fetch of a task that consumed every sample then ends with `Closed` instead of waiting.
    async fn mark_complete(&self, partition: &str) -> Result<()>;

    /// Removes an empty partition (with its completion mark and sampler state). A partition that
    /// still holds samples is `Conflict`; a missing one is fine.
    async fn drop_partition(&self, partition: &str) -> Result<()>;

    /// Makes `fields` of `keys` (created if missing) read the payloads of `public_keys` in the
    /// public partition, without copying. All-or-nothing: everything is validated first.
    /// `Unsupported` when the storage backend cannot resolve links.
    async fn kv_link(&self, req: LinkRequest) -> Result<KvMeta>;

    /// Drops the links of `fields` of `keys` (the cells read as never written); returns how many.
    async fn kv_unlink(
        &self,
        partition: &str,
        keys: &[String],
        fields: &[FieldName],
    ) -> Result<usize>;

    /// Step 1 of `kv_clear_unlinked_public`: marks clearing, in one step, every key of the public
    /// partition starting with `prefix` that was linked at least once and is linked no more.
    /// Public keys never linked yet are protected (a producer may be between put and link).
    async fn mark_unlinked_public(&self, public_partition: &str, prefix: &str) -> Result<KvMeta>;

    /// Before a storage write of `fields` (their dtype and kind; shapes are ignored) to
    /// `samples`: refuses it unless its production notice would be accepted as things stand
    /// (samples owned and not being cleared, no public sample still linked, no written cell
    /// linked or under a field-level clear, dtype and kind compatible), so a refused write
    /// never overwrites a live value. Returns the samples' metadata for the storage call: the
    /// fields every sample holds, tags, and the backend meta of every field each sample holds.
    async fn prepare_write(
        &self,
        partition: &str,
        samples: &[SampleId],
        fields: &BTreeMap<FieldName, FieldMeta>,
    ) -> Result<BatchMeta>;

    /// `kv_retrieve_meta` with `create` for a write of `fields`, checked like
    /// [`ControlPlane::prepare_write`] before any key is created. Keys whose sample is being
    /// cleared (a clear whose storage step has not finished) are returned in
    /// [`KvMeta::clearing`] and then nothing is created: the caller finishes those clears
    /// ([`ControlPlane::kv_mark_clearing`]) and asks again.
    async fn kv_prepare_put(
        &self,
        partition: &str,
        keys: &[String],
        fields: &BTreeMap<FieldName, FieldMeta>,
    ) -> Result<KvMeta>;

    /// Step 1 of a whole-key clear: like [`ControlPlane::mark_clearing`] for the samples of
    /// `keys`, including keys already being cleared (so a clear whose storage step failed is
    /// finished by the next clear). Unknown keys are skipped.
    async fn kv_mark_clearing(&self, partition: &str, keys: &[String]) -> Result<BatchMeta>;

    /// The whole state as a snapshot (see `Controller::snapshot`).
    async fn snapshot(&self) -> Result<(Vec<u8>, crate::SnapshotCounts)>;

    /// The whole state, and from the same instant a hold on every step that removes stored
    /// cells (clears wait to be marked, overwrites to be published) until
    /// [`ControlPlane::release_removals`] or `ttl`: a checkpoint copying payloads out of a
    /// shared store reads the cells the snapshot names while nothing can remove them. Returns
    /// the hold's token. One hold at a time: `Unavailable` while another is in place.
    async fn snapshot_holding_removals(
        &self,
        ttl: std::time::Duration,
    ) -> Result<(Vec<u8>, crate::SnapshotCounts, u64)>;

    /// Lifts the hold `hold` of [`ControlPlane::snapshot_holding_removals`] (an expired or
    /// unknown hold is fine).
    async fn release_removals(&self, hold: u64) -> Result<()>;

    /// Replaces the state with a snapshot's (see `Controller::restore`).
    async fn restore(&self, snapshot: Vec<u8>) -> Result<crate::SnapshotCounts>;

    /// What the controller holds (partitions, progress, leases, index allocation), for
    /// `tq stats` and the state gauges. Not metered; cheap (counts, no per-sample lists).
    async fn status(&self) -> Result<ControllerStatus>;

    /// Per sample: still owned by `partition` at that generation, not being cleared, and
    /// holding every one of `fields`. Tells a read that found cells missing whether the data
    /// was lost (`true`) or cleared meanwhile (`false`), and a refused write which of its
    /// samples are gone (their storage cells are garbage).
    async fn still_hold(
        &self,
        partition: &str,
        samples: &[SampleId],
        fields: &[FieldName],
    ) -> Result<Vec<bool>>;
}

/// A `kv_link` request: `fields` of `keys[i]` in `partition` read `public_keys[i]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkRequest {
    pub partition: String,
    pub keys: Vec<String>,
    /// `__public__` or `__public__/<namespace>`.
    pub public_partition: String,
    pub public_keys: Vec<String>,
    pub fields: Vec<FieldName>,
}

/// A snapshot of the controller's state, for `tq stats` and the `tq_partition_*`,
/// `tq_global_index_*` and `tq_controller_*` gauges.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ControllerStatus {
    /// The epoch of the controller's state. In JSON (and other human-readable formats) a hex
    /// string, as `tq stats` prints it: the number is above 2^53, which JSON readers round.
    #[serde(with = "epoch_text")]
    pub epoch: u64,
    /// Seconds since this controller started.
    pub uptime_seconds: f64,
    /// Partitions in creation order.
    pub partitions: Vec<PartitionStatus>,
    /// Sample indexes handed out and not released.
    pub index_allocated: u64,
    /// Released indexes waiting to be reused.
    pub index_reusable: u64,
    /// Leased samples whose lease expired before they were acknowledged (they are delivered
    /// again), since start. Expiry is noticed by the next fetch of the partition.
    pub leases_expired_total: u64,
    /// Fetches waiting for samples right now.
    pub waiting_fetches: u64,
    /// Open connections to the controller's server (0 embedded).
    pub connections: u64,
    /// The controller process's resident memory, where known.
    pub memory_rss_bytes: Option<u64>,
}

/// One partition in a [`ControllerStatus`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PartitionStatus {
    pub name: String,
    /// Visible samples (allocated, not being cleared).
    pub samples: u64,
    /// Samples that hold every field of the partition.
    pub produced: u64,
    /// Fields with at least one member.
    pub fields: u64,
    /// KV keys.
    pub keys: u64,
    /// Marked complete (no more samples will be added).
    pub complete: bool,
    /// Tasks that fetched from the partition, by name.
    pub tasks: Vec<TaskStatus>,
}

impl PartitionStatus {
    /// Produced samples over visible samples (0 for an empty partition).
    pub fn production_progress(&self) -> f64 {
        ratio(self.produced, self.samples)
    }
}

/// One task of a [`PartitionStatus`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TaskStatus {
    pub name: String,
    /// Visible samples the task consumed for good.
    pub consumed: u64,
    /// Visible samples the task holds under a lease not yet acknowledged.
    pub leased: u64,
    /// Outstanding leased samples, including ones whose expiry has not been noticed yet.
    pub leases: u64,
}

impl TaskStatus {
    /// Consumed samples over the partition's visible samples.
    pub fn consumption_progress(&self, partition: &PartitionStatus) -> f64 {
        ratio(self.consumed, partition.samples)
    }
}

fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// An epoch as 16 hex digits in human-readable formats (JSON), as a number in binary ones
/// (the wire).
mod epoch_text {
    use serde::{de::Error as _, Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(epoch: &u64, s: S) -> std::result::Result<S::Ok, S::Error> {
        if s.is_human_readable() {
            s.serialize_str(&format!("{epoch:016x}"))
        } else {
            s.serialize_u64(*epoch)
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<u64, D::Error> {
        if d.is_human_readable() {
            let text = String::deserialize(d)?;
            u64::from_str_radix(&text, 16)
                .map_err(|e| D::Error::custom(format!("epoch `{text}` is not hex: {e}")))
        } else {
            u64::deserialize(d)
        }
    }
}
