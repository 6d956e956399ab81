//! Checkpoints of a deployment whose payloads stay in a shared store (KV on Redis or object
//! storage): the controller's whole state in one file, described by a manifest written last.
//!
//! ```text
//! DIR/controller-<epoch>-<unix ms>.state   the controller snapshot (tq_controller::checkpoint)
//! DIR/MANIFEST.toml                        format, tq version, epoch, counts, and every file's
//!                                          size and CRC-32; its last line is its own CRC-32
//! ```
//!
//! A checkpoint exists once its manifest does: the state file has a name of its own and the
//! manifest replaces the previous one by a rename, so a save that fails or is killed half-way
//! leaves the previous checkpoint whole. Loading checks the manifest, then every file's size
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

    fn decode(text: &str, path: &Path) -> Result<CheckpointManifest> {
        let bad = |why: String| Error::corrupted(format!("checkpoint: `{}` {why}", path.display()));
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
                "checkpoint: `{}` is format {}, newer than this build reads (up to \
                 {CHECKPOINT_FORMAT}); load it with a newer tq",
                path.display(),
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
        let dir = dir.as_ref();
        self.check_reattachable()?;
        std::fs::create_dir_all(dir).map_err(|e| io_error("create", dir, e))?;
        let (state, counts) = self.control().snapshot().await?;
        let created_unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let epoch = format!("{:016x}", self.epoch());
        let name = format!("controller-{epoch}-{created_unix_ms}.state");
        write_atomically(&dir.join(&name), &state)?;
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
        // The checkpoint exists from here on; the previous one until here.
        write_atomically(&dir.join(MANIFEST), manifest.encode()?.as_bytes())?;
        for old in state_files(dir)?
            .into_iter()
            .filter(|p| !p.ends_with(&name))
        {
            if let Err(e) = std::fs::remove_file(&old) {
                tracing::warn!(file = %old.display(), error = %e, "could not remove an earlier checkpoint's state file");
            }
        }
        tracing::info!(dir = %dir.display(), samples = counts.samples, "checkpoint saved");
        Ok(manifest)
    }

    /// Restores the checkpoint in `dir` into this client's controller, which must hold no
    /// partition yet. Every file is checked (manifest checksum and format, each file's size
    /// and CRC-32, then the snapshot's own header and decoding) before anything changes; an
    /// error names the file at fault. Afterwards the controller is in the checkpoint's epoch:
    /// clients connected before are refused, new ones (and this one) see the restored state.
    pub async fn load_checkpoint(&self, dir: impl AsRef<Path>) -> Result<CheckpointManifest> {
        let dir = dir.as_ref();
        self.check_reattachable()?;
        let path = dir.join(MANIFEST);
        let text = std::fs::read_to_string(&path).map_err(|e| io_error("read", &path, e))?;
        let manifest = CheckpointManifest::decode(&text, &path)?;
        let [file] = manifest.files.as_slice() else {
            return Err(Error::corrupted(format!(
                "checkpoint: `{}` lists {} files, format {} has one",
                path.display(),
                manifest.files.len(),
                manifest.format
            )));
        };
        if file.name.contains(['/', '\\']) || file.name.starts_with('.') {
            return Err(Error::corrupted(format!(
                "checkpoint: `{}` names the file `{}` outside its directory",
                path.display(),
                file.name
            )));
        }
        let state_path = dir.join(&file.name);
        let state = std::fs::read(&state_path).map_err(|e| io_error("read", &state_path, e))?;
        if state.len() as u64 != file.bytes || crc_hex(&state) != file.crc32 {
            return Err(Error::corrupted(format!(
                "checkpoint: `{}` is damaged: {} bytes with CRC-32 {}, the manifest says {} \
                 bytes with {}",
                state_path.display(),
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
            .map_err(|e| e.context(format!("checkpoint `{}`", state_path.display())))?;
        // The controller is in the checkpoint's epoch now; this client's storage follows, to
        // find the keys of that epoch.
        self.storage().adopt_epoch(self.epoch());
        tracing::info!(dir = %dir.display(), samples = counts.samples, "checkpoint loaded");
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

/// The controller state files in `dir`.
fn state_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let entries = std::fs::read_dir(dir).map_err(|e| io_error("list", dir, e))?;
    Ok(entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("controller-") && n.ends_with(".state"))
        })
        .collect())
}
