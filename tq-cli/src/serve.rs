//! `tq serve`, `tq controller`, `tq storage-unit`: tq as network servers.
//!
//! Every server prints one `listening <role> [<id>] <endpoint>` line per endpoint on stdout once
//! it accepts connections, and shuts down cleanly on SIGINT or SIGTERM.

use clap::Args;
use std::sync::Arc;
use tq_backend_simple::UnitServer;
use tq_client::Config;
use tq_controller::ControllerServer;
use tq_core::{Error, Result};
use tq_net::{Endpoint, Server, ServerConfig};

use crate::observe::{MetricsArgs, Probe};
use std::future::Future;
use std::pin::Pin;
use tq_client::DeploymentStatus;

/// SSD offload of storage units.
#[derive(Args, Debug, Clone)]
pub struct SsdArgs {
    /// Offload cells at least `--ssd-threshold` bytes large to files under this directory
    /// (created if missing; each run uses its own subdirectory, removed on shutdown). Without
    /// it, the configuration's `[storage.ssd]` applies (`TQ_STORAGE_SSD_ENABLED=true` and
    /// `TQ_STORAGE_SSD_PATH=...` from the environment).
    #[arg(long)]
    ssd_path: Option<std::path::PathBuf>,
    /// Size from which a cell goes to disk.
    #[arg(long, default_value_t = tq_backend_ssd::DEFAULT_THRESHOLD_BYTES)]
    ssd_threshold: usize,
}

impl SsdArgs {
    /// The offload the flags ask for; `None` leaves it to the configuration's `[storage.ssd]`.
    fn offload(&self) -> Option<tq_backend_ssd::SsdConfig> {
        self.ssd_path.as_ref().map(|path| {
            tq_backend_ssd::SsdConfig::enabled_at(path).with_threshold(self.ssd_threshold)
        })
    }
}

/// Options every server shares.
#[derive(Args, Debug, Clone)]
pub struct Security {
    /// Shared token peers must present (or set TQ_NET_TOKEN, or `net.token` in the
    /// configuration). Required for non-loopback addresses.
    #[arg(long, env = "TQ_NET_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Allow a non-loopback address without a token.
    #[arg(long)]
    insecure: bool,
    /// The configuration file clients read too (TOML, see the README); `TQ_*` environment
    /// variables override it, and flags override both.
    #[arg(long)]
    config: Option<std::path::PathBuf>,
}

impl Security {
    /// The configuration (file, then environment), with the token flag taking precedence.
    fn load(&mut self) -> Result<Config> {
        let mut config = Config::load(self.config.as_deref())?;
        match &self.token {
            Some(t) => config.net.token = Some(t.clone()),
            None => self.token = config.net.token.clone(),
        }
        Ok(config)
    }

    /// Refuses to expose a server beyond this host without a token, unless `--insecure`.
    fn check(&self, endpoint: &Endpoint) -> Result<()> {
        tq::server::check_exposure(endpoint, self.token.as_deref(), self.insecure)
    }
}

#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// Controller endpoint (`tcp://host:port`, port 0 picks one; or `unix:///path`).
    #[arg(long, default_value = "tcp://127.0.0.1:7700")]
    listen: String,
    /// Number of storage units to run in this process (default: `storage.num_units`, 2).
    #[arg(long)]
    units: Option<u32>,
    /// Host the storage units listen on (each on a free port).
    #[arg(long, default_value = "127.0.0.1")]
    unit_host: String,
    /// Host name clients use to reach the units, if not `--unit-host` (e.g. when it is 0.0.0.0).
    #[arg(long)]
    advertise_host: Option<String>,
    /// Maximum samples per storage unit (default: `storage.capacity_per_unit`, unlimited).
    #[arg(long)]
    capacity_per_unit: Option<usize>,
    #[command(flatten)]
    ssd: SsdArgs,
    /// Default sampler of the controller (`sequential`, `grpo:<n>`, `rank-aware`,
    /// `seqlen-balanced:<dp_size>[:<n>]`; default: `controller.default_sampler`).
    #[arg(long)]
    default_sampler: Option<tq_controller::SamplerSpec>,
    #[command(flatten)]
    security: Security,
    #[command(flatten)]
    metrics: MetricsArgs,
}

#[derive(Args, Debug, Clone)]
pub struct ControllerArgs {
    /// Endpoint to listen on.
    #[arg(long, default_value = "tcp://127.0.0.1:7700")]
    listen: String,
    /// Number of storage units that will register (sample index i lives on unit (i / 16) % units;
    /// default: `storage.num_units`). Not for shared storage (`storage.backend = "kv"`).
    #[arg(long)]
    units: Option<u32>,
    /// Default sampler (`sequential`, `grpo:<n>`, `rank-aware`, `seqlen-balanced:<dp_size>[:<n>]`;
    /// default: `controller.default_sampler`).
    #[arg(long)]
    default_sampler: Option<tq_controller::SamplerSpec>,
    /// Keep the controller's state in this directory: every change is on disk before it is
    /// answered, and a controller started again on the directory (after a crash or kill -9)
    /// carries on with the same state and epoch.
    #[arg(long)]
    state_dir: Option<std::path::PathBuf>,
    #[command(flatten)]
    security: Security,
    #[command(flatten)]
    metrics: MetricsArgs,
}

#[derive(Args, Debug, Clone)]
pub struct UnitArgs {
    /// The controller to register with.
    #[arg(long, visible_alias = "connect", value_name = "URL")]
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
    /// Maximum samples this unit holds (default: `storage.capacity_per_unit`, unlimited).
    #[arg(long)]
    capacity: Option<usize>,
    #[command(flatten)]
    ssd: SsdArgs,
    #[command(flatten)]
    security: Security,
    #[command(flatten)]
    metrics: MetricsArgs,
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

/// The controller a configuration describes (see `tq::server::controller_service`).
fn controller(
    config: &Config,
    units: Option<u32>,
    sampler: Option<tq_controller::SamplerSpec>,
) -> Result<ControllerServer> {
    tq::server::controller_service(config, units, sampler)
}

/// `tq serve`: a controller and N storage units in one process.
pub fn serve(mut args: ServeArgs) -> Result<()> {
    let config = args.security.load()?;
    // On the runtime the configuration sizes (`net.server_threads`).
    tq::server::server_runtime(&config)?.block_on(serve_with(args, config))
}

async fn serve_with(args: ServeArgs, config: Config) -> Result<()> {
    let shutdown = shutdown_signal()?;
    let exporter = args.metrics.install()?;
    let options = tq::server::ServeOptions {
        listen: args.listen.clone(),
        units: args.units,
        unit_host: args.unit_host.clone(),
        advertise_host: args.advertise_host.clone(),
        capacity_per_unit: args.capacity_per_unit,
        default_sampler: args.default_sampler,
        ssd: args.ssd.offload(),
        insecure: args.security.insecure,
        remote_units: false,
    };
    let deployment = tq::server::Deployment::start(config, options).await?;
    for (id, endpoint) in deployment.unit_endpoints() {
        println!("listening unit {id} {endpoint}");
    }
    println!("listening controller {}", deployment.url());
    let probe = Arc::new(ServerProbe {
        controller: Some(deployment.controller_service().clone()),
        units: deployment.unit_services().to_vec(),
        storage: None,
    });
    let _metrics = args.metrics.serve(exporter, probe).await?;
    shutdown.await;
    eprintln!("shutting down");
    deployment.shutdown().await;
    Ok(())
}

/// Serves `service` on `listen`, announces it, and returns the server with the probe of its
/// metrics endpoint (the controller and the units this process hosts).
async fn start_controller(
    listen: &Endpoint,
    server_config: ServerConfig,
    service: Arc<ControllerServer>,
    units: Vec<Arc<UnitServer>>,
    storage: Option<Arc<dyn tq_core::StorageManager>>,
) -> Result<(Server, Arc<dyn Probe>)> {
    let server = Server::bind(listen, server_config, service.clone()).await?;
    service.count_connections(server.connection_count());
    println!("listening controller {}", server.local_endpoint());
    let probe = Arc::new(ServerProbe {
        controller: Some(service),
        units,
        storage,
    });
    Ok((server, probe))
}

/// `tq controller`: the controller alone; storage units register with it.
pub fn controller_server(mut args: ControllerArgs) -> Result<()> {
    let config = args.security.load()?;
    // On the runtime the configuration sizes (`net.server_threads`).
    tq::server::server_runtime(&config)?.block_on(controller_with(args, config))
}

async fn controller_with(args: ControllerArgs, config: Config) -> Result<()> {
    let shutdown = shutdown_signal()?;
    let exporter = args.metrics.install()?;
    let listen: Endpoint = args.listen.parse()?;
    args.security.check(&listen)?;
    let mut service = controller(&config, args.units, args.default_sampler)?;
    if let Some(dir) = &args.state_dir {
        service = service.with_state_dir(dir)?;
    }
    // Shared storage (a KV store): the health check probes it, and this controller claims
    // its epoch there (one live controller per epoch).
    let storage = if config.storage_is_shared() {
        Some(config.build_shared_storage()?)
    } else {
        None
    };
    if let Some(storage) = &storage {
        service = service.with_epoch_claim(storage.clone(), owner_id(args.state_dir.as_deref())?);
    }
    let service = Arc::new(service);
    claim_at_start(&service).await?;
    let renewing = {
        let service = service.clone();
        tokio::spawn(async move { service.renew_claim().await })
    };
    let (server, probe) = start_controller(
        &listen,
        tq::server::server_config(&config, "controller"),
        service,
        Vec::new(),
        storage,
    )
    .await?;
    let _metrics = args.metrics.serve(exporter, probe).await?;
    shutdown.await;
    eprintln!("shutting down");
    renewing.abort();
    server.shutdown().await;
    Ok(())
}

/// The owner number under which a controller claims its epoch of shared storage: drawn once
/// per state dir (kept in `<state-dir>/controller.owner`, so a controller restarted on it is
/// the same owner and need not wait for its own claim to lapse), or per process without one.
fn owner_id(state_dir: Option<&std::path::Path>) -> Result<u64> {
    let Some(dir) = state_dir else {
        return Ok(tq_core::new_epoch());
    };
    let path = dir.join("controller.owner");
    let io = |what: &str, e: std::io::Error| {
        Error::unavailable(format!(
            "state dir: cannot {what} `{}`: {e}",
            path.display()
        ))
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => u64::from_str_radix(text.trim(), 16).map_err(|e| {
            Error::corrupted(format!(
                "state dir: `{}` is not an owner number: {e}",
                path.display()
            ))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let owner = tq_core::new_epoch();
            std::fs::write(&path, format!("{owner:016x}\n")).map_err(|e| io("write", e))?;
            Ok(owner)
        }
        Err(e) => Err(io("read", e)),
    }
}

/// Claims the controller's epoch before serving, waiting (one lease at most) for a dead
/// predecessor's claim to lapse; a claim still renewed after that belongs to a live controller,
/// and this one does not start.
async fn claim_at_start(service: &ControllerServer) -> Result<()> {
    match tq_core::waiting_out_claims(|| service.claim_epoch()).await {
        Err(e) if e.kind() == &tq_core::ErrorKind::Conflict => Err(e),
        Err(e) => {
            // The store does not answer yet (it may start after the controller): serve, say
            // so, and claim at the first renewal that reaches it. `/healthz` reports the store
            // down meanwhile.
            tracing::warn!(error = %e, "cannot claim this controller's epoch in the shared storage yet; serving, and retrying");
            Ok(())
        }
        Ok(()) => Ok(()),
    }
}

/// The `/metrics` state and `/healthz` answer of a server process: its controller (if it runs
/// one) and the storage units it hosts.
struct ServerProbe {
    controller: Option<Arc<ControllerServer>>,
    units: Vec<Arc<UnitServer>>,
    /// The shared storage (a KV store) of a controller that has no units, probed by health.
    storage: Option<Arc<dyn tq_core::StorageManager>>,
}

impl ServerProbe {
    async fn unit_status(&self) -> Result<Vec<tq_core::telemetry::UnitStatus>> {
        let mut out = Vec::with_capacity(self.units.len());
        for unit in &self.units {
            out.push(unit.stats().await?.to_status());
        }
        Ok(out)
    }
}

impl Probe for ServerProbe {
    fn state(&self) -> Pin<Box<dyn Future<Output = Result<String>> + Send + '_>> {
        Box::pin(async move {
            let units = self.unit_status().await?;
            Ok(match &self.controller {
                Some(c) => tq::telemetry::render_status(&DeploymentStatus {
                    storage_backend: String::new(),
                    controller: c.status(),
                    units,
                }),
                None => {
                    let mut out = String::new();
                    tq::telemetry::render_units(&mut out, &units);
                    out
                }
            })
        })
    }

    fn health(&self) -> Pin<Box<dyn Future<Output = Result<()>> + Send + '_>> {
        Box::pin(async move {
            if let Some(c) = &self.controller {
                let t = c.topology();
                if !t.is_complete() {
                    return Err(Error::unavailable(format!(
                        "{} of {} storage units registered",
                        t.units.len(),
                        t.expected_units
                    )));
                }
                let lapsed = c.lapsed_units();
                if !lapsed.is_empty() {
                    let names: Vec<String> = lapsed
                        .iter()
                        .map(|(id, ago)| {
                            format!("`{id}` (last registered {:.1} s ago)", ago.as_secs_f64())
                        })
                        .collect();
                    return Err(Error::unavailable(format!(
                        "storage units down: {}",
                        names.join(", ")
                    )));
                }
            }
            if let Some(storage) = &self.storage {
                crate::observe::storage_health(storage.as_ref()).await?;
            }
            for unit in &self.units {
                if unit.epoch() == 0 {
                    return Err(Error::unavailable(
                        "storage unit has not registered with a controller yet",
                    ));
                }
                unit.stats().await?;
            }
            Ok(())
        })
    }
}

/// `tq storage-unit`: one storage unit that registers with a controller (and keeps doing so:
/// `tq::server::RegisteredUnit`).
pub fn storage_unit(mut args: UnitArgs) -> Result<()> {
    let config = args.security.load()?;
    // On the runtime the configuration sizes (`net.server_threads`).
    tq::server::server_runtime(&config)?.block_on(storage_unit_with(args, config))
}

async fn storage_unit_with(args: UnitArgs, config: Config) -> Result<()> {
    let shutdown = shutdown_signal()?;
    tokio::pin!(shutdown);
    let exporter = args.metrics.install()?;
    let listen: Endpoint = args.listen.parse()?;
    args.security.check(&listen)?;
    let controller: Endpoint = args.controller.parse()?;
    let options = tq::server::UnitOptions {
        id: args.id.clone(),
        listen: args.listen.clone(),
        advertise: args.advertise.clone(),
        capacity: args.capacity,
        ssd: args.ssd.offload(),
    };
    // The controller may start after us: registering keeps trying for a while (stopping at
    // SIGTERM/Ctrl-C).
    let mut unit = tokio::select! {
        r = tq::server::RegisteredUnit::start(&config, &controller, options) => r?,
        _ = &mut shutdown => {
            eprintln!("shutting down before registering");
            return Ok(());
        }
    };
    println!("listening unit {} {}", args.id, unit.endpoint());
    let probe = Arc::new(ServerProbe {
        controller: None,
        units: vec![unit.handler().clone()],
        storage: None,
    });
    let _metrics = args.metrics.serve(exporter, probe).await?;
    let refused = tokio::select! {
        _ = &mut shutdown => None,
        e = unit.lost() => Some(e),
    };
    eprintln!("shutting down");
    unit.shutdown().await;
    match refused {
        // Another process holds the id now: this one must not serve under it.
        Some(e) => Err(e.context(format!("unit `{}` lost its registration", args.id))),
        None => Ok(()),
    }
}
