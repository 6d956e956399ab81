//! tq-client: the user-facing API of tq.
//!
//! ```no_run
//! use tq_client::{Client, Config};
//! use tq_core::{Batch, Column, Tensor};
//!
//! # async fn run() -> tq_core::Result<()> {
//! let tq = Client::builder().config(Config::default()).build()?;
//! let batch = Batch::from_columns([(
//!     "input_ids",
//!     Column::Dense(Tensor::from_slice(vec![2, 3], &[1i64, 2, 3, 4, 5, 6])?),
//! )])?;
//! let train = tq.partition("train");
//! train.kv_batch_put(&["a", "b"], &batch, None).await?;
//! let back = train.kv_batch_get(&["b", "a"], Some(&["input_ids"])).await?;
//! assert_eq!(back.len(), 2);
//! train.kv_clear(&["a", "b"]).await?;
//! # Ok(()) }
//! ```
//!
//! Two APIs over the same store:
//! - **KV**: samples named by string keys in a partition ([`Partition::kv_put`],
//!   `kv_batch_put`, `kv_batch_get`, `kv_list`, `kv_clear`, `kv_clear_fields`, ...).
//! - **Metadata**: the controller hands out [`tq_core::BatchMeta`]s ([`Partition::fetch`],
//!   [`Client::get_meta`], [`Client::put`], [`Partition::put_new`], [`Client::get_data`],
//!   [`Client::clear_samples`], [`Partition::clear`], status queries).
//!
//! Partition-scoped operations live on a [`Partition`] handle (`tq.partition("train")`), so a
//! partition name is never confused with a key or a task name.
//!
//! [`Client::embedded`] runs everything in this process; [`BlockingClient`] wraps it for
//! callers without an async runtime.

mod backends;
mod blocking;
mod builder;
mod clear;
mod client;
mod config;
mod key_cache;
mod kv;
mod partition;
#[cfg(feature = "remote")]
mod remote;
mod shared;
mod stream;
pub mod telemetry;
pub mod wait;

pub use backends::BackendFactory;
pub use blocking::{BlockingBatchStream, BlockingClient, BlockingPartition};
pub use builder::ClientBuilder;
pub use client::{Client, KvBatchMeta};
pub use config::reference::{
    reference_markdown as configuration_reference, KeyDoc, KEYS as CONFIGURATION_KEYS,
};
pub use config::{
    Backend, Config, ControllerSection, KvSection, NetSection, NotBuilt, SsdSection, StorageSection,
};
pub use key_cache::KeyCacheStats;
pub use partition::Partition;
#[cfg(feature = "remote")]
pub use remote::pool_config;
pub use shared::LinkOptions;
pub use stream::{BatchStream, Delivery, StreamConfig, StreamItem, StreamProgress};
pub use telemetry::DeploymentStatus;
#[cfg(feature = "metrics")]
pub use telemetry::MetricsExporter;
pub use tq_controller::{
    ConsumptionStatus, GetMetaMode, GetMetaRequest, KeyListing, ProductionStatus, SnapshotCounts,
    Wait,
};
