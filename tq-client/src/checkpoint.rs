//! Checkpoints of a deployment whose payloads stay in a shared store (KV on Redis or object
//! storage): the controller's whole state in one file, described by a manifest written last,
//! in a local directory or (feature `object-store`) under a prefix of an object store — S3
//! with feature `s3` (`s3://bucket/prefix`, credentials from the `AWS_*` environment).
//!
//! ```text
//! DIR/controller-<epoch>-<unix ms>.state   the controller snapshot (tq_controller::checkpoint)
//! DIR/MANIFEST.toml                        format, tq version, epoch, counts, and every file's
//!                                          size and CRC-32; its last line is its own CRC-32
//! ```
//!
//! A checkpoint exists once its manifest does: the state file has a name of its own and the
//! manifest replaces the previous one by a rename (a single put on an object store, which is
//! atomic), so a save that fails or is killed half-way leaves the previous checkpoint whole. Loading checks the manifest, then every file's size
//! and checksum, then the snapshot itself, before the controller changes anything.
//!
//! The payloads are not copied: the snapshot carries the controller's epoch, so a restored
//! controller's clients find the KV keys of that epoch where they are. Storage units hold their
//! payloads in their own memory or disks, which a checkpoint does not copy yet: a checkpoint
//! of such a deployment is refused rather than written without its data.

use crate::config::Backend;
use crate::Client;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use tq_controller::SnapshotCounts;
use tq_core::{Error, Result};

/// The manifest format this build writes; it reads this one and older.
pub const CHECKPOINT_FORMAT: u32 = 1;

const MANIFEST: &str = "MANIFEST.toml";
const CRC_LINE: &str = "# crc32 ";

/// One file of a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointFile {
    pub name: String,
    pub bytes: u64,
    /// CRC-32 of the file, 8 hex digits.
    pub crc32: String,
}

/// What `MANIFEST.toml` says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointManifest {
    pub format: u32,
    pub tq_version: String,
    pub created_unix_ms: u64,
    /// The controller epoch of the state (16 hex digits): KV keys carry it.
    pub epoch: String,
    /// The storage the payloads stay in.
    pub storage: String,
    pub counts: SnapshotCounts,
    pub files: Vec<CheckpointFile>,
}

fn io_error(what: &str, path: &Path, e: std::io::Error) -> Error {
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
enum Place {
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
    fn parse(url: &str) -> Result<Place> {
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
                return Err(crate::config::feature_off(
                    &format!("checkpoint URL `{url}`"),
                    "s3",
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

    fn describe(&self, name: &str) -> String {
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

    fn prepare(&self) -> Result<()> {
        match self {
            Place::Dir(dir) => std::fs::create_dir_all(dir).map_err(|e| io_error("create", dir, e)),
            #[cfg(feature = "object-store")]
            Place::Store { .. } => Ok(()),
        }
    }

    /// Writes a whole file; readers see the old one or the new one, never a part.
    async fn put(&self, name: &str, bytes: Vec<u8>) -> Result<()> {
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

    async fn get(&self, name: &str) -> Result<Vec<u8>> {
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

    /// The names of the controller state files present.
    async fn state_files(&self) -> Result<Vec<String>> {
        let is_state = |n: &str| n.starts_with("controller-") && n.ends_with(".state");
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

    async fn remove(&self, name: &str) -> Result<()> {
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

fn crc_hex(bytes: &[u8]) -> String {
    format!("{:08x}", crc32fast::hash(bytes))
}

impl CheckpointManifest {
    fn encode(&self) -> Result<String> {
        let body = toml::to_string(self)
            .map_err(|e| Error::internal(format!("checkpoint: cannot encode the manifest: {e}")))?;
        Ok(format!("{body}{CRC_LINE}{}\n", crc_hex(body.as_bytes())))
    }

    fn decode(text: &str, path: &str) -> Result<CheckpointManifest> {
        let bad = |why: String| Error::corrupted(format!("checkpoint: `{path}` {why}"));
        let at = text
            .rfind(CRC_LINE)
            .ok_or_else(|| bad("has no checksum line".into()))?;
        let (body, line) = text.split_at(at);
        let want = line[CRC_LINE.len()..].trim();
        if want != crc_hex(body.as_bytes()) {
            return Err(bad(format!(
                "is damaged (checksum {} in the file, {} computed)",
                want,
                crc_hex(body.as_bytes())
            )));
        }
        #[derive(Deserialize)]
        struct Format {
            format: u32,
        }
        let format: Format =
            toml::from_str(body).map_err(|e| bad(format!("does not parse: {e}")))?;
        if format.format > CHECKPOINT_FORMAT {
            return Err(Error::invalid(format!(
                "checkpoint: `{path}` is format {}, newer than this build reads (up to \
                 {CHECKPOINT_FORMAT}); load it with a newer tq",
                format.format
            )));
        }
        toml::from_str(body).map_err(|e| bad(format!("does not parse: {e}")))
    }
}

impl Client {
    /// Saves the controller's whole state to the directory `dir` (created if missing) as a
    /// checkpoint that [`Client::load_checkpoint`] restores, in this or another deployment on
    /// the same store. The state is taken in one step under the controller's lock, so every
    /// sample it marks produced had its cells written (cells are written before a put is
    /// published); the payloads stay in the store. Refused for storage whose payloads die with
    /// the process or live in storage units (they are not copied).
    pub async fn save_checkpoint(&self, dir: impl AsRef<Path>) -> Result<CheckpointManifest> {
        self.save_checkpoint_in(Place::Dir(dir.as_ref().to_path_buf()))
            .await
    }

    /// [`Client::save_checkpoint`] to a URL: a directory (`DIR` or `file://DIR`) or, with
    /// feature `s3`, `s3://bucket/prefix` (credentials from the `AWS_*` environment).
    pub async fn save_checkpoint_to_url(&self, url: &str) -> Result<CheckpointManifest> {
        self.save_checkpoint_in(Place::parse(url)?).await
    }

    /// [`Client::save_checkpoint`] under `prefix` of any object store (feature `object-store`).
    #[cfg(feature = "object-store")]
    pub async fn save_checkpoint_to_store(
        &self,
        store: std::sync::Arc<dyn object_store::ObjectStore>,
        prefix: &str,
    ) -> Result<CheckpointManifest> {
        let label = format!("object store {store}");
        self.save_checkpoint_in(Place::Store {
            store,
            prefix: prefix.trim_end_matches('/').to_string(),
            label,
        })
        .await
    }

    async fn save_checkpoint_in(&self, place: Place) -> Result<CheckpointManifest> {
        self.check_reattachable()?;
        place.prepare()?;
        let (state, counts) = self.control().snapshot().await?;
        let created_unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let epoch = format!("{:016x}", self.epoch());
        let name = format!("controller-{epoch}-{created_unix_ms}.state");
        let manifest = CheckpointManifest {
            format: CHECKPOINT_FORMAT,
            tq_version: env!("CARGO_PKG_VERSION").to_string(),
            created_unix_ms,
            epoch,
            storage: self.storage().name().to_string(),
            counts,
            files: vec![CheckpointFile {
                name: name.clone(),
                bytes: state.len() as u64,
                crc32: crc_hex(&state),
            }],
        };
        place.put(&name, state).await?;
        // The checkpoint exists from here on; the previous one until here.
        place.put(MANIFEST, manifest.encode()?.into_bytes()).await?;
        for old in place.state_files().await? {
            if old != name {
                if let Err(e) = place.remove(&old).await {
                    tracing::warn!(file = %place.describe(&old), error = %e, "could not remove an earlier checkpoint's state file");
                }
            }
        }
        tracing::info!(at = %place.describe(MANIFEST), samples = counts.samples, "checkpoint saved");
        Ok(manifest)
    }

    /// Restores the checkpoint in `dir` into this client's controller, which must hold no
    /// partition yet. Every file is checked (manifest checksum and format, each file's size
    /// and CRC-32, then the snapshot's own header and decoding) before anything changes; an
    /// error names the file at fault. Afterwards the controller is in the checkpoint's epoch:
    /// clients connected before are refused, new ones (and this one) see the restored state.
    pub async fn load_checkpoint(&self, dir: impl AsRef<Path>) -> Result<CheckpointManifest> {
        self.load_checkpoint_in(Place::Dir(dir.as_ref().to_path_buf()))
            .await
    }

    /// [`Client::load_checkpoint`] from a URL (see [`Client::save_checkpoint_to_url`]).
    pub async fn load_checkpoint_from_url(&self, url: &str) -> Result<CheckpointManifest> {
        self.load_checkpoint_in(Place::parse(url)?).await
    }

    /// [`Client::load_checkpoint`] from `prefix` of any object store (feature `object-store`).
    #[cfg(feature = "object-store")]
    pub async fn load_checkpoint_from_store(
        &self,
        store: std::sync::Arc<dyn object_store::ObjectStore>,
        prefix: &str,
    ) -> Result<CheckpointManifest> {
        let label = format!("object store {store}");
        self.load_checkpoint_in(Place::Store {
            store,
            prefix: prefix.trim_end_matches('/').to_string(),
            label,
        })
        .await
    }

    async fn load_checkpoint_in(&self, place: Place) -> Result<CheckpointManifest> {
        self.check_reattachable()?;
        let text = place.get(MANIFEST).await?;
        let text = String::from_utf8(text).map_err(|_| {
            Error::corrupted(format!(
                "checkpoint: `{}` is not UTF-8 text",
                place.describe(MANIFEST)
            ))
        })?;
        let manifest = CheckpointManifest::decode(&text, &place.describe(MANIFEST))?;
        let [file] = manifest.files.as_slice() else {
            return Err(Error::corrupted(format!(
                "checkpoint: `{}` lists {} files, format {} has one",
                place.describe(MANIFEST),
                manifest.files.len(),
                manifest.format
            )));
        };
        if file.name.contains(['/', '\\']) || file.name.starts_with('.') {
            return Err(Error::corrupted(format!(
                "checkpoint: `{}` names the file `{}` outside its directory",
                place.describe(MANIFEST),
                file.name
            )));
        }
        let state = place.get(&file.name).await?;
        if state.len() as u64 != file.bytes || crc_hex(&state) != file.crc32 {
            return Err(Error::corrupted(format!(
                "checkpoint: `{}` is damaged: {} bytes with CRC-32 {}, the manifest says {} \
                 bytes with {}",
                place.describe(&file.name),
                state.len(),
                crc_hex(&state),
                file.bytes,
                file.crc32
            )));
        }
        let counts = self
            .control()
            .restore(state)
            .await
            .map_err(|e| e.context(format!("checkpoint `{}`", place.describe(&file.name))))?;
        // The controller is in the checkpoint's epoch now; this client's storage follows, to
        // find the keys of that epoch.
        self.storage().adopt_epoch(self.epoch());
        tracing::info!(at = %place.describe(MANIFEST), samples = counts.samples, "checkpoint loaded");
        Ok(manifest)
    }

    /// A checkpoint does not copy payloads: they must outlive this process in a shared store.
    fn check_reattachable(&self) -> Result<()> {
        let storage = &self.config().storage;
        if storage.backend != Backend::Kv {
            return Err(Error::unsupported(
                "checkpoint (the payloads of storage units are not copied into checkpoints \
                 yet; use KV storage on Redis or object storage, which the data outlives)",
                self.storage().name(),
            ));
        }
        #[cfg(feature = "kv")]
        if let Some(s) = storage
            .kv
            .stores
            .iter()
            .find(|s| s.url.starts_with("memory:") || s.url.starts_with("object-memory:"))
        {
            return Err(Error::unsupported(
                format!(
                    "checkpoint (store `{}` keeps its data in this process's memory, which a \
                     checkpoint does not copy)",
                    s.url
                ),
                self.storage().name(),
            ));
        }
        Ok(())
    }
}
