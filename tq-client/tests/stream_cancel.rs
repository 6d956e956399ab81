//! A stream dropped while its fetch is completing: the samples that fetch took never reach a
//! consumer, so they must come back at once — not be lost (at-most-once delivery consumed them)
//! and not stay leased until the lease expires (acknowledged delivery). Found by the streaming
//! criterion benchmark, where a new stream of the same task after a dropped one waited for a
//! batch that the dropped stream's fetcher had taken.
//!
//! The storage here holds every read at a gate, so the test knows the fetch has taken its
//! samples and is reading them when it drops the stream.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use async_trait::async_trait;
use futures::StreamExt;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, Semaphore};
use tq_client::{Client, Config, StreamConfig};
use tq_core::{
    Batch, BatchMeta, Capabilities, Column, FieldFilter, MergeOp, PutReceipt, Result,
    StorageManager, Tensor,
};

/// In-memory storage whose reads signal `entered` and then wait for a permit of `open`.
struct GatedReads {
    inner: Arc<dyn StorageManager>,
    entered: Notify,
    open: Semaphore,
}

#[async_trait]
impl StorageManager for GatedReads {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn put(&self, meta: &BatchMeta, batch: &Batch) -> Result<PutReceipt> {
        self.inner.put(meta, batch).await
    }
    async fn get(&self, meta: &BatchMeta) -> Result<Batch> {
        self.entered.notify_one();
        let _pass = self.open.acquire().await.expect("gate");
        self.inner.get(meta).await
    }
    async fn update(&self, meta: &BatchMeta, batch: &Batch, merge: &MergeOp) -> Result<PutReceipt> {
        self.inner.update(meta, batch, merge).await
    }
    async fn clear(&self, meta: &BatchMeta, fields: &FieldFilter) -> Result<()> {
        self.inner.clear(meta, fields).await
    }
}

fn ints(rows: usize) -> Batch {
    let v: Vec<i64> = (0..rows as i64 * 2).collect();
    Batch::from_columns([(
        "x",
        Column::Dense(Tensor::from_slice(vec![rows, 2], &v).unwrap()),
    )])
    .unwrap()
}

async fn a_dropped_streams_samples_come_back(acknowledged: bool) {
    let storage = Arc::new(GatedReads {
        inner: Arc::new(
            tq_backend_simple::SimpleStorage::in_memory(2, Default::default()).unwrap(),
        ),
        entered: Notify::new(),
        open: Semaphore::new(0),
    });
    let tq = Client::builder()
        .config(Config::default())
        .storage(storage.clone())
        .build()
        .unwrap();
    let p = tq.partition("p");
    p.put_new(&ints(4)).await.unwrap();
    let config = || {
        let c = StreamConfig::new("trainer", &["x"], 4).idle_timeout(Duration::from_secs(30));
        // A lease far longer than the test: only a give-back can free the samples in time.
        if acknowledged {
            c.acknowledged(Duration::from_secs(3600))
        } else {
            c
        }
    };
    let stream = p.stream(config()).unwrap();
    // The fetch has taken the four samples and is reading them: drop the stream now.
    storage.entered.notified().await;
    drop(stream);
    storage.open.add_permits(1_000);

    let mut again = p.stream(config()).unwrap();
    let item = again
        .next()
        .await
        .expect("an item")
        .expect("the dropped stream's samples, delivered again");
    assert_eq!(item.meta.len(), 4);
    assert_eq!(item.batch, ints(4));
    if acknowledged {
        assert_eq!(again.ack(&item).await.unwrap(), 4);
    }
    let status = p.consumption_status("trainer").await.unwrap();
    assert!(status.consumed.iter().all(|c| *c), "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_once_samples_of_a_dropped_stream_are_not_lost() {
    a_dropped_streams_samples_come_back(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leased_samples_of_a_dropped_stream_are_released_at_once() {
    a_dropped_streams_samples_come_back(true).await;
}
