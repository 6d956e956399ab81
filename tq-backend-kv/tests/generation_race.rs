//! A stale writer racing the reuse of its index, interleaved deterministically: the stale put
//! reads "no newer generation", then stalls before writing while the sample that reused the
//! index is written in full; then the stale put goes on. The generation key must not move back
//! (the new sample stays readable) and the stale put must fail and leave no cells behind.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic
use async_trait::async_trait;
use bytes::Bytes;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tq_backend_kv::{KvCapabilities, KvOptions, KvStorageManager, KvStore, KvValue, MemoryKvStore};
use tq_core::{Batch, BatchMeta, Column, ErrorKind, Result, SampleId, StorageManager, Tensor};

/// The memory store, holding back the first write of generation-0 cells until released.
struct Gate {
    inner: Arc<MemoryKvStore>,
    reached: Notify,
    release: Notify,
}

#[async_trait]
impl KvStore for Gate {
    fn name(&self) -> &str {
        "gate"
    }
    fn capabilities(&self) -> KvCapabilities {
        self.inner.capabilities()
    }
    async fn mset(&self, items: Vec<(String, KvValue)>, ttl: Option<Duration>) -> Result<()> {
        if items.iter().any(|(k, _)| k.contains("}/0/")) {
            self.reached.notify_one();
            self.release.notified().await;
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

fn rows(base: i64) -> Batch {
    Batch::from_columns([(
        "x",
        Column::Dense(Tensor::from_slice(vec![1, 2], &[base, base + 1]).unwrap()),
    )])
    .unwrap()
}

fn meta(generation: u32, batch: &Batch) -> BatchMeta {
    BatchMeta::new("p", vec![SampleId::new(7, generation)])
        .with_fields(batch.schemas())
        .unwrap()
}

#[tokio::test]
async fn a_stale_put_landing_after_the_reuse_fails_and_leaves_nothing() {
    let memory = Arc::new(MemoryKvStore::new());
    let gate = Arc::new(Gate {
        inner: memory.clone(),
        reached: Notify::new(),
        release: Notify::new(),
    });
    let kv = Arc::new(KvStorageManager::new(gate.clone(), KvOptions::default()).unwrap());
    let (stale, fresh) = (rows(-1), rows(100));
    let stale_put = {
        let kv = kv.clone();
        let (m, b) = (meta(0, &stale), stale.clone());
        tokio::spawn(async move { kv.put(&m, &b).await })
    };
    // The stale put has read the (absent) generation key and is about to write its cells.
    gate.reached.notified().await;
    kv.put(&meta(1, &fresh), &fresh)
        .await
        .expect("the new sample's put");
    gate.release.notify_one();
    let e = stale_put
        .await
        .unwrap()
        .expect_err("the stale put must fail");
    assert_eq!(e.kind(), &ErrorKind::Conflict, "{e}");
    assert!(e.message().contains("reused by generation 1"), "{e}");
    // The new sample reads its own data; the stale generation reads nothing.
    let got = kv
        .get(&meta(1, &fresh))
        .await
        .expect("the new sample is readable");
    assert_eq!(got.column("x"), fresh.column("x"));
    assert!(kv.get(&meta(0, &stale)).await.is_err());
    // Only the new sample's cell and generation key are left.
    assert_eq!(memory.resident_keys(), 2);
}
