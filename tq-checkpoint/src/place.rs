//! Where a checkpoint's files live: a local directory, or (feature `object-store`) a prefix of
//! an object store. Every file is written whole, so a reader sees the old file or the new one.

use std::path::{Path, PathBuf};
use tq_core::{Bytes, Error, Result};

pub(crate) fn io_error(what: &str, path: &Path, e: std::io::Error) -> Error {
    let kind = if e.kind() == std::io::ErrorKind::NotFound {
        tq_core::ErrorKind::NotFound
    } else {
        tq_core::ErrorKind::Unavailable
    };
    Error::new(
        kind,
        format!("checkpoint: cannot {what} `{}`: {e}", path.display()),
    )
    .with_source(e)
}

/// Where a checkpoint's files live.
pub(crate) enum Place {
    Dir(PathBuf),
    #[cfg(feature = "object-store")]
    Store {
        store: std::sync::Arc<dyn object_store::ObjectStore>,
        prefix: String,
        /// For messages: the URL or the store's description.
        label: String,
    },
}

impl Place {
    /// A directory (a path or `file://` URL), or (feature `s3`) `s3://bucket/prefix`.
    pub(crate) fn parse(url: &str) -> Result<Place> {
        if let Some(path) = url.strip_prefix("file://") {
            return Ok(Place::Dir(PathBuf::from(path)));
        }
        if let Some(rest) = url.strip_prefix("s3://") {
            #[cfg(feature = "s3")]
            {
                let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
                let store = object_store::aws::AmazonS3Builder::from_env()
                    .with_bucket_name(bucket)
                    .build()
                    .map_err(|e| Error::invalid(format!("checkpoint: `{url}`: {e}")))?;
                return Ok(Place::Store {
                    store: std::sync::Arc::new(store),
                    prefix: prefix.trim_end_matches('/').to_string(),
                    label: url.to_string(),
                });
            }
            #[cfg(not(feature = "s3"))]
            {
                let _ = rest;
                return Err(Error::unsupported(
                    format!("checkpoint URL `{url}`"),
                    "this build of tq (enable the `s3` feature of the `tq` crate)",
                ));
            }
        }
        if url.contains("://") {
            return Err(Error::invalid(format!(
                "checkpoint: `{url}`: use a directory (`DIR` or `file://DIR`) or `s3://bucket/prefix`"
            )));
        }
        Ok(Place::Dir(PathBuf::from(url)))
    }

    pub(crate) fn describe(&self, name: &str) -> String {
        match self {
            Place::Dir(dir) => dir.join(name).display().to_string(),
            #[cfg(feature = "object-store")]
            Place::Store { prefix, label, .. } => format!("{label} ({})", Self::key(prefix, name)),
        }
    }

    #[cfg(feature = "object-store")]
    fn key(prefix: &str, name: &str) -> String {
        if prefix.is_empty() {
            name.to_string()
        } else {
            format!("{prefix}/{name}")
        }
    }

    #[cfg(feature = "object-store")]
    fn store_error(&self, what: &str, name: &str, e: object_store::Error) -> Error {
        let kind = match e {
            object_store::Error::NotFound { .. } => tq_core::ErrorKind::NotFound,
            _ => tq_core::ErrorKind::Unavailable,
        };
        Error::new(
            kind,
            format!("checkpoint: cannot {what} `{}`: {e}", self.describe(name)),
        )
        .with_source(e)
    }

    pub(crate) fn prepare(&self) -> Result<()> {
        match self {
            Place::Dir(dir) => std::fs::create_dir_all(dir).map_err(|e| io_error("create", dir, e)),
            #[cfg(feature = "object-store")]
            Place::Store { .. } => Ok(()),
        }
    }

    /// Writes a whole file; readers see the old one or the new one, never a part.
    pub(crate) async fn put(&self, name: &str, bytes: Vec<u8>) -> Result<()> {
        match self {
            Place::Dir(dir) => write_atomically(&dir.join(name), &bytes),
            #[cfg(feature = "object-store")]
            Place::Store { store, prefix, .. } => {
                use object_store::ObjectStoreExt;
                let path = object_store::path::Path::from(Self::key(prefix, name));
                store
                    .put(&path, bytes.into())
                    .await
                    .map(|_| ())
                    .map_err(|e| self.store_error("write", name, e))
            }
        }
    }

    pub(crate) async fn get(&self, name: &str) -> Result<Vec<u8>> {
        match self {
            Place::Dir(dir) => {
                let path = dir.join(name);
                std::fs::read(&path).map_err(|e| io_error("read", &path, e))
            }
            #[cfg(feature = "object-store")]
            Place::Store { store, prefix, .. } => {
                use object_store::ObjectStoreExt;
                let path = object_store::path::Path::from(Self::key(prefix, name));
                let got = store
                    .get(&path)
                    .await
                    .map_err(|e| self.store_error("read", name, e))?;
                got.bytes()
                    .await
                    .map(|b| b.to_vec())
                    .map_err(|e| self.store_error("read", name, e))
            }
        }
    }

    /// Writes a whole file made of `parts` (written as they are, not joined first); returns
    /// its size and CRC-32. Readers see the old file or the new one, never a part.
    pub(crate) async fn put_parts(&self, name: &str, parts: Vec<Bytes>) -> Result<(u64, u32)> {
        let mut crc = crc32fast::Hasher::new();
        let mut len = 0u64;
        for p in &parts {
            crc.update(p);
            len += p.len() as u64;
        }
        match self {
            Place::Dir(dir) => {
                use std::io::Write;
                let path = dir.join(name);
                let tmp = path.with_extension("tmp");
                let mut f = std::fs::File::create(&tmp).map_err(|e| io_error("create", &tmp, e))?;
                for p in &parts {
                    f.write_all(p).map_err(|e| io_error("write", &tmp, e))?;
                }
                f.sync_all().map_err(|e| io_error("sync", &tmp, e))?;
                drop(f);
                std::fs::rename(&tmp, &path).map_err(|e| io_error("rename into", &path, e))?;
            }
            #[cfg(feature = "object-store")]
            Place::Store { store, prefix, .. } => {
                use object_store::ObjectStoreExt;
                let path = object_store::path::Path::from(Self::key(prefix, name));
                let joined: Vec<u8> = parts.concat();
                store
                    .put(&path, joined.into())
                    .await
                    .map_err(|e| self.store_error("write", name, e))?;
            }
        }
        Ok((len, crc.finalize()))
    }

    /// The names of the files present for which `is_state` holds.
    pub(crate) async fn files_matching(&self, is_state: fn(&str) -> bool) -> Result<Vec<String>> {
        match self {
            Place::Dir(dir) => {
                let entries = std::fs::read_dir(dir).map_err(|e| io_error("list", dir, e))?;
                Ok(entries
                    .filter_map(|e| e.ok())
                    .filter_map(|e| e.file_name().to_str().map(str::to_string))
                    .filter(|n| is_state(n))
                    .collect())
            }
            #[cfg(feature = "object-store")]
            Place::Store { store, prefix, .. } => {
                use futures::TryStreamExt;
                let base =
                    (!prefix.is_empty()).then(|| object_store::path::Path::from(prefix.as_str()));
                let listed: Vec<object_store::ObjectMeta> = store
                    .list(base.as_ref())
                    .try_collect()
                    .await
                    .map_err(|e| self.store_error("list", "", e))?;
                Ok(listed
                    .into_iter()
                    .filter_map(|m| m.location.filename().map(str::to_string))
                    .filter(|n| is_state(n))
                    .collect())
            }
        }
    }

    pub(crate) async fn remove(&self, name: &str) -> Result<()> {
        match self {
            Place::Dir(dir) => {
                let path = dir.join(name);
                std::fs::remove_file(&path).map_err(|e| io_error("remove", &path, e))
            }
            #[cfg(feature = "object-store")]
            Place::Store { store, prefix, .. } => {
                use object_store::ObjectStoreExt;
                let path = object_store::path::Path::from(Self::key(prefix, name));
                store
                    .delete(&path)
                    .await
                    .map_err(|e| self.store_error("remove", name, e))
            }
        }
    }
}

/// Writes `bytes` to `path` through a temporary file, synced, then renamed into place.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp).map_err(|e| io_error("create", &tmp, e))?;
    f.write_all(bytes).map_err(|e| io_error("write", &tmp, e))?;
    f.sync_all().map_err(|e| io_error("sync", &tmp, e))?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(|e| io_error("rename into", path, e))
}
