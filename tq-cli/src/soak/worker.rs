//! `tq soak-worker`: one client process of a soak, which the soak may kill at any moment.
//!
//! - role `stream`: a producer writing keyed samples (`kv_batch_put`, tag `id`) and a consumer
//!   taking them with an acknowledged stream, checking every row's checksum, acknowledging,
//!   then clearing the samples (metadata API); samples a fault destroyed are read one by one and
//!   reported lost, never taken for data.
//! - role `kv`: rounds over keys of its own: put, `kv_batch_update` (add), `kv_link` to public
//!   rows, field clears, reads checked against what it wrote, and clears checked to read
//!   `NotFound`.
//!
//! Everything it does goes to its log (see [`super::ledger`]). It stops when its standard input
//! closes: the producer stops, the consumer drains what is left, and it exits.

mod kv;
mod stream;

use super::ledger::Log;
use clap::{Args, ValueEnum};
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tq_client::{Client, Config};
use tq_core::{Error, Result, Retry};

/// The partition of the stream samples.
pub const STREAM_PARTITION: &str = "soak";
/// The partition of the KV workers' keys.
pub const KV_PARTITION: &str = "soak-kv";
/// Where the KV workers' linked rows live.
pub const PUBLIC_PARTITION: &str = "__public__/soak";

/// How long a failing step is retried before it is reported as failed.
const RETRY_BUDGET: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Role {
    Stream,
    Kv,
}

#[derive(Args, Debug, Clone)]
pub struct WorkerArgs {
    /// The controller (`tcp://host:port`).
    #[arg(long)]
    connect: String,
    #[arg(long, value_enum)]
    role: Role,
    /// This worker's number (unique per incarnation: sample ids and keys are derived from it).
    #[arg(long)]
    worker: u64,
    /// The log file.
    #[arg(long)]
    log: PathBuf,
    #[arg(long, default_value_t = 16)]
    batch: usize,
    #[arg(long, default_value_t = 256)]
    width: usize,
    /// The producer waits while the stream partition holds more samples than this.
    #[arg(long, default_value_t = 8192)]
    max_backlog: usize,
    /// Lease of a consumed batch, in milliseconds.
    #[arg(long, default_value_t = 5000)]
    lease_ms: u64,
}

struct Ctx {
    tq: Client,
    log: Log,
    args: WorkerArgs,
    stop: Arc<AtomicBool>,
    /// Set when this worker's producer has written its last put: its consumer drains only
    /// after that, so no sample of its own arrives after the consumers have left.
    produced_all: AtomicBool,
    /// Errors already printed in full (step and kind).
    said: std::sync::Mutex<std::collections::HashSet<String>>,
}

impl Ctx {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    fn error(&self, what: &str, e: &Error) {
        self.log.line(&format!("E {what}: {:?}", e.kind()));
        self.say_first(what, e);
    }

    /// Prints the first error of each kind per step in full, for the person reading the run.
    fn say_first(&self, what: &str, e: &Error) {
        let first = self
            .said
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(format!("{what}: {:?}", e.kind()));
        if first {
            eprintln!("soak worker {}: {what}: {e}", self.args.worker);
        }
    }

    /// Runs `op` until it succeeds, fails for good, or has failed for [`RETRY_BUDGET`].
    /// `idempotent`: also repeat it after an outcome-unknown failure.
    async fn retrying<T, F, Fut>(&self, what: &str, idempotent: bool, mut op: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let started = Instant::now();
        let mut pause = Duration::from_millis(20);
        loop {
            match op().await {
                Ok(v) => return Ok(v),
                Err(e) => {
                    let again = match e.retry() {
                        Retry::Safe => true,
                        Retry::OutcomeUnknown => idempotent,
                        _ => false,
                    };
                    if !again || started.elapsed() > RETRY_BUDGET {
                        return Err(e);
                    }
                    self.log
                        .line(&format!("E {what} (retried): {:?}", e.kind()));
                    self.say_first(&format!("{what} (retried)"), &e);
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(500));
                }
            }
        }
    }
}

pub async fn run(args: WorkerArgs) -> Result<()> {
    if args.batch == 0 || args.width == 0 {
        return Err(Error::invalid("--batch and --width must be at least 1"));
    }
    let log = Log::create(&args.log)?;
    let stop = Arc::new(AtomicBool::new(false));
    {
        // Standard input closing is the signal to finish.
        let stop = stop.clone();
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
            stop.store(true, Ordering::Relaxed);
        });
    }
    let mut config = Config::default();
    config.net.request_timeout_ms = 5_000;
    let started = Instant::now();
    let tq = loop {
        match Client::connect_with(&args.connect, config.clone()).await {
            Ok(tq) => break tq,
            Err(e) if started.elapsed() < RETRY_BUDGET => {
                log.line(&format!("E connect (retried): {:?}", e.kind()));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(e),
        }
    };
    let ctx = Arc::new(Ctx {
        tq,
        log,
        args,
        stop,
        produced_all: AtomicBool::new(false),
        said: Default::default(),
    });
    match ctx.args.role {
        Role::Stream => {
            let producer = tokio::spawn(stream::produce(ctx.clone()));
            stream::consume(&ctx).await;
            producer
                .await
                .map_err(|e| Error::internal(format!("the producer panicked: {e}")))?;
        }
        Role::Kv => kv::kv_rounds(&ctx).await,
    }
    Ok(())
}
