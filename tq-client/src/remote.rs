//! `Client::connect`: the same client over a remote controller and remote storage units.

use crate::{Client, Config};
use std::sync::Arc;
use std::time::Duration;
use tq_backend_simple::{RemoteUnit, SimpleStorage};
use tq_controller::RemoteControlPlane;
use tq_core::{Error, Result};
use tq_net::{ClientConfig, Endpoint, Pool};

/// The connection pool settings a configuration asks for.
pub fn pool_config(config: &Config) -> ClientConfig {
    ClientConfig {
        token: config.net.token.clone(),
        connect_timeout: config.connect_timeout(),
        request_timeout: config.request_timeout(),
        retry: tq_net::RetryConfig {
            max_elapsed: Duration::from_millis(config.net.retry_max_elapsed_ms),
            ..tq_net::RetryConfig::default()
        },
        ..ClientConfig::default()
    }
}

impl Client {
    /// Connects to a controller (`tcp://host:port` or `unix:///path`) with the default
    /// configuration plus environment overrides (e.g. `TQ_NET_TOKEN`). Shortcut for
    /// `Client::builder().connect(url)`.
    pub async fn connect(url: &str) -> Result<Client> {
        Client::builder().connect(url).await
    }

    /// [`Client::connect`] with this configuration. Shortcut for
    /// `Client::builder().config(config).connect(url)`.
    pub async fn connect_with(url: &str, config: Config) -> Result<Client> {
        Client::builder().config(config).connect(url).await
    }
}

/// Connects to a controller, waits until every storage unit has registered (up to the connect
/// timeout) and routes to the units in the controller's order, so every process places samples
/// identically. A controller whose storage is shared (a KV store) hands out its description
/// instead: the client builds the same storage and reads and writes it directly.
pub(crate) async fn connect(
    url: &str,
    mut config: Config,
    merges: tq_core::MergeRegistry,
    backends: &crate::backends::BackendRegistry,
) -> Result<Client> {
    {
        let endpoint: Endpoint = url.parse()?;
        let pool = Pool::new(pool_config(&config));
        let control =
            RemoteControlPlane::new(pool.clone(), endpoint.clone(), config.request_timeout());
        let deadline = tokio::time::Instant::now() + config.connect_timeout();
        let topology = loop {
            let t = control.topology().await?;
            if t.is_complete() {
                break t;
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(Error::unavailable(format!(
                    "controller {endpoint}: {} of {} storage units registered",
                    t.units.len(),
                    t.expected_units
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        if let Some(storage) = &topology.storage {
            adopt_storage(&mut config, storage, &endpoint)?;
            let storage = crate::backends::build(&config, merges, backends, topology.epoch)
                .map_err(|e| e.context(format!("the storage of controller {endpoint}")))?;
            return Ok(Client::from_parts(Arc::new(control), storage, config));
        }
        if !merges.is_empty() {
            return Err(Error::invalid(format!(
                "merge functions: controller {endpoint} keeps payloads in storage-unit processes, \
                 where merges run; register them there"
            )));
        }
        let units = topology
            .units
            .iter()
            .map(|u| {
                let ep: Endpoint = u.endpoint.parse().map_err(|e: Error| {
                    e.context(format!("storage unit `{}` registered a bad endpoint", u.id))
                })?;
                Ok(Arc::new(
                    RemoteUnit::new(u.id.clone(), ep, pool.clone())
                        .with_epoch(topology.epoch)
                        .with_registration(u.registration)
                        .with_shared_memory(config.net.shared_memory),
                ) as Arc<dyn tq_unit::StorageUnit>)
            })
            .collect::<Result<Vec<_>>>()?;
        let storage = SimpleStorage::new(units)?;
        Ok(Client::from_parts(
            Arc::new(control),
            Arc::new(storage),
            config,
        ))
    }
}

/// Takes the controller's `[storage]` section into `config`. A client configuration that says
/// something else about storage is refused: two processes must never use different stores,
/// routing or TTLs for one job.
fn adopt_storage(config: &mut Config, description: &str, controller: &Endpoint) -> Result<()> {
    let theirs = Config::from_toml(description)
        .map_err(|e| {
            e.context(format!(
                "the storage description of controller {controller}"
            ))
        })?
        .storage;
    let ours = &config.storage;
    if *ours != crate::StorageSection::default() && *ours != theirs {
        return Err(Error::invalid(format!(
            "the client configuration's [storage] (backend `{}`) contradicts the storage of \
             controller {controller} (backend `{}`): a connected client uses the controller's \
             storage; remove [storage] from the client configuration",
            ours.backend, theirs.backend
        )));
    }
    config.storage = theirs;
    Ok(())
}
