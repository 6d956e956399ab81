//! The controller at scale: many clients, each with connections of its own, draining one
//! partition by `fetch(batch)` → `get_data` → `clear_samples`; and the in-process cost of one
//! fetch by partition size (what a fetch costs the controller, without the network).

use crate::controller::{insert_request, produced};
use crate::measure::{measure_rounds, Stats};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tq_client::Client;
use tq_controller::{ControlPlane, Controller, ControllerConfig, GetMetaRequest, Wait};
use tq_core::{Batch, Column, DType, Error, ErrorKind, FieldMeta, Result, SampleId, Tensor};

/// What one many-clients run did.
#[derive(Debug, Clone)]
pub struct ScaleRun {
    pub clients: usize,
    pub samples: usize,
    pub payload_bytes: usize,
    /// From the first fetch to the last client's end.
    pub elapsed: Duration,
    /// Connecting every client (each with its own connections).
    pub connect: Duration,
    /// What the server process's resident memory grew by while the clients connected (idle),
    /// per client (`None` where /proc does not say).
    pub server_bytes_per_client: Option<u64>,
    pub fetches: u64,
    /// Controller requests: fetches plus the two of each clear (mark, release).
    pub controller_requests: u64,
    /// Client-side latency of each fetch that returned samples, sorted.
    pub fetch_latency: Vec<Duration>,
    /// Samples handed out, and how many of them twice.
    pub consumed: usize,
    pub duplicates: usize,
    pub errors: usize,
    /// The first error, to say what went wrong.
    pub first_error: Option<String>,
}

impl ScaleRun {
    pub fn samples_per_s(&self) -> f64 {
        self.consumed as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    pub fn requests_per_s(&self) -> f64 {
        self.controller_requests as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// The `q` quantile (0..=1) of the fetch latency.
    pub fn fetch_quantile(&self, q: f64) -> Duration {
        if self.fetch_latency.is_empty() {
            return Duration::ZERO;
        }
        let i = ((self.fetch_latency.len() - 1) as f64 * q).round() as usize;
        self.fetch_latency[i]
    }

    /// Every sample handed out exactly once, with no error.
    pub fn exactly_once(&self) -> bool {
        self.consumed == self.samples && self.duplicates == 0 && self.errors == 0
    }
}

/// Writes `samples` samples (field `id`, plus `x` of `payload_bytes` bytes when not 0) into a
/// new partition of the deployment at `url`, marks it complete, connects `clients` clients and
/// lets each loop `fetch(batch)` → `get_data` (with a payload) → `clear_samples` until the
/// partition is drained.
pub async fn many_clients(
    url: &str,
    server_pid: Option<u32>,
    clients: usize,
    samples: usize,
    payload_bytes: usize,
    batch: usize,
) -> Result<ScaleRun> {
    let writer = Client::connect(url).await?;
    let name = format!(
        "scale-{clients}-{samples}-{payload_bytes}-{}",
        tq_core::new_epoch() % 1_000_000
    );
    let partition = writer.partition(name.clone());
    let mut next = 0usize;
    while next < samples {
        let n = (samples - next).min(1024);
        let ids: Vec<i64> = (next..next + n).map(|i| i as i64).collect();
        let mut columns = vec![(
            "id".to_string(),
            Column::Dense(Tensor::from_slice(vec![n], &ids)?),
        )];
        if payload_bytes > 0 {
            let x = vec![7u8; n * payload_bytes];
            columns.push((
                "x".to_string(),
                Column::Dense(Tensor::from_slice(vec![n, payload_bytes], &x)?),
            ));
        }
        partition.put_new(&Batch::from_columns(columns)?).await?;
        next += n;
    }
    partition.complete().await?;

    let rss_before = server_pid.and_then(rss_of);
    let connect_started = Instant::now();
    let connected = futures::future::join_all((0..clients).map(|_| Client::connect(url))).await;
    let connect = connect_started.elapsed();
    let connected: Vec<Client> = connected.into_iter().collect::<Result<_>>()?;
    let server_bytes_per_client = match (rss_before, server_pid.and_then(rss_of)) {
        (Some(before), Some(after)) => Some(after.saturating_sub(before) / clients.max(1) as u64),
        _ => None,
    };

    let started = Instant::now();
    let tasks: Vec<_> = connected
        .into_iter()
        .map(|client| {
            let name = name.clone();
            tokio::spawn(async move { drain(client, &name, batch, payload_bytes > 0).await })
        })
        .collect();
    let mut seen: Vec<SampleId> = Vec::with_capacity(samples);
    let mut run = ScaleRun {
        clients,
        samples,
        payload_bytes,
        elapsed: Duration::ZERO,
        connect,
        server_bytes_per_client,
        fetches: 0,
        controller_requests: 0,
        fetch_latency: Vec::new(),
        consumed: 0,
        duplicates: 0,
        errors: 0,
        first_error: None,
    };
    for task in tasks {
        let one = task
            .await
            .map_err(|e| Error::internal(format!("a client task failed: {e}")))?;
        run.fetches += one.fetches;
        run.controller_requests += one.fetches + 2 * one.clears;
        run.fetch_latency.extend(one.latency);
        seen.extend(one.samples);
        run.errors += one.errors;
        if run.first_error.is_none() {
            run.first_error = one.first_error;
        }
    }
    run.elapsed = started.elapsed();
    run.fetch_latency.sort_unstable();
    run.consumed = seen.len();
    seen.sort_unstable();
    seen.dedup();
    run.duplicates = run.consumed - seen.len();
    let _ = partition.clear().await;
    Ok(run)
}

/// Resident memory of process `pid` (VmRSS in /proc).
fn rss_of(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// What one client did.
#[derive(Default)]
struct Drained {
    fetches: u64,
    clears: u64,
    latency: Vec<Duration>,
    samples: Vec<SampleId>,
    errors: usize,
    first_error: Option<String>,
}

async fn drain(client: Client, partition: &str, batch: usize, read: bool) -> Drained {
    let p = client.partition(partition);
    let mut out = Drained::default();
    let fail = |out: &mut Drained, e: Error| {
        out.errors += 1;
        out.first_error.get_or_insert_with(|| e.to_string());
    };
    loop {
        let t = Instant::now();
        let meta = match p.fetch(&["id"], "scale", batch).await {
            Ok(meta) => meta,
            Err(e) if e.kind() == &ErrorKind::Closed => return out,
            Err(e) => {
                fail(&mut out, e);
                return out;
            }
        };
        out.fetches += 1;
        if meta.is_empty() {
            continue;
        }
        out.latency.push(t.elapsed());
        if read {
            if let Err(e) = client.get_data(&meta).await {
                fail(&mut out, e);
            }
        }
        match client.clear_samples(&meta).await {
            Ok(()) => out.clears += 1,
            Err(e) => fail(&mut out, e),
        }
        out.samples.extend_from_slice(meta.samples());
    }
}

/// Inserts `samples` samples into `partition` and produces their field `id`.
async fn fill(c: &Controller, partition: &str, samples: usize) -> Result<()> {
    let meta = c
        .get_meta(insert_request(partition, &["id"], samples))
        .await?;
    let schemas = BTreeMap::from([("id".to_string(), FieldMeta::dense(DType::I64, vec![]))]);
    c.notify_production(produced(partition, &meta, schemas))
        .await
        .map(drop)
}

/// The in-process cost of one `fetch(batch)` from a partition of `samples` produced samples
/// (one field), each fetch's samples given back untimed so that every fetch meets the same
/// partition.
pub fn fetch_cost(
    runtime: &tokio::runtime::Runtime,
    samples: usize,
    batch: usize,
    reps: usize,
) -> Result<Stats> {
    let c = Arc::new(Controller::new(ControllerConfig::default())?);
    runtime.block_on(fill(&c, "p", samples))?;
    measure_rounds(crate::controller::WARMUP_ROUNDS, reps, || {
        let t = Instant::now();
        let got = runtime.block_on(c.get_meta(GetMetaRequest::fetch(
            "p",
            &["id"],
            "t",
            batch,
            Wait::NoWait,
        )))?;
        let took = t.elapsed();
        if got.len() != batch {
            return Err(Error::internal(format!(
                "fetch of {batch} from {samples} samples got {}",
                got.len()
            )));
        }
        runtime.block_on(c.return_fetched("p", "t", None, got.samples()))?;
        Ok(took)
    })
}

/// What [`parallel_fetches`] measured.
#[derive(Debug, Clone, Copy)]
pub struct ParallelRun {
    pub threads: usize,
    pub partitions: usize,
    /// Fetch + give-back rounds per second, over all threads.
    pub rounds_per_s: f64,
}

/// The in-process controller driven by `threads` OS threads at once, each looping
/// `fetch(batch)` → `return_fetched` `rounds` times on partition `thread % partitions` (each of
/// `samples` produced samples): how far requests on different partitions run side by side
/// (`partitions == threads`) against requests on one (`partitions == 1`).
pub fn parallel_fetches(
    threads: usize,
    partitions: usize,
    samples: usize,
    batch: usize,
    rounds: usize,
) -> Result<ParallelRun> {
    let threads = threads.max(1);
    let partitions = partitions.clamp(1, threads);
    let c = Arc::new(Controller::new(ControllerConfig::default())?);
    let runtime = one_thread_runtime()?;
    runtime.block_on(async {
        for p in 0..partitions {
            fill(&c, &format!("p{p}"), samples).await?;
        }
        Ok::<_, Error>(())
    })?;
    let start = Arc::new(std::sync::Barrier::new(threads + 1));
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let (c, start) = (c.clone(), start.clone());
            std::thread::spawn(move || -> Result<()> {
                let runtime = one_thread_runtime()?;
                let name = format!("p{}", t % partitions);
                // Each thread its own task name: threads on one partition do not take from
                // each other, so every fetch finds a full batch.
                let task = format!("t{t}");
                start.wait();
                runtime.block_on(async {
                    for _ in 0..rounds {
                        let got = c
                            .get_meta(GetMetaRequest::fetch(
                                name.as_str(),
                                &["id"],
                                task.as_str(),
                                batch,
                                Wait::NoWait,
                            ))
                            .await?;
                        if got.len() != batch {
                            return Err(Error::internal(format!(
                                "{name}: fetch of {batch} got {}",
                                got.len()
                            )));
                        }
                        c.return_fetched(&name, &task, None, got.samples()).await?;
                    }
                    Ok(())
                })
            })
        })
        .collect();
    start.wait();
    let started = Instant::now();
    for w in workers {
        w.join()
            .map_err(|_| Error::internal("a benchmark thread panicked"))??;
    }
    let elapsed = started.elapsed();
    Ok(ParallelRun {
        threads,
        partitions,
        rounds_per_s: (threads * rounds) as f64 / elapsed.as_secs_f64().max(1e-9),
    })
}

fn one_thread_runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .map_err(|e| Error::internal(format!("cannot start a runtime: {e}")))
}

/// Bytes of each raw round trip of [`raw_round_trips`]: about a small fetch's request.
pub const RAW_MESSAGE_BYTES: usize = 64;

/// The transport's floor for the many-clients workload, measured in the same run:
/// `clients` connections (opened first, each its own) to an echo server on loopback, each
/// sending `per_client` messages of [`RAW_MESSAGE_BYTES`] and waiting for each echo. The
/// server runs on a thread of its own with a two-worker runtime, as `tq serve` does, and the
/// clients on the caller's runtime, as the many-clients run's clients do. Round trips per
/// second over all clients.
pub async fn raw_round_trips(clients: usize, per_client: usize) -> Result<f64> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let io = |e: std::io::Error| Error::internal(format!("raw loopback baseline: {e}"));
    let (addr_tx, addr_rx) = tokio::sync::oneshot::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = std::thread::spawn(move || -> std::io::Result<()> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            let _ = addr_tx.send(listener.local_addr()?);
            let accept = async {
                loop {
                    let (mut conn, _) = listener.accept().await?;
                    conn.set_nodelay(true)?;
                    tokio::spawn(async move {
                        let mut buf = [0u8; RAW_MESSAGE_BYTES];
                        while conn.read_exact(&mut buf).await.is_ok() {
                            if conn.write_all(&buf).await.is_err() {
                                break;
                            }
                        }
                    });
                }
            };
            tokio::select! {
                r = accept => r,
                _ = stop_rx => Ok(()),
            }
        })
    });
    let addr = addr_rx
        .await
        .map_err(|_| Error::internal("raw loopback baseline: the echo server did not start"))?;
    let mut conns = Vec::with_capacity(clients);
    for _ in 0..clients {
        let conn = tokio::net::TcpStream::connect(addr).await.map_err(io)?;
        conn.set_nodelay(true).map_err(io)?;
        conns.push(conn);
    }
    let started = Instant::now();
    let tasks: Vec<_> = conns
        .into_iter()
        .map(|mut conn| {
            tokio::spawn(async move {
                let mut buf = [7u8; RAW_MESSAGE_BYTES];
                for _ in 0..per_client {
                    conn.write_all(&buf).await?;
                    conn.read_exact(&mut buf).await?;
                }
                Ok::<_, std::io::Error>(())
            })
        })
        .collect();
    for t in tasks {
        t.await
            .map_err(|e| Error::internal(format!("raw loopback baseline: {e}")))?
            .map_err(io)?;
    }
    let elapsed = started.elapsed();
    let _ = stop_tx.send(());
    server
        .join()
        .map_err(|_| Error::internal("raw loopback baseline: the echo server panicked"))?
        .map_err(io)?;
    Ok((clients * per_client) as f64 / elapsed.as_secs_f64().max(1e-9))
}

/// What the whole-partition queries cost in process on a partition of `samples` produced
/// samples: `production_status` of one field and `consumption_status` of one task (which
/// answer a row per sample, so they cost the partition by what they return), and the
/// controller's `status` (`tq stats`: counts, from bitmaps).
pub struct QueryCosts {
    pub production_status: Stats,
    pub consumption_status: Stats,
    pub status: Stats,
    /// The same run's floor of a per-sample answer: a `Vec` of `samples` sample ids and one
    /// of as many flags, built and dropped.
    pub answer_floor: Stats,
}

pub fn query_costs(
    runtime: &tokio::runtime::Runtime,
    samples: usize,
    reps: usize,
) -> Result<QueryCosts> {
    let c = Arc::new(Controller::new(ControllerConfig::default())?);
    runtime.block_on(fill(&c, "p", samples))?;
    let check = |got: usize, what: &str| {
        if got == samples {
            Ok(())
        } else {
            Err(Error::internal(format!(
                "{what} of {samples} samples answered {got} rows"
            )))
        }
    };
    let warmup = crate::controller::WARMUP_ROUNDS;
    let production_status = measure_rounds(warmup, reps, || {
        let t = Instant::now();
        let got = runtime.block_on(c.production_status("p", &["id".to_string()]))?;
        let took = t.elapsed();
        check(got.samples.len(), "production_status")?;
        Ok(took)
    })?;
    let consumption_status = measure_rounds(warmup, reps, || {
        let t = Instant::now();
        let got = runtime.block_on(c.consumption_status("p", "t"))?;
        let took = t.elapsed();
        check(got.samples.len(), "consumption_status")?;
        Ok(took)
    })?;
    let answer_floor = measure_rounds(warmup, reps, || {
        let t = Instant::now();
        let ids: Vec<SampleId> = (0..samples as u32)
            .map(|index| SampleId {
                index,
                generation: 0,
            })
            .collect();
        let flags: Vec<bool> = (0..samples).map(|i| i % 3 != 0).collect();
        std::hint::black_box((&ids, &flags));
        let took = t.elapsed();
        check(ids.len().min(flags.len()), "the answer floor")?;
        Ok(took)
    })?;
    let status = measure_rounds(warmup, reps, || {
        let t = Instant::now();
        let got = c.status();
        let took = t.elapsed();
        let held: u64 = got.partitions.iter().map(|p| p.samples).sum();
        check(held as usize, "status")?;
        Ok(took)
    })?;
    Ok(QueryCosts {
        production_status,
        consumption_status,
        status,
        answer_floor,
    })
}

/// One `fetch(batch)` made durable on a state dir (`tq controller --state-dir`): the fetch,
/// then [`tq_controller::StateDir::changed`], which returns once a record with it is on disk,
/// from a partition of `samples` produced samples. A record carries each changed partition
/// whole, so this shows what a commit costs by partition size.
pub fn state_dir_fetch_cost(
    runtime: &tokio::runtime::Runtime,
    dir: &std::path::Path,
    samples: usize,
    batch: usize,
    reps: usize,
) -> Result<Stats> {
    let c = Arc::new(Controller::new(ControllerConfig::default())?);
    let state = tq_controller::StateDir::open(dir, c.clone())?;
    runtime.block_on(async {
        fill(&c, "p", samples).await?;
        state.changed().await
    })?;
    let reps = reps.min(samples / batch.max(1)).max(1);
    measure_rounds(0, reps, || {
        runtime.block_on(async {
            let t = Instant::now();
            let got = c
                .get_meta(GetMetaRequest::fetch(
                    "p",
                    &["id"],
                    "t",
                    batch,
                    Wait::NoWait,
                ))
                .await?;
            state.changed().await?;
            let took = t.elapsed();
            if got.len() != batch {
                return Err(Error::internal(format!(
                    "fetch of {batch} from {samples} samples got {}",
                    got.len()
                )));
            }
            Ok(took)
        })
    })
}

/// The disk's floor for a commit, in the same run: appending `bytes` to a file in `dir` and
/// `fdatasync`ing it, `reps` times.
pub fn append_sync_floor(dir: &std::path::Path, bytes: usize, reps: usize) -> Result<Stats> {
    use std::io::Write;
    let io = |e: std::io::Error| Error::internal(format!("disk floor in {}: {e}", dir.display()));
    let path = dir.join("floor.bin");
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(io)?;
    let block = vec![5u8; bytes];
    let stats = measure_rounds(2, reps, || {
        let t = Instant::now();
        file.write_all(&block).map_err(io)?;
        file.sync_data().map_err(io)?;
        Ok(t.elapsed())
    });
    let _ = std::fs::remove_file(&path);
    stats
}
