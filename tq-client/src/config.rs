//! Client configuration: a typed struct read from TOML, with environment overrides.
//!
//! ```toml
//! [controller]
//! default_sampler = "sequential"   # or "grpo:<n>", "rank-aware",
//!                                  # "seqlen-balanced:<dp_size>[:<n>]"
//! fetch_timeout_ms = 30000         # how long `Client::fetch` waits for ready samples
//!
//! [controller.samplers]            # extra samplers a fetch can name
//! grpo = "grpo:4"
//!
//! [storage]
//! backend = "simple"               # in-memory storage units (the embedded default)
//! num_units = 2                    # sample index i lives on unit (i / 16) % num_units
//! capacity_per_unit = 100000       # samples per unit; omit for unlimited
//! compaction_threshold = 0.5       # compact a put's allocation when less than this is live
//!
//! [storage.kv]                     # with backend = "kv" (see tq_backend_kv::KvConfig)
//! stores = [{ url = "redis://127.0.0.1:6379" }]   # memory://, redis+cluster://h:p,..,
//!                                  # file:///dir, object-memory://
//! data_ttl_ms = 3600000            # omit: no TTL, clear deletes
//! routing = { kind = "by-size", threshold = 65536, small = "a", large = "b" }
//!
//! [storage.ssd]                    # offload large cells of the units to disk
//! enabled = true
//! path = "/mnt/nvme/tq"            # created with parents; runs keep their files below it
//! threshold_bytes = 1048576        # cells at least this large go to disk
//! engine = "auto"                  # io_uring when available, else pread/pwrite
//!
//! [net]                            # remote deployments
//! token = "..."                    # shared secret (better: TQ_NET_TOKEN)
//! request_timeout_ms = 30000
//! connect_timeout_ms = 5000
//! key_cache_entries = 16384        # remote clients: overlap small gets with the key lookup
//! retry_max_elapsed_ms = 10000     # keep retrying what is safe to repeat through a restart
//! shared_memory = false            # same-host units: large payloads through shared memory
//! ```
//!
//! # Environment overrides
//!
//! Every key can be overridden by an environment variable, by one rule: `TQ_` followed by the
//! key's path in upper case with `_` between the parts, e.g. `TQ_STORAGE_NUM_UNITS=4`,
//! `TQ_CONTROLLER_FETCH_TIMEOUT_MS=500`, `TQ_STORAGE_KV_DATA_TTL_MS=60000`,
//! `TQ_STORAGE_SSD_ENABLED=true`, `TQ_CONTROLLER_SAMPLERS_GRPO=grpo:4` (adds a named sampler).
//! Values are TOML values (`4`, `true`, `[{ url = "memory://" }]`); anything else is taken as a
//! string. A variable under `TQ_CONTROLLER_`, `TQ_STORAGE_` or `TQ_NET_` that names no key is
//! an error, like an unknown key in the file; other `TQ_*` variables are not configuration and
//! are left alone.
//!
//! # Backends and features
//!
//! `storage.backend` is `simple` (feature `simple`, on by default), `kv` (feature `kv`; Redis and
//! object storage need `redis` / `object-store` as well), or the name of a backend registered
//! with [`crate::ClientBuilder::backend`]. The `[storage.kv]` and `[storage.ssd]` sections exist
//! only in builds with the `kv` / `ssd` feature; in other builds the section is an error naming
//! the feature, never silently ignored.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;
use tq_core::{Error, Result};

mod env;
pub mod reference;
use env::set_from_env;

/// Most worker threads `net.server_threads` may ask for.
const MAX_SERVER_THREADS: usize = 1024;

/// Everything a client needs. `Config::default()` is a working setup.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub controller: ControllerSection,
    pub storage: StorageSection,
    pub net: NetSection,
}

/// Settings of remote deployments (`Client::connect`, `tq serve`, ...). `Debug` does not show
/// the token.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NetSection {
    /// Shared secret every peer presents in its handshake (required by servers that listen on
    /// a non-loopback address). Prefer the `TQ_NET_TOKEN` environment variable to a file.
    pub token: Option<String>,
    /// Deadline of one request, in milliseconds (a waiting fetch gets its wait on top).
    pub request_timeout_ms: u64,
    /// Deadline of connecting to a peer, and of waiting for every storage unit to register
    /// when a client connects, in milliseconds.
    pub connect_timeout_ms: u64,
    /// Keys whose metadata a remote client remembers so that small gets of them overlap the
    /// storage read with the key lookup (see `Client::with_key_cache`); `0` turns it off.
    pub key_cache_entries: usize,
    /// How long a request that failed in transport (no connection, a lost one) and is safe to
    /// repeat keeps being retried, with backoff and jitter, in milliseconds (never past the
    /// request's own deadline): rides out a controller or storage-unit restart. `0`: only the
    /// one retry an idempotent request always gets. Counted in `tq_net_retries_total`.
    pub retry_max_elapsed_ms: u64,
    /// Move large payloads (from 256 KiB) through shared memory when a storage unit runs on
    /// the same machine and offers it: sealed memfd segments handed over a Unix socket, read
    /// by mapping them instead of through TCP. Falls back to TCP, with one log line saying
    /// why, when the unit is elsewhere or refuses. Off by default (Linux only).
    pub shared_memory: bool,
    /// Servers (controller, storage units): how long a connection stays awake after each
    /// request for the next one before its thread sleeps, in microseconds. A thread woken
    /// from sleep costs 40–120 µs on a VM; a conversation's next request (a put's notice after
    /// its write) usually comes sooner. `0`: sleep at once. Decision 0046.
    pub server_stay_awake_us: u64,
    /// Servers (controller, storage units): worker threads of the runtime a tq program or the
    /// Python package runs them on. One by default: a request costs a server microseconds, and
    /// with more workers the thread woken by the socket hands each request to another
    /// (a second wake-up per message), while a connection staying awake keeps a sibling worker
    /// waking and searching. More threads help a server whose requests are long and
    /// concurrent (many clients on many cores). Decision 0051.
    pub server_threads: usize,
}

impl std::fmt::Debug for NetSection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetSection")
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("request_timeout_ms", &self.request_timeout_ms)
            .field("connect_timeout_ms", &self.connect_timeout_ms)
            .field("key_cache_entries", &self.key_cache_entries)
            .field("retry_max_elapsed_ms", &self.retry_max_elapsed_ms)
            .field("shared_memory", &self.shared_memory)
            .field("server_stay_awake_us", &self.server_stay_awake_us)
            .field("server_threads", &self.server_threads)
            .finish()
    }
}

impl Default for NetSection {
    fn default() -> Self {
        NetSection {
            token: None,
            request_timeout_ms: 30_000,
            connect_timeout_ms: 5_000,
            key_cache_entries: 16_384,
            retry_max_elapsed_ms: 10_000,
            shared_memory: false,
            // tq_net::DEFAULT_STAY_AWAKE (tq-net is optional here; the facade tests they agree).
            server_stay_awake_us: 200,
            server_threads: 1,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ControllerSection {
    /// Sampler for fetches that name none (a [`tq_controller::SamplerSpec`]: `sequential`,
    /// `grpo:<n>`, `rank-aware`, `seqlen-balanced:<dp_size>` or `seqlen-balanced:<dp_size>:<n>`).
    pub default_sampler: String,
    /// How long [`crate::Partition::fetch`] waits for enough ready samples, in milliseconds.
    pub fetch_timeout_ms: u64,
    /// Extra samplers fetches can name (`GetMetaRequest::with_sampler`): name → any of the
    /// forms `default_sampler` accepts.
    pub samplers: BTreeMap<String, String>,
    /// Samples the controller holds at once over all partitions (`None`: no limit besides the
    /// index space). An insert or a put of new keys beyond it is refused before anything is
    /// allocated or written.
    pub max_samples: Option<u64>,
}

impl Default for ControllerSection {
    fn default() -> Self {
        ControllerSection {
            default_sampler: "sequential".into(),
            fetch_timeout_ms: 30_000,
            samplers: BTreeMap::new(),
            max_samples: None,
        }
    }
}

/// Which storage backend holds the payloads (`storage.backend`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Backend {
    /// `simple`: in-memory storage units in this process (feature `simple`), optionally with
    /// SSD offload (`[storage.ssd]`, feature `ssd`).
    #[default]
    Simple,
    /// `kv`: the generic key-value adapter (`[storage.kv]`, feature `kv`): in-memory, Redis
    /// (feature `redis`) or object_store (feature `object-store`).
    Kv,
    /// Any other name: a backend registered with [`crate::ClientBuilder::backend`].
    Custom(String),
}

impl Backend {
    /// The name configuration uses.
    pub fn name(&self) -> &str {
        match self {
            Backend::Simple => "simple",
            Backend::Kv => "kv",
            Backend::Custom(name) => name,
        }
    }
}

impl std::str::FromStr for Backend {
    type Err = Error;
    fn from_str(s: &str) -> Result<Backend> {
        let s = s.trim();
        match s {
            "simple" => Ok(Backend::Simple),
            "kv" => Ok(Backend::Kv),
            "" => Err(Error::invalid("storage.backend must not be empty")),
            name if name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') =>
            {
                Ok(Backend::Custom(name.to_string()))
            }
            other => Err(Error::invalid(format!(
                "storage.backend `{other}`: a backend name has only letters, digits, `-` and `_`"
            ))),
        }
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Serialize for Backend {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for Backend {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Backend, D::Error> {
        let s = String::deserialize(d)?;
        s.parse()
            .map_err(|e: Error| serde::de::Error::custom(e.message()))
    }
}

/// The place of a configuration section whose backend this build leaves out (its cargo feature
/// is off). Any content is accepted when parsing and remembered as present, so that
/// [`Config::validate`] can name the missing feature instead of ignoring the section.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NotBuilt {
    present: bool,
}

impl NotBuilt {
    /// Whether the configuration had this section.
    pub fn is_present(&self) -> bool {
        self.present
    }
}

impl Serialize for NotBuilt {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        s.serialize_map(Some(0))?.end()
    }
}

impl<'de> Deserialize<'de> for NotBuilt {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<NotBuilt, D::Error> {
        let table = BTreeMap::<String, serde::de::IgnoredAny>::deserialize(d)?;
        Ok(NotBuilt {
            present: !table.is_empty(),
        })
    }
}

/// The `[storage.kv]` section: [`tq_backend_kv::KvConfig`] with feature `kv`.
#[cfg(feature = "kv")]
pub type KvSection = tq_backend_kv::KvConfig;
/// The `[storage.kv]` section: an error when present, since this build has no `kv` feature.
#[cfg(not(feature = "kv"))]
pub type KvSection = NotBuilt;

/// The `[storage.ssd]` section: [`tq_backend_ssd::SsdConfig`] with feature `ssd`.
#[cfg(feature = "ssd")]
pub type SsdSection = tq_backend_ssd::SsdConfig;
/// The `[storage.ssd]` section: an error when present, since this build has no `ssd` feature.
#[cfg(not(feature = "ssd"))]
pub type SsdSection = NotBuilt;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StorageSection {
    pub backend: Backend,
    /// Number of storage units; sample index `i` lives on unit `(i / 16) % num_units`
    /// (`tq_core::routing`).
    pub num_units: u32,
    /// Maximum samples per unit (`None`: unlimited). Only the `simple` backend has units.
    pub capacity_per_unit: Option<usize>,
    /// A dense put's allocation is compacted when less than this fraction of its rows is live.
    pub compaction_threshold: f64,
    /// Settings of `backend = "kv"`.
    pub kv: KvSection,
    /// SSD offload of the simple backend's units (`[storage.ssd]`: `enabled`, `path`,
    /// `threshold_bytes` (default 1 MiB), `engine` = `auto` | `uring` | `psync`).
    pub ssd: SsdSection,
}

impl Default for StorageSection {
    fn default() -> Self {
        StorageSection {
            backend: Backend::Simple,
            num_units: 2,
            capacity_per_unit: None,
            compaction_threshold: 0.5,
            kv: KvSection::default(),
            ssd: SsdSection::default(),
        }
    }
}

impl StorageSection {
    /// The URL of a KV store of this configuration that keeps its data in this process's
    /// memory (`memory:`, `object-memory:`), if any: its payloads end with the process, so a
    /// checkpoint that leaves payloads in their store would lose them.
    pub fn in_process_kv_store(&self) -> Option<&str> {
        #[cfg(feature = "kv")]
        {
            self.kv
                .stores
                .iter()
                .map(|s| s.url.as_str())
                .find(|u| u.starts_with("memory:") || u.starts_with("object-memory:"))
        }
        #[cfg(not(feature = "kv"))]
        None
    }
}

/// The top-level sections environment variables can address (`TQ_<SECTION>_...`).
pub(crate) const ENV_SECTIONS: [&str; 3] = ["controller", "storage", "net"];

impl Config {
    /// Parses TOML; unknown keys are errors (a typo should not silently use a default).
    pub fn from_toml(text: &str) -> Result<Config> {
        let c: Config =
            toml::from_str(text).map_err(|e| Error::invalid(format!("configuration: {e}")))?;
        c.validate()?;
        // Whether a key was written cannot be told from its default: look at the text.
        let table: toml::Table =
            toml::from_str(text).map_err(|e| Error::invalid(format!("configuration: {e}")))?;
        let set = table
            .get("storage")
            .and_then(|s| s.as_table())
            .is_some_and(|s| s.contains_key("num_units"));
        c.check_num_units(set)?;
        Ok(c)
    }

    /// Reads `path` (if given) then applies the environment's overrides.
    pub fn load(path: Option<&Path>) -> Result<Config> {
        let mut c = match path {
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|e| {
                    Error::invalid(format!("cannot read configuration {}", p.display()))
                        .with_source(e)
                })?;
                Config::from_toml(&text)?
            }
            None => Config::default(),
        };
        c.apply_env(std::env::vars())?;
        Ok(c)
    }

    /// Applies the `TQ_<PATH>` overrides among `vars` (name, value) — see the module docs for
    /// the rule. All or nothing: on error the configuration is unchanged.
    pub fn apply_env(&mut self, vars: impl IntoIterator<Item = (String, String)>) -> Result<()> {
        let mut vars: Vec<(String, String)> = vars
            .into_iter()
            .filter(|(k, _)| {
                ENV_SECTIONS
                    .iter()
                    .any(|s| k.starts_with(&format!("TQ_{}_", s.to_uppercase())))
            })
            .collect();
        if vars.is_empty() {
            return Ok(());
        }
        vars.sort();
        let mut tree = toml::Table::try_from(&*self)
            .map_err(|e| Error::internal(format!("configuration does not serialize: {e}")))?;
        for (name, raw) in &vars {
            set_from_env(&mut tree, name, raw)?;
        }
        let c: Config = toml::Value::Table(tree)
            .try_into()
            .map_err(|e| Error::invalid(format!("configuration from the environment: {e}")))?;
        c.validate()?;
        c.check_num_units(vars.iter().any(|(k, _)| k == "TQ_STORAGE_NUM_UNITS"))?;
        *self = c;
        Ok(())
    }

    /// Rejects settings that cannot work, and settings that would be silently ignored.
    pub fn validate(&self) -> Result<()> {
        let s = &self.storage;
        if s.num_units == 0 {
            return Err(Error::invalid("storage.num_units must be at least 1"));
        }
        if !(0.0..=1.0).contains(&s.compaction_threshold) {
            return Err(Error::invalid(
                "storage.compaction_threshold must be between 0 and 1",
            ));
        }
        if s.capacity_per_unit == Some(0) {
            return Err(Error::invalid(
                "storage.capacity_per_unit must be at least 1",
            ));
        }
        if self.controller.max_samples == Some(0) {
            return Err(Error::invalid("controller.max_samples must be at least 1"));
        }
        if !(1..=MAX_SERVER_THREADS).contains(&self.net.server_threads) {
            return Err(Error::invalid(format!(
                "net.server_threads must be between 1 and {MAX_SERVER_THREADS}, got {}",
                self.net.server_threads
            )));
        }
        self.validate_kv()?;
        self.validate_ssd()?;
        if s.backend != Backend::Simple && s.capacity_per_unit.is_some() {
            return Err(Error::invalid(format!(
                "storage.capacity_per_unit applies to the `simple` backend's units, \
                 not to storage.backend = `{}`",
                s.backend
            )));
        }
        self.sampler_specs()?;
        Ok(())
    }

    #[cfg(feature = "kv")]
    fn validate_kv(&self) -> Result<()> {
        let s = &self.storage;
        if s.backend == Backend::Kv {
            s.kv.validate()
        } else if s.kv != KvSection::default() {
            Err(Error::invalid(format!(
                "[storage.kv] is set but storage.backend is `{}`; set backend = \"kv\" or remove it",
                s.backend
            )))
        } else {
            Ok(())
        }
    }

    #[cfg(not(feature = "kv"))]
    fn validate_kv(&self) -> Result<()> {
        if self.storage.backend == Backend::Kv || self.storage.kv.is_present() {
            return Err(feature_off(
                "storage.backend = \"kv\" and [storage.kv]",
                "kv",
            ));
        }
        Ok(())
    }

    #[cfg(feature = "ssd")]
    fn validate_ssd(&self) -> Result<()> {
        let s = &self.storage;
        if s.ssd.enabled && s.backend != Backend::Simple {
            return Err(Error::invalid(format!(
                "storage.ssd offloads the `simple` backend's units; storage.backend is `{}`",
                s.backend
            )));
        }
        if !s.ssd.enabled && s.ssd != SsdSection::default() {
            return Err(Error::invalid(
                "[storage.ssd] has settings but enabled = false; set enabled = true or remove them",
            ));
        }
        Ok(())
    }

    #[cfg(not(feature = "ssd"))]
    fn validate_ssd(&self) -> Result<()> {
        if self.storage.ssd.is_present() {
            return Err(feature_off("[storage.ssd]", "ssd"));
        }
        Ok(())
    }

    /// The default sampler's spec and the named samplers' specs, parsed.
    pub fn sampler_specs(
        &self,
    ) -> Result<(
        tq_controller::SamplerSpec,
        Vec<(String, tq_controller::SamplerSpec)>,
    )> {
        let default = self
            .controller
            .default_sampler
            .parse()
            .map_err(|e: Error| e.context("controller.default_sampler"))?;
        let named = self
            .controller
            .samplers
            .iter()
            .map(|(name, spec)| {
                spec.parse()
                    .map(|s| (name.clone(), s))
                    .map_err(|e: Error| e.context(format!("controller.samplers.{name}")))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok((default, named))
    }

    /// The `[storage]` section alone, as TOML: what a controller whose storage is shared hands
    /// to the clients that connect (it may hold credentials; never log it).
    pub fn storage_description(&self) -> Result<String> {
        let broken = |e: &dyn std::fmt::Display| {
            Error::internal(format!("the [storage] section does not serialize: {e}"))
        };
        let mut storage = toml::Table::try_from(&self.storage).map_err(|e| broken(&e))?;
        if self.storage_is_shared() {
            // Units have no meaning for shared storage, and a client refuses the key there.
            storage.remove("num_units");
        }
        if self.storage.ssd == SsdSection::default() {
            // SSD offload off: nothing to say, and a client built without the `ssd` feature
            // refuses any `[storage.ssd]` it is handed, even a disabled one.
            storage.remove("ssd");
        }
        let mut description = toml::Table::new();
        description.insert("storage".into(), toml::Value::Table(storage));
        toml::to_string(&description).map_err(|e| broken(&e))
    }

    /// Builds the shared storage this configuration names (a KV backend), as every client of
    /// a controller serving it will, and drops it — no I/O. A controller checks this at start,
    /// so that a backend this build lacks (a typo such as `kvv`, or a custom backend, which
    /// only a program of its own can register), or a `rediss://` store in a build without the
    /// `redis-tls` feature, stops it instead of being handed to clients that refuse it.
    pub fn check_shared_storage(&self) -> Result<()> {
        self.build_shared_storage().map(drop)
    }

    /// The shared storage this configuration names, built as a client builds it (no custom
    /// backends, keys outside any epoch, no I/O): what a controller serving it probes for its
    /// health checks.
    pub fn build_shared_storage(&self) -> Result<std::sync::Arc<dyn tq_core::StorageManager>> {
        crate::backends::build(
            self,
            tq_core::MergeRegistry::default(),
            &crate::backends::BackendRegistry::new(),
            0,
        )
    }

    /// Refuses `storage.num_units` set (`set`) for a backend without storage units.
    fn check_num_units(&self, set: bool) -> Result<()> {
        if set && self.storage.backend != Backend::Simple {
            return Err(Error::invalid(format!(
                "storage.num_units applies to the `simple` backend's units; storage.backend is \
                 `{}`, which has none: remove it",
                self.storage.backend
            )));
        }
        Ok(())
    }

    /// True when every process reaches the payloads directly (a KV store, a custom backend),
    /// rather than through the storage units a controller lists.
    pub fn storage_is_shared(&self) -> bool {
        self.storage.backend != Backend::Simple
    }

    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.net.request_timeout_ms)
    }

    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.net.connect_timeout_ms)
    }

    pub fn fetch_timeout(&self) -> Duration {
        Duration::from_millis(self.controller.fetch_timeout_ms)
    }
}

/// The error for configuration that needs a cargo feature this build lacks.
#[cfg_attr(
    all(feature = "simple", feature = "kv", feature = "ssd"),
    allow(dead_code) // every backend is built in
)]
pub(crate) fn feature_off(what: &str, feature: &str) -> Error {
    Error::unsupported(
        what,
        format!("this build of tq (enable the `{feature}` feature of the `tq` crate)"),
    )
}

#[cfg(test)]
mod tests;
