//! `tq soak`: producers and consumers running for a long time against a deployment of its own
//! (a controller and storage-unit processes on loopback), with faults: every `--fault-every`
//! one storage unit is killed (SIGKILL) and started again under the same id, losing the cells
//! it held. All along it checks what must hold whatever happens:
//! - no sample is handed to consumers twice, and every sample read holds its own data;
//! - a sample whose cells a fault destroyed is reported (`DataLost` / `NotFound`), never
//!   returned empty or as other data;
//! - at the end every sample produced was either consumed once or reported lost, and no
//!   index stays in use.
//!
//! It prints a summary (samples, faults, errors by kind, the controller's peak memory) and
//! exits non-zero when an invariant broke.

use crate::procs::{spawn_server, Servers};
use clap::Args;
use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tq_client::{Client, Config, GetMetaRequest, Wait};
use tq_core::{Batch, Column, Error, ErrorKind, Result, Tensor};

#[derive(Args, Debug, Clone)]
pub struct SoakArgs {
    /// How long producers run, in seconds (consumers then drain what is left).
    #[arg(long, default_value_t = 60)]
    duration: u64,
    /// Producer/consumer pairs (tasks in this process, each with its own client).
    #[arg(long, default_value_t = 2)]
    clients: usize,
    /// Storage-unit processes.
    #[arg(long, default_value_t = 2)]
    units: u32,
    /// Seconds between faults (a unit killed and restarted); 0: no faults.
    #[arg(long, default_value_t = 10)]
    fault_every: u64,
    /// Samples per put.
    #[arg(long, default_value_t = 16)]
    batch: usize,
    /// Elements (i64) per sample.
    #[arg(long, default_value_t = 256)]
    width: usize,
    /// Producers pause while more than this many samples are produced but neither consumed
    /// nor reported lost, so the backlog (and each fetch's work) stays bounded; 0: no limit.
    #[arg(long, default_value_t = 8192)]
    max_backlog: usize,
    /// Seconds between progress lines on stderr (samples produced, consumed, reported lost,
    /// faults so far); 0: none.
    #[arg(long, default_value_t = 10)]
    progress_every: u64,
}

#[derive(Default)]
struct Tally {
    produced: HashSet<i64>,
    consumed: HashSet<i64>,
    errors: BTreeMap<String, u64>,
    violations: Vec<String>,
}

impl Tally {
    fn error(&mut self, what: &str, e: &Error) {
        *self
            .errors
            .entry(format!("{what}: {:?}", e.kind()))
            .or_default() += 1;
    }
}

fn rows(first: i64, n: usize, width: usize) -> Result<Batch> {
    let values: Vec<i64> = (0..n * width).map(|i| first + (i / width) as i64).collect();
    Batch::from_columns([(
        "x",
        Column::Dense(Tensor::from_slice(vec![n, width], &values)?),
    )])
}

async fn produce(
    tq: Client,
    id: usize,
    args: SoakArgs,
    stop: Arc<AtomicBool>,
    tally: Arc<Mutex<Tally>>,
) {
    let mut next = (id as i64) << 40;
    while !stop.load(Ordering::Relaxed) {
        if args.max_backlog > 0 && backlog(&tally) > args.max_backlog {
            // Backpressure: wait for the consumers (a real pipeline's rollout waits for the
            // trainer the same way).
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        }
        let batch = match rows(next, args.batch, args.width) {
            Ok(b) => b,
            Err(e) => {
                lock(&tally)
                    .violations
                    .push(format!("building a batch: {e}"));
                return;
            }
        };
        match tq.partition("soak").put_new(&batch).await {
            Ok(_) => {
                let mut t = lock(&tally);
                t.produced.extend(next..next + args.batch as i64);
                next += args.batch as i64;
            }
            Err(e) => {
                // A unit being restarted: counted, and the put is tried again with new samples
                // (a failed `put_new` removes the samples it created).
                lock(&tally).error("put", &e);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Samples produced and neither consumed nor reported lost yet.
fn backlog(tally: &Mutex<Tally>) -> usize {
    let t = lock(tally);
    let lost = t.errors.get("samples reported lost").copied().unwrap_or(0) as usize;
    t.produced.len().saturating_sub(t.consumed.len() + lost)
}

fn lock(t: &Mutex<Tally>) -> std::sync::MutexGuard<'_, Tally> {
    t.lock().unwrap_or_else(|p| p.into_inner())
}

/// Consumes until `stop` is set and a fetch finds nothing.
async fn consume(tq: Client, args: SoakArgs, stop: Arc<AtomicBool>, tally: Arc<Mutex<Tally>>) {
    loop {
        let req = GetMetaRequest::fetch(
            "soak",
            &["x"],
            "train",
            args.batch,
            Wait::For(Duration::from_millis(200)),
        )
        .with_lease(Duration::from_secs(5));
        let meta = match tq.get_meta(req).await {
            Ok(m) => m,
            Err(e) if e.kind() == &ErrorKind::Timeout => {
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                continue;
            }
            Err(e) => {
                lock(&tally).error("fetch", &e);
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if meta.is_empty() {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            continue;
        }
        // A unit that is being restarted refuses connections for a moment: read again (the
        // batch is leased to this consumer; giving up would leave it leased past the end of
        // the run) for up to 2 s, then count it with the failures below.
        let mut read = tq.get_data(&meta).await;
        let retry_until = Instant::now() + Duration::from_secs(2);
        while let Err(e) = &read {
            if !e.is_retryable() || Instant::now() >= retry_until {
                break;
            }
            lock(&tally).error("read (retried)", e);
            tokio::time::sleep(Duration::from_millis(50)).await;
            read = tq.get_data(&meta).await;
        }
        let ids: Vec<i64> = match read {
            Ok(batch) => {
                let Some(Column::Dense(x)) = batch.column("x") else {
                    lock(&tally)
                        .violations
                        .push("a read without field `x`".into());
                    continue;
                };
                let values = match x.to_vec::<i64>() {
                    Ok(v) => v,
                    Err(e) => {
                        lock(&tally)
                            .violations
                            .push(format!("a read of another dtype: {e}"));
                        continue;
                    }
                };
                let ids: Vec<i64> = values.chunks(args.width).map(|r| r[0]).collect();
                let own = values
                    .chunks(args.width)
                    .all(|r| r.iter().all(|v| *v == r[0]));
                if !own || ids.len() != meta.len() {
                    lock(&tally)
                        .violations
                        .push(format!("a read returned mixed rows: {ids:?}"));
                }
                let mut t = lock(&tally);
                for id in &ids {
                    if !t.consumed.insert(*id) {
                        t.violations.push(format!("sample {id} consumed twice"));
                    }
                }
                ids
            }
            Err(e) if matches!(e.kind(), ErrorKind::DataLost | ErrorKind::NotFound) => {
                // A fault destroyed cells of this batch: reported, never returned as data.
                lock(&tally).error("read", &e);
                Vec::new()
            }
            Err(e) => {
                // Still failing: the batch cannot be read, so it is reported lost (below)
                // rather than left leased.
                lock(&tally).error("read", &e);
                Vec::new()
            }
        };
        if ids.is_empty() {
            // Lost: consume the lease and clear the samples; count them by sample id below.
            let lost = meta.len();
            let _ = tq.ack("train", &meta).await;
            if let Err(e) = tq.clear_samples(&meta).await {
                lock(&tally).error("clear", &e);
            }
            let mut t = lock(&tally);
            *t.errors.entry("samples reported lost".into()).or_default() += lost as u64;
            continue;
        }
        if let Err(e) = tq.ack("train", &meta).await {
            lock(&tally).error("ack", &e);
        }
        if let Err(e) = tq.clear_samples(&meta).await {
            lock(&tally).error("clear", &e);
        }
    }
}

/// The controller and the units; returns the units' endpoints too, so that a restarted unit
/// listens where clients already route to it.
fn start(units: u32) -> Result<(Servers, Vec<String>)> {
    let n = units.to_string();
    let (c, controller) =
        spawn_server(&["controller", "--listen", "tcp://127.0.0.1:0", "--units", &n])?;
    let mut servers = Servers {
        children: vec![c],
        controller,
    };
    let mut endpoints = Vec::new();
    for i in 0..units {
        let (u, endpoint) = spawn_server(&[
            "storage-unit",
            "--controller",
            &servers.controller.clone(),
            "--id",
            &format!("unit-{i}"),
        ])?;
        servers.children.push(u);
        endpoints.push(endpoint);
    }
    Ok((servers, endpoints))
}

pub fn run(args: SoakArgs) -> Result<()> {
    if args.clients == 0 || args.units == 0 || args.batch == 0 || args.width == 0 {
        return Err(Error::invalid(
            "--clients, --units, --batch and --width must be at least 1",
        ));
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::internal("cannot start the runtime").with_source(e))?;
    let (mut servers, unit_endpoints) = start(args.units)?;
    let url = servers.controller.clone();
    let controller_pid = servers.children[0].id();
    let tally = Arc::new(Mutex::new(Tally::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let faults = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    runtime.block_on(async {
        let mut tasks = Vec::new();
        for c in 0..args.clients {
            let mut config = Config::default();
            config.net.request_timeout_ms = 5_000;
            let tq = Client::connect_with(&url, config).await?;
            tasks.push(tokio::spawn(produce(
                tq.clone(),
                c,
                args.clone(),
                stop.clone(),
                tally.clone(),
            )));
            tasks.push(tokio::spawn(consume(
                tq,
                args.clone(),
                stop.clone(),
                tally.clone(),
            )));
        }
        let deadline = started + Duration::from_secs(args.duration);
        let mut next_fault =
            (args.fault_every > 0).then(|| Instant::now() + Duration::from_secs(args.fault_every));
        let mut victim = 0u32;
        let progress_every = Duration::from_secs(args.progress_every);
        let mut next_progress = Instant::now() + progress_every;
        while Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if args.progress_every > 0 && Instant::now() >= next_progress {
                next_progress += progress_every;
                let t = lock(&tally);
                eprintln!(
                    "soak progress: {:.0} s, {} produced, {} consumed, {} reported lost, {} faults",
                    started.elapsed().as_secs_f64(),
                    t.produced.len(),
                    t.consumed.len(),
                    t.errors.get("samples reported lost").copied().unwrap_or(0),
                    faults.load(Ordering::Relaxed)
                );
            }
            if next_fault.is_some_and(|t| Instant::now() >= t) {
                // The unit's process is children[1 + victim]: kill it and start it again.
                let slot = 1 + victim as usize;
                let _ = servers.children[slot].kill();
                let _ = servers.children[slot].wait();
                // Same id, same endpoint: a unit that comes back where it was (its cells are gone).
                let (u, _) = spawn_server(&[
                    "storage-unit",
                    "--controller",
                    &url,
                    "--id",
                    &format!("unit-{victim}"),
                    "--listen",
                    &unit_endpoints[victim as usize],
                ])?;
                servers.children[slot] = u;
                faults.fetch_add(1, Ordering::Relaxed);
                victim = (victim + 1) % args.units;
                next_fault = Some(Instant::now() + Duration::from_secs(args.fault_every));
            }
        }
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            t.await
                .map_err(|e| Error::internal(format!("a soak task panicked: {e}")))?;
        }
        // Everything consumed or cleared: no sample may be left.
        let tq = Client::connect_with(&url, Config::default()).await?;
        let status = tq.partition("soak").consumption_status("train").await;
        if let Ok(status) = status {
            if !status.samples.is_empty() {
                lock(&tally).violations.push(format!(
                    "{} samples left in the partition",
                    status.samples.len()
                ));
            }
        }
        Ok::<_, Error>(())
    })?;
    let t = lock(&tally);
    let lost_reported = t.errors.get("samples reported lost").copied().unwrap_or(0);
    let accounted = t.consumed.len() as u64 + lost_reported;
    let mut violations = t.violations.clone();
    if accounted != t.produced.len() as u64 {
        violations.push(format!(
            "{} samples produced, {} consumed + {lost_reported} reported lost",
            t.produced.len(),
            t.consumed.len()
        ));
    }
    if let Some(stray) = t.consumed.iter().find(|id| !t.produced.contains(id)) {
        violations.push(format!("sample {stray} consumed but never produced"));
    }
    println!(
        "soak: {:.0} s, {} clients, {} units, {} faults",
        started.elapsed().as_secs_f64(),
        args.clients,
        args.units,
        faults.load(Ordering::Relaxed)
    );
    println!(
        "  samples: {} produced, {} consumed, {lost_reported} reported lost",
        t.produced.len(),
        t.consumed.len()
    );
    for (what, n) in &t.errors {
        if what != "samples reported lost" {
            println!("  errors: {what} × {n}");
        }
    }
    if let Some(bytes) = crate::procs::peak_rss_bytes(Some(controller_pid)) {
        println!("  controller peak RSS: {:.1} MiB", bytes as f64 / 1048576.0);
    }
    drop(servers);
    if violations.is_empty() {
        println!("  check: OK");
        Ok(())
    } else {
        for v in &violations {
            println!("  VIOLATION: {v}");
        }
        Err(Error::internal(format!(
            "soak: {} invariant(s) broken",
            violations.len()
        )))
    }
}
