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
//! num_units = 2                    # sample index i lives on unit i % num_units
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
//! ```
//!
//! Every key can be overridden by an environment variable named `TQ_<SECTION>_<KEY>` in upper
//! case, e.g. `TQ_STORAGE_NUM_UNITS=4` or `TQ_CONTROLLER_FETCH_TIMEOUT_MS=500`.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;
use tq_core::{Error, Result};

/// Everything `Client::embedded` needs. `Config::default()` is a working setup.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub controller: ControllerSection,
    pub storage: StorageSection,
    pub net: NetSection,
}

/// Settings of remote deployments (`Client::connect`, `tq serve`, ...).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
}

impl Default for NetSection {
    fn default() -> Self {
        NetSection {
            token: None,
            request_timeout_ms: 30_000,
            connect_timeout_ms: 5_000,
            key_cache_entries: 16_384,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ControllerSection {
    /// Sampler for fetches that name none: `sequential`, `grpo:<n>`, `rank-aware`,
    /// `seqlen-balanced:<dp_size>` or `seqlen-balanced:<dp_size>:<n>`
    /// (see `tq_controller::sampler_from_name`).
    pub default_sampler: String,
    /// How long [`crate::Client::fetch`] waits for enough ready samples, in milliseconds.
    pub fetch_timeout_ms: u64,
    /// Extra samplers fetches can name (`GetMetaRequest::with_sampler`): name → any of the
    /// forms `default_sampler` accepts.
    pub samplers: BTreeMap<String, String>,
}

impl Default for ControllerSection {
    fn default() -> Self {
        ControllerSection {
            default_sampler: "sequential".into(),
            fetch_timeout_ms: 30_000,
            samplers: BTreeMap::new(),
        }
    }
}

/// Which storage backend holds the payloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// In-memory storage units in this process.
    #[default]
    Simple,
    /// The generic key-value adapter (`[storage.kv]`): in-memory, Redis (feature `redis`) or
    /// object_store (feature `object-store`).
    Kv,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StorageSection {
    pub backend: Backend,
    /// Number of storage units; sample index `i` lives on unit `i % num_units`.
    pub num_units: u32,
    /// Maximum samples per unit (`None`: unlimited).
    pub capacity_per_unit: Option<usize>,
    /// A dense put's allocation is compacted when less than this fraction of its rows is live.
    pub compaction_threshold: f64,
    /// Settings of `backend = "kv"`.
    pub kv: tq_backend_kv::KvConfig,
    /// SSD offload of the simple backend's units (`[storage.ssd]`: `enabled`, `path`,
    /// `threshold_bytes` (default 1 MiB), `engine` = `auto` | `uring` | `psync`).
    pub ssd: tq_backend_ssd::SsdConfig,
}

impl Default for StorageSection {
    fn default() -> Self {
        StorageSection {
            backend: Backend::Simple,
            num_units: 2,
            capacity_per_unit: None,
            compaction_threshold: 0.5,
            kv: tq_backend_kv::KvConfig::default(),
            ssd: tq_backend_ssd::SsdConfig::default(),
        }
    }
}

impl Config {
    /// Parses TOML; unknown keys are errors (a typo should not silently use a default).
    pub fn from_toml(text: &str) -> Result<Config> {
        let c: Config =
            toml::from_str(text).map_err(|e| Error::invalid(format!("configuration: {e}")))?;
        c.validate()?;
        Ok(c)
    }

    /// Reads `path` (if given) then applies environment overrides.
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
        c.apply_env(|k| std::env::var(k).ok())?;
        Ok(c)
    }

    /// Applies `TQ_<SECTION>_<KEY>` overrides read through `get`.
    pub fn apply_env(&mut self, get: impl Fn(&str) -> Option<String>) -> Result<()> {
        fn parse<T: std::str::FromStr>(key: &str, v: &str) -> Result<T> {
            v.trim().parse().map_err(|_| {
                Error::invalid(format!("environment variable {key}: cannot parse `{v}`"))
            })
        }
        if let Some(v) = get("TQ_CONTROLLER_DEFAULT_SAMPLER") {
            self.controller.default_sampler = v;
        }
        if let Some(v) = get("TQ_CONTROLLER_FETCH_TIMEOUT_MS") {
            self.controller.fetch_timeout_ms = parse("TQ_CONTROLLER_FETCH_TIMEOUT_MS", &v)?;
        }
        if let Some(v) = get("TQ_STORAGE_BACKEND") {
            self.storage.backend = match v.trim() {
                "simple" => Backend::Simple,
                "kv" => Backend::Kv,
                other => {
                    return Err(Error::invalid(format!(
                        "environment variable TQ_STORAGE_BACKEND: unknown backend `{other}`"
                    )))
                }
            };
        }
        if let Some(v) = get("TQ_STORAGE_NUM_UNITS") {
            self.storage.num_units = parse("TQ_STORAGE_NUM_UNITS", &v)?;
        }
        if let Some(v) = get("TQ_STORAGE_CAPACITY_PER_UNIT") {
            self.storage.capacity_per_unit = Some(parse("TQ_STORAGE_CAPACITY_PER_UNIT", &v)?);
        }
        if let Some(v) = get("TQ_STORAGE_SSD_PATH") {
            self.storage.ssd.enabled = true;
            self.storage.ssd.path = Some(v.into());
        }
        if let Some(v) = get("TQ_STORAGE_SSD_THRESHOLD_BYTES") {
            self.storage.ssd.threshold_bytes = parse("TQ_STORAGE_SSD_THRESHOLD_BYTES", &v)?;
        }
        if let Some(v) = get("TQ_NET_TOKEN") {
            self.net.token = Some(v);
        }
        if let Some(v) = get("TQ_NET_REQUEST_TIMEOUT_MS") {
            self.net.request_timeout_ms = parse("TQ_NET_REQUEST_TIMEOUT_MS", &v)?;
        }
        if let Some(v) = get("TQ_NET_CONNECT_TIMEOUT_MS") {
            self.net.connect_timeout_ms = parse("TQ_NET_CONNECT_TIMEOUT_MS", &v)?;
        }
        if let Some(v) = get("TQ_NET_KEY_CACHE_ENTRIES") {
            self.net.key_cache_entries = parse("TQ_NET_KEY_CACHE_ENTRIES", &v)?;
        }
        if let Some(v) = get("TQ_STORAGE_COMPACTION_THRESHOLD") {
            self.storage.compaction_threshold = parse("TQ_STORAGE_COMPACTION_THRESHOLD", &v)?;
        }
        self.validate()
    }

    /// Rejects settings that cannot work.
    pub fn validate(&self) -> Result<()> {
        if self.storage.num_units == 0 {
            return Err(Error::invalid("storage.num_units must be at least 1"));
        }
        if !(0.0..=1.0).contains(&self.storage.compaction_threshold) {
            return Err(Error::invalid(
                "storage.compaction_threshold must be between 0 and 1",
            ));
        }
        if self.storage.capacity_per_unit == Some(0) {
            return Err(Error::invalid(
                "storage.capacity_per_unit must be at least 1",
            ));
        }
        if self.storage.backend == Backend::Kv {
            self.storage.kv.validate()?;
        }
        tq_controller::sampler_from_name(&self.controller.default_sampler)?;
        for (name, spec) in &self.controller.samplers {
            tq_controller::sampler_from_name(spec)
                .map_err(|e| e.context(format!("controller.samplers.{name}")))?;
        }
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_and_env_overrides() {
        let c = Config::from_toml("[storage]\nnum_units = 4\n").unwrap();
        assert_eq!(c.storage.num_units, 4);
        assert_eq!(c.controller, ControllerSection::default());
        assert!(Config::from_toml("[storage]\nnum_unitz = 4\n").is_err());
        assert!(Config::from_toml("[storage]\nnum_units = 0\n").is_err());
        let mut c = Config::default();
        c.apply_env(|k| match k {
            "TQ_STORAGE_NUM_UNITS" => Some("3".into()),
            "TQ_CONTROLLER_DEFAULT_SAMPLER" => Some("grpo:4".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!(c.storage.num_units, 3);
        assert_eq!(c.controller.default_sampler, "grpo:4");
        let e = c
            .apply_env(|k| (k == "TQ_STORAGE_NUM_UNITS").then(|| "x".into()))
            .unwrap_err();
        assert!(e.message().contains("TQ_STORAGE_NUM_UNITS"));
        assert!(c
            .apply_env(|k| (k == "TQ_CONTROLLER_DEFAULT_SAMPLER").then(|| "nope".into()))
            .is_err());
    }

    #[test]
    fn kv_section() {
        let c = Config::from_toml(
            "[storage]\nbackend = \"kv\"\n[storage.kv]\ndata_ttl_ms = 5000\n\
             stores = [{ name = \"a\", url = \"memory://\" }, { name = \"b\", url = \"memory://\" }]\n\
             routing = { kind = \"by-field\", fields = { reward = \"b\" }, default = \"a\" }\n",
        )
        .unwrap();
        assert_eq!(c.storage.backend, Backend::Kv);
        assert_eq!(c.storage.kv.data_ttl_ms, Some(5000));
        assert_eq!(c.storage.kv.stores.len(), 2);
        assert_eq!(c.storage.kv.redis, tq_backend_kv::RedisConfig::default());
        let c = Config::from_toml(
            "[storage]\nbackend = \"kv\"\n[storage.kv.redis]\ndelete = \"del\"\nexpire = \"script\"\n",
        )
        .unwrap();
        assert_eq!(c.storage.kv.redis.delete, tq_backend_kv::RedisDelete::Del);
        assert_eq!(
            c.storage.kv.redis.expire,
            tq_backend_kv::RedisExpire::Script
        );
        assert!(Config::from_toml("[storage.kv.redis]\nexpire = \"lua\"\n").is_err());
        assert!(Config::from_toml(
            "[storage]\nbackend = \"kv\"\n[storage.kv]\nstores = [{ url = \"nope://x\" }]\n"
        )
        .is_err());
        assert_eq!(Config::default().storage.backend, Backend::Simple);
    }
}
