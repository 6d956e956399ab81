//! tq-client: the user-facing API of tq.
//!
//! ```no_run
//! use tq_client::{Client, Config};
//! use tq_core::{Batch, Column, Tensor};
//!
//! # async fn run() -> tq_core::Result<()> {
//! let tq = Client::embedded(Config::default())?;
//! let batch = Batch::from_columns([(
//!     "input_ids",
//!     Column::Dense(Tensor::from_slice(vec![2, 3], &[1i64, 2, 3, 4, 5, 6])?),
//! )])?;
//! tq.kv_batch_put("train", &["a", "b"], Some(&batch), None).await?;
//! let back = tq.kv_batch_get("train", &["b", "a"], Some(&["input_ids"])).await?;
//! assert_eq!(back.len(), 2);
//! tq.kv_clear("train", &["a", "b"], None).await?;
//! # Ok(()) }
//! ```
//!
//! Two APIs over the same store:
//! - **KV**: samples named by string keys in a partition (`kv_put`, `kv_batch_put`,
//!   `kv_batch_get`, `kv_list`, `kv_clear`).
//! - **Metadata**: the controller hands out [`tq_core::BatchMeta`]s (`get_meta`/`fetch`,
//!   `put`/`put_new`, `get_data`, `clear_samples`, `clear_partition`, status queries).
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
mod partition;
#[cfg(feature = "remote")]
mod remote;
mod shared;
mod stream;

pub use backends::BackendFactory;
pub use blocking::{BlockingBatchStream, BlockingClient, BlockingPartition};
pub use builder::ClientBuilder;
pub use client::{Client, KvBatchMeta};
pub use config::{
    Backend, Config, ControllerSection, KvSection, NetSection, NotBuilt, SsdSection, StorageSection,
};
pub use key_cache::KeyCacheStats;
pub use partition::Partition;
#[cfg(feature = "remote")]
pub use remote::pool_config;
pub use shared::LinkOptions;
pub use stream::{BatchStream, Delivery, StreamConfig, StreamItem, StreamProgress};
pub use tq_controller::{
    ConsumptionStatus, GetMetaMode, GetMetaRequest, KeyListing, ProductionStatus, Wait,
};
