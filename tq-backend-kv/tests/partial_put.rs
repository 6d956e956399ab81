//! A put that fails half-way leaves nothing readable: cells are written before the sample's
//! generation key, so a first write whose cells only partly landed is "not stored", never a
//! sample with some fields. An overwrite that fails half-way leaves the old sample whole: it
//! writes beside the cells the metadata describes, never over them. Injected failures over the
//! memory store, a real redis-server and a real Redis Cluster.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic
mod common;

use async_trait::async_trait;
use bytes::Bytes;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tq_backend_kv::{KvCapabilities, KvOptions, KvStorageManager, KvStore, KvValue, MemoryKvStore};
use tq_core::{
    Batch, BatchMeta, Column, Error, ErrorKind, Result, SampleId, StorageManager, Tensor,
};

/// A store that fails the `n`-th write call (counting from 1) and passes everything else on.
struct FailNthWrite {
    inner: Arc<dyn KvStore>,
    calls: AtomicUsize,
    fail_at: usize,
}

#[async_trait]
impl KvStore for FailNthWrite {
    fn name(&self) -> &str {
        "fail-nth-write"
    }
    fn capabilities(&self) -> KvCapabilities {
        KvCapabilities {
            // A sample and a half per call: the put needs three calls, and one of them
            // leaves a sample with one field written and the other not.
            max_keys_per_call: 3,
            max_concurrent_calls: 1,
            ..self.inner.capabilities()
        }
    }
    async fn mset(&self, items: Vec<(String, KvValue)>, ttl: Option<Duration>) -> Result<()> {
        if self.calls.fetch_add(1, Ordering::SeqCst) + 1 == self.fail_at {
            return Err(Error::unavailable("injected: the store went away mid-put"));
        }
        self.inner.mset(items, ttl).await
    }
    async fn mget(&self, keys: &[String]) -> Result<Vec<Option<Bytes>>> {
        self.inner.mget(keys).await
    }
    async fn delete(&self, keys: &[String]) -> Result<()> {
        self.inner.delete(keys).await
    }
    async fn raise_generations(
        &self,
        items: Vec<(String, u32)>,
        ttl: Option<Duration>,
    ) -> Result<Vec<u32>> {
        self.inner.raise_generations(items, ttl).await
    }
}

fn batch() -> Batch {
    batch_from(0)
}

fn batch_from(base: i64) -> Batch {
    let x: Vec<i64> = (base..base + 8).collect();
    let y: Vec<f32> = (base..base + 8).map(|v| v as f32).collect();
    Batch::from_columns([
        (
            "x",
            Column::Dense(Tensor::from_slice(vec![4, 2], &x).unwrap()),
        ),
        (
            "y",
            Column::Dense(Tensor::from_slice(vec![4, 2], &y).unwrap()),
        ),
    ])
    .unwrap()
}

async fn half_done_put_is_invisible(store: Arc<dyn KvStore>) {
    for fail_at in 1..=3 {
        let namespace = common::unique("partial");
        let failing = Arc::new(FailNthWrite {
            inner: store.clone(),
            calls: AtomicUsize::new(0),
            fail_at,
        });
        let kv = KvStorageManager::new(
            failing,
            KvOptions {
                namespace: namespace.clone(),
                ..KvOptions::default()
            },
        )
        .unwrap();
        let b = batch();
        let samples: Vec<SampleId> = (0..4).map(|i| SampleId::new(i, 0)).collect();
        let meta = BatchMeta::new("p", samples)
            .with_fields(b.schemas())
            .unwrap();
        let e = kv.put(&meta, &b).await.expect_err("the injected failure");
        assert_eq!(e.kind(), &ErrorKind::Unavailable, "{e}");
        // Some cells landed; no sample is readable, whole or in part.
        for r in 0..4 {
            let one = meta.select_samples(&[r]).unwrap();
            for fields in [vec!["x"], vec!["y"], vec!["x", "y"]] {
                let e = kv
                    .get(&one.select_fields(&fields).unwrap())
                    .await
                    .expect_err("a half-written sample must not read");
                assert!(
                    matches!(e.kind(), ErrorKind::NotFound | ErrorKind::DataLost),
                    "fail at call {fail_at}, row {r}, {fields:?}: {e}"
                );
            }
        }
        // Repeating the put (as a client does after a Safe failure) completes it.
        let kv = KvStorageManager::new(
            store.clone(),
            KvOptions {
                namespace,
                ..KvOptions::default()
            },
        )
        .unwrap();
        kv.put(&meta, &b).await.expect("the repeated put");
        let got = kv.get(&meta).await.expect("read after the repeat");
        assert_eq!(got.column("y"), b.column("y"));
        kv.clear(&meta, &tq_core::FieldFilter::All).await.unwrap();
    }
}

/// `meta` as the controller records it after a write that returned `receipt`.
fn recorded(meta: &BatchMeta, receipt: tq_core::PutReceipt) -> BatchMeta {
    let mut out = meta.clone();
    out.add_fields(receipt.schemas, receipt.backend_meta)
        .unwrap();
    out
}

/// Overwrites every sample's `x` and `y`, failing at each write call in turn: every sample
/// still reads whole and old, and (`keys`: how many keys the store holds, where the test can
/// count) the failed write left no key behind. Then a write that succeeds reads new, the old
/// cells stay readable until retired, and retiring them leaves only the new ones.
async fn half_done_overwrite_keeps_the_old_sample(
    store: Arc<dyn KvStore>,
    keys: Option<&dyn Fn() -> usize>,
) {
    let old = batch();
    let new = batch_from(100);
    for fail_at in 1..=3 {
        let options = KvOptions {
            namespace: common::unique("overwrite"),
            clear_expire_after: Duration::from_millis(1),
            ..KvOptions::default()
        };
        let plain = KvStorageManager::new(store.clone(), options.clone()).unwrap();
        let samples: Vec<SampleId> = (0..4).map(|i| SampleId::new(i, 0)).collect();
        let meta = BatchMeta::new("p", samples)
            .with_fields(old.schemas())
            .unwrap();
        let meta = recorded(&meta, plain.put(&meta, &old).await.unwrap());
        let before = keys.map(|k| k());
        let failing = KvStorageManager::new(
            Arc::new(FailNthWrite {
                inner: store.clone(),
                calls: AtomicUsize::new(0),
                fail_at,
            }),
            options,
        )
        .unwrap();
        let e = failing
            .put(&meta, &new)
            .await
            .expect_err("the injected failure");
        assert_eq!(e.kind(), &ErrorKind::Unavailable, "{e}");
        let got = plain.get(&meta).await.expect("the old sample reads");
        assert_eq!(got.column("x"), old.column("x"), "fail at call {fail_at}");
        assert_eq!(got.column("y"), old.column("y"), "fail at call {fail_at}");
        assert_eq!(
            keys.map(|k| k()),
            before,
            "fail at call {fail_at}: the failed overwrite left keys behind"
        );
        // The write succeeds: the new metadata reads new; the old still reads old (a reader
        // that fetched it before the publish) until the old cells are retired.
        let receipt = plain.put(&meta, &new).await.expect("the repeated put");
        let newer = recorded(&meta, receipt.clone());
        let got = plain.get(&newer).await.unwrap();
        assert_eq!(got.column("x"), new.column("x"));
        assert_eq!(got.column("y"), new.column("y"));
        assert_eq!(plain.get(&meta).await.unwrap().column("y"), old.column("y"));
        plain.retire_replaced(&meta).await.unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while plain.get(&meta).await.is_ok() {
            assert!(
                std::time::Instant::now() < deadline,
                "retired cells still read after 10 s"
            );
            tokio::task::yield_now().await;
        }
        let got = plain.get(&newer).await.unwrap();
        assert_eq!(got.column("x"), new.column("x"));
        plain
            .clear(&newer, &tq_core::FieldFilter::All)
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn memory_store() {
    half_done_put_is_invisible(Arc::new(MemoryKvStore::new())).await;
}

#[tokio::test]
async fn memory_store_overwrite() {
    let store = Arc::new(MemoryKvStore::new());
    let count = {
        let store = store.clone();
        move || {
            store.sweep();
            store.resident_keys()
        }
    };
    half_done_overwrite_keeps_the_old_sample(store.clone(), Some(&count)).await;
    assert_eq!(count(), 0, "every key is gone after the clears");
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn redis_single_node() {
    if !common::redis_available("partial_put redis_single_node") {
        return;
    }
    let server = common::RedisServer::start();
    let store = tq_backend_kv::RedisStore::single(&server.url(), Default::default()).unwrap();
    half_done_put_is_invisible(Arc::new(store)).await;
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn redis_cluster() {
    if !common::redis_available("partial_put redis_cluster") {
        return;
    }
    let cluster = common::RedisCluster::start();
    let store = tq_backend_kv::RedisStore::cluster(&cluster.urls(), Default::default()).unwrap();
    half_done_put_is_invisible(Arc::new(store)).await;
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn redis_single_node_overwrite() {
    if !common::redis_available("partial_put redis_single_node_overwrite") {
        return;
    }
    let server = common::RedisServer::start();
    let store = tq_backend_kv::RedisStore::single(&server.url(), Default::default()).unwrap();
    let count = || server.live_keys();
    half_done_overwrite_keeps_the_old_sample(Arc::new(store), Some(&count)).await;
    assert_eq!(count(), 0, "every key is gone after the clears");
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn redis_cluster_overwrite() {
    if !common::redis_available("partial_put redis_cluster_overwrite") {
        return;
    }
    let cluster = common::RedisCluster::start();
    let store = tq_backend_kv::RedisStore::cluster(&cluster.urls(), Default::default()).unwrap();
    half_done_overwrite_keeps_the_old_sample(Arc::new(store), None).await;
}
