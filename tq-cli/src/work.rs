//! `tq produce` and `tq consume`: one stage of a pipeline each, in its own process, against a
//! running deployment. They check a deployment from the outside (many processes, one job) and
//! drive the multi-process tests.
//!
//! A producer writes samples `first..first + count` of a partition (field `x`, tag `id`); a
//! consumer streams them with acknowledged delivery and prints `acked <id>` for each sample
//! once its acknowledgement succeeded, so that a run's output says exactly which samples were
//! consumed, and how often, even when a consumer is killed half-way.
//!
//! Both ride out a storage outage (a Redis failover, a restarted unit): an error whose retry
//! status allows it is retried with backoff for up to `--retry-ms` of consecutive failures — a
//! producer repeats its keyed put (idempotent: same keys, same data), a consumer opens its
//! stream again (a batch it had leased but not read is handed out again when its lease ends).

use clap::Args;
use futures::StreamExt;
use std::io::Write;
use std::time::{Duration, Instant};
use tq_client::StreamConfig;
use tq_core::{Batch, Column, Error, ErrorKind, Result, Retry, TagValue, Tags, Tensor};

#[derive(Args, Debug, Clone)]
pub struct ProduceArgs {
    #[command(flatten)]
    deployment: crate::deployment::DeploymentArgs,
    #[arg(long, default_value = "work")]
    partition: String,
    /// First sample id.
    #[arg(long, default_value_t = 0)]
    first: i64,
    /// How many samples to write.
    #[arg(long)]
    count: usize,
    /// Samples per put.
    #[arg(long, default_value_t = 16)]
    batch: usize,
    /// Elements (i64) per sample.
    #[arg(long, default_value_t = 64)]
    width: usize,
    /// Declare the partition complete after writing (consumers then end once it is drained).
    #[arg(long)]
    complete: bool,
    /// Keep retrying a put that failed with a retryable error for this long, in milliseconds.
    #[arg(long, default_value_t = 30_000)]
    retry_ms: u64,
    /// Pause between puts, in milliseconds (a rollout stage's pace).
    #[arg(long, default_value_t = 0)]
    pace_ms: u64,
}

#[derive(Args, Debug, Clone)]
pub struct ConsumeArgs {
    #[command(flatten)]
    deployment: crate::deployment::DeploymentArgs,
    #[arg(long, default_value = "work")]
    partition: String,
    /// The consumer task; consumers of one task share the samples.
    #[arg(long, default_value = "consume")]
    task: String,
    /// Samples per batch.
    #[arg(long, default_value_t = 8)]
    batch: usize,
    /// How long a batch stays leased before it is handed out again, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    lease_ms: u64,
    /// Work time per batch, in milliseconds, before acknowledging it.
    #[arg(long, default_value_t = 0)]
    work_ms: u64,
    /// Stop waiting after this long without a batch, in milliseconds (the stream then ends
    /// with an error: the partition was not completed).
    #[arg(long, default_value_t = 60_000)]
    idle_ms: u64,
    /// Keep reopening the stream after retryable errors for this long, in milliseconds.
    #[arg(long, default_value_t = 30_000)]
    retry_ms: u64,
    /// Clear each batch's samples once it is acknowledged (their payloads are deleted from
    /// storage), as the last stage of a pipeline does; without it, consumed samples stay
    /// until the partition is cleared (`tq partition drop`).
    #[arg(long)]
    clear: bool,
}

/// Consecutive retryable failures, with backoff, up to a budget.
struct Backoff {
    budget: Duration,
    since: Option<Instant>,
    pause: Duration,
}

impl Backoff {
    fn new(budget_ms: u64) -> Self {
        Backoff {
            budget: Duration::from_millis(budget_ms),
            since: None,
            pause: Duration::from_millis(50),
        }
    }

    /// After `e`: waits and returns `Ok` if it may be retried within the budget, else `e`.
    async fn retry(&mut self, what: &str, e: Error) -> Result<()> {
        let since = *self.since.get_or_insert_with(Instant::now);
        if e.retry() == Retry::Never || since.elapsed() + self.pause > self.budget {
            return Err(e);
        }
        tracing::warn!(error = %e, "{what} failed; retrying in {:?}", self.pause);
        tokio::time::sleep(self.pause).await;
        self.pause = (self.pause * 2).min(Duration::from_secs(1));
        Ok(())
    }

    fn succeeded(&mut self) {
        self.since = None;
        self.pause = Duration::from_millis(50);
    }
}

pub async fn produce(args: ProduceArgs) -> Result<()> {
    if args.batch == 0 || args.width == 0 {
        return Err(Error::invalid("--batch and --width must be at least 1"));
    }
    let tq = args.deployment.connect().await?;
    let partition = tq.partition(args.partition.clone());
    let last = args.first + args.count as i64;
    let mut next = args.first;
    while next < last {
        let n = ((last - next) as usize).min(args.batch);
        let values: Vec<i64> = (0..n * args.width)
            .map(|i| next + (i / args.width) as i64)
            .collect();
        let batch = Batch::from_columns([(
            "x",
            Column::Dense(Tensor::from_slice(vec![n, args.width], &values)?),
        )])?;
        let keys: Vec<String> = (next..next + n as i64).map(|id| format!("s{id}")).collect();
        let tags: Vec<Tags> = (next..next + n as i64)
            .map(|id| Tags::from([("id".to_string(), TagValue::Int(id))]))
            .collect();
        let mut backoff = Backoff::new(args.retry_ms);
        loop {
            match partition
                .kv_batch_put(&keys, &batch, Some(tags.clone()))
                .await
            {
                Ok(_) => break,
                Err(e) => backoff.retry("put", e).await?,
            }
        }
        next += n as i64;
        if args.pace_ms > 0 && next < last {
            tokio::time::sleep(Duration::from_millis(args.pace_ms)).await;
        }
    }
    if args.complete {
        partition.complete().await?;
    }
    println!("produced {} samples", args.count);
    Ok(())
}

pub async fn consume(args: ConsumeArgs) -> Result<()> {
    let tq = args.deployment.connect().await?;
    let open = || {
        tq.partition(args.partition.clone()).stream(
            StreamConfig::new(args.task.clone(), &["x"], args.batch)
                .acknowledged(Duration::from_millis(args.lease_ms))
                .idle_timeout(Duration::from_millis(args.idle_ms))
                .prefetch(1),
        )
    };
    let mut stream = open()?;
    let mut out = std::io::stdout().lock();
    let mut consumed = 0usize;
    let mut backoff = Backoff::new(args.retry_ms);
    while let Some(item) = stream.next().await {
        let item = match item {
            Ok(item) => item,
            // The stream's own end after `--idle-ms` without a batch: not an outage.
            Err(e) if e.kind() == &ErrorKind::Timeout && e.retry() == Retry::Safe => return Err(e),
            // A stream ends after an error: open it again.
            Err(e) => {
                backoff.retry("read", e).await?;
                stream = open()?;
                continue;
            }
        };
        let ids: Vec<i64> = item
            .meta
            .tags()
            .iter()
            .map(|t| match t.get("id") {
                Some(TagValue::Int(id)) => Ok(*id),
                _ => Err(Error::corrupted("a sample without its `id` tag")),
            })
            .collect::<Result<_>>()?;
        // The payload must be the producer's: every element of row r is the row's id.
        let Some(Column::Dense(x)) = item.batch.column("x") else {
            return Err(Error::corrupted("field `x` is missing or not dense"));
        };
        let values = x.to_vec::<i64>()?;
        let width = values.len() / ids.len().max(1);
        for (r, id) in ids.iter().enumerate() {
            if values[r * width..(r + 1) * width].iter().any(|v| v != id) {
                return Err(Error::corrupted(format!(
                    "sample {id} holds another sample's data"
                )));
            }
        }
        if args.work_ms > 0 {
            tokio::time::sleep(Duration::from_millis(args.work_ms)).await;
        }
        let acked = loop {
            match stream.ack(&item).await {
                Ok(n) => break n,
                Err(e) => backoff.retry("ack", e).await?,
            }
        };
        if args.clear && acked > 0 {
            // Idempotent (samples already cleared are skipped): retried like the ack.
            loop {
                match tq.clear_samples(&item.meta).await {
                    Ok(()) => break,
                    Err(e) => backoff.retry("clear", e).await?,
                }
            }
        }
        backoff.succeeded();
        if acked == ids.len() {
            for id in &ids {
                let _ = writeln!(out, "acked {id}");
            }
            let _ = out.flush();
            consumed += ids.len();
        }
    }
    println!("consumed {consumed} samples");
    Ok(())
}
