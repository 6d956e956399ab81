//! tq: a streaming sample store for reinforcement-learning post-training.
//!
//! This is the one crate a downstream project depends on. It re-exports the client, the data
//! model, the errors, the samplers and the storage traits; storage backends are cargo features:
//!
//! | feature | what it adds | default |
//! |---|---|---|
//! | `simple` | in-memory storage units in this process (`storage.backend = "simple"`) | yes |
//! | `remote` | [`Client::connect`]: a controller and storage units in other processes | yes |
//! | `server` | `tq::server`: host a deployment (controller, storage units) in this process | no |
//! | `ssd` | `[storage.ssd]`: large cells on local disk (io_uring, pread/pwrite fallback) | no |
//! | `kv` | `storage.backend = "kv"` on the in-memory KV store; the [`storage::KvStore`] trait | no |
//! | `redis` | ... on Redis and Redis Cluster | no |
//! | `redis-tls` | ... on Redis over TLS (`rediss://`) | no |
//! | `object-store` | ... on object_store (local files, in-memory) | no |
//! | `s3` | ... on S3-compatible object storage | no |
//! | `testkit` | [`testkit`]: the conformance kits for backend authors | no |
//! | `metrics` | a Prometheus exporter in this process ([`ClientBuilder::metrics`]) | no |
//!
//! A configuration that names a backend whose feature is off is refused with an error that
//! names the feature. A custom backend is plugged in with [`ClientBuilder::storage`] or, by
//! name, with [`ClientBuilder::backend`] (then `storage.backend = "<name>"` chooses it).
//!
//! ```no_run
//! use tq::{Batch, Client, Column, Config, Tensor};
//!
//! # async fn run() -> tq::Result<()> {
//! let tq = Client::builder().config(Config::default()).build()?; // embedded
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

pub use tq_client::wait;
pub use tq_client::Partition;
pub use tq_client::{
    Backend, BackendFactory, BatchStream, BlockingBatchStream, BlockingClient, BlockingPartition,
    Client, ClientBuilder, Config, ConsumptionStatus, ControllerSection, Delivery, GetMetaMode,
    GetMetaRequest, KeyCacheStats, KeyListing, KvBatchMeta, KvSection, LinkOptions, NetSection,
    NotBuilt, ProductionStatus, SnapshotCounts, SsdSection, StorageSection, StreamConfig,
    StreamItem, StreamProgress, Wait,
};

/// Checkpoints of a whole deployment and dumps of a partition's keys, the two file formats:
/// `use tq::checkpoint::{Checkpoints, Dumps}` and call `client.save_checkpoint(dir)`,
/// `client.load_checkpoint(dir)`, `partition.kv_dump(url, None, &options)`,
/// `partition.kv_load(url)` (or the `Blocking` traits on the blocking handles). Object-store
/// and S3 places come with the features of those names.
pub mod checkpoint {
    pub use tq_checkpoint::*;
}
pub use tq_core::{
    numel, Batch, BatchMeta, Bytes, Column, DType, Element, Error, ErrorKind, FieldKind, FieldMeta,
    FieldName, LeaseId, MergeFn, MergeOp, MergeRegistry, Result, Retry, SampleId, Subject,
    TagValue, Tags, Tensor, Value,
};

/// The control plane: the [`control::ControlPlane`] trait every controller implements (what
/// [`Client::from_parts`] takes) with its administrative half [`control::ControlAdmin`], the
/// in-process [`control::Controller`], and the request and answer types of its methods.
pub mod control {
    pub use tq_controller::{
        is_public, ControlAdmin, ControlPlane, Controller, ControllerConfig, ControllerOp, KvMeta,
        LinkRequest, MeteredPlane, ProductionNotice, RequestId, Resend, PUBLIC_PARTITION,
    };
}

/// Fresh payload buffers that are cheap to fill: huge pages for large ones, a process-wide
/// pool of read buffers (`TQ_BUFFER_POOL_MIB`).
pub mod buffer {
    pub use tq_core::buffer::{
        concatenated, copied, zeroed, BufferPool, PoolBuffer, DEFAULT_POOL_MIB, POOL_MIN_BYTES,
    };
}

/// The global allocator tq's own programs use (feature `mimalloc`): small blocks from
/// mimalloc, payload-sized ones from the system allocator. A program opts in with
/// `#[global_allocator] static A: tq::alloc::SplitAllocator = tq::alloc::SplitAllocator;`.
#[cfg(feature = "mimalloc")]
pub mod alloc {
    pub use tq_core::alloc::{SplitAllocator, LARGE};
}

#[cfg(feature = "server")]
pub mod server;

pub mod telemetry;

/// Samplers: how a fetch picks ready samples. Built-in ones by [`sampler::SamplerSpec`] (the strings
/// configuration uses); custom ones implement [`sampler::Sampler`] and are registered with
/// [`ClientBuilder::sampler`].
pub mod sampler {
    pub use tq_controller::{
        Candidate, GrpoGroupNSampler, RankAwareSampler, Sampled, Sampler, SamplerContext,
        SamplerSpec, SeqlenBalancedSampler, SequentialSampler,
    };
}

/// The traits a storage backend implements, and the built-in backends' building blocks.
///
/// A backend is a [`storage::StorageManager`]; `docs/backends-guide.md` walks through writing one (and
/// a `KvStore` (feature `kv`), which the `kv` feature's adapter turns into a full backend).
pub mod storage {
    /// The attribute the storage traits are implemented with (`#[async_trait]`).
    pub use async_trait::async_trait;
    pub use tq_core::{BackendMeta, Capabilities, FieldFilter, Links, PutReceipt, StorageManager};

    #[cfg(feature = "simple")]
    pub use tq_backend_simple::{SimpleConfig, SimpleStorage};
    #[cfg(feature = "simple")]
    pub use tq_unit::{
        reclaim, MemoryUnit, StorageUnit, UnitConfig, UnitPut, UnitRows, UnitStats, UnitUpdate,
        UnitUpdateReply,
    };

    #[cfg(feature = "ssd")]
    pub use tq_backend_ssd::{SsdConfig, SsdUnit};

    #[cfg(feature = "object-store")]
    pub use tq_backend_kv::ObjectKvStore;
    #[cfg(feature = "kv")]
    pub use tq_backend_kv::{
        KvCapabilities, KvConfig, KvOptions, KvStorageManager, KvStore, KvStoreExt, KvValue,
        MemoryKvStore, Routing,
    };
    #[cfg(feature = "redis")]
    pub use tq_backend_kv::{RedisOptions, RedisStore};
}

/// Conformance kits for backend authors (feature `testkit`): one `pub async fn` per contract,
/// and `run_all`.
#[cfg(feature = "testkit")]
pub mod testkit {
    /// The [`crate::storage::KvStore`] kit (with feature `kv`).
    #[cfg(feature = "kv")]
    pub use tq_backend_kv::testkit as kv;
    /// The [`crate::storage::StorageManager`] kit.
    pub use tq_core::testkit as storage;
}
