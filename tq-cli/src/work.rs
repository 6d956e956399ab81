//! `tq produce` and `tq consume`: one stage of a pipeline each, in its own process, against a
//! running deployment. They check a deployment from the outside (many processes, one job) and
//! drive the multi-process tests.
//!
//! A producer writes samples `first..first + count` of a partition (field `x`, tag `id`); a
//! consumer streams them with acknowledged delivery and prints `acked <id>` for each sample
//! once its acknowledgement succeeded, so that a run's output says exactly which samples were
//! consumed, and how often, even when a consumer is killed half-way.

use clap::Args;
use futures::StreamExt;
use std::io::Write;
use std::time::Duration;
use tq_client::{Client, Config, StreamConfig};
use tq_core::{Batch, Column, Error, Result, TagValue, Tags, Tensor};

#[derive(Args, Debug, Clone)]
pub struct ProduceArgs {
    /// The controller (`tcp://host:port`).
    #[arg(long)]
    connect: String,
    /// Configuration file (network settings: token, timeouts).
    #[arg(long)]
    config: Option<std::path::PathBuf>,
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
}

#[derive(Args, Debug, Clone)]
pub struct ConsumeArgs {
    /// The controller (`tcp://host:port`).
    #[arg(long)]
    connect: String,
    /// Configuration file (network settings: token, timeouts).
    #[arg(long)]
    config: Option<std::path::PathBuf>,
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
}

async fn connect(url: &str, config: Option<&std::path::Path>) -> Result<Client> {
    Client::connect_with(url, Config::load(config)?).await
}

pub async fn produce(args: ProduceArgs) -> Result<()> {
    if args.batch == 0 || args.width == 0 {
        return Err(Error::invalid("--batch and --width must be at least 1"));
    }
    let tq = connect(&args.connect, args.config.as_deref()).await?;
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
        partition.kv_batch_put(&keys, &batch, Some(tags)).await?;
        next += n as i64;
    }
    if args.complete {
        partition.complete().await?;
    }
    println!("produced {} samples", args.count);
    Ok(())
}

pub async fn consume(args: ConsumeArgs) -> Result<()> {
    let tq = connect(&args.connect, args.config.as_deref()).await?;
    let mut stream = tq.partition(args.partition.clone()).stream(
        StreamConfig::new(args.task.clone(), &["x"], args.batch)
            .acknowledged(Duration::from_millis(args.lease_ms))
            .idle_timeout(Duration::from_millis(args.idle_ms))
            .prefetch(1),
    )?;
    let mut out = std::io::stdout().lock();
    let mut consumed = 0usize;
    while let Some(item) = stream.next().await {
        let item = item?;
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
        let acked = stream.ack(&item).await?;
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
