//! [`KvConfig`]: a serde-friendly description of a KV deployment (the `[storage.kv]` section of
//! the client configuration) and how to build it.
//!
//! ```toml
//! [storage.kv]
//! namespace = "tq"
//! data_ttl_ms = 3600000          # omit: no TTL, clear deletes
//! clear_expire_after_ms = 1000
//! op_timeout_ms = 10000          # Redis: deadline of one call
//! stores = [
//!   { name = "small", url = "redis://127.0.0.1:6379" },
//!   { name = "large", url = "file:///var/lib/tq" },
//! ]
//! routing = { kind = "by-size", threshold = 65536, small = "small", large = "large" }
//!
//! [storage.kv.redis]             # Redis stores only
//! delete = "unlink"              # or "del"
//! expire = "pipeline"            # or "script" (one EVAL per call: less client CPU, more server)
//! ```
//!
//! Store URLs: `memory://`, `redis://host:port[/db]`, `rediss://…` (feature `redis-tls`),
//! `redis+cluster://h1:p1,h2:p2,…`, `file:///absolute/dir`, `object-memory://`.

use crate::manager::{KvOptions, KvStorageManager, Routing, DEFAULT_CLEAR_EXPIRE_AFTER};
use crate::memory::MemoryKvStore;
use crate::store::KvStore;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tq_core::{Error, Result};

/// One store: a name (its routing tag; defaults to the scheme) and a URL. The URL may carry a
/// password (`redis://:secret@host:6379`); `Debug`, and every message tq makes, show it
/// redacted ([`redact_url`]).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreConfig {
    pub name: Option<String>,
    pub url: String,
}

impl std::fmt::Debug for StoreConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreConfig")
            .field("name", &self.name)
            .field("url", &redact_url(&self.url))
            .finish()
    }
}

/// `url` with the password of every `user:password@` part replaced by `***` (all hosts of a
/// cluster URL), for messages and logs.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let hosts: Vec<String> = rest
        .split(',')
        .map(|part| match part.rsplit_once('@') {
            Some((userinfo, host)) => match userinfo.split_once(':') {
                Some((user, _password)) => format!("{user}:***@{host}"),
                None => format!("***@{host}"),
            },
            None => part.to_string(),
        })
        .collect();
    format!("{scheme}://{}", hosts.join(","))
}

/// The routing rule between several stores.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum RoutingConfig {
    #[default]
    First,
    ByField {
        fields: BTreeMap<String, String>,
        default: String,
    },
    BySize {
        threshold: usize,
        small: String,
        large: String,
    },
}

/// How Redis stores remove keys (`RedisOptions::delete`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum RedisDelete {
    /// `UNLINK`: memory is freed in the server's background thread.
    #[default]
    Unlink,
    /// `DEL`: synchronous.
    Del,
}

/// How Redis stores set deadlines (`RedisOptions::expire`; see `ExpireCommand`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum RedisExpire {
    /// One pipelined `PEXPIRE` per key (the faster on the machines we measured).
    #[default]
    Pipeline,
    /// One `EVAL` of a Lua loop per call: less client CPU, more server CPU.
    Script,
}

/// The `[storage.kv.redis]` table: settings of every Redis store (other stores ignore it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RedisConfig {
    pub delete: RedisDelete,
    pub expire: RedisExpire,
    /// Replicas that must confirm each write before it is acknowledged (`WAIT`); `0`: none.
    /// Costs one replication round trip per write call (docs/backends.md).
    pub wait_replicas: u32,
    /// How long a write waits for those confirmations before it fails, in milliseconds.
    pub wait_timeout_ms: u64,
}

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig {
            delete: RedisDelete::default(),
            expire: RedisExpire::default(),
            wait_replicas: 0,
            wait_timeout_ms: 1000,
        }
    }
}

/// The `[storage.kv]` configuration section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KvConfig {
    pub namespace: String,
    pub stores: Vec<StoreConfig>,
    pub data_ttl_ms: Option<u64>,
    pub clear_expire_after_ms: u64,
    pub op_timeout_ms: u64,
    pub routing: RoutingConfig,
    pub redis: RedisConfig,
}

impl Default for KvConfig {
    fn default() -> Self {
        KvConfig {
            namespace: "tq".into(),
            stores: vec![StoreConfig {
                name: None,
                url: "memory://".into(),
            }],
            data_ttl_ms: None,
            clear_expire_after_ms: DEFAULT_CLEAR_EXPIRE_AFTER.as_millis() as u64,
            op_timeout_ms: 10_000,
            routing: RoutingConfig::First,
            redis: RedisConfig::default(),
        }
    }
}

fn scheme(url: &str) -> &str {
    url.split_once("://").map_or(url, |(s, _)| s)
}

impl KvConfig {
    /// Checks what can be checked without connecting.
    pub fn validate(&self) -> Result<()> {
        if self.stores.is_empty() {
            return Err(Error::invalid(
                "storage.kv.stores must name at least one store",
            ));
        }
        if self.data_ttl_ms == Some(0) {
            return Err(Error::invalid(
                "storage.kv.data_ttl_ms must be positive (omit it for no TTL)",
            ));
        }
        for s in &self.stores {
            match scheme(&s.url) {
                "memory" | "redis" | "rediss" | "redis+cluster" | "rediss+cluster" | "file"
                | "object-memory" => {}
                other => {
                    return Err(Error::invalid(format!(
                        "storage.kv.stores: unknown store scheme `{other}` in `{}`",
                        redact_url(&s.url)
                    )))
                }
            }
        }
        Ok(())
    }

    /// The store one entry of `stores` describes, with this configuration's options (Redis
    /// timeouts and commands). Benchmarks use it for raw baselines on the very same store.
    pub fn build_store(&self, s: &StoreConfig) -> Result<Arc<dyn KvStore>> {
        let url = s.url.as_str();
        match scheme(url) {
            "memory" => Ok(Arc::new(MemoryKvStore::new())),
            #[cfg(feature = "redis")]
            "redis" | "rediss" | "redis+cluster" | "rediss+cluster" => {
                let options = crate::RedisOptions {
                    op_timeout: Duration::from_millis(self.op_timeout_ms),
                    delete: match self.redis.delete {
                        RedisDelete::Unlink => crate::DeleteCommand::Unlink,
                        RedisDelete::Del => crate::DeleteCommand::Del,
                    },
                    expire: match self.redis.expire {
                        RedisExpire::Pipeline => crate::ExpireCommand::Pipeline,
                        RedisExpire::Script => crate::ExpireCommand::Script,
                    },
                    wait_replicas: self.redis.wait_replicas,
                    wait_timeout: Duration::from_millis(self.redis.wait_timeout_ms.max(1)),
                    ..Default::default()
                };
                Ok(Arc::new(crate::RedisStore::from_url(url, options)?))
            }
            #[cfg(feature = "object-store")]
            "file" => Ok(Arc::new(crate::ObjectKvStore::local(
                url.trim_start_matches("file://"),
            )?)),
            #[cfg(feature = "object-store")]
            "object-memory" => Ok(Arc::new(crate::ObjectKvStore::in_memory())),
            other => Err(Error::unsupported(
                format!("kv store `{}`", redact_url(url)),
                format!("{other} (build tq-backend-kv with its cargo feature)"),
            )),
        }
    }

    /// Builds the manager, with keys outside any controller epoch. Redis stores connect on
    /// first use, so this does no I/O.
    pub fn build(&self) -> Result<KvStorageManager> {
        self.build_in_epoch(0)
    }

    /// Builds the manager whose keys belong to controller epoch `epoch` (see
    /// [`KvOptions::epoch`]).
    pub fn build_in_epoch(&self, epoch: u64) -> Result<KvStorageManager> {
        self.validate()?;
        let stores = self
            .stores
            .iter()
            .map(|s| {
                let name = s.name.clone().unwrap_or_else(|| scheme(&s.url).to_string());
                Ok((name, self.build_store(s)?))
            })
            .collect::<Result<Vec<_>>>()?;
        let routing = match &self.routing {
            RoutingConfig::First => Routing::First,
            RoutingConfig::ByField { fields, default } => Routing::ByField {
                fields: fields.clone(),
                default: default.clone(),
            },
            RoutingConfig::BySize {
                threshold,
                small,
                large,
            } => Routing::BySize {
                threshold: *threshold,
                small: small.clone(),
                large: large.clone(),
            },
        };
        KvStorageManager::with_stores(
            stores,
            KvOptions {
                namespace: self.namespace.clone(),
                data_ttl: self.data_ttl_ms.map(Duration::from_millis),
                clear_expire_after: Duration::from_millis(self.clear_expire_after_ms),
                routing,
                epoch,
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_show() {
        assert_eq!(
            redact_url("redis://:s3cret@10.0.0.1:6379/0"),
            "redis://:***@10.0.0.1:6379/0"
        );
        assert_eq!(redact_url("redis://tq:s3cret@h:1"), "redis://tq:***@h:1");
        assert_eq!(
            redact_url("redis+cluster://a:s3cret@h1:1,a:s3cret@h2:2"),
            "redis+cluster://a:***@h1:1,a:***@h2:2"
        );
        assert_eq!(redact_url("file:///var/lib/tq"), "file:///var/lib/tq");
        let c = StoreConfig {
            name: None,
            url: "redis://:s3cret@h:1".into(),
        };
        assert!(!format!("{c:?}").contains("s3cret"));
        let e = KvConfig {
            stores: vec![StoreConfig {
                name: None,
                url: "nope://:s3cret@h".into(),
            }],
            ..KvConfig::default()
        }
        .validate()
        .unwrap_err();
        assert!(!e.message().contains("s3cret"), "{e}");
    }
}
