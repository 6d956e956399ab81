//! Hosting a deployment in this process: a controller and storage units serving over TCP, as
//! `tq serve` does (feature `server`). Clients elsewhere reach it with [`crate::Client::connect`]
//! at [`Deployment::url`]. `tq serve`, the benchmarks and the Python package's `tq.serve` all
//! start their servers here.
//!
//! ```no_run
//! # async fn run() -> tq::Result<()> {
//! let deployment = tq::server::Deployment::start(tq::Config::default(), Default::default()).await?;
//! let client = tq::Client::connect(deployment.url()).await?;
//! # drop(client);
//! deployment.shutdown().await;
//! # Ok(()) }
//! ```

use crate::{Config, Error, Result};
use std::sync::Arc;
use std::time::Duration;
use tq_backend_simple::{MemoryUnit, StorageUnit, UnitConfig};
use tq_controller::{
    Controller, ControllerConfig, Registration, RemoteControlPlane, SamplerSpec, UnitInfo,
};

pub use tq_backend_simple::UnitServer;
pub use tq_controller::ControllerServer;
pub use tq_net::{Endpoint, Server, ServerConfig, DEFAULT_STAY_AWAKE};

/// How [`Deployment::start`] serves (the flags of `tq serve`).
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// The controller's endpoint (`tcp://host:port`; port 0 picks a free one).
    pub listen: String,
    /// Storage units to run (default: `storage.num_units`). None with shared (KV) storage.
    pub units: Option<u32>,
    /// Host the storage units listen on, each on a free port.
    pub unit_host: String,
    /// Host name clients use to reach the units, when not `unit_host` (e.g. it is 0.0.0.0).
    pub advertise_host: Option<String>,
    /// Maximum samples per storage unit (default: `storage.capacity_per_unit`).
    pub capacity_per_unit: Option<usize>,
    /// The controller's default sampler (default: `controller.default_sampler`).
    pub default_sampler: Option<SamplerSpec>,
    /// SSD offload of the units, overriding `[storage.ssd]` (feature `ssd`).
    #[cfg(feature = "ssd")]
    pub ssd: Option<tq_backend_ssd::SsdConfig>,
    /// Serve a non-loopback address without a token.
    pub insecure: bool,
    /// Run no storage units here: `units` of them run elsewhere ([`RegisteredUnit`]) and
    /// register with this controller (what `tq controller --units N` does).
    pub remote_units: bool,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            listen: "tcp://127.0.0.1:0".into(),
            units: None,
            unit_host: "127.0.0.1".into(),
            advertise_host: None,
            capacity_per_unit: None,
            default_sampler: None,
            #[cfg(feature = "ssd")]
            ssd: None,
            insecure: false,
            remote_units: false,
        }
    }
}

/// Refuses to expose a server beyond this host without a token, unless `insecure`.
pub fn check_exposure(endpoint: &Endpoint, token: Option<&str>, insecure: bool) -> Result<()> {
    if !endpoint.is_loopback() && token.is_none() {
        if insecure {
            tracing::warn!(%endpoint, "listening on a non-loopback address without a token (insecure)");
        } else {
            return Err(Error::invalid(format!(
                "refusing to listen on non-loopback {endpoint} without a token: set one \
                 (--token, TQ_NET_TOKEN or net.token), or allow it explicitly (--insecure)"
            )));
        }
    }
    Ok(())
}

/// The runtime a program runs its servers on: `config.net.server_threads` worker threads
/// (one by default) named `tq-server`, with I/O and timers. `tq serve`, `tq controller`,
/// `tq storage-unit` and the Python package's servers use it; a program that hosts servers on
/// a runtime of its own can size it the same way.
///
/// Why one thread (decision 0051): on a multi-thread runtime the worker that a message wakes
/// is often not the one that runs its task, so every request costs a second wake-up, and a
/// connection staying awake for the next request (`net.server_stay_awake_us`) makes the idle
/// workers wake each other while it waits. Under Ray on two cores that halved the put + get
/// round trip (0.32–0.38 to 0.17–0.27 ms).
pub fn server_runtime(config: &Config) -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(config.net.server_threads.max(1))
        .thread_name("tq-server")
        .enable_all()
        .build()
        .map_err(|e| Error::internal("cannot start the servers' runtime").with_source(e))
}

/// The settings of a server named `name` with `config`'s token.
pub fn server_config(config: &Config, name: &str) -> ServerConfig {
    ServerConfig {
        token: config.net.token.clone(),
        name: name.to_string(),
        stay_awake: std::time::Duration::from_micros(config.net.server_stay_awake_us),
        ..ServerConfig::default()
    }
}

/// The controller a configuration describes: its samplers, and either `units` storage units
/// (which resolve links) or the configuration's shared storage (which does not).
pub fn controller_service(
    config: &Config,
    units: Option<u32>,
    sampler: Option<SamplerSpec>,
) -> Result<ControllerServer> {
    let (default_sampler, named) = config.sampler_specs()?;
    let shared = config.storage_is_shared();
    if shared && units.is_some() {
        return Err(Error::invalid(format!(
            "units: the configured storage (backend `{}`) is shared by every process and has \
             no storage units",
            config.storage.backend
        )));
    }
    if shared {
        // Refuse at start what every client would refuse on connecting.
        config
            .check_shared_storage()
            .map_err(|e| e.context("the [storage] section this controller hands its clients"))?;
    }
    let units = units.unwrap_or(config.storage.num_units);
    if units == 0 {
        return Err(Error::invalid("a deployment needs at least 1 storage unit"));
    }
    let controller = Controller::new(ControllerConfig {
        storage_units: if shared { 1 } else { units },
        max_samples: config.controller.max_samples,
        default_sampler: sampler.unwrap_or(default_sampler),
        storage_backend: config.storage.backend.to_string(),
        links_supported: !shared,
    })?;
    for (name, spec) in named {
        controller.register_sampler(name, spec.build()?);
    }
    let controller = Arc::new(controller);
    Ok(if shared {
        tracing::info!(backend = %config.storage.backend, "shared storage: clients reach it directly");
        ControllerServer::with_shared_storage(controller, config.storage_description()?)
    } else {
        ControllerServer::new(controller, units)
    })
}

/// SSD offload for units: `explicit` if given, else the configuration's `[storage.ssd]`.
#[cfg(feature = "ssd")]
pub type Offload = Option<tq_backend_ssd::SsdConfig>;
/// SSD offload for units (none without feature `ssd`).
#[cfg(not(feature = "ssd"))]
pub type Offload = Option<std::convert::Infallible>;

#[cfg(feature = "ssd")]
fn offload(config: &Config, explicit: Offload) -> Offload {
    explicit.or_else(|| {
        config
            .storage
            .ssd
            .enabled
            .then(|| config.storage.ssd.clone())
    })
}

#[cfg(not(feature = "ssd"))]
fn offload(_config: &Config, _explicit: Offload) -> Offload {
    None
}

/// A storage unit `id` serving on `listen`: in memory, or with large cells on disk when
/// `ssd` (or the configuration) says so. Not yet registered with a controller.
pub async fn start_unit(
    id: &str,
    listen: &Endpoint,
    capacity: Option<usize>,
    ssd: Offload,
    config: &Config,
) -> Result<(Server, Arc<UnitServer>)> {
    let unit_config = UnitConfig {
        capacity: capacity.or(config.storage.capacity_per_unit),
        compaction_threshold: config.storage.compaction_threshold,
        ..UnitConfig::default()
    };
    let offload = offload(config, ssd);
    let unit_id = id.to_string();
    let make = move || -> Result<Arc<dyn StorageUnit>> {
        #[cfg(feature = "ssd")]
        if let Some(offload) = &offload {
            return Ok(Arc::new(tq_backend_ssd::SsdUnit::new(
                unit_id.clone(),
                unit_config.clone(),
                offload.clone(),
            )?));
        }
        #[cfg(not(feature = "ssd"))]
        let _ = &offload;
        // Its cells are slices of the frames it received, which only it holds: large clears
        // free them behind the answer.
        Ok(Arc::new(
            MemoryUnit::with_config(unit_id.clone(), unit_config.clone())?
                .free_cleared_behind(true),
        ))
    };
    let handler = Arc::new(UnitServer::new(make()?).with_factory(Box::new(make)));
    // Same-host clients that turn `net.shared_memory` on move large payloads through it; a
    // unit that cannot offer it still serves everything over the network.
    if let Err(e) = handler.offer_shared_memory() {
        tracing::info!(unit = %id, error = %e, "storage unit offers no shared memory");
    }
    let server = Server::bind(listen, server_config(config, id), handler.clone()).await?;
    Ok((server, handler))
}

/// `local` as clients should reach it: with `host` instead of the listening address's host.
pub fn advertised(local: &Endpoint, host: Option<&str>) -> Result<String> {
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

/// A controller and its storage units serving in this process (see the module docs).
pub struct Deployment {
    controller: Server,
    service: Arc<ControllerServer>,
    units: Vec<Server>,
    unit_services: Vec<Arc<UnitServer>>,
    unit_endpoints: Vec<(String, String)>,
    url: String,
    config: Config,
}

impl Deployment {
    /// Starts the units (registered with the controller in its epoch before anyone can
    /// connect), then the controller. Refuses a non-loopback address without a token unless
    /// `options.insecure`.
    pub async fn start(config: Config, options: ServeOptions) -> Result<Deployment> {
        let listen: Endpoint = options.listen.parse()?;
        let token = config.net.token.as_deref();
        check_exposure(&listen, token, options.insecure)?;
        let service = Arc::new(controller_service(
            &config,
            options.units,
            options.default_sampler,
        )?);
        let unit_count = if config.storage_is_shared() || options.remote_units {
            0
        } else {
            options.units.unwrap_or(config.storage.num_units)
        };
        let unit_listen: Endpoint = format!("tcp://{}:0", options.unit_host).parse()?;
        if unit_count > 0 {
            check_exposure(&unit_listen, token, options.insecure)?;
        }
        let mut units = Vec::new();
        let mut unit_services = Vec::new();
        let mut unit_endpoints = Vec::new();
        for i in 0..unit_count {
            let id = format!("unit-{i}");
            #[cfg(feature = "ssd")]
            let ssd = options.ssd.clone();
            #[cfg(not(feature = "ssd"))]
            let ssd = None;
            let (server, handler) =
                start_unit(&id, &unit_listen, options.capacity_per_unit, ssd, &config).await?;
            // In the controller's process: its epoch from the start.
            handler.adopt_epoch(service.epoch())?;
            let endpoint = advertised(server.local_endpoint(), options.advertise_host.as_deref())?;
            let registration = service.register_unit(UnitInfo {
                id: id.clone(),
                endpoint: endpoint.clone(),
                instance: tq_core::new_epoch(),
                registration: 0,
            })?;
            handler.adopt_registration(registration);
            units.push(server);
            unit_services.push(handler);
            unit_endpoints.push((id, endpoint));
        }
        let controller = Server::bind(
            &listen,
            server_config(&config, "controller"),
            service.clone(),
        )
        .await?;
        service.count_connections(controller.connection_count());
        let url = controller.local_endpoint().to_string();
        Ok(Deployment {
            controller,
            service,
            units,
            unit_services,
            unit_endpoints,
            url,
            config,
        })
    }

    /// Where clients connect (`tcp://host:port`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Each storage unit's id and endpoint, in routing order.
    pub fn unit_endpoints(&self) -> &[(String, String)] {
        &self.unit_endpoints
    }

    /// The controller being served (for metrics and health probes).
    pub fn controller_service(&self) -> &Arc<ControllerServer> {
        &self.service
    }

    /// The storage units being served, in routing order.
    pub fn unit_services(&self) -> &[Arc<UnitServer>] {
        &self.unit_services
    }

    /// A client in this process that calls the controller and the storage units directly,
    /// with no socket and no encoding in between: what the process hosting the deployment
    /// uses itself (an embedded client's cost, while other processes connect to
    /// [`Deployment::url`]). It sees and changes the same state as every connected client.
    ///
    /// `Unsupported` when the units are not in this process (`remote_units`) or the storage is
    /// shared (connect to [`Deployment::url`] instead). Closing the client leaves the
    /// deployment serving. The units here never change epoch (their controller is in this
    /// process and does not restart), so the handles taken now stay the ones served.
    pub fn local_client(&self) -> Result<crate::Client> {
        if self.unit_services.is_empty() {
            let what = if self.config.storage_is_shared() {
                self.config.storage.backend.to_string()
            } else {
                "storage units in other processes".to_string()
            };
            return Err(Error::unsupported(
                format!("local_client (connect to {} instead)", self.url),
                what,
            ));
        }
        let units = self
            .unit_services
            .iter()
            .map(|u| u.unit())
            .collect::<Result<Vec<_>>>()?;
        let storage = tq_backend_simple::SimpleStorage::new(units)?;
        // Metered here as the served requests are metered by the server.
        let control = Arc::new(tq_controller::MeteredPlane::new(
            self.service.controller().clone(),
        ));
        Ok(crate::Client::from_parts(
            control,
            Arc::new(storage),
            self.config.clone(),
        ))
    }

    /// Stops accepting, ends the connections, then stops the units.
    pub async fn shutdown(self) {
        self.controller.shutdown().await;
        for u in self.units {
            u.shutdown().await;
        }
    }
}

/// How often a [`RegisteredUnit`] registers again, so that a restarted controller is rejoined
/// quickly.
pub const REGISTER_EVERY: Duration = Duration::from_millis(500);

/// How a [`RegisteredUnit`] serves (the flags of `tq storage-unit`).
#[derive(Debug, Clone)]
pub struct UnitOptions {
    /// The unit's id; unit `i` of a controller with `N` units holds the samples whose index
    /// routes to it (`tq_core::routing::unit_of(index, N) == i`; `unit-<i>`, as [`Deployment`]
    /// names them).
    pub id: String,
    /// Where it listens (`tcp://host:port`; port 0 picks a free one).
    pub listen: String,
    /// The endpoint clients reach it at, when not the listening one (e.g. it is 0.0.0.0).
    pub advertise: Option<String>,
    /// Maximum samples (default: `storage.capacity_per_unit`).
    pub capacity: Option<usize>,
    /// SSD offload, overriding `[storage.ssd]`.
    pub ssd: Offload,
}

/// A storage unit serving on its own and registered with a controller elsewhere: what
/// `tq storage-unit` runs, and what the Python package's Ray placement starts on each node.
/// It keeps registering every [`REGISTER_EVERY`] in the background, so a controller that
/// restarts finds it again.
pub struct RegisteredUnit {
    server: Server,
    handler: Arc<UnitServer>,
    endpoint: String,
    keeping: tokio::task::JoinHandle<Error>,
}

impl RegisteredUnit {
    /// Starts the unit and registers it with `controller`: retried for 30 s while the
    /// controller is not reachable, and while another process holds the id until that
    /// holder's registration lapses (a dead predecessor); a holder still alive after that
    /// is a duplicate, and its refusal is returned. Nothing keeps serving after an error.
    pub async fn start(
        config: &Config,
        controller: &Endpoint,
        options: UnitOptions,
    ) -> Result<RegisteredUnit> {
        // Exposure (a non-loopback address without a token) is the caller's to check, with
        // its `insecure` flag: see `check_exposure`.
        let listen: Endpoint = options.listen.parse()?;
        let (server, handler) =
            start_unit(&options.id, &listen, options.capacity, options.ssd, config).await?;
        let endpoint = match &options.advertise {
            Some(a) => a.parse::<Endpoint>()?.to_string(),
            None => server.local_endpoint().to_string(),
        };
        let control = RemoteControlPlane::new(
            tq_net::Pool::new(tq_client::pool_config(config)),
            controller.clone(),
            config.request_timeout(),
        );
        let mut info = UnitInfo {
            id: options.id.clone(),
            endpoint: endpoint.clone(),
            instance: tq_core::new_epoch(),
            registration: 0,
        };
        let registered = match register_at_start(&control, &info).await {
            Ok(r) => r,
            Err(e) => {
                server.shutdown().await;
                return Err(e.context(format!(
                    "registering unit `{}` with {controller}",
                    options.id
                )));
            }
        };
        if let Err(e) = handler.adopt_epoch(registered.epoch) {
            server.shutdown().await;
            return Err(e);
        }
        handler.adopt_registration(registered.registration);
        info.registration = registered.registration;
        let keeping = {
            let handler = handler.clone();
            tokio::spawn(async move {
                control
                    .keep_registered(info, REGISTER_EVERY, |r| {
                        handler.adopt_registration(r.registration);
                        if let Err(e) = handler.adopt_epoch(r.epoch) {
                            tracing::warn!(error = %e, "cannot make the unit anew for the controller's new epoch; retrying at the next registration");
                        }
                    })
                    .await
            })
        };
        Ok(RegisteredUnit {
            server,
            handler,
            endpoint,
            keeping,
        })
    }

    /// Where clients reach the unit.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The unit being served (for metrics and health probes).
    pub fn handler(&self) -> &Arc<UnitServer> {
        &self.handler
    }

    /// Resolves when the unit lost its registration (another process took its id after this
    /// one could not register for too long): it must then stop serving under that id.
    pub async fn lost(&mut self) -> Error {
        match (&mut self.keeping).await {
            Ok(e) => e,
            Err(e) => Error::internal(format!("the registration task ended: {e}")),
        }
    }

    /// Stops registering and serving.
    pub async fn shutdown(self) {
        self.keeping.abort();
        self.server.shutdown().await;
    }
}

/// The first registration of a [`RegisteredUnit`] (see [`RegisteredUnit::start`]).
async fn register_at_start(control: &RemoteControlPlane, info: &UnitInfo) -> Result<Registration> {
    let start = tokio::time::Instant::now();
    let deadline = start + Duration::from_secs(30);
    let held_deadline = start + tq_controller::REGISTRATION_LAPSE + REGISTER_EVERY;
    loop {
        match control.register_unit(info.clone()).await {
            Ok(r) => return Ok(r),
            Err(e) if e.is_retryable() && tokio::time::Instant::now() < deadline => {
                tracing::info!(error = %e, "controller not reachable yet; retrying");
            }
            Err(e)
                if e.kind() == &tq_core::ErrorKind::Conflict
                    && e.message().contains(tq_controller::UNIT_ID_HELD)
                    && tokio::time::Instant::now() < held_deadline =>
            {
                tracing::info!(error = %e, "unit id held; retrying until a dead holder's registration lapses");
            }
            Err(e) => return Err(e),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_stay_awake_as_configured_and_the_defaults_agree() {
        let default = server_config(&Config::default(), "controller");
        assert_eq!(default.stay_awake, DEFAULT_STAY_AWAKE);
        let mut config = Config::default();
        config.net.server_stay_awake_us = 0;
        assert_eq!(
            server_config(&config, "unit").stay_awake,
            std::time::Duration::ZERO
        );
        config.net.server_stay_awake_us = 750;
        let set = server_config(&config, "unit");
        assert_eq!(set.stay_awake, std::time::Duration::from_micros(750));
        assert_eq!(set.name, "unit");
    }

    #[test]
    fn the_servers_runtime_has_the_configured_workers() {
        let one = server_runtime(&Config::default()).unwrap();
        assert_eq!(one.metrics().num_workers(), 1);
        let mut config = Config::default();
        config.net.server_threads = 3;
        assert_eq!(server_runtime(&config).unwrap().metrics().num_workers(), 3);
    }
}
