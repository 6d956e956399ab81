//! [`ObjectKvStore`]: a [`KvStore`] on any `object_store` (feature `object-store`): local file
//! system and in-memory by default, S3 with the `s3` feature.
//!
//! Object stores have no TTL and no expire: the capabilities say so, `mset` ignores its TTL and
//! `expire` deletes. Each key is one object; its `/`-separated components become path segments
//! (escaped by `object_store`), so distinct keys are distinct objects.
//!
//! Generation keys are raised with conditional puts where the store has them (`PutMode::Create`
//! for a new key, `PutMode::Update` with the version read, retried when another writer got
//! there first): in memory and on S3. The local file system has no conditional update
//! (`object_store` refuses `PutMode::Update` there): it reads, then writes, and says so in
//! [`KvCapabilities::atomic_generations`].

use crate::store::{KvCapabilities, KvStore, KvValue};
use async_trait::async_trait;
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::path::{Path, PathPart};
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutPayload, UpdateVersion};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tq_core::{Error, Result};

/// A [`KvStore`] over an [`ObjectStore`].
pub struct ObjectKvStore {
    name: String,
    store: Arc<dyn ObjectStore>,
    concurrency: usize,
    /// The store takes `PutMode::Update` (until it refuses one as not implemented).
    conditional: AtomicBool,
}

/// How many times one generation key is read and conditionally written before giving up: each
/// retry means another writer changed the key in between, which takes a reuse of the index per
/// attempt.
const RAISE_ATTEMPTS: usize = 16;

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
            conditional: AtomicBool::new(true),
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
        let out = Self::new(Arc::new(fs)).with_name("fs");
        // `LocalFileSystem` has `PutMode::Create` but not `PutMode::Update`.
        out.conditional.store(false, Ordering::Relaxed);
        Ok(out)
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

    /// Raises one generation key with conditional puts; `None` if the store turned out to have
    /// no conditional update (the caller falls back to read-then-write).
    async fn raise_conditionally(&self, key: &str, want: u32) -> Result<Option<u32>> {
        use object_store::Error as E;
        let path = Self::path(key);
        for _ in 0..RAISE_ATTEMPTS {
            let mode = match self.store.get(&path).await {
                Ok(found) => {
                    let version = UpdateVersion {
                        e_tag: found.meta.e_tag.clone(),
                        version: found.meta.version.clone(),
                    };
                    let raw = found
                        .bytes()
                        .await
                        .map_err(|e| map_err(&self.name, key, e))?;
                    let held = crate::codec::decode_generation(key, &raw)?;
                    if held >= want {
                        return Ok(Some(held));
                    }
                    PutMode::Update(version)
                }
                Err(E::NotFound { .. }) => PutMode::Create,
                Err(e) => return Err(map_err(&self.name, key, e)),
            };
            let value: PutPayload = crate::codec::encode_generation(want).into();
            match self.store.put_opts(&path, value, mode.into()).await {
                Ok(_) => return Ok(Some(want)),
                // Another writer changed the key since it was read: look again.
                Err(E::AlreadyExists { .. } | E::Precondition { .. }) => continue,
                Err(E::NotImplemented { .. }) => {
                    tracing::warn!(
                        store = %self.name,
                        "object store has no conditional update: generation keys are raised \
                         with a read, then a write"
                    );
                    self.conditional.store(false, Ordering::Relaxed);
                    return Ok(None);
                }
                Err(e) => return Err(map_err(&self.name, key, e)),
            }
        }
        Err(Error::unavailable(format!(
            "object store `{}`: generation key `{key}` changed under each of {RAISE_ATTEMPTS} \
             conditional writes",
            self.name
        )))
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
            atomic_generations: self.conditional.load(Ordering::Relaxed),
        }
    }

    async fn raise_generations(
        &self,
        items: Vec<(String, u32)>,
        ttl: Option<Duration>,
    ) -> Result<Vec<u32>> {
        if self.conditional.load(Ordering::Relaxed) {
            let calls: Vec<_> = items
                .iter()
                .map(|(k, want)| self.raise_conditionally(k, *want))
                .collect();
            let raised: Vec<Option<u32>> = futures::stream::iter(calls)
                .buffered(self.concurrency)
                .try_collect()
                .await?;
            if raised.iter().all(Option::is_some) {
                return Ok(raised.into_iter().flatten().collect());
            }
        }
        crate::store::raise_by_read_then_write(self, items, ttl).await
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

    /// Many writers raise one generation key at once, in shuffled order: with conditional puts
    /// the key ends at the largest generation, and no writer is told it holds a smaller one
    /// than it asked for unless a larger one was there.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_raises_keep_the_largest_generation() {
        use crate::store::KvStore;
        use std::sync::Arc;
        let store = Arc::new(super::ObjectKvStore::in_memory());
        assert!(store.capabilities().atomic_generations);
        for round in 0..20u32 {
            let key = format!("tq/{{p/{round}}}/gen");
            let mut wants: Vec<u32> = (0..32).collect();
            wants.rotate_left((round as usize * 7) % 32);
            let tasks: Vec<_> = wants
                .iter()
                .map(|&want| {
                    let (store, key) = (store.clone(), key.clone());
                    tokio::spawn(async move {
                        let held = store.raise_generations(vec![(key, want)], None).await;
                        (want, held.unwrap()[0])
                    })
                })
                .collect();
            for t in tasks {
                let (want, held) = t.await.unwrap();
                assert!(held >= want, "round {round}: raised {want}, told {held}");
            }
            let raw = store.mget(std::slice::from_ref(&key)).await.unwrap()[0]
                .clone()
                .unwrap();
            assert_eq!(
                crate::codec::decode_generation(&key, &raw).unwrap(),
                31,
                "round {round}: the key moved back"
            );
        }
    }

    #[test]
    fn the_file_system_says_its_generations_are_not_atomic() {
        use crate::store::KvStore;
        let dir = std::env::temp_dir().join(format!("tq-objstore-caps-{}", std::process::id()));
        let s = super::ObjectKvStore::local(&dir).unwrap();
        assert!(!s.capabilities().atomic_generations);
        let _ = std::fs::remove_dir_all(dir);
    }
}
