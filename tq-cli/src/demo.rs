//! `tq demo`: an embedded GRPO-style pipeline with concurrent stages.
//!
//! - a prompt writer puts prompts into partition `prompts`, then declares it complete;
//! - rollout streams prompts in batches, writes `n` responses per prompt into `train` (one put
//!   per batch, so each prompt's group is contiguous), clears the prompts, and declares `train`
//!   complete when the prompt stream ends;
//! - reward streams responses and writes a reward for each;
//! - the trainer streams complete groups (GRPO sampler) with prompt, response and reward in
//!   acknowledged mode, checks them, acknowledges and clears them.
//!
//! Every consumer is a `Client::stream`: it waits for data without polling and ends when its
//! partition is complete and consumed.
//!
//! At the end it checks that every response was trained exactly once, in a complete group.
//!
//! Against a running deployment (`--connect`) it keeps to partitions of its own
//! (`demo-<run>/prompts`, `demo-<run>/train`, unique per run, so other jobs and other demos are
//! untouched), checks that the controller has the `grpo` sampler before writing anything, and
//! clears what it wrote whether it succeeds or fails.

use clap::Args;
use futures::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tq_client::{Client, GetMetaMode, GetMetaRequest, StreamConfig, StreamItem, Wait};
use tq_core::{Batch, BatchMeta, Column, Error, Result, TagValue, Tensor};

#[derive(Args, Debug, Clone)]
pub struct DemoArgs {
    /// Number of prompts.
    #[arg(long, default_value_t = 2048)]
    prompts: usize,
    /// Responses per prompt (GRPO group size).
    #[arg(long, short = 'n', default_value_t = 4)]
    responses: usize,
    /// Prompts per rollout batch.
    #[arg(long, default_value_t = 16)]
    rollout_batch: usize,
    /// Responses per reward batch.
    #[arg(long, default_value_t = 64)]
    reward_batch: usize,
    /// Prompts (groups) per training step.
    #[arg(long, default_value_t = 8)]
    train_groups: usize,
    /// Prompt length in tokens (i64).
    #[arg(long, default_value_t = 512)]
    prompt_len: usize,
    /// Maximum response length in tokens (i64); actual lengths vary per response.
    #[arg(long, default_value_t = 1024)]
    response_len: usize,
    /// Number of in-memory storage units (embedded runs on the default storage).
    #[arg(long, default_value_t = 2)]
    units: u32,
    /// With `--controller URL`: run the stages against a running deployment instead of an
    /// embedded one, whatever its storage. Its controller must know the sampler `grpo`
    /// (`[controller.samplers] grpo = "grpo:<responses>"` in its configuration). Without it,
    /// `--config` is the storage of the embedded run (e.g. Redis).
    #[command(flatten)]
    deployment: crate::deployment::DeploymentArgs,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

/// Bytes moved through tq (written plus read).
#[derive(Default)]
struct Traffic {
    written: AtomicU64,
    read: AtomicU64,
}

impl Traffic {
    fn wrote(&self, b: &Batch) {
        self.written.fetch_add(b.nbytes() as u64, Ordering::Relaxed);
    }
    fn read(&self, b: &Batch) {
        self.read.fetch_add(b.nbytes() as u64, Ordering::Relaxed);
    }
}

/// The partitions of one run.
#[derive(Debug, Clone)]
struct Names {
    prompts: String,
    train: String,
}

impl Names {
    /// Unique per run: `demo-<8 hex digits>/prompts` and `…/train`.
    fn new() -> Self {
        let run = format!("demo-{:08x}", tq_core::new_epoch() as u32);
        Names {
            prompts: format!("{run}/prompts"),
            train: format!("{run}/train"),
        }
    }
}

/// How long a stage may see no data before its stream gives up.
const IDLE: Duration = Duration::from_secs(30);

fn tag_int(meta: &BatchMeta, row: usize, key: &str) -> Result<i64> {
    match meta.tags()[row].get(key) {
        Some(TagValue::Int(v)) => Ok(*v),
        other => Err(Error::internal(format!(
            "sample {} has tag `{key}` = {other:?}",
            meta.samples()[row]
        ))),
    }
}

fn tokens(seed: u64, len: usize) -> Vec<i64> {
    // A cheap deterministic token stream (xorshift).
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 50_000) as i64
        })
        .collect()
}

fn response_len(args: &DemoArgs, uid: i64, j: usize) -> usize {
    let max = args.response_len.max(1);
    1 + ((uid as usize * 31 + j * 17) % max)
}

async fn write_prompts(
    tq: Client,
    args: DemoArgs,
    names: Names,
    traffic: Arc<Traffic>,
) -> Result<()> {
    let chunk = args.rollout_batch.max(1);
    let mut uid = 0usize;
    while uid < args.prompts {
        let rows = chunk.min(args.prompts - uid);
        let mut flat = Vec::with_capacity(rows * args.prompt_len);
        for r in 0..rows {
            flat.extend(tokens((uid + r) as u64, args.prompt_len));
        }
        let batch = Batch::from_columns([(
            "prompt_ids",
            Column::Dense(Tensor::from_slice(vec![rows, args.prompt_len], &flat)?),
        )])?;
        let mut meta = tq
            .get_meta(GetMetaRequest {
                partition: names.prompts.clone(),
                fields: vec![],
                mode: GetMetaMode::Insert { count: rows },
                sampler: None,
                dp_rank: None,
                batch_index: None,
                sampler_args: None,
            })
            .await?;
        for (r, t) in meta.tags_mut().iter_mut().enumerate() {
            t.insert("uid".into(), TagValue::Int((uid + r) as i64));
        }
        tq.put(&meta, &batch).await?;
        traffic.wrote(&batch);
        uid += rows;
    }
    tq.partition(&names.prompts).complete().await
}

async fn rollout(tq: Client, args: DemoArgs, names: Names, traffic: Arc<Traffic>) -> Result<()> {
    let n = args.responses;
    let mut prompts = tq.partition(&names.prompts).stream(
        StreamConfig::new("rollout", &["prompt_ids"], args.rollout_batch).idle_timeout(IDLE),
    )?;
    while let Some(item) = prompts.next().await {
        let StreamItem {
            meta, batch: data, ..
        } = item?;
        traffic.read(&data);
        let Some(Column::Dense(p)) = data.column("prompt_ids") else {
            return Err(Error::internal("prompt_ids came back non-dense"));
        };
        // n responses per prompt, in one put so each group is contiguous.
        let mut prompt_rows = Vec::with_capacity(meta.len() * n);
        let mut responses = Vec::with_capacity(meta.len() * n);
        let mut tags = Vec::with_capacity(meta.len() * n);
        for row in 0..meta.len() {
            let uid = tag_int(&meta, row, "uid")?;
            for j in 0..n {
                prompt_rows.push(row);
                let len = response_len(&args, uid, j);
                responses.push(Tensor::from_slice(
                    vec![len],
                    &tokens(uid as u64 * 1000 + j as u64, len),
                )?);
                tags.push(
                    [
                        ("uid".to_string(), TagValue::Int(uid)),
                        ("j".to_string(), TagValue::Int(j as i64)),
                    ]
                    .into(),
                );
            }
        }
        let batch = Batch::from_columns([
            ("prompt_ids", Column::Dense(p.clone()).select(&prompt_rows)),
            ("response_ids", Column::Ragged(responses)),
        ])?;
        let mut out = tq
            .get_meta(GetMetaRequest {
                partition: names.train.clone(),
                fields: vec![],
                mode: GetMetaMode::Insert { count: batch.len() },
                sampler: None,
                dp_rank: None,
                batch_index: None,
                sampler_args: None,
            })
            .await?;
        out.tags_mut().clone_from_slice(&tags);
        tq.put(&out, &batch).await?;
        traffic.wrote(&batch);
        tq.clear_samples(&meta).await?;
    }
    tq.partition(&names.train).complete().await
}

async fn reward(tq: Client, args: DemoArgs, names: Names, traffic: Arc<Traffic>) -> Result<()> {
    let mut responses = tq.partition(&names.train).stream(
        StreamConfig::new("reward", &["response_ids"], args.reward_batch).idle_timeout(IDLE),
    )?;
    while let Some(item) = responses.next().await {
        let StreamItem {
            meta, batch: data, ..
        } = item?;
        traffic.read(&data);
        let rows = data.column("response_ids").expect("fetched field").values();
        let scores: Vec<f32> = rows
            .iter()
            .map(|v| {
                let t = v.as_tensor().expect("tensor field");
                (t.numel() % 97) as f32 / 97.0
            })
            .collect();
        let batch = Batch::from_columns([(
            "reward",
            Column::Dense(Tensor::from_slice(vec![scores.len(), 1], &scores)?),
        )])?;
        tq.put(&meta, &batch).await?;
        traffic.wrote(&batch);
    }
    Ok(())
}

async fn train(
    tq: Client,
    args: DemoArgs,
    names: Names,
    traffic: Arc<Traffic>,
    trained: Arc<Mutex<HashMap<(i64, i64), u32>>>,
    progress: ProgressBar,
) -> Result<()> {
    let n = args.responses;
    let fields = ["prompt_ids", "response_ids", "reward"];
    let mut groups = tq.partition(&names.train).stream(
        StreamConfig::new("trainer", &fields, args.train_groups * n)
            .sampler("grpo")
            .acknowledged(Duration::from_secs(60))
            .idle_timeout(IDLE),
    )?;
    while let Some(item) = groups.next().await {
        let item = item?;
        let (meta, data) = (&item.meta, &item.batch);
        traffic.read(data);
        // Groups must be complete: n consecutive rows of one uid, responses 0..n.
        for g in 0..meta.len() / n {
            let uid = tag_int(meta, g * n, "uid")?;
            for j in 0..n {
                let row = g * n + j;
                if tag_int(meta, row, "uid")? != uid {
                    return Err(Error::internal(format!(
                        "trainer got an incomplete group at sample {}",
                        meta.samples()[row]
                    )));
                }
                let resp = data.column("response_ids").expect("fetched").value(row);
                let want_len = response_len(&args, uid, tag_int(meta, row, "j")? as usize);
                if resp.as_tensor().map(|t| t.numel()) != Some(want_len) {
                    return Err(Error::internal(format!(
                        "sample {}: response has the wrong length",
                        meta.samples()[row]
                    )));
                }
                *trained
                    .lock()
                    .expect("trained map")
                    .entry((uid, tag_int(meta, row, "j")?))
                    .or_default() += 1;
            }
        }
        groups.ack(&item).await?;
        tq.clear_samples(meta).await?;
        progress.inc(meta.len() as u64);
    }
    Ok(())
}

pub async fn run(args: DemoArgs) -> Result<()> {
    if args.prompts == 0
        || args.responses == 0
        || args.rollout_batch == 0
        || args.train_groups == 0
        || args.reward_batch == 0
    {
        return Err(Error::invalid("counts and batch sizes must be at least 1"));
    }
    let mut config = args.deployment.config()?;
    let tq = match &args.deployment.controller {
        Some(url) => Client::connect_with(url, config).await?,
        None => {
            if args.deployment.config.is_none() {
                config.storage.num_units = args.units;
            }
            config
                .controller
                .samplers
                .insert("grpo".into(), format!("grpo:{}", args.responses));
            Client::embedded(config)?
        }
    };
    let names = Names::new();
    // Before anything is written: the trainer needs the controller's `grpo` sampler.
    check_sampler(&tq, &names).await?;
    let outcome = run_stages(&tq, &args, &names).await;
    // Its own partitions only, whatever happened (a failed run leaves nothing behind either).
    let mut leftover = Vec::new();
    for p in [&names.prompts, &names.train] {
        let part = tq.partition(p.as_str());
        let held = part
            .consumption_status("none")
            .await
            .map_or(0, |s| s.samples.len());
        if let Err(e) = part.clear().await {
            tracing::warn!(partition = %p, error = %e, "cannot clear a demo partition");
            leftover.push(format!("{p} ({held} samples, not cleared: {e})"));
        } else if held > 0 && outcome.is_ok() {
            leftover.push(format!("{p} ({held} samples)"));
        }
    }
    let report = outcome?;
    report.print(&args, &tq, &leftover);
    if report.missing == 0 && report.duplicated == 0 && leftover.is_empty() {
        println!("  check             OK: every sample trained exactly once, all data cleared");
        Ok(())
    } else {
        Err(Error::internal(format!(
            "check failed: {} samples never trained, {} trained more than once, partitions left: {leftover:?}",
            report.missing, report.duplicated
        )))
    }
}

/// Refuses to start when the controller has no sampler `grpo` (a connected deployment must
/// configure it), asking with a fetch from an empty partition that takes nothing.
async fn check_sampler(tq: &Client, names: &Names) -> Result<()> {
    let probe = GetMetaRequest::fetch(&names.train, &["reward"], "trainer", 1, Wait::NoWait)
        .with_sampler("grpo");
    let answer = tq.get_meta(probe).await;
    // The probe created nothing worth keeping.
    let _ = tq.partition(&names.train).clear().await;
    answer.map(drop).map_err(|e| {
        e.context(
            "the demo's trainer needs the sampler `grpo` (configure the controller with \
             `[controller.samplers] grpo = \"grpo:<responses>\"`)",
        )
    })
}

/// What a run measured and checked.
struct Report {
    total: u64,
    elapsed: f64,
    missing: usize,
    duplicated: usize,
    traffic: Arc<Traffic>,
}

impl Report {
    fn print(&self, args: &DemoArgs, tq: &Client, leftover: &[String]) {
        let (w, r) = (
            self.traffic.written.load(Ordering::Relaxed),
            self.traffic.read.load(Ordering::Relaxed),
        );
        let storage = if args.deployment.controller.is_some() {
            format!("storage `{}`", tq.storage().name())
        } else {
            format!("{} storage units", args.units)
        };
        println!(
            "tq demo: {} prompts x {} responses, {storage}",
            args.prompts, args.responses
        );
        println!(
            "  trained samples   {} in {:.2} s ({:.0} samples/s)",
            self.total,
            self.elapsed,
            self.total as f64 / self.elapsed
        );
        println!(
            "  bytes moved       {:.1} MiB written, {:.1} MiB read ({:.2} Gbit/s)",
            w as f64 / 1048576.0,
            r as f64 / 1048576.0,
            (w + r) as f64 * 8.0 / 1e9 / self.elapsed
        );
        match crate::procs::peak_rss_bytes(None) {
            Some(b) => println!("  peak memory (RSS) {:.1} MiB", b as f64 / 1048576.0),
            None => println!("  peak memory (RSS) unavailable"),
        }
        println!("  partitions left   {leftover:?}");
    }
}

/// Runs the four stages to their end and counts what the trainer saw.
async fn run_stages(tq: &Client, args: &DemoArgs, names: &Names) -> Result<Report> {
    let tq = tq.clone();
    let args = args.clone();
    let total = (args.prompts * args.responses) as u64;
    let progress = if args.quiet {
        ProgressBar::hidden()
    } else {
        let p = ProgressBar::new(total);
        p.set_style(
            ProgressStyle::with_template(
                "{spinner} trained {pos}/{len} samples [{bar:40}] {per_sec} eta {eta}",
            )
            .expect("static template")
            .progress_chars("=> "),
        );
        p
    };
    let traffic = Arc::new(Traffic::default());
    let trained = Arc::new(Mutex::new(HashMap::new()));
    let start = Instant::now();
    let stages = vec![
        tokio::spawn(write_prompts(
            tq.clone(),
            args.clone(),
            names.clone(),
            traffic.clone(),
        )),
        tokio::spawn(rollout(
            tq.clone(),
            args.clone(),
            names.clone(),
            traffic.clone(),
        )),
        tokio::spawn(reward(
            tq.clone(),
            args.clone(),
            names.clone(),
            traffic.clone(),
        )),
        tokio::spawn(train(
            tq.clone(),
            args.clone(),
            names.clone(),
            traffic.clone(),
            trained.clone(),
            progress.clone(),
        )),
    ];
    for (name, stage) in ["prompt writer", "rollout", "reward", "trainer"]
        .iter()
        .zip(stages)
    {
        stage
            .await
            .map_err(|e| Error::internal(format!("{name} panicked: {e}")))?
            .map_err(|e| e.context(*name))?;
    }
    progress.finish_and_clear();
    let elapsed = start.elapsed().as_secs_f64();

    let (missing, duplicated) = {
        let trained = trained.lock().expect("trained map");
        let mut missing = 0;
        let mut duplicated = 0;
        for uid in 0..args.prompts as i64 {
            for j in 0..args.responses as i64 {
                match trained.get(&(uid, j)).copied().unwrap_or(0) {
                    0 => missing += 1,
                    1 => {}
                    _ => duplicated += 1,
                }
            }
        }
        (missing, duplicated)
    };
    Ok(Report {
        total,
        elapsed,
        missing,
        duplicated,
        traffic,
    })
}
