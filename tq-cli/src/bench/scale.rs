//! `tq bench --deployment scale`: the controller at scale — many clients, each with connections
//! of its own, draining partitions of several sizes against one `tq serve --units 2`, next to
//! the in-process cost of one fetch by partition size.

use super::{ms, us, BenchArgs};
use crate::procs::spawn_server;
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

    let (mut server, url) =
        spawn_server(&["serve", "--listen", "tcp://127.0.0.1:0", "--units", "2"])?;
    let server_pid = server.id();
    println!();
    println!(
        "## Controller at scale: C clients (own connections) draining a partition by fetch({batch}) → get_data → clear, one `tq serve --units 2` on loopback"
    );
    println!();
    println!(
        "| samples | payload | clients | samples/s | controller req/s | fetch p50 ms | fetch p99 ms | connect s | server KiB per idle client | exactly once |\n|---|---|---|---|---|---|---|---|---|---|"
    );
    let mut failed = Vec::new();
    for &payload in &payloads {
        for &n in &sizes {
            for &c in &clients {
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
                    "| {n} | {} | {c} | {:.0} | {:.0} | {} | {} | {:.2} | {per_client} | {} |",
                    if payload == 0 {
                        "none".to_string()
                    } else {
                        format!("{payload} B")
                    },
                    run.samples_per_s(),
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
