//! A whole-sample clear deletes the cells and releases the indexes at once. When the delete
//! fails and the release went through, the key is free at once (a new put works and reads
//! its own data), the error says the cells are deleted in the background, and the retry of
//! unfinished clears removes the leftover cells; a delete that keeps failing never touches
//! the index's next sample.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and examples may panic

use async_trait::async_trait;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tq_backend_simple::SimpleStorage;
use tq_client::{Client, Config};
use tq_core::{
    Batch, BatchMeta, Capabilities, Column, Error, FieldFilter, MergeOp, PutReceipt, Result,
    StorageManager, Tensor,
};

/// SimpleStorage whose clears fail while `failing` is set.
struct FlakyClears {
    inner: Arc<SimpleStorage>,
    failing: AtomicBool,
}

#[async_trait]
impl StorageManager for FlakyClears {
    fn name(&self) -> &str {
        "flaky-clears"
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn put(&self, meta: &BatchMeta, batch: &Batch) -> Result<PutReceipt> {
        self.inner.put(meta, batch).await
    }
    async fn get(&self, meta: &BatchMeta) -> Result<Batch> {
        self.inner.get(meta).await
    }
    async fn update(&self, meta: &BatchMeta, batch: &Batch, merge: &MergeOp) -> Result<PutReceipt> {
        self.inner.update(meta, batch, merge).await
    }
    async fn clear(&self, meta: &BatchMeta, fields: &FieldFilter) -> Result<()> {
        if self.failing.load(Ordering::SeqCst) {
            return Err(Error::unavailable("injected: the storage clear failed"));
        }
        self.inner.clear(meta, fields).await
    }
}

fn ints(base: i64) -> Batch {
    Batch::from_columns([(
        "x",
        Column::Dense(Tensor::from_slice(vec![1, 3], &[base, base + 1, base + 2]).unwrap()),
    )])
    .unwrap()
}

async fn stored_cells(storage: &SimpleStorage) -> usize {
    storage.stats().await.unwrap().iter().map(|s| s.cells).sum()
}

#[tokio::test]
async fn a_failed_delete_after_the_release_frees_the_key_and_is_finished_later() {
    let simple = Arc::new(SimpleStorage::in_memory(1, Default::default()).unwrap());
    let flaky = Arc::new(FlakyClears {
        inner: simple.clone(),
        failing: AtomicBool::new(false),
    });
    let tq = Client::builder()
        .config(Config::default())
        .storage(flaky.clone())
        .build()
        .unwrap();
    let p = tq.partition("p");
    p.kv_put("a", &ints(0), None).await.unwrap();
    assert_eq!(stored_cells(&simple).await, 1);

    flaky.failing.store(true, Ordering::SeqCst);
    let e = p.kv_clear(&["a"]).await.unwrap_err();
    assert!(e.message().contains("deleted in the background"), "{e}");
    assert!(e.is_retryable(), "{e}");
    assert!(
        p.kv_list().await.unwrap().entries.is_empty(),
        "the key is gone"
    );
    assert_eq!(tq.unfinished_clears(), 1);
    assert_eq!(stored_cells(&simple).await, 1, "the cell is left over");

    // The key is free at once: a new put (which may reuse the index, with a newer
    // generation) works and reads its own data, and the leftover delete cannot touch it.
    p.kv_put("a", &ints(10), None).await.unwrap();
    assert!(tq.retry_unfinished_clears().await.is_err(), "still failing");
    assert_eq!(p.kv_batch_get(&["a"], None).await.unwrap(), ints(10));

    flaky.failing.store(false, Ordering::SeqCst);
    assert_eq!(tq.retry_unfinished_clears().await.unwrap(), 0);
    assert_eq!(p.kv_batch_get(&["a"], None).await.unwrap(), ints(10));
    p.kv_clear(&["a"]).await.unwrap();
    assert_eq!(stored_cells(&simple).await, 0, "nothing left behind");
}
