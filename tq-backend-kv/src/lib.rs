//! tq-backend-kv: the generic key-value storage adapter.
//!
//! - [`KvStore`]: the small surface a key-value engine implements (`mset` with an optional TTL,
//!   `mget`, `delete`, `expire`), with declared [`KvCapabilities`]; [`KvStoreExt`] adds batch
//!   splitting and pipelining.
//! - [`KvStorageManager`]: [`tq_core::StorageManager`] over one or more stores, with routing by
//!   field name or value size ([`Routing`]) and the TTL design of upstream PR #156
//!   ([`KvOptions::data_ttl`]).
//! - Stores: [`MemoryKvStore`] (always; real TTL semantics), `RedisStore` (feature `redis`:
//!   single node and Redis Cluster), `ObjectKvStore` (feature `object-store`).
//!
//! The key scheme and value format are in [`codec`]; the design is written up in
//! `docs/backends.md`.
//!
//! # TTL
//!
//! With `data_ttl` set, every write states the TTL (re-arming it) and clear/expire mark keys to
//! disappear after [`KvOptions::clear_expire_after`] instead of deleting them. Both halves are
//! needed: the generation key of a sample (`<ns>/{p/i}/gen`) is rebuilt when the index is
//! reused, and so is a cell key when a field is cleared and written again in the same
//! generation; a deadline left on the old key would silently delete the fresh value. Without a
//! TTL, clear deletes (Redis `UNLINK`).

pub mod codec;
mod config;
mod manager;
mod memory;
mod metered;
#[cfg(feature = "object-store")]
mod objstore;
#[cfg(feature = "redis")]
mod redis_store;
mod store;
#[cfg(feature = "testkit")]
pub mod testkit;

pub use config::{
    redact_url, KvConfig, RedisConfig, RedisDelete, RedisExpire, RoutingConfig, StoreConfig,
};
pub use manager::{KvOptions, KvStorageManager, Routing, DEFAULT_CLEAR_EXPIRE_AFTER};
pub use memory::{MemoryKvStore, DEFAULT_SWEEP_INTERVAL};
#[cfg(feature = "object-store")]
pub use objstore::ObjectKvStore;
#[cfg(feature = "redis")]
pub use redis_store::{
    key_slot, DeleteCommand, ExpireCommand, RedisOptions, RedisStore,
    CLEAR_GENERATIONS_CROSS_SLOT_SCRIPT, CLEAR_GENERATIONS_SCRIPT, EXPIRE_SCRIPT,
    RAISE_GENERATIONS_SCRIPT,
};
pub use store::{KvCapabilities, KvStore, KvStoreExt, KvValue};
