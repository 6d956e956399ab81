//! `tq serve`, `tq controller`, `tq storage-unit`: tq as network servers.
//!
//! Every server prints one `listening <role> [<id>] <endpoint>` line per endpoint on stdout once
//! it accepts connections, and shuts down cleanly on SIGINT or SIGTERM.

use clap::Args;
use std::sync::Arc;
use std::time::Duration;
use tq_backend_simple::{MemoryUnit, StorageUnit, UnitConfig, UnitServer};
use tq_client::{pool_config, Config};
use tq_controller::{Controller, ControllerConfig, ControllerServer, RemoteControlPlane, UnitInfo};
use tq_core::{Error, Result};
use tq_net::{Endpoint, Server, ServerConfig};

/// SSD offload of storage units.
#[derive(Args, Debug, Clone)]
pub struct SsdArgs {
    /// Offload cells at least `--ssd-threshold` bytes large to files under this directory
    /// (created if missing; each run uses its own subdirectory, removed on shutdown).
    #[arg(long, env = "TQ_STORAGE_SSD_PATH")]
    ssd_path: Option<std::path::PathBuf>,
    /// Size from which a cell goes to disk.
    #[arg(long, default_value_t = tq_backend_ssd::DEFAULT_THRESHOLD_BYTES)]
    ssd_threshold: usize,
}

/// Options every server shares.
#[derive(Args, Debug, Clone)]
pub struct Security {
    /// Shared token peers must present (or set TQ_NET_TOKEN). Required for non-loopback addresses.
    #[arg(long, env = "TQ_NET_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Allow a non-loopback address without a token.
    #[arg(long)]
    insecure: bool,
}

impl Security {
    /// Refuses to expose a server beyond this host without a token, unless `--insecure`.
    fn check(&self, endpoint: &Endpoint) -> Result<()> {
        if !endpoint.is_loopback() && self.token.is_none() {
            if self.insecure {
                tracing::warn!(%endpoint, "listening on a non-loopback address without a token (--insecure)");
            } else {
                return Err(Error::invalid(format!(
                    "refusing to listen on non-loopback {endpoint} without a token: pass --token (or set TQ_NET_TOKEN), or --insecure"
                )));
            }
        }
        Ok(())
    }

    fn server_config(&self, name: &str) -> ServerConfig {
        ServerConfig {
            token: self.token.clone(),
            name: name.to_string(),
            ..ServerConfig::default()
        }
    }

    fn client_config(&self) -> Config {
        let mut c = Config::default();
        c.net.token = self.token.clone();
        c
    }
}

#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// Controller endpoint (`tcp://host:port`, port 0 picks one; or `unix:///path`).
    #[arg(long, default_value = "tcp://127.0.0.1:7700")]
    listen: String,
    /// Number of storage units to run in this process.
    #[arg(long, default_value_t = 2)]
    units: u32,
    /// Host the storage units listen on (each on a free port).
    #[arg(long, default_value = "127.0.0.1")]
    unit_host: String,
    /// Host name clients use to reach the units, if not `--unit-host` (e.g. when it is 0.0.0.0).
    #[arg(long)]
    advertise_host: Option<String>,
    /// Maximum samples per storage unit (unlimited if absent).
    #[arg(long)]
    capacity_per_unit: Option<usize>,
    #[command(flatten)]
    ssd: SsdArgs,
    /// Default sampler of the controller (`sequential`, `grpo:<n>`, `rank-aware`,
    /// `seqlen-balanced:<dp_size>[:<n>]`).
    #[arg(long, default_value = "sequential")]
    default_sampler: tq_controller::SamplerSpec,
    #[command(flatten)]
    security: Security,
}

#[derive(Args, Debug, Clone)]
pub struct ControllerArgs {
    /// Endpoint to listen on.
    #[arg(long, default_value = "tcp://127.0.0.1:7700")]
    listen: String,
    /// Number of storage units that will register (sample index i lives on unit i % units).
    #[arg(long)]
    units: u32,
    /// Default sampler (`sequential`, `grpo:<n>`, `rank-aware`, `seqlen-balanced:<dp_size>[:<n>]`).
    #[arg(long, default_value = "sequential")]
    default_sampler: tq_controller::SamplerSpec,
    #[command(flatten)]
    security: Security,
}

#[derive(Args, Debug, Clone)]
pub struct UnitArgs {
    /// The controller to register with.
    #[arg(long)]
    controller: String,
    /// Endpoint to listen on (port 0 picks one).
    #[arg(long, default_value = "tcp://127.0.0.1:0")]
    listen: String,
    /// Endpoint clients should use, if not the listening one (e.g. behind 0.0.0.0).
    #[arg(long)]
    advertise: Option<String>,
    /// Stable name of this unit; a restarted unit must reuse it to keep its place.
    #[arg(long)]
    id: String,
    /// Maximum samples this unit holds (unlimited if absent).
    #[arg(long)]
    capacity: Option<usize>,
    #[command(flatten)]
    ssd: SsdArgs,
    #[command(flatten)]
    security: Security,
}

/// Installs the SIGINT/SIGTERM handlers now (before anything is announced, so a signal that
/// arrives right after the "listening" lines is never handled by the default action) and
/// returns a future that completes on the first of them.
fn shutdown_signal() -> Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let io = |e: std::io::Error| Error::internal("cannot install signal handlers").with_source(e);
    let mut interrupt = signal(SignalKind::interrupt()).map_err(io)?;
    let mut terminate = signal(SignalKind::terminate()).map_err(io)?;
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
    })
}

fn controller(units: u32, sampler: tq_controller::SamplerSpec) -> Result<Arc<Controller>> {
    Ok(Arc::new(Controller::new(ControllerConfig {
        storage_units: units,
        default_sampler: sampler,
        // The servers run SimpleStorage units, which resolve links.
        ..ControllerConfig::default()
    })?))
}

async fn start_unit(
    id: &str,
    listen: &Endpoint,
    capacity: Option<usize>,
    ssd: &SsdArgs,
    security: &Security,
) -> Result<Server> {
    let config = UnitConfig {
        capacity,
        ..UnitConfig::default()
    };
    let unit: Arc<dyn StorageUnit> = match &ssd.ssd_path {
        Some(path) => Arc::new(tq_backend_ssd::SsdUnit::new(
            id,
            config,
            tq_backend_ssd::SsdConfig::enabled_at(path).with_threshold(ssd.ssd_threshold),
        )?),
        None => Arc::new(MemoryUnit::with_config(id, config)?),
    };
    let handler = Arc::new(UnitServer::new(unit));
    Server::bind(listen, security.server_config(id), handler).await
}

/// The endpoint clients should use: `local` with its host replaced by `host`, if given.
fn advertised(local: &Endpoint, host: Option<&str>) -> Result<String> {
    match (local, host) {
        (Endpoint::Tcp(addr), Some(host)) => {
            let port = addr.rsplit(':').next().unwrap_or_default();
            Ok(format!("tcp://{host}:{port}")
                .parse::<Endpoint>()?
                .to_string())
        }
        _ => Ok(local.to_string()),
    }
}

/// `tq serve`: a controller and N storage units in one process.
pub async fn serve(args: ServeArgs) -> Result<()> {
    let shutdown = shutdown_signal()?;
    if args.units == 0 {
        return Err(Error::invalid("--units must be at least 1"));
    }
    let listen: Endpoint = args.listen.parse()?;
    args.security.check(&listen)?;
    let unit_listen: Endpoint = format!("tcp://{}:0", args.unit_host).parse()?;
    args.security.check(&unit_listen)?;
    let service = Arc::new(ControllerServer::new(
        controller(args.units, args.default_sampler)?,
        args.units,
    ));
    let mut units = Vec::new();
    for i in 0..args.units {
        let id = format!("unit-{i}");
        let server = start_unit(
            &id,
            &unit_listen,
            args.capacity_per_unit,
            &args.ssd,
            &args.security,
        )
        .await?;
        let endpoint = advertised(server.local_endpoint(), args.advertise_host.as_deref())?;
        service.register_unit(UnitInfo {
            id: id.clone(),
            endpoint: endpoint.clone(),
        })?;
        println!("listening unit {id} {endpoint}");
        units.push(server);
    }
    let server = Server::bind(&listen, args.security.server_config("controller"), service).await?;
    println!("listening controller {}", server.local_endpoint());
    shutdown.await;
    eprintln!("shutting down");
    server.shutdown().await;
    for u in units {
        u.shutdown().await;
    }
    Ok(())
}

/// `tq controller`: the controller alone; storage units register with it.
pub async fn controller_server(args: ControllerArgs) -> Result<()> {
    let shutdown = shutdown_signal()?;
    if args.units == 0 {
        return Err(Error::invalid("--units must be at least 1"));
    }
    let listen: Endpoint = args.listen.parse()?;
    args.security.check(&listen)?;
    let service = Arc::new(ControllerServer::new(
        controller(args.units, args.default_sampler)?,
        args.units,
    ));
    let server = Server::bind(&listen, args.security.server_config("controller"), service).await?;
    println!("listening controller {}", server.local_endpoint());
    shutdown.await;
    eprintln!("shutting down");
    server.shutdown().await;
    Ok(())
}

/// How often a storage unit registers again, so a restarted controller is rejoined quickly.
const REGISTER_EVERY: Duration = Duration::from_millis(500);

/// `tq storage-unit`: one storage unit that registers with a controller (and keeps doing so).
pub async fn storage_unit(args: UnitArgs) -> Result<()> {
    let shutdown = shutdown_signal()?;
    let listen: Endpoint = args.listen.parse()?;
    args.security.check(&listen)?;
    let controller: Endpoint = args.controller.parse()?;
    let server = start_unit(&args.id, &listen, args.capacity, &args.ssd, &args.security).await?;
    let advertised = match &args.advertise {
        Some(a) => a.parse::<Endpoint>()?.to_string(),
        None => server.local_endpoint().to_string(),
    };
    let config = args.security.client_config();
    let control = RemoteControlPlane::new(
        tq_net::Pool::new(pool_config(&config)),
        controller.clone(),
        config.request_timeout(),
    );
    // The controller may start after us: keep trying for a while.
    let info = UnitInfo {
        id: args.id.clone(),
        endpoint: advertised.clone(),
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match control.register_unit(info.clone()).await {
            Ok(()) => break,
            Err(e) if e.is_retryable() && tokio::time::Instant::now() < deadline => {
                tracing::info!(error = %e, "controller not reachable yet; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => {
                server.shutdown().await;
                return Err(e.context(format!("registering unit `{}` with {controller}", args.id)));
            }
        }
    }
    println!("listening unit {} {}", args.id, advertised);
    // Rejoin a controller that restarted (it starts with an empty unit table).
    tokio::select! {
        _ = shutdown => {}
        _ = control.keep_registered(info, REGISTER_EVERY) => {}
    }
    eprintln!("shutting down");
    server.shutdown().await;
    Ok(())
}
