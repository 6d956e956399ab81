//! tq-core: the data model, errors and storage traits shared by every tq crate.
//!
//! - [`Tensor`], [`Value`], [`Column`], [`Batch`]: payloads, always `Bytes` underneath so that
//!   slicing rows and moving data between components never copies.
//! - [`FieldMeta`], [`SampleId`], [`BatchMeta`]: what the controller knows and hands out.
//! - [`StorageManager`]: the data-plane trait; [`testkit`] (feature `testkit`) is the conformance
//!   suite every backend runs.
//! - [`Error`] / [`ErrorKind`]: the one public error type.
//!
//! This crate does no I/O ([`buffer`] only advises the kernel how to back large buffers).

#[cfg(feature = "mimalloc")]
pub mod alloc;
pub mod buffer;
pub mod cells;
mod column;
mod dtype;
mod epoch;
mod error;
mod merge;
mod meta;
mod resend;
pub mod routing;
mod schema;
mod storage;
pub mod telemetry;
mod tensor;

#[cfg(feature = "testkit")]
pub mod testkit;

pub use column::{Batch, Column, FieldName};
pub use dtype::{DType, Element};
pub use epoch::{epoch_mismatch, new_epoch};
pub use error::{Error, ErrorKind, Result, Retry, Subject};
pub use merge::{apply_merge, MergeRegistry};
pub use meta::{
    snapshot_layout as meta_snapshot_layout, BackendMeta, BatchMeta, BatchMetaParts, LeaseId,
    Links, SampleId, TagValue, Tags,
};
pub use resend::Resend;
pub use schema::{FieldKind, FieldMeta};
pub use storage::{
    waiting_out_claims, Capabilities, FieldFilter, MergeFn, MergeOp, PutReceipt, StorageManager,
    EPOCH_CLAIMED, EPOCH_CLAIM_LEASE,
};
pub use tensor::{numel, Tensor, Value};

/// Re-exported so downstream crates name the same `Bytes` type.
pub use bytes::Bytes;
