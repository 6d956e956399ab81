//! `tq soak`: a mixed workload from many client processes against a deployment of its own on
//! loopback, for a long time, with faults — and the checks of what must hold whatever happens.
//!
//! The clients are `tq soak-worker` processes ([`worker`]): stream workers (keyed puts with
//! tags, acknowledged streams, metadata-API acknowledgements and clears) and KV workers (puts,
//! `kv_batch_update`, `kv_link`, field clears, clears). Every row carries a checksum of its
//! content ([`content`]). Each `--fault-every` seconds one fault strikes, in turn: a storage
//! unit (or Redis) killed and restarted, a unit (or Redis) paused with SIGSTOP for longer than a
//! request's deadline, a worker process killed with SIGKILL (and a new one started).
//!
//! At the end the workers drain and stop, the soak clears every partition and checks, from the
//! workers' logs ([`ledger`]) and the deployment's own status:
//! - no content mismatch: every successful read returned the checksummed rows written last;
//! - every stream sample produced was consumed exactly once or reported lost, and losses
//!   happened only where a fault destroys data (a killed in-memory unit; never with Redis,
//!   whose append-only file is synced on every write), always as errors, never as data;
//! - no leak after the final clear: no sample index in use, no cell in any unit, no key in Redis;
//! - memory: each server process's resident memory after the final clear, next to its
//!   starting level (reported; checked within `--memory-slack-mib`).

mod content;
mod deployment;
mod ledger;
pub mod worker;

use crate::procs::rss_bytes;
use clap::Args;
use deployment::{Deployment, Fault, Storage};
use ledger::Ledger;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tq_client::{Client, Config};
use tq_core::{Error, Result};

#[derive(Args, Debug, Clone)]
pub struct SoakArgs {
    /// How long the workers run, in seconds (then they drain what is left).
    #[arg(long, default_value_t = 60)]
    duration: u64,
    /// Stream worker processes (each a producer and an acknowledged consumer).
    #[arg(long, default_value_t = 2)]
    clients: usize,
    /// KV worker processes (puts, updates, links, field clears, clears of keys of their own).
    #[arg(long, default_value_t = 2)]
    kv_clients: usize,
    /// Where the payloads live.
    #[arg(long, value_enum, default_value_t = Storage::Units)]
    storage: Storage,
    /// Storage-unit processes (`--storage units`).
    #[arg(long, default_value_t = 2)]
    units: u32,
    /// Seconds between faults; 0: no faults.
    #[arg(long, default_value_t = 10)]
    fault_every: u64,
    /// How long a paused (SIGSTOP) process stays paused, in seconds: longer than the workers'
    /// 5 s request deadline, so requests to it time out.
    #[arg(long, default_value_t = 6)]
    pause_secs: u64,
    /// Samples per put.
    #[arg(long, default_value_t = 16)]
    batch: usize,
    /// Payload elements (i64) per sample.
    #[arg(long, default_value_t = 256)]
    width: usize,
    /// Producers wait while the stream partition holds more samples than this, so the backlog
    /// (and each fetch's work) stays bounded.
    #[arg(long, default_value_t = 8192)]
    max_backlog: usize,
    /// Seconds between progress lines on stderr; 0: none.
    #[arg(long, default_value_t = 10)]
    progress_every: u64,
    /// How far above its starting level a server's resident memory may stay after the final
    /// clear, in MiB (allocators keep some freed memory; a leak grows with the run).
    #[arg(long, default_value_t = 64)]
    memory_slack_mib: u64,
}

/// One worker process and its log.
struct Worker {
    child: Child,
    log: PathBuf,
}

struct Workers {
    exe: PathBuf,
    url: String,
    dir: PathBuf,
    args: SoakArgs,
    next_number: u64,
    running: Vec<(worker::Role, Worker)>,
    killed: usize,
}

impl Workers {
    fn spawn(&mut self, role: worker::Role, ledger: &mut Ledger) -> Result<()> {
        // Numbers start at 1: stream sample ids and KV keys are derived from them.
        self.next_number += 1;
        let n = self.next_number;
        let log = self.dir.join(format!("worker-{n}.log"));
        let role_name = match role {
            worker::Role::Stream => "stream",
            worker::Role::Kv => "kv",
        };
        let child = Command::new(&self.exe)
            .args(["soak-worker", "--connect", &self.url, "--role", role_name])
            .args(["--worker", &n.to_string(), "--log"])
            .arg(&log)
            .args(["--batch", &self.args.batch.to_string()])
            .args(["--width", &self.args.width.to_string()])
            .args(["--max-backlog", &self.args.max_backlog.to_string()])
            // Their warnings (a unit refusing a read of lost cells) would drown the report;
            // RUST_LOG set by the caller wins.
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "error".into()),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| Error::internal("cannot start a soak worker").with_source(e))?;
        ledger.watch(log.clone());
        self.running.push((role, Worker { child, log }));
        Ok(())
    }

    /// Kills one worker (SIGKILL, in turn) and starts another of its role.
    fn kill_one(&mut self, ledger: &mut Ledger) -> Result<()> {
        if self.running.is_empty() {
            return Ok(());
        }
        let victim = self.killed % self.running.len();
        self.killed += 1;
        let (role, mut w) = self.running.remove(victim);
        let _ = w.child.kill();
        let _ = w.child.wait();
        ledger.killed(&[w.log]);
        self.spawn(role, ledger)
    }

    /// Closes every worker's standard input (their signal to finish) and waits for them.
    fn finish(&mut self, ledger: &mut Ledger) {
        for (_, w) in &mut self.running {
            drop(w.child.stdin.take());
        }
        let until = Instant::now() + Duration::from_secs(180);
        for (_, w) in &mut self.running {
            loop {
                match w.child.try_wait() {
                    Ok(Some(status)) if status.success() => break,
                    Ok(Some(status)) => {
                        ledger
                            .errors
                            .insert(format!("VIOLATIONS: a worker exited with {status}"), 1);
                        break;
                    }
                    Ok(None) if Instant::now() < until => {
                        std::thread::sleep(Duration::from_millis(50))
                    }
                    _ => {
                        let _ = w.child.kill();
                        let _ = w.child.wait();
                        ledger
                            .errors
                            .insert("VIOLATIONS: a worker did not finish within 180 s".into(), 1);
                        break;
                    }
                }
            }
        }
        self.running.clear();
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for (_, w) in &mut self.running {
            let _ = w.child.kill();
            let _ = w.child.wait();
        }
    }
}

/// A server process's resident memory: at start, the most seen, at the end.
#[derive(Default, Clone, Copy)]
struct Memory {
    start: u64,
    peak: u64,
    end: u64,
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / 1_048_576.0
}

pub fn run(args: SoakArgs) -> Result<()> {
    if args.clients + args.kv_clients == 0 || args.units == 0 || args.batch == 0 || args.width == 0
    {
        return Err(Error::invalid(
            "--units, --batch, --width and --clients + --kv-clients must be at least 1",
        ));
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|e| Error::internal("cannot start the runtime").with_source(e))?;
    let dir = std::env::temp_dir().join(format!("tq-soak-{}", std::process::id()));
    std::fs::create_dir_all(&dir)
        .map_err(|e| Error::internal("cannot create the soak's directory").with_source(e))?;
    let result = soak(&args, &runtime, &dir);
    if result.is_ok() {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        println!("  the workers' logs are kept in {}", dir.display());
    }
    result
}

fn soak(args: &SoakArgs, runtime: &tokio::runtime::Runtime, dir: &std::path::Path) -> Result<()> {
    let mut deployment = Deployment::start(args.storage, args.units, dir)?;
    let mut memory: BTreeMap<(String, u32), Memory> = BTreeMap::new();
    let mut watch_memory = |deployment: &Deployment, at_end: bool| {
        for (name, pid) in deployment.processes() {
            let Some(rss) = rss_bytes(pid) else { continue };
            let m = memory.entry((name, pid)).or_insert(Memory {
                start: rss,
                ..Memory::default()
            });
            m.peak = m.peak.max(rss);
            if at_end {
                m.end = rss;
            }
        }
    };
    watch_memory(&deployment, false);
    let mut ledger = Ledger::default();
    let mut workers = Workers {
        exe: std::env::current_exe()
            .map_err(|e| Error::internal("cannot find the tq binary").with_source(e))?,
        url: deployment.url().to_string(),
        dir: dir.to_path_buf(),
        args: args.clone(),
        next_number: 0,
        running: Vec::new(),
        killed: 0,
    };
    for _ in 0..args.clients {
        workers.spawn(worker::Role::Stream, &mut ledger)?;
    }
    for _ in 0..args.kv_clients {
        workers.spawn(worker::Role::Kv, &mut ledger)?;
    }
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.duration);
    let rotation = Fault::rotation(args.storage);
    let mut faults: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut fault_turn = 0usize;
    let mut next_fault =
        (args.fault_every > 0).then(|| started + Duration::from_secs(args.fault_every));
    let mut next_progress = started + Duration::from_secs(args.progress_every);
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        deployment.resume_paused(false);
        if args.progress_every > 0 && Instant::now() >= next_progress {
            next_progress += Duration::from_secs(args.progress_every);
            ledger.ingest();
            watch_memory(&deployment, false);
            let (produced, consumed, lost) = ledger.stream_totals();
            eprintln!(
                "soak progress: {:.0} s, stream {produced} produced, {consumed} consumed, {lost} reported lost; kv {} rounds, {} rows verified, {} reported lost; {} faults, {} violations",
                started.elapsed().as_secs_f64(),
                ledger.kv_rounds,
                ledger.kv_rows_verified,
                ledger.kv_rows_lost,
                faults.values().sum::<u64>(),
                ledger.errors.get("VIOLATIONS").copied().unwrap_or(0),
            );
        }
        if next_fault.is_some_and(|t| Instant::now() >= t) {
            deployment.resume_paused(true);
            let fault = rotation[fault_turn % rotation.len()];
            fault_turn += 1;
            watch_memory(&deployment, false);
            match fault {
                Fault::KillWorker => workers.kill_one(&mut ledger)?,
                other => deployment.inflict(other, Duration::from_secs(args.pause_secs))?,
            }
            *faults.entry(fault_name(fault)).or_default() += 1;
            next_fault = Some(Instant::now() + Duration::from_secs(args.fault_every));
        }
    }
    deployment.resume_paused(true);
    workers.finish(&mut ledger);
    ledger.ingest();
    let unaccounted = ledger.check_streams();
    if !unaccounted.is_empty() {
        runtime.block_on(describe_samples(deployment.url(), &unaccounted));
    }
    watch_memory(&deployment, false);

    // The final clear, then what is left: nothing may be.
    let leftovers = runtime.block_on(final_clear(deployment.url()));
    let redis_keys = deployment.redis_keys();
    watch_memory(&deployment, true);

    let mut violations = ledger.violations.clone();
    for (what, _) in ledger
        .errors
        .iter()
        .filter(|(k, _)| k.starts_with("VIOLATIONS:"))
    {
        violations.push(what.trim_start_matches("VIOLATIONS: ").to_string());
    }
    let (produced, consumed, stream_lost) = ledger.stream_totals();
    let lost = stream_lost + ledger.kv_rows_lost;
    let destroying_faults = faults
        .get(fault_name(Fault::KillUnit))
        .copied()
        .unwrap_or(0);
    if lost > 0 && destroying_faults == 0 {
        violations.push(format!(
            "{lost} samples reported lost without a fault that destroys data (only a killed \
             in-memory unit may lose samples)"
        ));
    }
    match &leftovers {
        Ok(left) if left.is_empty() => {}
        Ok(left) => violations.push(format!("left after the final clear: {}", left.join(", "))),
        Err(e) => violations.push(format!("the final clear failed: {e}")),
    }
    if let Some(n) = redis_keys.filter(|n| *n > 0) {
        violations.push(format!(
            "{n} keys left in Redis after the final clear, such as {:?}",
            deployment.some_redis_keys()
        ));
    }
    let slack = args.memory_slack_mib * 1_048_576;
    for ((name, _), m) in &memory {
        if m.end > 0 && m.end > m.start + slack {
            violations.push(format!(
                "{name}: resident memory {:.1} MiB after the final clear, {:.1} MiB at its start",
                mib(m.end),
                mib(m.start)
            ));
        }
    }

    println!(
        "soak: {:.0} s, {} stream + {} kv clients, storage {:?}, {} faults",
        started.elapsed().as_secs_f64(),
        args.clients,
        args.kv_clients,
        args.storage,
        faults.values().sum::<u64>()
    );
    for (name, n) in &faults {
        println!("  fault: {name} × {n}");
    }
    println!(
        "  stream samples: {produced} produced, {consumed} consumed, {stream_lost} reported lost"
    );
    println!(
        "  kv: {} rounds, {} rows verified, {} rows reported lost",
        ledger.kv_rounds, ledger.kv_rows_verified, ledger.kv_rows_lost
    );
    println!("  content mismatches: {}", ledger.mismatches);
    for (what, n) in ledger
        .errors
        .iter()
        .filter(|(k, _)| !k.starts_with("VIOLATIONS"))
    {
        println!("  errors: {what} × {n}");
    }
    let leaked = match &leftovers {
        Ok(left) => left.len().to_string(),
        Err(_) => "unknown".into(),
    };
    println!(
        "  leaked after the final clear: {leaked}{}",
        redis_keys.map_or(String::new(), |n| format!(", {n} Redis keys"))
    );
    for ((name, pid), m) in &memory {
        println!(
            "  memory: {name} (pid {pid}): {:.1} MiB at start, {:.1} MiB peak, {} after the final clear",
            mib(m.start),
            mib(m.peak),
            if m.end > 0 { format!("{:.1} MiB", mib(m.end)) } else { "(killed)".into() }
        );
    }
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

fn fault_name(fault: Fault) -> &'static str {
    match fault {
        Fault::KillUnit => "storage unit killed (SIGKILL) and restarted",
        Fault::PauseUnit => "storage unit paused (SIGSTOP)",
        Fault::KillRedis => "redis-server killed (SIGKILL) and restarted",
        Fault::PauseRedis => "redis-server paused (SIGSTOP)",
        Fault::KillController => "controller killed (SIGKILL) and restarted on its state dir",
        Fault::KillWorker => "worker killed (SIGKILL) and replaced",
    }
}

/// Prints what the controller knows of stream samples the ledger cannot account for (the
/// first few): whether their key exists, which fields are produced, consumed or leased.
async fn describe_samples(url: &str, ids: &[i64]) {
    let tq = match Client::connect_with(url, Config::default()).await {
        Ok(tq) => tq,
        Err(e) => return println!("  cannot look at unaccounted samples: {e}"),
    };
    let partition = tq.partition(worker::STREAM_PARTITION);
    let consumption = partition.consumption_status("train").await.ok();
    for id in ids.iter().take(4) {
        let key = format!("s{id}");
        match partition.kv_meta(&[&key]).await {
            Ok(meta) => {
                let sample = meta.samples()[0];
                let produced: Vec<&str> = meta.field_names().collect();
                let state = consumption.as_ref().and_then(|c| {
                    let at = c.samples.iter().position(|s| *s == sample)?;
                    Some((c.consumed[at], c.leased[at]))
                });
                println!(
                    "  unaccounted sample {id}: key {key} is sample {sample}, fields {produced:?},                      (consumed, leased) by `train`: {state:?}"
                );
            }
            Err(e) => println!("  unaccounted sample {id}: key {key}: {e}"),
        }
    }
}

/// Clears the soak's partitions and returns what is left anywhere in the deployment.
async fn final_clear(url: &str) -> Result<Vec<String>> {
    let tq = Client::connect_with(url, Config::default()).await?;
    // What the workers left (a killed producer's put in doubt, samples whose clear failed):
    // said, not counted as a leak; the clear below must remove it.
    for p in tq.controller_status().await?.partitions {
        if p.samples > 0 || p.keys > 0 {
            println!(
                "  before the final clear: partition `{}` holds {} samples, {} keys",
                p.name, p.samples, p.keys
            );
        }
    }
    for name in [
        worker::STREAM_PARTITION,
        worker::KV_PARTITION,
        worker::PUBLIC_PARTITION,
    ] {
        tq.partition(name).clear().await?;
    }
    let status = tq.status().await?;
    let mut left = Vec::new();
    for p in &status.controller.partitions {
        if p.samples > 0 || p.keys > 0 {
            left.push(format!(
                "partition `{}`: {} samples, {} keys",
                p.name, p.samples, p.keys
            ));
        }
    }
    if status.controller.index_allocated > 0 {
        left.push(format!(
            "{} sample indexes still allocated",
            status.controller.index_allocated
        ));
    }
    for u in &status.units {
        if u.cells > 0 || u.bytes > 0 {
            left.push(format!(
                "unit {}: {} cells, {} bytes",
                u.id, u.cells, u.bytes
            ));
        }
    }
    Ok(left)
}
