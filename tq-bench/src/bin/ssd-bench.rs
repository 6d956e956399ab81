//! SSD offload benchmark: `cargo run --release -p tq-bench --bin ssd-bench -- [--path DIR]
//! [--total-mib N] [--reps N] [--rss-samples N] [--skip-throughput] [--skip-rss]`.
//!
//! The memory runs each happen in a fresh child process (`ssd-bench rss-child ...`) so that
//! neither inherits the other's heap.

use std::path::PathBuf;
use std::process::Command;
use tq_bench::ssd::{rss_workload, throughput, RssReport};

const GIB: f64 = (1u64 << 30) as f64;

fn arg<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> T {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path: PathBuf = arg(&args, "--path", PathBuf::from("target/ssd-bench"));
    if args.get(1).map(String::as_str) == Some("rss-child") {
        let mode: String = arg(&args, "--mode", "ssd".to_string());
        let samples: usize = arg(&args, "--rss-samples", 500);
        let trim = !args.iter().any(|a| a == "--no-trim");
        let dir = (mode == "ssd").then_some(path.as_path());
        let r = runtime().block_on(rss_workload(dir, samples, 3, trim));
        println!(
            "RSS {} {} {} {} {}",
            r.peak, r.before_clear, r.after_clear, r.disk_bytes, r.live_bytes
        );
        return;
    }
    std::fs::create_dir_all(&path).expect("bench directory");
    let total_mib: usize = arg(&args, "--total-mib", 1024);
    let reps: usize = arg(&args, "--reps", 5);
    let rss_samples: usize = arg(&args, "--rss-samples", 500);
    println!(
        "# SSD bench: path {}, {} CPUs",
        path.display(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    if !args.iter().any(|a| a == "--skip-throughput") {
        println!("\n## Throughput ({total_mib} MiB per repetition, {reps} reps after 1 warm-up; Gbit/s median [min-max])");
        println!("| cell | what | put Gbit/s | get Gbit/s |");
        println!("|---|---|---|---|");
        let rows = runtime().block_on(throughput(&path, total_mib, reps));
        let mut base = (0.0, 0.0);
        for r in rows {
            let gb = |s: &tq_bench::Stats| {
                let rate = |d: std::time::Duration| r.bytes as f64 * 8.0 / 1e9 / d.as_secs_f64();
                (s.gbit_per_s(r.bytes), rate(s.max), rate(s.min))
            };
            let (p, pmin, pmax) = gb(&r.put);
            let (g, gmin, gmax) = gb(&r.get);
            let rel = if r.what.starts_with("std::fs") {
                base = (p, g);
                String::new()
            } else {
                format!(
                    " ({:.0}% / {:.0}% of std::fs)",
                    100.0 * p / base.0,
                    100.0 * g / base.1
                )
            };
            println!(
                "| {} MiB | {}{rel} | {p:.2} [{pmin:.2}-{pmax:.2}] | {g:.2} [{gmin:.2}-{gmax:.2}] |",
                r.cell_mib, r.what
            );
        }
    }
    if !args.iter().any(|a| a == "--skip-rss") {
        let gib = rss_samples as f64 * 5.0 / 1024.0;
        println!("\n## Memory ({rss_samples} samples x (4 MiB offloaded + 4 x 256 KiB in memory) = {gib:.2} GiB, 80% offloaded; 3 put-get-clear iterations, last reported)");
        println!("| mode | peak RSS GiB | RSS before clear GiB | RSS after clear GiB | disk GiB |");
        println!("|---|---|---|---|---|");
        let exe = std::env::current_exe().expect("exe");
        let mut results: Vec<(String, RssReport)> = Vec::new();
        for (label, mode, extra) in [
            ("in memory", "memory", None),
            ("SSD offload", "ssd", None),
            ("SSD offload, no malloc_trim", "ssd", Some("--no-trim")),
        ] {
            let mut cmd = Command::new(&exe);
            cmd.args(["rss-child", "--mode", mode, "--path"])
                .arg(&path)
                .args(["--rss-samples", &rss_samples.to_string()]);
            if let Some(e) = extra {
                cmd.arg(e);
            }
            let out = cmd.output().expect("child runs");
            let text = String::from_utf8_lossy(&out.stdout);
            let Some(line) = text.lines().find(|l| l.starts_with("RSS ")) else {
                eprintln!(
                    "{label}: child failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                continue;
            };
            let v: Vec<u64> = line[4..]
                .split(' ')
                .filter_map(|x| x.parse().ok())
                .collect();
            let r = RssReport {
                peak: v[0],
                before_clear: v[1],
                after_clear: v[2],
                disk_bytes: v[3],
                live_bytes: v[4],
            };
            println!(
                "| {label} | {:.3} | {:.3} | {:.3} | {:.3} |",
                r.peak as f64 / GIB,
                r.before_clear as f64 / GIB,
                r.after_clear as f64 / GIB,
                r.disk_bytes as f64 / GIB
            );
            results.push((label.to_string(), r));
        }
        if let (Some(m), Some(s)) = (
            results.iter().find(|(l, _)| l == "in memory"),
            results.iter().find(|(l, _)| l == "SSD offload"),
        ) {
            println!(
                "\nRSS with offload / in memory: peak {:.2}, before clear {:.2}",
                s.1.peak as f64 / m.1.peak as f64,
                s.1.before_clear as f64 / m.1.before_clear as f64
            );
        }
    }
}
