//! `tq`: the command-line entry point.

#[cfg(feature = "bench")]
mod bench;
mod checkpoint;
mod config_cmd;
mod demo;
mod deployment;
mod observe;
mod partition;
mod procs;
mod serve;
#[cfg(any(feature = "bench", feature = "soak"))]
mod servers;
#[cfg(feature = "soak")]
mod soak;
mod work;

use clap::{CommandFactory, FromArgMatches, Subcommand};
use std::process::ExitCode;

#[derive(clap::Parser)]
#[command(
    name = "tq",
    version,
    about = "tq: a streaming sample store for RL post-training"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log lines as human-readable text or as one JSON object per line (for log shippers).
    /// Levels come from RUST_LOG (default `warn`); request spans are at `info`.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run an embedded GRPO-style pipeline (prompts → rollout → reward → trainer) and check
    /// that every sample is trained exactly once.
    Demo(demo::DemoArgs),
    /// Measure the standard workloads on the embedded deployment next to in-run baselines.
    #[cfg(feature = "bench")]
    Bench(bench::BenchArgs),
    /// Run a controller and N storage units in this process.
    Serve(serve::ServeArgs),
    /// Run a controller; storage units register with it.
    Controller(serve::ControllerArgs),
    /// Run one storage unit and register it with a controller.
    StorageUnit(serve::UnitArgs),
    /// Write samples into a running deployment (one pipeline stage in its own process).
    Produce(work::ProduceArgs),
    /// Consume samples from a running deployment with acknowledged delivery, printing
    /// `acked <id>` per sample.
    Consume(work::ConsumeArgs),
    /// Run a mixed workload from many client processes for a long time against a deployment of
    /// its own, with faults (killed and paused storage, killed clients), and check that nothing
    /// is lost silently, handed out twice, read wrong or left behind.
    #[cfg(feature = "soak")]
    Soak(soak::SoakArgs),
    /// One client process of `tq soak` (started by it).
    #[cfg(feature = "soak")]
    #[command(hide = true)]
    SoakWorker(soak::worker::WorkerArgs),
    /// Save or load a checkpoint of a running deployment's controller state (payloads stay in
    /// the shared store: KV on Redis or object storage).
    Checkpoint(checkpoint::CheckpointArgs),
    /// Show a running deployment: partitions (samples, production and consumption per task,
    /// leases), storage units (cells, bytes, capacity, SSD) and the controller.
    Stats(observe::StatsArgs),
    /// Check a configuration file, or print the configuration reference.
    Config(config_cmd::ConfigArgs),
    /// Look after a running deployment's partitions: list, clear, drop, complete,
    /// reset-consumption.
    Partition(partition::PartitionArgs),
    /// Check that a deployment answers (the controller and every storage unit); exit code 0
    /// when it does, 1 with the reason otherwise. For probes and scripts.
    Health(observe::HealthArgs),
}

/// The storage backends this binary was built with (`tq --version` lists them): a controller
/// configured for one that is missing refuses to start.
fn backends() -> Vec<&'static str> {
    let mut out = vec!["simple", "ssd"];
    if cfg!(feature = "kv") {
        out.push("kv (memory://)");
    }
    if cfg!(feature = "redis") {
        out.push("redis");
    }
    if cfg!(feature = "object-store") {
        out.push("object-store (file://)");
    }
    out
}

/// Small blocks from mimalloc, payload buffers from the system allocator (`tq::alloc`; why in
/// docs/decisions/0050-programs-allocate-small-blocks-with-mimalloc.md).
#[global_allocator]
static ALLOCATOR: tq::alloc::SplitAllocator = tq::alloc::SplitAllocator;

/// Runs a command's future on the runtime of the commands that are not servers (servers run on
/// one sized by their configuration: `tq::server::server_runtime`).
fn on_runtime(command: impl std::future::Future<Output = tq::Result<()>>) -> tq::Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| tq::Error::internal("cannot start the async runtime").with_source(e))?
        .block_on(command)
}

fn main() -> ExitCode {
    // Built once per process, so leaking it is the same as a static.
    let version: &'static str = Box::leak(
        format!(
            "{} (storage backends: {})",
            env!("CARGO_PKG_VERSION"),
            backends().join(", ")
        )
        .into_boxed_str(),
    );
    let matches = Cli::command().version(version).get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    // Colours only on a terminal: a log file or collector gets plain text.
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().init(),
    }
    let result = match cli.command {
        Command::Demo(args) => on_runtime(demo::run(args)),
        #[cfg(feature = "bench")]
        Command::Bench(args) => bench::run(args),
        Command::Serve(args) => serve::serve(args),
        Command::Controller(args) => serve::controller_server(args),
        Command::StorageUnit(args) => serve::storage_unit(args),
        Command::Produce(args) => on_runtime(work::produce(args)),
        Command::Consume(args) => on_runtime(work::consume(args)),
        #[cfg(feature = "soak")]
        Command::Soak(args) => soak::run(args),
        #[cfg(feature = "soak")]
        Command::SoakWorker(args) => on_runtime(soak::worker::run(args)),
        Command::Checkpoint(args) => on_runtime(checkpoint::run(args)),
        Command::Stats(args) => on_runtime(observe::stats(args)),
        Command::Health(args) => on_runtime(observe::health(args)),
        Command::Partition(args) => on_runtime(partition::run(args)),
        Command::Config(args) => config_cmd::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
