//! Operating a deployment: the `/metrics` and `/healthz` endpoint of `--metrics-listen`,
//! `tq stats` and `tq health`.
//!
//! The endpoint is a few dozen lines of HTTP/1.1 over a tokio listener instead of an HTTP
//! framework: it answers two GET paths with small bodies and closes the connection, which is
//! all a Prometheus scraper or a liveness probe needs, and it keeps hyper and its dependencies
//! out of the server binary. Every scrape renders fresh: the exporter's request metrics plus
//! the state gauges computed from a status snapshot taken for that scrape.

use clap::Args;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tq_client::{DeploymentStatus, MetricsExporter};
use tq_core::{Error, Result};

/// What a scrape shows and whether the server is healthy, computed per request.
pub trait Probe: Send + Sync + 'static {
    /// The state gauges of this process (Prometheus text).
    fn state(&self) -> Pin<Box<dyn Future<Output = Result<String>> + Send + '_>>;
    /// `Ok` when the server can do its job; the error says why not.
    fn health(&self) -> Pin<Box<dyn Future<Output = Result<()>> + Send + '_>>;
}

/// Metrics-endpoint options shared by the servers.
#[derive(Args, Debug, Clone, Default)]
pub struct MetricsArgs {
    /// Serve Prometheus metrics on `http://ADDR/metrics` and a health check on
    /// `http://ADDR/healthz` (200 when serving, 503 with the reason otherwise), e.g.
    /// `127.0.0.1:9100`. Off by default.
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<String>,
}

impl MetricsArgs {
    /// Installs the exporter when metrics are asked for. Call before building anything that
    /// records (handles are taken at construction).
    pub fn install(&self) -> Result<Option<MetricsExporter>> {
        self.metrics_listen
            .as_ref()
            .map(|_| MetricsExporter::install())
            .transpose()
    }

    /// Starts the endpoint (if asked for) and prints `listening metrics http://ADDR`.
    pub async fn serve(
        &self,
        exporter: Option<MetricsExporter>,
        probe: Arc<dyn Probe>,
    ) -> Result<Option<tokio::task::JoinHandle<()>>> {
        let (Some(addr), Some(exporter)) = (&self.metrics_listen, exporter) else {
            return Ok(None);
        };
        let listener = TcpListener::bind(addr).await.map_err(|e| {
            Error::unavailable(format!("--metrics-listen {addr}: cannot listen: {e}"))
                .with_source(e)
        })?;
        let local = listener
            .local_addr()
            .map_err(|e| Error::unavailable(format!("--metrics-listen {addr}: {e}")))?;
        println!("listening metrics http://{local}");
        Ok(Some(tokio::spawn(accept_loop(listener, exporter, probe))))
    }
}

async fn accept_loop(listener: TcpListener, exporter: MetricsExporter, probe: Arc<dyn Probe>) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!(error = %e, "metrics endpoint: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let (exporter, probe) = (exporter.clone(), probe.clone());
        tokio::spawn(async move {
            if let Err(e) = answer(stream, &exporter, probe.as_ref()).await {
                tracing::debug!(%peer, error = %e, "metrics endpoint: request failed");
            }
        });
    }
}

/// Longest request head read; scrapers send a few hundred bytes.
const MAX_REQUEST_HEAD: usize = 8 << 10;
/// A client that sends nothing is dropped after this.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

async fn answer(
    mut stream: TcpStream,
    exporter: &MetricsExporter,
    probe: &dyn Probe,
) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(512);
    let read_head = async {
        let mut buf = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_REQUEST_HEAD {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            head.extend_from_slice(&buf[..n]);
        }
        std::io::Result::Ok(())
    };
    if tokio::time::timeout(REQUEST_TIMEOUT, read_head)
        .await
        .is_err()
    {
        return Ok(());
    }
    let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (status, content_type, body) = match (method, path) {
        ("GET", "/metrics") => match probe.state().await {
            Ok(state) => {
                let mut body = exporter.render();
                body.push_str(&state);
                ("200 OK", "text/plain; version=0.0.4", body)
            }
            Err(e) => (
                "500 Internal Server Error",
                "text/plain",
                format!("cannot read the state: {e}\n"),
            ),
        },
        ("GET", "/healthz") => match probe.health().await {
            Ok(()) => ("200 OK", "text/plain", "ok\n".to_string()),
            Err(e) => ("503 Service Unavailable", "text/plain", format!("{e}\n")),
        },
        ("GET", _) => (
            "404 Not Found",
            "text/plain",
            "not found: try /metrics or /healthz\n".to_string(),
        ),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "only GET is served\n".to_string(),
        ),
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

/// `tq stats`.
#[derive(Args, Debug, Clone)]
pub struct StatsArgs {
    /// The controller (`tcp://host:port` or `unix:///path`); the same as `--controller`.
    url: Option<String>,
    /// Print the status as JSON (one object per refresh) instead of tables.
    #[arg(long)]
    json: bool,
    /// Refresh every this many seconds until interrupted.
    #[arg(long, value_name = "SECS")]
    watch: Option<f64>,
    #[command(flatten)]
    deployment: crate::deployment::DeploymentArgs,
}

/// `tq health`.
#[derive(Args, Debug, Clone)]
pub struct HealthArgs {
    /// The controller (`tcp://host:port` or `unix:///path`); the same as `--controller`.
    url: Option<String>,
    #[command(flatten)]
    deployment: crate::deployment::DeploymentArgs,
}

/// `tq stats URL`: partitions, storage units and the controller, as tables or JSON.
pub async fn stats(args: StatsArgs) -> Result<()> {
    if args.watch.is_some_and(|s| !(s > 0.0 && s.is_finite())) {
        return Err(Error::invalid("--watch needs a positive number of seconds"));
    }
    let client = args.deployment.connect_or_at(args.url.as_deref()).await?;
    loop {
        let status = client.status().await?;
        let text = if args.json {
            let mut text = serde_json::to_string(&status)
                .map_err(|e| Error::internal(format!("cannot encode the status: {e}")))?;
            text.push('\n');
            text
        } else if args.watch.is_some() {
            // Clear the screen and home the cursor, like `watch`.
            format!("\x1b[2J\x1b[H{}", tables(&status))
        } else {
            tables(&status)
        };
        if !write_out(&text)? {
            // The reader went away (`tq stats --watch 1 | head`): a normal end.
            return Ok(());
        }
        match args.watch {
            Some(secs) => tokio::time::sleep(Duration::from_secs_f64(secs)).await,
            None => return Ok(()),
        }
    }
}

/// How long a health check waits for the storage to answer.
const HEALTH_DEADLINE: Duration = Duration::from_secs(5);

/// [`tq_core::StorageManager::check_health`] within [`HEALTH_DEADLINE`] (for `tq health` and
/// `/healthz`).
pub async fn storage_health(storage: &dyn tq_core::StorageManager) -> Result<()> {
    match tokio::time::timeout(HEALTH_DEADLINE, storage.check_health()).await {
        Ok(checked) => checked,
        Err(_) => Err(Error::timeout(format!(
            "storage `{}` did not answer within {HEALTH_DEADLINE:?}",
            storage.name()
        ))),
    }
}

/// Writes `text` to stdout; `false` when the reader closed the pipe.
fn write_out(text: &str) -> Result<bool> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(Error::unavailable(format!("cannot write to stdout: {e}"))),
    }
}

/// `tq health URL`: exit 0 when the controller answers and every storage unit does too.
pub async fn health(args: HealthArgs) -> Result<()> {
    let client = args.deployment.connect_or_at(args.url.as_deref()).await?;
    let status = client.status().await?;
    let down: Vec<String> = status
        .units
        .iter()
        .filter_map(|u| {
            u.down
                .as_ref()
                .map(|why| format!("storage unit `{}`: {why}", u.id))
        })
        .collect();
    if !down.is_empty() {
        return Err(Error::unavailable(format!(
            "{} of {} storage units are down: {}",
            down.len(),
            status.units.len(),
            down.join("; ")
        )));
    }
    // A shared store (Redis, object storage) answers too.
    storage_health(client.storage().as_ref()).await?;
    println!(
        "ok: controller epoch {:016x}, {} partitions, {} storage units",
        status.controller.epoch,
        status.controller.partitions.len(),
        status.units.len()
    );
    Ok(())
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// The human-readable form of `tq stats`.
pub fn tables(status: &DeploymentStatus) -> String {
    use std::fmt::Write as _;
    let c = &status.controller;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "controller  epoch {:016x}  uptime {:.0} s  connections {}  waiting fetches {}  \
         leases expired {}  indexes in use {} (reusable {})  storage {}",
        c.epoch,
        c.uptime_seconds,
        c.connections,
        c.waiting_fetches,
        c.leases_expired_total,
        c.index_allocated,
        c.index_reusable,
        status.storage_backend
    );
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:<24} {:>9} {:>9} {:>6} {:<16} {:>9} {:>7}",
        "PARTITION", "SAMPLES", "PRODUCED", "KEYS", "TASK", "CONSUMED", "LEASED"
    );
    for p in &c.partitions {
        let produced = format!("{:.0}%", p.production_progress() * 100.0);
        if p.tasks.is_empty() {
            let _ = writeln!(
                out,
                "{:<24} {:>9} {:>9} {:>6} {:<16} {:>9} {:>7}",
                p.name, p.samples, produced, p.keys, "-", "-", "-"
            );
        }
        for t in &p.tasks {
            let consumed = format!("{:.0}%", t.consumption_progress(p) * 100.0);
            let _ = writeln!(
                out,
                "{:<24} {:>9} {:>9} {:>6} {:<16} {:>9} {:>7}",
                p.name, p.samples, produced, p.keys, t.name, consumed, t.leases
            );
        }
    }
    if !status.units.is_empty() {
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "{:<16} {:>9} {:>9} {:>12} {:>10} {:>12} {:>12}",
            "UNIT", "SAMPLES", "CELLS", "BYTES", "CAPACITY", "ON SSD", "FREEING"
        );
        for u in &status.units {
            if let Some(why) = &u.down {
                let _ = writeln!(out, "{:<16} DOWN: {why}", u.id);
                continue;
            }
            let capacity = u.capacity.map_or("-".to_string(), |c| c.to_string());
            // Bytes cleared but not yet given back (the memory unit frees them behind its
            // clears, see tq::storage::reclaim).
            let freeing = u
                .counters
                .get(tq::storage::reclaim::RECLAIM_PENDING)
                .map_or("-".to_string(), |&b| mib(b));
            let _ = writeln!(
                out,
                "{:<16} {:>9} {:>9} {:>12} {:>10} {:>12} {:>12}",
                u.id,
                u.rows,
                u.cells,
                mib(u.bytes),
                capacity,
                mib(u.offloaded_bytes),
                freeing
            );
        }
    }
    out
}
