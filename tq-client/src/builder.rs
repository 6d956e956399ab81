//! [`ClientBuilder`]: one place that wires a client — embedded or connected — from a
//! configuration, optional custom storage, merge functions, samplers and custom backends.

use crate::backends::{BackendFactory, BackendRegistry};
use crate::{Client, Config};
use std::sync::Arc;
use tq_controller::{Controller, ControllerConfig, Sampler};
use tq_core::{Error, MergeFn, MergeRegistry, Result, StorageManager};

/// Builds a [`Client`]. Start with [`Client::builder`].
///
/// ```no_run
/// # async fn run() -> tq_core::Result<()> {
/// use tq_client::{Client, Config};
/// // In this process, with the default configuration plus `TQ_*` environment overrides:
/// let embedded = Client::builder().build()?;
/// // A remote deployment:
/// let remote = Client::builder().config(Config::default()).connect("tcp://127.0.0.1:7700").await?;
/// # Ok(()) }
/// ```
///
/// Settings that cannot apply to the chosen deployment are errors, never silently dropped:
/// samplers run in the controller, and merge functions where the payloads are written (in this
/// process for a shared KV store, in the storage-unit processes otherwise), so a connected
/// client refuses samplers, and merges unless the controller's storage is shared.
#[derive(Default)]
#[must_use = "a builder does nothing until build() or connect()"]
pub struct ClientBuilder {
    config: Option<Config>,
    storage: Option<Arc<dyn StorageManager>>,
    merges: MergeRegistry,
    samplers: Vec<(String, Arc<dyn Sampler>)>,
    backends: BackendRegistry,
    key_cache_entries: Option<usize>,
    /// Install this process's Prometheus exporter before building (feature `metrics`).
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    install_metrics: bool,
}

impl std::fmt::Debug for ClientBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientBuilder")
            .field("config", &self.config)
            .field(
                "storage",
                &self.storage.as_ref().map(|s| s.name().to_string()),
            )
            .field(
                "samplers",
                &self.samplers.iter().map(|(n, _)| n).collect::<Vec<_>>(),
            )
            .field("backends", &self.backends.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl ClientBuilder {
    /// The configuration to use. Without one, [`Config::load`]`(None)`: the defaults plus the
    /// environment's `TQ_*` overrides.
    pub fn config(mut self, config: Config) -> Self {
        self.config = Some(config);
        self
    }

    /// Use this storage instead of building the one `storage.backend` names (embedded only).
    pub fn storage(mut self, storage: Arc<dyn StorageManager>) -> Self {
        self.storage = Some(storage);
        self
    }

    /// A merge function `kv_update` can name (`MergeOp::Named(name)`), registered on the
    /// storage the builder makes (embedded only).
    pub fn merge(mut self, name: impl Into<String>, f: MergeFn) -> Self {
        self.merges.register(name, f);
        self
    }

    /// Every merge function of `merges` (added to those already registered).
    pub fn merges(mut self, merges: &MergeRegistry) -> Self {
        for (name, f) in merges.iter() {
            self.merges.register(name.clone(), f.clone());
        }
        self
    }

    /// A sampler fetches can name (`GetMetaRequest::with_sampler`), besides those the
    /// configuration's `[controller.samplers]` builds (embedded only).
    pub fn sampler(mut self, name: impl Into<String>, sampler: Arc<dyn Sampler>) -> Self {
        self.samplers.push((name.into(), sampler));
        self
    }

    /// A custom storage backend that configuration can choose with `storage.backend = "<name>"`.
    /// The factory receives the whole configuration and the builder's merge functions.
    pub fn backend(
        mut self,
        name: impl Into<String>,
        factory: impl Fn(&Config, &MergeRegistry) -> Result<Arc<dyn StorageManager>>
            + Send
            + Sync
            + 'static,
    ) -> Self {
        let factory: BackendFactory = Arc::new(factory);
        self.backends.insert(name.into(), factory);
        self
    }

    /// Overrides `net.key_cache_entries` (see [`Client::with_key_cache`]).
    pub fn key_cache_entries(mut self, entries: usize) -> Self {
        self.key_cache_entries = Some(entries);
        self
    }

    /// Installs this process's Prometheus exporter ([`crate::MetricsExporter`]) before the
    /// client is built, so that its controller (embedded) and storage record into it; read it
    /// with `tq::telemetry::Metrics::metrics` or [`crate::MetricsExporter::render`]. Installing twice is
    /// fine (the first exporter is kept); another recorder installed by the application is an
    /// error at build.
    #[cfg(feature = "metrics")]
    pub fn metrics(mut self, install: bool) -> Self {
        self.install_metrics = install;
        self
    }

    fn install_metrics(&self) -> Result<()> {
        #[cfg(feature = "metrics")]
        if self.install_metrics {
            crate::MetricsExporter::install()?;
        }
        Ok(())
    }

    fn take_config(&mut self) -> Result<Config> {
        let config = match self.config.take() {
            Some(c) => c,
            None => Config::load(None)?,
        };
        config.validate()?;
        Ok(config)
    }

    /// An embedded client: the controller and the storage run in this process.
    pub fn build(mut self) -> Result<Client> {
        self.install_metrics()?;
        let config = self.take_config()?;
        // The epoch is chosen before the storage is built: KV keys carry it.
        let epoch = tq_core::new_epoch();
        let storage = match self.storage.take() {
            Some(storage) => {
                if !self.merges.is_empty() {
                    return Err(Error::invalid(
                        "merge functions are registered on the storage the builder makes; \
                         register them on the custom storage passed to ClientBuilder::storage",
                    ));
                }
                storage
            }
            None => crate::backends::build(&config, self.merges, &self.backends, epoch)?,
        };
        let (default_sampler, named) = config.sampler_specs()?;
        let controller = Controller::new(ControllerConfig {
            storage_units: config.storage.num_units,
            max_samples: config.controller.max_samples,
            default_sampler,
            storage_backend: storage.name().to_string(),
            links_supported: storage.capabilities().links,
        })?
        .with_epoch(epoch);
        for (name, spec) in named {
            controller.register_sampler(name, spec.build()?);
        }
        for (name, sampler) in self.samplers {
            controller.register_sampler(name, sampler);
        }
        // The controller records the controller role's request metrics (a no-op until an
        // exporter is installed).
        let control = Arc::new(tq_controller::MeteredPlane::new(Arc::new(controller)));
        let client = Client::from_parts(control, storage, config);
        Ok(match self.key_cache_entries {
            Some(n) => client.with_key_cache(n),
            None => client,
        })
    }

    /// A client of the controller at `url` (`tcp://host:port` or `unix:///path`).
    #[cfg(feature = "remote")]
    pub async fn connect(mut self, url: &str) -> Result<Client> {
        self.install_metrics()?;
        let config = self.take_config()?;
        let embedded_only = [
            (
                self.storage.is_some(),
                "a custom storage (ClientBuilder::storage)",
            ),
            (!self.merges.is_empty(), "merge functions"),
            (!self.samplers.is_empty(), "samplers"),
            (
                !config.controller.samplers.is_empty(),
                "[controller.samplers]",
            ),
        ];
        if let Some((_, what)) = embedded_only.iter().find(|(set, _)| *set) {
            return Err(Error::invalid(format!(
                "{what}: only an embedded client can carry these; a connected client uses \
                 the controller's and the storage units' (configure them on the servers)"
            )));
        }
        let entries = self
            .key_cache_entries
            .unwrap_or(config.net.key_cache_entries);
        let client = crate::remote::connect(url, config, self.merges, &self.backends).await?;
        Ok(client.with_key_cache(entries))
    }
}
