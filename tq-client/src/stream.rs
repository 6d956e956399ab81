//! Streaming consumption: `Client::stream` hands a consumer its batches as they become ready,
//! fetching the next ones while the caller works on the current one.
//!
//! Delivery guarantees:
//! - [`Delivery::AtMostOnce`] (upstream's behaviour): samples are consumed when their metadata is
//!   handed out. A consumer that crashes loses what it was given, including prefetched batches.
//! - [`Delivery::Acknowledged`]: samples are leased; [`BatchStream::ack`] consumes them. A lease
//!   that is not acknowledged in time expires and the samples are handed out again (to this or
//!   another consumer): at-least-once. An acknowledgement after expiry consumes nothing.
//!
//! The stream waits on the controller (one long-poll per batch, no busy polling) and ends
//! cleanly when the partition is declared complete ([`crate::Partition::complete`]) and the
//! task has consumed all of it. When nothing arrives for `idle_timeout` it yields one
//! `Timeout` error item and then ends, so a consumer can tell "done" from "gave up waiting".

use crate::Client;
use futures::Stream;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::mpsc;
use tq_controller::{GetMetaRequest, Wait};
use tq_core::{Batch, BatchMeta, Error, ErrorKind, FieldName, Result, Retry};

/// When handed-out samples count as consumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Delivery {
    /// Consumed when handed out (lost if the consumer crashes).
    AtMostOnce,
    /// Leased for `lease`; consumed on [`BatchStream::ack`]; redelivered after the lease expires.
    Acknowledged { lease: Duration },
}

/// What to stream.
#[derive(Debug, Clone)]
pub struct StreamConfig {
    pub task: String,
    pub fields: Vec<FieldName>,
    /// Samples per batch (per rank for rank-aware samplers).
    pub batch_size: usize,
    /// A sampler registered on the controller; `None` uses its default.
    pub sampler: Option<String>,
    /// Data-parallel rank, for samplers that keep per-rank state (rank-aware, seqlen-balanced).
    /// Batch indexes count up from 0 per stream.
    pub dp_rank: Option<u32>,
    pub delivery: Delivery,
    /// Batches fetched ahead while the caller works (at least 1).
    pub prefetch: usize,
    /// The stream stops waiting when no batch arrives for this long (it yields a `Timeout`
    /// error, then ends).
    pub idle_timeout: Duration,
}

impl StreamConfig {
    /// Streams `batch_size` samples of `fields` at a time for `task`: at-most-once, default
    /// sampler, 2 batches of prefetch, 60 s idle timeout. The partition is the one whose
    /// [`crate::Partition::stream`] takes this configuration.
    pub fn new(task: impl Into<String>, fields: &[&str], batch_size: usize) -> Self {
        StreamConfig {
            task: task.into(),
            fields: fields.iter().map(|f| f.to_string()).collect(),
            batch_size,
            sampler: None,
            dp_rank: None,
            delivery: Delivery::AtMostOnce,
            prefetch: 2,
            idle_timeout: Duration::from_secs(60),
        }
    }

    pub fn sampler(mut self, name: impl Into<String>) -> Self {
        self.sampler = Some(name.into());
        self
    }
    pub fn dp_rank(mut self, rank: u32) -> Self {
        self.dp_rank = Some(rank);
        self
    }
    pub fn acknowledged(mut self, lease: Duration) -> Self {
        self.delivery = Delivery::Acknowledged { lease };
        self
    }
    pub fn prefetch(mut self, batches: usize) -> Self {
        self.prefetch = batches;
        self
    }
    pub fn idle_timeout(mut self, timeout: Duration) -> Self {
        self.idle_timeout = timeout;
        self
    }
}

/// One streamed batch.
#[derive(Debug, Clone)]
pub struct StreamItem {
    pub meta: BatchMeta,
    pub batch: Batch,
    /// Position of this batch in the stream (the sampler's batch index).
    pub batch_index: u64,
}

/// How far a stream got.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamProgress {
    pub batches: u64,
    pub samples: u64,
    pub bytes: u64,
}

#[derive(Default)]
struct Counters {
    batches: AtomicU64,
    samples: AtomicU64,
    bytes: AtomicU64,
}

/// A `futures::Stream` of ready batches. Dropping it stops the prefetching.
pub struct BatchStream {
    rx: mpsc::Receiver<Result<StreamItem>>,
    counters: Arc<Counters>,
    fetcher: tokio::task::JoinHandle<()>,
    client: Client,
    partition: String,
    task: String,
}

impl BatchStream {
    /// Batches, samples and payload bytes handed to the caller so far.
    pub fn progress(&self) -> StreamProgress {
        StreamProgress {
            batches: self.counters.batches.load(Ordering::Relaxed),
            samples: self.counters.samples.load(Ordering::Relaxed),
            bytes: self.counters.bytes.load(Ordering::Relaxed),
        }
    }

    /// Acknowledges an item of an acknowledged-mode stream: its samples are consumed. Returns
    /// how many were (fewer when the lease expired meanwhile: those samples went back to the
    /// ready set and may be another consumer's now, so do not clear them; clear the item's
    /// samples only when every one was acknowledged).
    pub async fn ack(&self, item: &StreamItem) -> Result<usize> {
        self.client.ack(&self.task, &item.meta).await
    }

    /// Keeps an item of an acknowledged-mode stream leased for `extend` from now, for a step
    /// that takes longer than the stream's lease (see [`Client::renew_lease`]). Returns how
    /// many of its samples were still held.
    pub async fn renew(&self, item: &StreamItem, extend: Duration) -> Result<usize> {
        self.client
            .renew_lease(&self.task, &item.meta, extend)
            .await
    }

    /// The partition this stream reads.
    pub fn partition(&self) -> &str {
        &self.partition
    }
}

impl Drop for BatchStream {
    fn drop(&mut self) {
        self.fetcher.abort();
    }
}

impl Stream for BatchStream {
    type Item = Result<StreamItem>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(Ok(item))) => {
                let c = &self.counters;
                c.batches.fetch_add(1, Ordering::Relaxed);
                c.samples
                    .fetch_add(item.meta.len() as u64, Ordering::Relaxed);
                c.bytes
                    .fetch_add(item.batch.nbytes() as u64, Ordering::Relaxed);
                Poll::Ready(Some(Ok(item)))
            }
            other => other,
        }
    }
}

/// Samples a fetch took for a stream that have not reached its consumer yet. Dropped without
/// [`Undelivered::delivered`] — the stream was dropped (its fetcher cancelled mid-read or
/// its channel closed) or the data could not be read — it gives them back to the controller
/// (`ControlPlane::return_fetched`), so that an at-most-once consumption is not lost and an
/// acknowledged lease is not held until it expires. The give-back runs as a task of its own,
/// since a drop cannot wait.
struct Undelivered {
    client: Client,
    partition: String,
    task: String,
    meta: BatchMeta,
    /// False once the batch is handed over.
    armed: bool,
}

impl Undelivered {
    fn new(client: &Client, partition: &str, task: &str, meta: BatchMeta) -> Self {
        Undelivered {
            client: client.clone(),
            partition: partition.to_string(),
            task: task.to_string(),
            meta,
            armed: true,
        }
    }

    /// The samples taken.
    fn meta(&self) -> &BatchMeta {
        &self.meta
    }

    /// The batch is being handed to the consumer: nothing to give back. Returns the metadata.
    fn delivered(mut self) -> BatchMeta {
        self.armed = false;
        std::mem::take(&mut self.meta)
    }
}

impl Drop for Undelivered {
    fn drop(&mut self) {
        if !self.armed || self.meta.is_empty() {
            return;
        }
        let meta = std::mem::take(&mut self.meta);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(partition = %self.partition, task = %self.task, samples = meta.len(), "a dropped stream's samples cannot be given back outside a runtime");
            return;
        };
        let (client, partition, task) = (
            self.client.clone(),
            std::mem::take(&mut self.partition),
            std::mem::take(&mut self.task),
        );
        runtime.spawn(async move {
            let given = client
                .control()
                .return_fetched(&partition, &task, meta.lease(), meta.samples())
                .await;
            match given {
                Ok(n) => tracing::debug!(%partition, %task, returned = n, "gave back samples a stream did not deliver"),
                Err(e) => tracing::warn!(%partition, %task, samples = meta.len(), error = %e, "cannot give back samples a stream did not deliver; they stay consumed (at-most-once) or leased until the lease expires"),
            }
        });
    }
}

/// Fetches batches into `tx` until the stream ends or the receiver goes away.
async fn fetch_loop(
    client: Client,
    partition: String,
    cfg: StreamConfig,
    tx: mpsc::Sender<Result<StreamItem>>,
) {
    let mut batch_index = 0u64;
    let field_refs: Vec<&str> = cfg.fields.iter().map(String::as_str).collect();
    loop {
        let mut req = GetMetaRequest::fetch(
            partition.clone(),
            &field_refs,
            cfg.task.clone(),
            cfg.batch_size,
            Wait::For(cfg.idle_timeout),
        );
        req.sampler = cfg.sampler.clone();
        if let Some(rank) = cfg.dp_rank {
            req = req.with_rank(rank, batch_index);
        }
        if let Delivery::Acknowledged { lease } = cfg.delivery {
            req = req.with_lease(lease);
        }
        let result = match client.get_meta(req).await {
            Ok(meta) => {
                // Taken for this stream: from here until the consumer's channel has the batch,
                // the samples go back if anything stops them (see `Undelivered`).
                let taken = Undelivered::new(&client, &partition, &cfg.task, meta);
                match client.get_data(taken.meta()).await {
                    Ok(batch) => {
                        // A slot first, then the hand-over without another await: no point at
                        // which the batch is neither guarded nor in the channel.
                        let Ok(slot) = tx.reserve().await else {
                            return;
                        };
                        slot.send(Ok(StreamItem {
                            meta: taken.delivered(),
                            batch,
                            batch_index,
                        }));
                        batch_index += 1;
                        continue;
                    }
                    Err(e) => Err(e),
                }
            }
            Err(e) if e.kind() == &ErrorKind::Closed => {
                tracing::debug!(partition = %partition, task = %cfg.task, "stream finished: partition complete");
                return;
            }
            Err(e) if e.kind() == &ErrorKind::Timeout => {
                // Waiting stopped, the partition is not complete: say so with a last error
                // item, so that a consumer can tell it from the clean end of a completed
                // partition. Nothing was consumed by the fetch that timed out.
                tracing::info!(partition = %partition, task = %cfg.task, "stream ended: idle for {:?}", cfg.idle_timeout);
                let idle = Error::timeout(format!(
                    "partition `{}`, task `{}`: no ready batch within the stream's idle timeout \
                     of {:?}; the stream ends (the partition is not complete)",
                    partition, cfg.task, cfg.idle_timeout
                ))
                .with_retry(Retry::Safe);
                let _ = tx.send(Err(idle)).await;
                return;
            }
            Err(e) => Err(e),
        };
        let failed = result.is_err();
        if tx.send(result).await.is_err() || failed {
            return;
        }
        batch_index += 1;
    }
}

impl Client {
    /// Streams ready batches of `partition` (see [`crate::Partition::stream`]).
    pub(crate) fn stream(&self, partition: &str, config: StreamConfig) -> Result<BatchStream> {
        if config.batch_size == 0 {
            return Err(Error::invalid("stream batch size must be at least 1"));
        }
        if config.fields.is_empty() {
            return Err(Error::invalid(format!(
                "partition `{partition}`: a stream needs at least one field"
            )));
        }
        if let Delivery::Acknowledged { lease } = config.delivery {
            if lease.is_zero() {
                return Err(Error::invalid("a lease must last longer than zero"));
            }
        }
        let (tx, rx) = mpsc::channel(config.prefetch.max(1));
        let (partition, task) = (partition.to_string(), config.task.clone());
        let fetcher = tokio::spawn(fetch_loop(self.clone(), partition.clone(), config, tx));
        Ok(BatchStream {
            rx,
            counters: Arc::default(),
            fetcher,
            client: self.clone(),
            partition,
            task,
        })
    }

    /// Consumes the samples of `meta`, which an acknowledged-mode fetch handed to `task`.
    /// Returns how many were; fewer means the lease expired meanwhile and the rest may be
    /// another consumer's now (see [`BatchStream::ack`]: clear only a fully acknowledged batch).
    pub async fn ack(&self, task: &str, meta: &BatchMeta) -> Result<usize> {
        let lease = meta.lease().ok_or_else(|| {
            Error::invalid(format!(
                "partition `{}`: these samples were not handed out in acknowledged mode",
                meta.partition()
            ))
        })?;
        self.control()
            .ack(meta.partition(), task, lease, meta.samples())
            .await
    }

    /// Keeps the samples of `meta`, which an acknowledged-mode fetch handed to `task`, leased
    /// for `extend` from now (a step that takes longer than the lease it fetched with).
    /// Returns how many were still held; fewer means the rest's lease ran out and they may be
    /// another consumer's now.
    pub async fn renew_lease(
        &self,
        task: &str,
        meta: &BatchMeta,
        extend: Duration,
    ) -> Result<usize> {
        let lease = meta.lease().ok_or_else(|| {
            Error::invalid(format!(
                "partition `{}`: these samples were not handed out in acknowledged mode",
                meta.partition()
            ))
        })?;
        self.control()
            .renew_lease(meta.partition(), task, lease, meta.samples(), extend)
            .await
    }

    /// Declares that producers will add no more samples to `partition`: streams end once they
    /// consumed everything. The mark stays until `clear_partition`.
    pub(crate) async fn complete_partition(&self, partition: &str) -> Result<()> {
        self.control().mark_complete(partition).await
    }
}
