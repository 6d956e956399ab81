//! `tq bench`: the standard workloads on the embedded deployment (next to a memcpy of the same
//! bytes) and on a remote one (a controller and two storage-unit processes on loopback, next to
//! raw tokio TCP moving the same bytes), plus controller cost and small-request latency.
//! Prints markdown.

use crate::servers::{spawn_server, Servers};

mod scale;
use clap::{Args, ValueEnum};
use std::time::Duration;
use tq_bench::{baseline, clears, controller, kv, latency, links, same_host, steps, workloads};
use tq_client::{Client, Config};
use tq_core::{Error, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Deployment {
    Embedded,
    Remote,
    Both,
    /// A controller process whose storage is the KV store at `--kv-url` (clients reach it
    /// directly), next to raw pipelined writes, reads and deletes of the same cells.
    RemoteKv,
    /// The same with the controller in this process (what criterion's `redis` and
    /// `object_store` targets measure).
    EmbeddedKv,
    /// The remote deployment through two clients against the same unit processes, one with
    /// `net.shared_memory` off and one with it on: each workload over TCP and over shared
    /// memory next to raw loopback TCP in the same run, and what client and units hold.
    SameHost,
    /// The controller at scale: many clients draining partitions of several sizes against
    /// one `tq serve --units 2` (`--scale-*`), next to the in-process fetch cost by size.
    Scale,
}

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Comma-separated workloads (simple-small, simple-medium, simple-large, complex-small,
    /// complex-medium, complex-large, perftest-small).
    #[arg(
        long,
        default_value = "simple-small,simple-medium,simple-large,complex-small,complex-medium,complex-large"
    )]
    workloads: String,
    /// Samples per batch.
    #[arg(long, default_value_t = 1024)]
    samples: usize,
    /// Timed repetitions per figure (after one warm-up).
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Number of storage units.
    #[arg(long, default_value_t = 2)]
    units: u32,
    /// Which deployments to measure.
    #[arg(long, value_enum, default_value_t = Deployment::Both)]
    deployment: Deployment,
    /// Round trips for the latency figure.
    #[arg(long, default_value_t = 1000)]
    latency_rounds: usize,
    /// Prompts of the shared-payload (kv_link) figure; 0 skips it.
    #[arg(long, default_value_t = 64)]
    link_prompts: usize,
    /// The store of `--deployment remote-kv` or `embedded-kv` (`redis://host:port`, `redis+cluster://h:p,..`,
    /// `file:///dir`); its keys under `tq-bench-raw` and the `tq` namespace are overwritten.
    #[arg(long)]
    kv_url: Option<String>,
    /// With `remote-kv` on Redis: replicas each write waits for (`wait_replicas`), to see what
    /// confirming replication costs next to the same run without it.
    #[arg(long, default_value_t = 0)]
    kv_redis_wait: u32,
    /// `--deployment scale`: client counts (each client with connections of its own).
    #[arg(long, default_value = "16,128,1024")]
    scale_clients: String,
    /// `--deployment scale`: partition sizes (samples written before the clients start).
    #[arg(long, default_value = "4096,16384,65536")]
    scale_samples: String,
    /// `--deployment scale`: payload bytes per sample (0: metadata only, no get_data).
    #[arg(long, default_value = "0,4096")]
    scale_payloads: String,
    /// `--deployment scale`: samples per fetch.
    #[arg(long, default_value_t = 8)]
    scale_batch: usize,
}

fn start_remote(units: u32) -> Result<Servers> {
    crate::servers::start_controller_and_units(units, &[]).map(|(servers, _)| servers)
}

/// A configuration file that puts the payloads in the KV store at `url`.
fn write_kv_config(url: &str, wait_replicas: u32) -> Result<std::path::PathBuf> {
    let path = std::env::temp_dir().join(format!("tq-bench-{}.toml", std::process::id()));
    std::fs::write(
        &path,
        format!(
            "[storage]\nbackend = \"kv\"\n[storage.kv]\nstores = [{{ url = \"{url}\" }}]\n\
             [storage.kv.redis]\nwait_replicas = {wait_replicas}\nwait_timeout_ms = 10000\n"
        ),
    )
    .map_err(|e| Error::internal("cannot write the benchmark's configuration").with_source(e))?;
    Ok(path)
}

/// A controller process configured by `config` (a file from [`write_kv_config`]).
fn start_remote_kv(config: &std::path::Path) -> Result<Servers> {
    let config = config.to_string_lossy().to_string();
    let (c, controller) = spawn_server(&[
        "controller",
        "--listen",
        "tcp://127.0.0.1:0",
        "--config",
        &config,
    ])?;
    Ok(Servers {
        children: vec![c],
        controller,
    })
}

fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1e3)
}

/// `median (min–max)` in ms.
fn ms_range(s: &tq_bench::Stats) -> String {
    format!("{} ({}–{})", ms(s.median), ms(s.min), ms(s.max))
}

fn us(d: Duration) -> String {
    format!("{:.0}", d.as_secs_f64() * 1e6)
}

/// The fewest timed rounds of each controller figure.
const CONTROLLER_MIN_REPS: usize = 300;

pub fn run(args: BenchArgs) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::internal("cannot start the runtime").with_source(e))?;
    let names: Vec<&str> = args
        .workloads
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    for n in &names {
        if !workloads::NAMES.contains(n) {
            return Err(Error::invalid(format!(
                "unknown workload `{n}` (known: {})",
                workloads::NAMES.join(", ")
            )));
        }
    }
    // A controller round takes about a millisecond: take enough of them for a stable median
    // (criterion's controller target takes thousands), whatever `--reps` asks of the payload
    // figures.
    let controller_reps = args.reps.max(CONTROLLER_MIN_REPS);
    println!(
        "## Controller (no payload), {controller_reps} repetitions after {} warm-up rounds",
        controller::WARMUP_ROUNDS
    );
    println!();
    println!("| operation | ms median (min–max) |\n|---|---|");
    let s = controller::allocate_notify_fetch(&runtime, args.samples, 28, controller_reps)?;
    println!(
        "| allocate + notify + fetch, {} samples × 28 fields | {} |",
        args.samples,
        ms_range(&s)
    );
    let s = controller::kv_retrieve_meta(&runtime, args.samples, 4, controller_reps)?;
    println!(
        "| kv_retrieve_meta, {} keys | {} |",
        args.samples,
        ms_range(&s)
    );

    if args.deployment == Deployment::Scale {
        return scale::run(&runtime, &args);
    }
    if args.deployment == Deployment::SameHost {
        return same_host(&runtime, &args, &names);
    }
    let mut config = Config::default();
    config.storage.num_units = args.units;
    let deployments: Vec<&str> = match args.deployment {
        Deployment::Scale | Deployment::SameHost => vec![],
        Deployment::Embedded => vec!["embedded"],
        Deployment::Remote => vec!["remote"],
        Deployment::Both => vec!["embedded", "remote"],
        Deployment::RemoteKv => vec!["remote-kv"],
        Deployment::EmbeddedKv => vec!["embedded-kv"],
    };
    for deployment in deployments {
        if deployment == "remote-kv" || deployment == "embedded-kv" {
            let url = args.kv_url.as_deref().ok_or_else(|| {
                Error::invalid(format!(
                    "--deployment {deployment} needs --kv-url (e.g. redis://127.0.0.1:6379)"
                ))
            })?;
            kv_deployment(&runtime, &args, &names, url, deployment == "embedded-kv")?;
            continue;
        }
        let remote = deployment == "remote";
        let servers = if remote {
            Some(start_remote(args.units)?)
        } else {
            None
        };
        let tq = match &servers {
            Some(s) => runtime.block_on(Client::connect_with(&s.controller, config.clone()))?,
            None => Client::embedded(config.clone())?,
        };
        println!();
        if remote {
            println!(
                "## Remote: controller and {} storage-unit processes on loopback, {} samples per batch, {} repetitions",
                args.units, args.samples, args.reps
            );
        } else {
            println!(
                "## Embedded, {} storage units, {} samples per batch, {} repetitions",
                args.units, args.samples, args.reps
            );
        }
        println!();
        println!("{}", kv::TABLE_HEADER);
        let mut memory = Vec::new();
        for name in &names {
            let batch = workloads::by_name(name, args.samples).expect("checked above");
            let (put_base, get_base) = if remote {
                // As many connections as tq moves the batch over (one per unit).
                let streams = args.units as usize;
                let (send, receive) =
                    runtime.block_on(baseline::tcp(batch.nbytes(), streams, args.reps))?;
                (
                    kv::Baseline {
                        name: format!("raw TCP send, {streams} conn"),
                        stats: send,
                    },
                    kv::Baseline {
                        name: format!("raw TCP receive, {streams} conn"),
                        stats: receive,
                    },
                )
            } else {
                let m = baseline::memcpy(&batch, args.reps);
                (
                    kv::Baseline {
                        name: "memcpy".into(),
                        stats: m,
                    },
                    kv::Baseline {
                        name: "memcpy".into(),
                        stats: m,
                    },
                )
            };
            let report = kv::run(
                &runtime, &tq, name, &batch, args.reps, put_base, get_base, !remote,
            )?;
            println!("{}", report.rows());
            memory.extend(report.memory_line());
        }
        if !memory.is_empty() {
            println!();
            for m in memory {
                println!("- {m}");
            }
        }
        // Where a put's and a get's wall time goes: the same calls one at a time.
        println!();
        println!(
            "A put and a get step by step (the calls kv_batch_put and kv_batch_get make, each timed alone; the floor is a controller round trip of one key):"
        );
        println!();
        println!("{}", steps::TABLE_HEADER);
        for name in &names {
            let batch = workloads::by_name(name, args.samples).expect("checked above");
            println!(
                "{}",
                steps::run(&runtime, &tq, name, &batch, args.reps)?.rows()
            );
        }
        let clears = clears::run(&runtime, &tq, args.reps)?;
        println!();
        println!(
            "Clears of many small cells (clear-28: kv_clear of 512 and 1024 keys × {} fields of {} B, each after a put and a get):",
            clears::FIELDS,
            clears::CELL_BYTES
        );
        println!();
        println!("{}", clears::TABLE_HEADER);
        println!("{}", clears.rows(deployment));
        // Latency is measured from a single-threaded client runtime, as a thread issuing
        // one request after another would use, so no reply needs a cross-thread wake-up.
        let rounds = args.latency_rounds.max(1);
        let single = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::internal("cannot start the runtime").with_source(e))?;
        let (lat, uncached, floor, woken) = single.block_on(async {
            let (cached, uncached) = match &servers {
                Some(s) => {
                    // The same rounds without the key cache, so its gain shows in one run.
                    let mut plain = config.clone();
                    plain.net.key_cache_entries = 0;
                    let plain = Client::connect_with(&s.controller, plain).await?;
                    let client = Client::connect_with(&s.controller, config.clone()).await?;
                    let (without, with) =
                        latency::put_get_alternating(&plain, &client, rounds).await?;
                    (with, Some(latency::Percentiles::of(without)))
                }
                None => (latency::put_get(&tq, rounds).await?, None),
            };
            let lat = latency::Percentiles::of(cached);
            let floor = latency::Percentiles::of(baseline::tcp_ping_pong(4096, rounds).await?);
            let woken =
                latency::Percentiles::of(baseline::tcp_ping_pong_cross_thread(4096, rounds).await?);
            Ok::<_, Error>((lat, uncached, floor, woken))
        })?;
        let uncached = uncached.map_or(String::new(), |u| {
            format!(
                " (without the key cache: p50 {} µs, p99 {} µs)",
                us(u.p50),
                us(u.p99)
            )
        });
        println!();
        println!("Latency, {rounds} rounds of kv_put (4 KiB) + kv_batch_get: p50 {} µs, p99 {} µs, max {} µs{uncached}; raw TCP 4 KiB ping-pong on one thread: p50 {} µs, p99 {} µs; to an echo thread that sleeps between messages: p50 {} µs, p99 {} µs.",
            us(lat.p50), us(lat.p99), us(lat.max), us(floor.p50), us(floor.p99), us(woken.p50), us(woken.p99));
        drop(tq);
        drop(servers);
    }
    if args.link_prompts > 0 && matches!(args.deployment, Deployment::Embedded | Deployment::Both) {
        let (n, bytes) = (8, 1 << 20);
        let r = links::run(&runtime, args.link_prompts, n, bytes, args.reps)?;
        println!();
        println!(
            "## Shared payloads (kv_link), embedded: {} prompts of 1 MiB, n = {n} responses each, {} repetitions",
            args.link_prompts, args.reps
        );
        println!();
        println!("{}", r.lines());
    }
    Ok(())
}

/// `--deployment same-host`: each workload through a TCP-only client and a shared-memory client
/// of the same remote deployment, next to raw loopback TCP over as many connections as units;
/// then one put, get and clear per client with the memory of this process and the units.
fn same_host(runtime: &tokio::runtime::Runtime, args: &BenchArgs, names: &[&str]) -> Result<()> {
    let servers = start_remote(args.units)?;
    let mut config = Config::default();
    config.storage.num_units = args.units;
    let tcp = runtime.block_on(Client::connect_with(&servers.controller, config.clone()))?;
    config.net.shared_memory = true;
    let shm = runtime.block_on(Client::connect_with(&servers.controller, config))?;
    // The first child is the controller, the others are the units.
    let mut pids = vec![std::process::id()];
    pids.extend(servers.children.iter().skip(1).map(|c| c.id()));
    println!();
    println!(
        "## Same host: controller and {} storage-unit processes on loopback, payloads over TCP and over shared memory (`net.shared_memory`), {} samples per batch, {} repetitions",
        args.units, args.samples, args.reps
    );
    println!();
    println!("{}", kv::TABLE_HEADER);
    let mut memory = Vec::new();
    for name in names {
        let batch = workloads::by_name(name, args.samples).expect("checked above");
        let streams = args.units as usize;
        let (send, receive) =
            runtime.block_on(baseline::tcp(batch.nbytes(), streams, args.reps))?;
        let put_base = kv::Baseline {
            name: format!("raw TCP send, {streams} conn"),
            stats: send,
        };
        let get_base = kv::Baseline {
            name: format!("raw TCP receive, {streams} conn"),
            stats: receive,
        };
        for (client, label) in [(&tcp, "TCP"), (&shm, "shared memory")] {
            let workload = format!("{name}, {label}");
            let report = kv::run(
                runtime,
                client,
                &workload,
                &batch,
                args.reps,
                put_base.clone(),
                get_base.clone(),
                false,
            )?;
            let rows = report.rows();
            // The baselines once per workload, before the TCP client's rows.
            let skip = if label == "TCP" { 0 } else { 2 };
            for row in rows.lines().skip(skip) {
                println!("{row}");
            }
            let steps = same_host::memory_steps(runtime, client, &batch, &pids)?;
            memory.push(steps.row(name, label, batch.nbytes()));
        }
    }
    if args.latency_rounds > 0 {
        // A one-sample round trip through each client, in alternating blocks: a 4 KiB get is
        // known to be small and skips the channel, so the two should agree.
        let rounds = args.latency_rounds;
        let (over_tcp, over_shm) =
            runtime.block_on(latency::put_get_alternating(&tcp, &shm, rounds))?;
        let (over_tcp, over_shm) = (
            latency::Percentiles::of(over_tcp),
            latency::Percentiles::of(over_shm),
        );
        println!();
        println!(
            "Latency, {rounds} rounds of kv_put (4 KiB) + kv_batch_get: TCP client p50 {} µs, p99 {} µs; shared-memory client p50 {} µs, p99 {} µs.",
            us(over_tcp.p50),
            us(over_tcp.p99),
            us(over_shm.p50),
            us(over_shm.p99)
        );
    }
    println!();
    println!(
        "Memory of this process and the {} unit processes together, MiB of growth over each step from before the put (held = their private memory + the growth of the system's shared memory, where segments live; peak RSS counts a shared page in every process that touches it):",
        args.units
    );
    println!();
    println!("{}", same_host::TABLE_HEADER);
    for row in memory {
        println!("{row}");
    }
    Ok(())
}

/// `--deployment remote-kv` / `embedded-kv`: put, get and clear through a client of a
/// controller (a process of its own, or in this process) whose storage is the KV store at
/// `url`, next to the store's own pipelined writes, reads and deletes of the same cells, in the
/// same run.
fn kv_deployment(
    runtime: &tokio::runtime::Runtime,
    args: &BenchArgs,
    names: &[&str],
    url: &str,
    embedded: bool,
) -> Result<()> {
    let config_path = write_kv_config(url, args.kv_redis_wait)?;
    let servers = if embedded {
        None
    } else {
        Some(start_remote_kv(&config_path).inspect_err(|_| {
            let _ = std::fs::remove_file(&config_path);
        })?)
    };
    let result = (|| {
        let tq = match &servers {
            Some(s) => runtime.block_on(Client::connect_with(&s.controller, Config::default()))?,
            None => Client::embedded(Config::load(Some(&config_path))?)?,
        };
        let raw = tq_bench::kv_raw::RawKv::open(url)?;
        println!();
        println!(
            "## {} controller + KV store `{}` ({}{}), {} samples per batch, {} repetitions",
            if embedded { "Embedded" } else { "Remote" },
            tq_bench::kv_raw::redact_url(url),
            raw.describe(),
            if args.kv_redis_wait > 0 {
                format!(", tq's writes wait for {} replica(s)", args.kv_redis_wait)
            } else {
                String::new()
            },
            args.samples,
            args.reps
        );
        println!();
        println!("{}", kv::TABLE_HEADER);
        for name in names {
            let batch = workloads::by_name(name, args.samples).expect("checked above");
            let [put, get, delete] = runtime.block_on(raw.run(&batch, args.reps))?;
            let mut report = kv::run(
                runtime,
                &tq,
                name,
                &batch,
                args.reps,
                kv::Baseline {
                    name: "raw pipelined write".into(),
                    stats: put,
                },
                kv::Baseline {
                    name: "raw pipelined read".into(),
                    stats: get,
                },
                false,
            )?;
            report.clear_baseline = Some(kv::Baseline {
                name: "raw pipelined delete".into(),
                stats: delete,
            });
            println!("{}", report.rows());
        }
        if let Some(s) = &servers {
            print_clear_steps(runtime, &s.controller, args.samples, args.reps)?;
        }
        Ok(())
    })();
    drop(servers);
    let _ = std::fs::remove_file(config_path);
    result
}

/// The controller's part of a KV clear (mark the keys' samples, then release them), measured
/// against the deployment's controller process, next to an empty request and a raw TCP round
/// trip to a thread that sleeps between messages: the floor under any call to another process.
fn print_clear_steps(
    runtime: &tokio::runtime::Runtime,
    controller_url: &str,
    keys: usize,
    reps: usize,
) -> Result<()> {
    let plane = tq_controller::RemoteControlPlane::new(
        tq_net::Pool::new(tq_net::ClientConfig::default()),
        controller_url.parse()?,
        Duration::from_secs(30),
    );
    let rounds = (reps * 20).max(50);
    let (steps, raw) = runtime.block_on(async {
        let steps = controller::kv_clear_steps(&plane, keys, 4, rounds).await?;
        let raw = baseline::tcp_ping_pong_cross_thread(64, rounds).await?;
        Ok::<_, Error>((steps, tq_bench::Stats::from_samples(raw)))
    })?;
    let times = |s: &tq_bench::Stats| s.median.as_secs_f64() / raw.median.as_secs_f64();
    println!();
    println!("### The controller's part of a clear: {keys} keys × 4 fields, {rounds} rounds");
    println!();
    println!("| step | ms median (min–max) | × raw round trip |");
    println!("|---|---|---|");
    println!(
        "| raw TCP round trip, 64 B, to a sleeping thread | {} | 1.00 |",
        ms_range(&raw)
    );
    let [empty, mark, release] = &steps;
    for (name, s) in [
        ("empty request (`list_partitions`)", empty),
        ("`kv_mark_clearing`", mark),
        ("`release`", release),
    ] {
        println!("| {name} | {} | {:.2} |", ms_range(s), times(s));
    }
    Ok(())
}
