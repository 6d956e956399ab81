//! `tq`: the command-line entry point.

#[cfg(feature = "bench")]
mod bench;
mod checkpoint;
mod demo;
mod procs;
mod serve;
mod soak;
mod work;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "tq",
    version,
    about = "tq: a streaming sample store for RL post-training"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
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
    /// Run producers and consumers for a long time against a deployment of its own, killing and
    /// restarting storage units, and check that nothing is lost silently or handed out twice.
    Soak(soak::SoakArgs),
    /// Save or load a checkpoint of a running deployment's controller state (payloads stay in
    /// the shared store: KV on Redis or object storage).
    Checkpoint(checkpoint::CheckpointArgs),
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = match cli.command {
        Command::Demo(args) => runtime.block_on(demo::run(args)),
        #[cfg(feature = "bench")]
        Command::Bench(args) => bench::run(args),
        Command::Serve(args) => runtime.block_on(serve::serve(args)),
        Command::Controller(args) => runtime.block_on(serve::controller_server(args)),
        Command::StorageUnit(args) => runtime.block_on(serve::storage_unit(args)),
        Command::Produce(args) => runtime.block_on(work::produce(args)),
        Command::Consume(args) => runtime.block_on(work::consume(args)),
        Command::Soak(args) => soak::run(args),
        Command::Checkpoint(args) => runtime.block_on(checkpoint::run(args)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
