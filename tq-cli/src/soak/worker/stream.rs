//! The stream role: a producer of keyed samples and an acknowledged consumer that checks,
//! acknowledges and clears them, reporting what a fault destroyed as lost.

use super::{Ctx, STREAM_PARTITION};
use crate::soak::content::{self, FIELDS};
use crate::soak::ledger::{format_ids, sample_id};
use futures::StreamExt;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tq_client::{GetMetaRequest, StreamConfig, Wait};
use tq_core::{Batch, BatchMeta, Error, ErrorKind, Result, TagValue, Tags};

/// The consumers' task.
const TASK: &str = "train";

pub(super) async fn produce(ctx: Arc<Ctx>) {
    let partition = ctx.tq.partition(STREAM_PARTITION);
    let mut seq = 0u64;
    while !ctx.stopped() {
        if ctx.args.max_backlog > 0 {
            let backlog = ctx.tq.controller_status().await.map(|s| {
                s.partitions
                    .iter()
                    .find(|p| p.name == STREAM_PARTITION)
                    .map_or(0, |p| p.samples)
            });
            match backlog {
                Ok(n) if n as usize > ctx.args.max_backlog => {
                    // A real rollout waits for its trainer the same way.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
                Ok(_) => {}
                Err(e) => {
                    ctx.error("status", &e);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            }
        }
        let n = ctx.args.batch as u64;
        let ids: Vec<i64> = (seq..seq + n)
            .map(|s| sample_id(ctx.args.worker, s))
            .collect();
        seq += n;
        let samples: Vec<(i64, i64)> = ids.iter().map(|&id| (id, 0)).collect();
        let batch = match content::rows(&samples, ctx.args.width) {
            Ok(b) => b,
            Err(e) => return ctx.log.line(&format!("V building a batch: {e}")),
        };
        let keys: Vec<String> = ids.iter().map(|id| format!("s{id}")).collect();
        let tags: Vec<Tags> = ids
            .iter()
            .map(|&id| Tags::from([("id".to_string(), TagValue::Int(id))]))
            .collect();
        ctx.log.line(&format!("P {}", format_ids(&ids)));
        // Same keys, same data: repeating the put after an unknown outcome is harmless.
        let put = ctx
            .retrying("put", true, || {
                partition.kv_batch_put(&keys, &batch, Some(tags.clone()))
            })
            .await;
        match put {
            Ok(_) => ctx.log.line("p"),
            Err(e) => {
                ctx.log.line(&format!("x {:?}", e.kind()));
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    ctx.produced_all.store(true, Ordering::Relaxed);
}

/// Consumes with an acknowledged stream until stopped and idle for longer than a lease (so
/// that batches a killed worker held come back and are taken).
pub(super) async fn consume(ctx: &Ctx) {
    let partition = ctx.tq.partition(STREAM_PARTITION);
    let lease = Duration::from_millis(ctx.args.lease_ms);
    let mut idle_since: Option<Instant> = None;
    loop {
        // A fetch of an incomplete partition waits for a whole batch, so the tail (fewer
        // samples than a batch) is drained one sample at a time once production stopped.
        let draining = ctx.stopped() && ctx.produced_all.load(Ordering::Relaxed);
        let batch = if draining { 1 } else { ctx.args.batch };
        let config = StreamConfig::new(TASK, &FIELDS, batch)
            .acknowledged(lease)
            .idle_timeout(Duration::from_secs(1))
            .prefetch(1);
        let mut stream = match partition.stream(config) {
            Ok(s) => s,
            Err(e) => return ctx.log.line(&format!("V cannot open a stream: {e}")),
        };
        while let Some(item) = stream.next().await {
            match item {
                Ok(item) => {
                    idle_since = None;
                    let ack = ctx.retrying("ack", true, || stream.ack(&item));
                    finish(ctx, &item.meta, Ok(&item.batch), ack).await;
                }
                Err(e) if e.kind() == &ErrorKind::Timeout => break,
                Err(e) if matches!(e.kind(), ErrorKind::DataLost | ErrorKind::NotFound) => {
                    // The stream gave the batch back; find it and report what is lost.
                    ctx.error("stream read", &e);
                    idle_since = None;
                    fetch_and_sort_out(ctx, batch).await;
                    break;
                }
                Err(e) => {
                    ctx.error("stream", &e);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    break;
                }
            }
        }
        if ctx.stopped() && ctx.produced_all.load(Ordering::Relaxed) {
            let since = *idle_since.get_or_insert_with(Instant::now);
            if since.elapsed() > lease + Duration::from_secs(2) {
                return;
            }
        }
    }
}

/// The ids of `meta`'s samples, from their `id` tags.
fn tagged_ids(meta: &BatchMeta) -> Option<Vec<i64>> {
    meta.tags()
        .iter()
        .map(|t| match t.get("id") {
            Some(TagValue::Int(id)) => Some(*id),
            _ => None,
        })
        .collect()
}

/// Checks a read batch against its samples' ids, acknowledges it (`ack`, run only after the
/// ledger has the `F` line), logs the outcome and clears the samples.
async fn finish(
    ctx: &Ctx,
    meta: &BatchMeta,
    read: std::result::Result<&Batch, &Error>,
    ack: impl Future<Output = Result<usize>>,
) {
    let Some(ids) = tagged_ids(meta) else {
        return ctx.log.line("V a stream sample without its `id` tag");
    };
    if let Ok(batch) = read {
        match content::check(batch) {
            Ok(rows) if rows.len() == ids.len() => {
                for (row, id) in rows.iter().zip(&ids) {
                    if !row.intact || row.id != *id {
                        ctx.log.line(&format!(
                            "M sample {id}: read row of sample {} version {} (checksum {})",
                            row.id,
                            row.ver,
                            if row.intact { "holds" } else { "fails" }
                        ));
                    }
                }
            }
            Ok(rows) => ctx.log.line(&format!(
                "M {} samples read as {} rows",
                ids.len(),
                rows.len()
            )),
            Err(what) => ctx
                .log
                .line(&format!("M samples {}: {what}", format_ids(&ids))),
        }
    }
    // `F` is written before the acknowledgement, so that a kill in between leaves the batch
    // in doubt rather than consumed without a trace.
    ctx.log.line(&format!("F {}", format_ids(&ids)));
    let settled = match (&read, ack.await) {
        // Acknowledged under this worker's lease: consumed here (read, or reported lost).
        (Ok(_), Ok(n)) if n == ids.len() => {
            ctx.log.line("A");
            true
        }
        (Err(e), Ok(n)) if n == ids.len() => {
            ctx.log.line(&format!("L {:?}", e.kind()));
            true
        }
        // The lease had expired and the samples went to another consumer, which settles them
        // (a lost read here may be that consumer having cleared them already).
        (_, Ok(0)) => {
            ctx.log.line("N");
            false
        }
        (_, Ok(_)) => {
            ctx.log.line("a");
            false
        }
        (_, Err(e)) => {
            ctx.error("ack", &e);
            ctx.log.line("a");
            false
        }
    };
    // Only samples this worker consumed are its to clear: clearing after an acknowledgement
    // that came too late would destroy samples another consumer now holds (an acknowledgement
    // reports how many, not which; the final clear takes what a partial one leaves).
    if !settled {
        return;
    }
    if let Err(e) = ctx
        .retrying("clear", true, || ctx.tq.clear_samples(meta))
        .await
    {
        ctx.error("clear", &e);
    }
}

/// After a stream read failed for lost data: fetches a batch of `batch` samples (the stream's
/// size: one at a time while draining the tail, where a whole batch may never be ready again)
/// under a lease, reads it sample by sample, and finishes the readable ones as consumed and
/// the rest as lost.
async fn fetch_and_sort_out(ctx: &Ctx, batch: usize) {
    let req = GetMetaRequest::fetch(
        STREAM_PARTITION,
        &FIELDS,
        TASK,
        batch,
        Wait::For(Duration::from_secs(1)),
    )
    .with_lease(Duration::from_millis(ctx.args.lease_ms));
    let meta = match ctx.tq.get_meta(req).await {
        Ok(m) if !m.is_empty() => m,
        Ok(_) => return,
        Err(e) => return ctx.error("fetch", &e),
    };
    for position in 0..meta.len() {
        let one = match meta.select_samples(&[position]) {
            Ok(m) => m,
            Err(e) => return ctx.log.line(&format!("V selecting a sample: {e}")),
        };
        let read = ctx.retrying("read", true, || ctx.tq.get_data(&one)).await;
        if let Err(e) = &read {
            if !matches!(e.kind(), ErrorKind::DataLost | ErrorKind::NotFound) {
                // Not a loss: leave it leased; it comes back when the lease ends.
                ctx.error("read", e);
                continue;
            }
        }
        let ack = ctx.retrying("ack", true, || ctx.tq.ack(TASK, &one));
        finish(ctx, &one, read.as_ref(), ack).await;
    }
}
