//! The `KvStore` kit (`tq_backend_kv::testkit`) against every built-in store: in memory,
//! Redis, Redis Cluster (real servers), object_store on a directory and in memory; and a store
//! that declares a per-call limit of zero, which the batch helpers must survive.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic
mod common;

use async_trait::async_trait;
use bytes::Bytes;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tq_backend_kv::testkit::run_all;
use tq_backend_kv::{KvCapabilities, KvStore, KvValue, MemoryKvStore};
use tq_core::Result;

#[tokio::test]
async fn memory_store() {
    run_all(|| async { Arc::new(MemoryKvStore::new()) as Arc<dyn KvStore> }).await;
}

/// The memory store, declaring `max_keys_per_call: 0` (a public field a store author can get
/// wrong) and counting its calls.
struct ZeroLimit {
    inner: MemoryKvStore,
    calls: Arc<AtomicUsize>,
}

#[async_trait]
impl KvStore for ZeroLimit {
    fn name(&self) -> &str {
        "zero-limit"
    }
    fn capabilities(&self) -> KvCapabilities {
        KvCapabilities {
            max_keys_per_call: 0,
            ..self.inner.capabilities()
        }
    }
    async fn mset(&self, items: Vec<(String, KvValue)>, ttl: Option<Duration>) -> Result<()> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.mset(items, ttl).await
    }
    async fn mget(&self, keys: &[String]) -> Result<Vec<Option<Bytes>>> {
        self.inner.mget(keys).await
    }
    async fn delete(&self, keys: &[String]) -> Result<()> {
        self.inner.delete(keys).await
    }
    async fn expire(&self, keys: &[String], after: Duration) -> Result<()> {
        self.inner.expire(keys, after).await
    }
}

#[tokio::test]
async fn a_store_declaring_a_zero_call_limit() {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    run_all(move || {
        let calls = c.clone();
        async move {
            Arc::new(ZeroLimit {
                inner: MemoryKvStore::new(),
                calls,
            }) as Arc<dyn KvStore>
        }
    })
    .await;
    assert!(calls.load(Ordering::Relaxed) > 0);
}

#[cfg(feature = "object-store")]
#[tokio::test]
async fn object_store_on_a_temp_dir() {
    let dir = common::TempDir::new();
    let root = dir.0.clone();
    run_all(|| {
        let root = root.clone();
        async move { Arc::new(tq_backend_kv::ObjectKvStore::local(root).unwrap()) as Arc<dyn KvStore> }
    })
    .await;
}

#[cfg(feature = "object-store")]
#[tokio::test]
async fn object_store_in_memory() {
    run_all(|| async { Arc::new(tq_backend_kv::ObjectKvStore::in_memory()) as Arc<dyn KvStore> })
        .await;
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn redis_single_node() {
    if !common::redis_available("redis_single_node") {
        return;
    }
    let server = common::RedisServer::start();
    let url = server.url();
    run_all(|| {
        let url = url.clone();
        async move {
            let opts = tq_backend_kv::RedisOptions {
                max_keys_per_call: 7,
                ..Default::default()
            };
            Arc::new(tq_backend_kv::RedisStore::single(&url, opts).unwrap()) as Arc<dyn KvStore>
        }
    })
    .await;
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn redis_cluster() {
    if !common::redis_available("redis_cluster") {
        return;
    }
    let cluster = common::RedisCluster::start();
    let urls = cluster.urls();
    run_all(|| {
        let urls = urls.clone();
        async move {
            Arc::new(tq_backend_kv::RedisStore::cluster(&urls, Default::default()).unwrap())
                as Arc<dyn KvStore>
        }
    })
    .await;
}
