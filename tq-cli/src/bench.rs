//! `tq bench`: the standard workloads on the embedded deployment, each next to a memcpy of the
//! same bytes measured in the same run, plus the controller's metadata cost. Prints markdown.

use clap::Args;
use tq_bench::{controller, embedded, workloads};
use tq_client::Config;
use tq_core::{Error, Result};

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
    /// Number of in-memory storage units.
    #[arg(long, default_value_t = 2)]
    units: u32,
}

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
    println!("## Controller (no payload), {} repetitions", args.reps);
    println!();
    println!("| operation | ms median (min–max) |\n|---|---|");
    let s = controller::allocate_notify_fetch(&runtime, args.samples, 28, args.reps.max(5))?;
    println!(
        "| allocate + notify + fetch, {} samples × 28 fields | {:.3} ({:.3}–{:.3}) |",
        args.samples,
        s.median.as_secs_f64() * 1e3,
        s.min.as_secs_f64() * 1e3,
        s.max.as_secs_f64() * 1e3
    );
    let s = controller::kv_retrieve_meta(&runtime, args.samples, 4, args.reps.max(5))?;
    println!(
        "| kv_retrieve_meta, {} keys | {:.3} ({:.3}–{:.3}) |",
        args.samples,
        s.median.as_secs_f64() * 1e3,
        s.min.as_secs_f64() * 1e3,
        s.max.as_secs_f64() * 1e3
    );
    println!();
    println!(
        "## Embedded, {} samples per batch, {} storage units, {} repetitions",
        args.samples, args.units, args.reps
    );
    println!();
    println!("{}", embedded::TABLE_HEADER);
    let mut memory = Vec::new();
    for name in names {
        let batch = workloads::by_name(name, args.samples).expect("checked above");
        let mut config = Config::default();
        config.storage.num_units = args.units;
        let report = embedded::run(&runtime, config, name, &batch, args.reps)?;
        println!("{}", report.rows());
        memory.push(report.memory_line());
    }
    println!();
    for m in memory {
        println!("- {m}");
    }
    Ok(())
}
