//! `tq bench --deployment scale`: the controller at scale — many clients, each with connections
//! of its own, draining partitions of several sizes against one `tq serve --units 2`, next to
//! the in-process cost of one fetch by partition size.

use super::{ms, us, BenchArgs};
use crate::servers::spawn_server;
use tq_bench::scale;
use tq_core::{Error, Result};

fn list(text: &str, what: &str) -> Result<Vec<usize>> {
    text.split(',')
        .map(|s| {
            s.trim()
                .parse::<usize>()
                .map_err(|_| Error::invalid(format!("{what}: `{s}` is not a number")))
        })
        .collect()
}

pub fn run(runtime: &tokio::runtime::Runtime, args: &BenchArgs) -> Result<()> {
    let clients = list(&args.scale_clients, "--scale-clients")?;
    let sizes = list(&args.scale_samples, "--scale-samples")?;
    let payloads = list(&args.scale_payloads, "--scale-payloads")?;
    let batch = args.scale_batch.max(1);

    println!();
    println!(
        "## Controller at scale: one fetch of {batch} in process, by partition size ({} repetitions)",
        args.reps.max(super::CONTROLLER_MIN_REPS)
    );
    println!();
    println!("| samples in the partition | µs median (min–max) | × the smallest |\n|---|---|---|");
    let mut smallest = None;
    for &n in &sizes {
        let s = scale::fetch_cost(runtime, n, batch, args.reps.max(super::CONTROLLER_MIN_REPS))?;
        let base = *smallest.get_or_insert(s.median);
        println!(
            "| {n} | {} ({}–{}) | {:.2} |",
            us(s.median),
            us(s.min),
            us(s.max),
            s.median.as_secs_f64() / base.as_secs_f64().max(1e-12)
        );
    }

    println!();
    println!(
        "## Controller at scale: whole-partition queries in process, by partition size (µs median; ns per sample)"
    );
    println!();
    println!("| samples in the partition | production_status (1 field) | consumption_status | status (`tq stats`) | floor: N ids + N flags into Vecs, same run |\n|---|---|---|---|---|");
    for &n in &sizes {
        let q = scale::query_costs(
            runtime,
            n,
            args.reps.max(super::CONTROLLER_MIN_REPS) / 10 + 5,
        )?;
        let per = |d: std::time::Duration| d.as_secs_f64() * 1e9 / n.max(1) as f64;
        println!(
            "| {n} | {} ({:.1}) | {} ({:.1}) | {} ({:.2}) | {} ({:.1}) |",
            us(q.production_status.median),
            per(q.production_status.median),
            us(q.consumption_status.median),
            per(q.consumption_status.median),
            us(q.status.median),
            per(q.status.median),
            us(q.answer_floor.median),
            per(q.answer_floor.median),
        );
    }

    let dir = tempfile_dir()?;
    println!();
    println!(
        "## Controller at scale: fetch({batch}) made durable on a state dir (`--state-dir` in {}), by partition size",
        dir.display()
    );
    println!();
    println!("| samples in the partition | fetch + commit ms median (min–max) | × the smallest | disk floor: append 1 KiB + fdatasync, ms |\n|---|---|---|---|");
    let mut smallest = None;
    for &n in &sizes {
        let run_dir = dir.join(format!("n{n}"));
        let s = scale::state_dir_fetch_cost(runtime, &run_dir, n, batch, 50)?;
        let floor = scale::append_sync_floor(&dir, 1024, 50)?;
        let _ = std::fs::remove_dir_all(&run_dir);
        let base = *smallest.get_or_insert(s.median);
        println!(
            "| {n} | {} ({}–{}) | {:.2} | {} |",
            ms(s.median),
            ms(s.min),
            ms(s.max),
            s.median.as_secs_f64() / base.as_secs_f64().max(1e-12),
            ms(floor.median)
        );
    }
    let _ = std::fs::remove_dir_all(&dir);

    let per_partition = sizes.first().copied().unwrap_or(4096);
    println!();
    println!(
        "## Controller at scale: fetch({batch}) + give back in process from OS threads at once, {} samples per partition ({} cores here)",
        per_partition,
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    println!();
    println!("| threads | partitions | rounds/s | × one thread |\n|---|---|---|---|");
    // 20,000 rounds per thread at the documented `--reps 5`.
    let rounds = (args.reps.max(1) * 4_000).min(20_000);
    let mut one = None;
    for (threads, partitions) in [(1, 1), (2, 2), (2, 1), (4, 4), (4, 1)] {
        let run = scale::parallel_fetches(threads, partitions, per_partition, batch, rounds)?;
        let base = *one.get_or_insert(run.rounds_per_s);
        println!(
            "| {threads} | {partitions} | {:.0} | {:.2} |",
            run.rounds_per_s,
            run.rounds_per_s / base.max(1e-9)
        );
    }

    // The transport's floor at each client count, measured before the deployment starts.
    let mut raw = Vec::with_capacity(clients.len());
    for &c in &clients {
        let per_client = (args.reps.max(1) * 40_000 / c.max(1)).max(50);
        raw.push(runtime.block_on(scale::raw_round_trips(c, per_client))?);
    }

    let (mut server, url) =
        spawn_server(&["serve", "--listen", "tcp://127.0.0.1:0", "--units", "2"])?;
    let server_pid = server.id();
    println!();
    println!(
        "## Controller at scale: C clients (own connections) draining a partition by fetch({batch}) → get_data → clear, one `tq serve --units 2` on loopback"
    );
    println!();
    println!(
        "(raw floor: {} B round trips to an echo server on loopback with C connections, measured in this run, at 5 per cycle without a payload and 7 with one, × {batch} samples)",
        scale::RAW_MESSAGE_BYTES
    );
    println!();
    println!(
        "| samples | payload | clients | samples/s | raw floor samples/s | × floor | controller req/s | fetch p50 ms | fetch p99 ms | connect s | server KiB per idle client | exactly once |\n|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    let mut failed = Vec::new();
    for &payload in &payloads {
        for &n in &sizes {
            for (&c, &raw_rt) in clients.iter().zip(&raw) {
                // A cycle's messages: fetch, mark, a clear per unit, release; with a payload
                // also a read per unit.
                let messages = if payload == 0 { 5.0 } else { 7.0 };
                let floor = raw_rt / messages * batch as f64;
                let run = runtime.block_on(scale::many_clients(
                    &url,
                    Some(server_pid),
                    c,
                    n,
                    payload,
                    batch,
                ))?;
                let per_client = run
                    .server_bytes_per_client
                    .map_or("n/a".to_string(), |b| format!("{:.0}", b as f64 / 1024.0));
                println!(
                    "| {n} | {} | {c} | {:.0} | {floor:.0} | {:.2} | {:.0} | {} | {} | {:.2} | {per_client} | {} |",
                    if payload == 0 {
                        "none".to_string()
                    } else {
                        format!("{payload} B")
                    },
                    run.samples_per_s(),
                    run.samples_per_s() / floor.max(1e-9),
                    run.requests_per_s(),
                    ms(run.fetch_quantile(0.5)),
                    ms(run.fetch_quantile(0.99)),
                    run.connect.as_secs_f64(),
                    if run.exactly_once() {
                        "yes".to_string()
                    } else {
                        format!(
                            "NO: {} of {} handed out, {} twice, {} errors",
                            run.consumed, run.samples, run.duplicates, run.errors
                        )
                    },
                );
                if !run.exactly_once() {
                    failed.push(format!(
                        "{n} samples, {c} clients: {}",
                        run.first_error
                            .clone()
                            .unwrap_or_else(|| "samples missing or twice".into())
                    ));
                }
            }
        }
    }
    let _ = server.kill();
    let _ = server.wait();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(Error::internal(format!(
            "the many-clients runs were not exactly once: {}",
            failed.join("; ")
        )))
    }
}

/// A new directory for the state-dir rows, under the working directory's `target/` when there
/// is one (a real disk; the system temp dir may be memory).
fn tempfile_dir() -> Result<std::path::PathBuf> {
    let base = if std::path::Path::new("target").is_dir() {
        std::path::PathBuf::from("target")
    } else {
        std::env::temp_dir()
    };
    let dir = base.join(format!("tq-bench-scale-{}", std::process::id()));
    std::fs::create_dir_all(&dir)
        .map_err(|e| Error::internal(format!("cannot create {}: {e}", dir.display())))?;
    Ok(dir)
}
