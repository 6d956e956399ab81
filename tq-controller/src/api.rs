//! The control-plane interface clients use, embedded or (later) remote, and its message types.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;
use tq_core::{BackendMeta, BatchMeta, FieldMeta, FieldName, SampleId, Tags};

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
        /// acknowledged mode, they are leased for `d` and consumed by [`ControlPlane::ack`](crate::ControlPlane::ack);
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
    /// From [`ControlPlane::kv_prepare_put`](crate::ControlPlane::kv_prepare_put) only: requested keys whose sample is being cleared.
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
