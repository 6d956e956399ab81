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
    runtime.block_on(async {
        let meta = c.get_meta(insert_request("p", &["id"], samples)).await?;
        let schemas = BTreeMap::from([("id".to_string(), FieldMeta::dense(DType::I64, vec![]))]);
        c.notify_production(produced("p", &meta, schemas))
            .await
            .map(drop)
    })?;
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
