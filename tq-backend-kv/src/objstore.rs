//! [`ObjectKvStore`]: a [`KvStore`] on any `object_store` (feature `object-store`): local file
//! system and in-memory by default, S3 with the `s3` feature.
//!
//! Object stores have no TTL and no expire: the capabilities say so, `mset` ignores its TTL and
//! `expire` deletes. Each key is one object; its `/`-separated components become path segments
//! (escaped by `object_store`), so distinct keys are distinct objects.

use crate::store::{KvCapabilities, KvStore, KvValue};
use async_trait::async_trait;
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::path::{Path, PathPart};
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use std::sync::Arc;
use std::time::Duration;
use tq_core::{Error, Result};

/// A [`KvStore`] over an [`ObjectStore`].
pub struct ObjectKvStore {
    name: String,
    store: Arc<dyn ObjectStore>,
    concurrency: usize,
}

/// Maps an object_store error to the kind a caller can act on. Only transport-like failures
/// (`Generic`, `JoinError`: the store could not be reached or the task died) are
/// `Unavailable`; the rest say precisely what the store refused.
pub(crate) fn map_err(store: &str, key: &str, e: object_store::Error) -> Error {
    use object_store::Error as E;
    let msg = format!("object store `{store}`, key `{key}`: {e}");
    let mapped = match &e {
        E::NotFound { .. } => Error::not_found(msg),
        E::AlreadyExists { .. } | E::Precondition { .. } | E::NotModified { .. } => {
            Error::conflict(msg)
        }
        E::PermissionDenied { .. } | E::Unauthenticated { .. } => Error::permission_denied(msg),
        E::InvalidPath { .. } | E::UnknownConfigurationKey { .. } => Error::invalid(msg),
        E::NotImplemented { .. } | E::NotSupported { .. } => {
            Error::unsupported(format!("kv operation on key `{key}`"), store.to_string())
        }
        _ => Error::unavailable(msg),
    };
    mapped.with_source(e)
}

impl ObjectKvStore {
    pub fn new(store: Arc<dyn ObjectStore>) -> Self {
        ObjectKvStore {
            name: "object-store".into(),
            store,
            concurrency: 32,
        }
    }

    /// Objects under `root` on the local file system (created if missing).
    pub fn local(root: impl AsRef<std::path::Path>) -> Result<Self> {
        let root = root.as_ref();
        std::fs::create_dir_all(root).map_err(|e| {
            Error::unavailable(format!("cannot create {}", root.display())).with_source(e)
        })?;
        let fs = object_store::local::LocalFileSystem::new_with_prefix(root)
            .map_err(|e| Error::invalid(format!("object store root {}: {e}", root.display())))?;
        Ok(Self::new(Arc::new(fs)).with_name("fs"))
    }

    /// Objects in memory (`object_store::memory::InMemory`).
    pub fn in_memory() -> Self {
        Self::new(Arc::new(object_store::memory::InMemory::new())).with_name("object-memory")
    }

    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// How many object requests run at once.
    pub fn with_concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.max(1);
        self
    }

    fn path(key: &str) -> Path {
        Path::from_iter(key.split('/').map(PathPart::from))
    }
}

#[async_trait]
impl KvStore for ObjectKvStore {
    fn name(&self) -> &str {
        &self.name
    }

    fn capabilities(&self) -> KvCapabilities {
        KvCapabilities {
            native_ttl: false,
            native_expire: false,
            max_keys_per_call: 256,
            max_concurrent_calls: 4,
            atomic_generations: false,
        }
    }

    async fn mset(&self, items: Vec<(String, KvValue)>, _ttl: Option<Duration>) -> Result<()> {
        let calls: Vec<_> = items
            .into_iter()
            .map(|(k, v)| async move {
                let payload: PutPayload = v.parts().into_iter().cloned().collect();
                self.store
                    .put(&Self::path(&k), payload)
                    .await
                    .map(|_| ())
                    .map_err(|e| map_err(&self.name, &k, e))
            })
            .collect();
        futures::stream::iter(calls)
            .buffer_unordered(self.concurrency)
            .try_collect::<Vec<()>>()
            .await
            .map(|_| ())
    }

    async fn mget(&self, keys: &[String]) -> Result<Vec<Option<Bytes>>> {
        let calls: Vec<_> = keys
            .iter()
            .map(|k| async move {
                match self.store.get(&Self::path(k)).await {
                    Ok(r) => r
                        .bytes()
                        .await
                        .map(Some)
                        .map_err(|e| map_err(&self.name, k, e)),
                    Err(object_store::Error::NotFound { .. }) => Ok(None),
                    Err(e) => Err(map_err(&self.name, k, e)),
                }
            })
            .collect();
        futures::stream::iter(calls)
            .buffered(self.concurrency)
            .try_collect()
            .await
    }

    async fn delete(&self, keys: &[String]) -> Result<()> {
        let paths: Vec<Result<Path, object_store::Error>> =
            keys.iter().map(|k| Ok(Self::path(k))).collect();
        let mut results = self
            .store
            .delete_stream(futures::stream::iter(paths).boxed());
        while let Some(r) = results.next().await {
            match r {
                Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(map_err(&self.name, "(batch delete)", e)),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::map_err;
    use object_store::Error as E;
    use tq_core::{ErrorKind, Retry};

    fn source() -> Box<dyn std::error::Error + Send + Sync> {
        "denied".into()
    }

    #[test]
    fn object_store_errors_map_to_precise_kinds() {
        let path = || "p/k".to_string();
        let cases = [
            (
                E::NotFound {
                    path: path(),
                    source: source(),
                },
                ErrorKind::NotFound,
            ),
            (
                E::Precondition {
                    path: path(),
                    source: source(),
                },
                ErrorKind::Conflict,
            ),
            (
                E::AlreadyExists {
                    path: path(),
                    source: source(),
                },
                ErrorKind::Conflict,
            ),
            (
                E::PermissionDenied {
                    path: path(),
                    source: source(),
                },
                ErrorKind::PermissionDenied,
            ),
            (
                E::Unauthenticated {
                    path: path(),
                    source: source(),
                },
                ErrorKind::PermissionDenied,
            ),
            (
                E::Generic {
                    store: "S3",
                    source: source(),
                },
                ErrorKind::Unavailable,
            ),
        ];
        for (e, kind) in cases {
            let mapped = map_err("s3", "k", e);
            assert_eq!(mapped.kind(), &kind, "{mapped}");
            assert!(mapped.message().contains("key `k`"), "{mapped}");
            let want = if kind == ErrorKind::Unavailable {
                Retry::Safe
            } else {
                Retry::Never
            };
            assert_eq!(mapped.retry(), want, "{mapped}");
        }
    }
}
