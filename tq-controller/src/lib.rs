//! tq-controller: the control plane of tq.
//!
//! It knows, per partition, which samples exist (allocating and reusing indexes with a
//! generation), which cells are produced, what every task has consumed, and the keys and tags
//! of the KV API. It never touches payloads and never depends on a storage backend.
//!
//! Clients use it through the [`ControlPlane`] trait; [`Controller`] is the in-process
//! implementation. The rules that keep data safe (docs/architecture.md, "The rules that keep data
//! safe") are enforced here: production notices for samples being cleared or not owned are
//! rejected, clears go mark → storage clear → release, every request gets an answer and waiting
//! never blocks others.

mod allocator;
mod api;
mod bitmap;
mod checkpoint;
mod controller;
mod metrics;
#[cfg(feature = "net")]
mod net;
mod ops;
mod partition;
mod sampler;
mod state_dir;

pub use api::{
    ConsumptionStatus, ControllerStatus, GetMetaMode, GetMetaRequest, KeyListing, KvMeta,
    LinkRequest, PartitionStatus, ProductionNotice, ProductionStatus, RequestId, TaskStatus, Wait,
};
pub use checkpoint::{SnapshotCounts, SNAPSHOT_FORMAT};
pub use controller::{
    sampler_from_name, snapshot_cells, snapshot_epoch, snapshot_in_epoch, Controller,
    ControllerConfig, StoredCells, ANSWER_MEMORY, MAX_ANSWERS_PER_CLIENT, MAX_INSERT_COUNT,
};
pub use metrics::MeteredPlane;
#[cfg(feature = "net")]
pub use net::{
    ControllerServer, Registration, RemoteControlPlane, Topology, UnitInfo, REGISTRATION_LAPSE,
    UNIT_ID_HELD,
};
pub use ops::{ControlAdmin, ControlPlane, ControllerOp, Resend};
pub use partition::{is_public, PUBLIC_PARTITION};
pub use sampler::{
    Candidate, GrpoGroupNSampler, RankAwareSampler, Sampled, Sampler, SamplerContext, SamplerSpec,
    SeqlenBalancedSampler, SequentialSampler,
};
pub use state_dir::{StateDir, StateDirOptions, COMPACT_MIN_BYTES};
