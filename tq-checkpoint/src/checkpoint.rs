//! Checkpoints: the controller's whole state and, for storage that keeps payloads in units of
//! its own (in memory, on a local SSD), a copy of every cell, described by a manifest written
//! last, in a local directory or (feature `object-store`) under a prefix of an object store —
//! S3 with feature `s3` (`s3://bucket/prefix`, credentials from the `AWS_*` environment).
//!
//! ```text
//! DIR/controller-<epoch>-<unix ms>.state       the controller snapshot (tq_controller::checkpoint)
//! DIR/unit-<i>-<unix ms>-<page>.cells          storage unit i's cells, 64 MiB a file (cells.rs)
//! DIR/kv-<unix ms>-<n>.pages                  with `copy_payloads`: KV cells read from the store
//!                                              (kv_copy.rs)
//! DIR/MANIFEST.toml                            format, tq version, epoch, counts, and every file's
//!                                              size and CRC-32; its last line is its own CRC-32
//! ```
//!
//! A checkpoint exists once its manifest does: every data file has a name of its own and the
//! manifest replaces the previous one by a rename (a single put on an object store, which is
//! atomic), so a save that fails or is killed half-way leaves the previous checkpoint whole.
//! Loading checks the manifest, then every file's size and checksum, the cells files' contents,
//! the unit count and that the units are empty, then the snapshot itself, before the
//! controller changes anything.
//!
//! Consistency with writers running: every unit first holds new puts and clears, then the
//! controller state is taken, then every unit captures its cells (copy-on-write for cells in
//! memory) and lets the writes go; see [`tq_core::cells`]. Every sample the state marks
//! produced therefore has its cells in the checkpoint. The write pause lasts from the hold to
//! the capture: a controller round trip plus a map walk per unit, and reading the disk cells of
//! an SSD unit.
//!
//! KV payloads stay in the store by default, and the snapshot carries the controller's epoch,
//! so a restored controller's clients find the KV keys of that epoch where they are. With
//! [`CheckpointOptions::copy_payloads`] they are copied too: the controller holds clears and
//! overwrites from the snapshot until every cell it names is read (see `kv_copy`). Stores that
//! keep data in this process's memory are refused unless their payloads are copied.

use crate::On;
use futures::{StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};
use std::future::Future;
use std::path::Path;
use tq_client::{Backend, Client};
use tq_controller::SnapshotCounts;
use tq_core::{Bytes, Error, Result};

/// The manifest format this build writes; it reads this one and older.
/// Format 2 added the cells of storage units (`units`); format 3 copied KV payloads
/// (`kv_copy`).
pub const CHECKPOINT_FORMAT: u32 = 3;

/// How a checkpoint is saved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CheckpointOptions {
    /// Copy KV payloads into the checkpoint instead of only recording where they are: the
    /// checkpoint then loads into another store (or an empty one) and is unaffected by what
    /// happens to the store afterwards. Clears and overwrites wait while the cells are read.
    /// Storage units' cells are always copied; this changes nothing for them.
    pub copy_payloads: bool,
}

pub(crate) const MANIFEST: &str = "MANIFEST.toml";
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
    /// The controller state (one file).
    pub files: Vec<CheckpointFile>,
    /// Per storage unit, in routing order, the files of its cells; empty when the payloads
    /// stay in a shared store (KV).
    #[serde(default)]
    pub units: Vec<UnitCells>,
    /// KV payloads copied from the store (saved with
    /// [`CheckpointOptions::copy_payloads`]; format 3 on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_copy: Option<UnitCells>,
}

/// The cells of one storage unit (or the KV payloads copied) in a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnitCells {
    pub cells: u64,
    pub bytes: u64,
    pub files: Vec<CheckpointFile>,
}

pub(crate) mod cells;
mod kv_copy;
mod stores;
use stores::check_same_stores;

use crate::place::Place;

pub(crate) fn crc_hex(bytes: &[u8]) -> String {
    format!("{:08x}", crc32fast::hash(bytes))
}

/// A data file of some checkpoint (controller states and unit cells).
fn is_checkpoint_file(name: &str) -> bool {
    (name.starts_with("controller-") && name.ends_with(".state"))
        || (name.starts_with("unit-") && name.ends_with(".cells"))
        || kv_copy::is_copy_file(name)
}

/// A TOML manifest with its own CRC-32 as the last line.
pub(crate) fn seal<T: Serialize>(manifest: &T, what: &str) -> Result<String> {
    let body = toml::to_string(manifest)
        .map_err(|e| Error::internal(format!("{what}: cannot encode the manifest: {e}")))?;
    Ok(format!("{body}{CRC_LINE}{}\n", crc_hex(body.as_bytes())))
}

/// The manifest in `text` (the file `path`), checked: its CRC-32 line, then its `format`
/// (newer than `newest` is refused), then the whole of it.
pub(crate) fn unseal<T: serde::de::DeserializeOwned>(
    text: &str,
    path: &str,
    what: &str,
    newest: u32,
) -> Result<T> {
    let bad = |why: String| Error::corrupted(format!("{what}: `{path}` {why}"));
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
    let format: Format = toml::from_str(body).map_err(|e| bad(format!("does not parse: {e}")))?;
    if format.format > newest {
        return Err(Error::invalid(format!(
            "{what}: `{path}` is format {}, newer than this build reads (up to {newest}); load \
             it with a newer tq",
            format.format
        )));
    }
    toml::from_str(body).map_err(|e| bad(format!("does not parse: {e}")))
}

impl CheckpointManifest {
    fn encode(&self) -> Result<String> {
        seal(self, "checkpoint")
    }

    fn decode(text: &str, path: &str) -> Result<CheckpointManifest> {
        unseal(text, path, "checkpoint", CHECKPOINT_FORMAT)
    }
}

/// Checkpoints of a deployment, saved and loaded through one of its clients (`use
/// tq::checkpoint::Checkpoints` to call them on a [`Client`]).
pub trait Checkpoints {
    /// Saves the controller's whole state to the directory `dir` (created if missing) as a
    /// checkpoint that [`Checkpoints::load_checkpoint`] restores, in this or another deployment
    /// like this one. The state is taken in one step under the controller's lock. Storage
    /// units (in memory, SSD, in other processes) have their cells copied, consistently with
    /// that state while writers run (see the module docs: writes pause from the hold to the
    /// capture); KV payloads stay in their store. Refused for storage whose payloads would be
    /// lost (a KV store in this process's memory, a custom backend that copies nothing).
    fn save_checkpoint(
        &self,
        dir: impl AsRef<Path> + Send,
    ) -> impl Future<Output = Result<CheckpointManifest>> + Send;

    /// [`Checkpoints::save_checkpoint`] to a URL: a directory (`DIR` or `file://DIR`) or, with
    /// feature `s3`, `s3://bucket/prefix` (credentials from the `AWS_*` environment).
    fn save_checkpoint_to_url(
        &self,
        url: &str,
    ) -> impl Future<Output = Result<CheckpointManifest>> + Send;

    /// [`Checkpoints::save_checkpoint_to_url`] with options: `copy_payloads` copies KV payloads
    /// into the checkpoint.
    fn save_checkpoint_with(
        &self,
        url: &str,
        options: CheckpointOptions,
    ) -> impl Future<Output = Result<CheckpointManifest>> + Send;

    /// [`Checkpoints::save_checkpoint`] under `prefix` of any object store (feature `object-store`).
    #[cfg(feature = "object-store")]
    fn save_checkpoint_to_store(
        &self,
        store: std::sync::Arc<dyn object_store::ObjectStore>,
        prefix: &str,
    ) -> impl Future<Output = Result<CheckpointManifest>> + Send;

    /// Restores the checkpoint in `dir` into this client's controller, which must hold no
    /// partition yet. Every file is checked (manifest checksum and format, each file's size
    /// and CRC-32, then the snapshot's own header and decoding) before anything changes; an
    /// error names the file at fault. Afterwards the controller is in the checkpoint's epoch
    /// (in a fresh one when the checkpoint copied KV payloads, which are written back under
    /// it): clients connected before are refused, new ones (and this one) see the restored
    /// state.
    fn load_checkpoint(
        &self,
        dir: impl AsRef<Path> + Send,
    ) -> impl Future<Output = Result<CheckpointManifest>> + Send;

    /// [`Checkpoints::load_checkpoint`] from a URL (see [`Checkpoints::save_checkpoint_to_url`]).
    fn load_checkpoint_from_url(
        &self,
        url: &str,
    ) -> impl Future<Output = Result<CheckpointManifest>> + Send;

    /// [`Checkpoints::load_checkpoint`] from `prefix` of any object store (feature `object-store`).
    #[cfg(feature = "object-store")]
    fn load_checkpoint_from_store(
        &self,
        store: std::sync::Arc<dyn object_store::ObjectStore>,
        prefix: &str,
    ) -> impl Future<Output = Result<CheckpointManifest>> + Send;
}

impl Checkpoints for Client {
    async fn save_checkpoint(&self, dir: impl AsRef<Path> + Send) -> Result<CheckpointManifest> {
        let place = Place::Dir(dir.as_ref().to_path_buf());
        On(self)
            .save_checkpoint_in(place, CheckpointOptions::default())
            .await
    }

    async fn save_checkpoint_to_url(&self, url: &str) -> Result<CheckpointManifest> {
        On(self)
            .save_checkpoint_in(Place::parse(url)?, CheckpointOptions::default())
            .await
    }

    async fn save_checkpoint_with(
        &self,
        url: &str,
        options: CheckpointOptions,
    ) -> Result<CheckpointManifest> {
        On(self)
            .save_checkpoint_in(Place::parse(url)?, options)
            .await
    }

    #[cfg(feature = "object-store")]
    async fn save_checkpoint_to_store(
        &self,
        store: std::sync::Arc<dyn object_store::ObjectStore>,
        prefix: &str,
    ) -> Result<CheckpointManifest> {
        let label = format!("object store {store}");
        let place = Place::Store {
            store,
            prefix: prefix.trim_end_matches('/').to_string(),
            label,
        };
        On(self)
            .save_checkpoint_in(place, CheckpointOptions::default())
            .await
    }

    async fn load_checkpoint(&self, dir: impl AsRef<Path> + Send) -> Result<CheckpointManifest> {
        On(self)
            .load_checkpoint_in(Place::Dir(dir.as_ref().to_path_buf()))
            .await
    }

    async fn load_checkpoint_from_url(&self, url: &str) -> Result<CheckpointManifest> {
        On(self).load_checkpoint_in(Place::parse(url)?).await
    }

    #[cfg(feature = "object-store")]
    async fn load_checkpoint_from_store(
        &self,
        store: std::sync::Arc<dyn object_store::ObjectStore>,
        prefix: &str,
    ) -> Result<CheckpointManifest> {
        let label = format!("object store {store}");
        On(self)
            .load_checkpoint_in(Place::Store {
                store,
                prefix: prefix.trim_end_matches('/').to_string(),
                label,
            })
            .await
    }
}

impl On<'_, Client> {
    async fn save_checkpoint_in(
        &self,
        place: Place,
        options: CheckpointOptions,
    ) -> Result<CheckpointManifest> {
        // Storage units are always copied; KV payloads on request.
        let units = self.storage().payload_checkpoint();
        let copy = match (units, options.copy_payloads) {
            (None, true) => Some(self.storage().payload_copy().ok_or_else(|| {
                Error::unsupported(
                    "checkpoint with copied payloads (this storage cannot copy its payloads)",
                    self.storage().name(),
                )
            })?),
            _ => None,
        };
        self.check_checkpointable(copy.is_some())?;
        place.prepare()?;
        let created_unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let mut kv_copy = None;
        let (state, counts, units) = match (units, copy) {
            (None, Some(copy)) => {
                let held = std::time::Instant::now();
                let (state, counts, hold) = self
                    .control()
                    .snapshot_holding_removals(tq_core::cells::DEFAULT_HOLD_TTL)
                    .await?;
                let copied = kv_copy::save(&place, copy, &state, created_unix_ms).await;
                if let Err(e) = self.control().release_removals(hold).await {
                    tracing::warn!(error = %e, "checkpoint: could not lift the hold on clears; it lifts itself after its time to live");
                }
                let copied = copied?;
                tracing::info!(
                    pause_ms = held.elapsed().as_secs_f64() * 1e3,
                    cells = copied.cells,
                    bytes = copied.bytes,
                    "checkpoint: KV payloads copied; clears and overwrites go on"
                );
                kv_copy = Some(copied);
                (state, counts, Vec::new())
            }
            (None, None) => {
                let (state, counts) = self.control().snapshot().await?;
                (state, counts, Vec::new())
            }
            (Some(payloads), _) => {
                // Hold every unit's writes, take the state, capture the cells: see the module
                // docs for why this order makes the copy consistent.
                let held = std::time::Instant::now();
                payloads.hold(tq_core::cells::DEFAULT_HOLD_TTL).await?;
                let (state, counts) = match self.control().snapshot().await {
                    Ok(s) => s,
                    Err(e) => {
                        payloads.release(&[]).await;
                        return Err(e);
                    }
                };
                let captures = payloads.capture().await?;
                tracing::info!(
                    pause_ms = held.elapsed().as_secs_f64() * 1e3,
                    cells = captures.iter().map(|c| c.cells).sum::<u64>(),
                    "checkpoint: cells captured; writes go on"
                );
                let written = cells::save(&place, payloads, &captures, created_unix_ms).await;
                payloads.release(&captures).await;
                (state, counts, written?)
            }
        };
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
            units,
            kv_copy,
        };
        place.put(&name, state).await?;
        // The checkpoint exists from here on; the previous one until here.
        place.put(MANIFEST, manifest.encode()?.into_bytes()).await?;
        let ours: std::collections::HashSet<&str> =
            manifest.all_files().map(|f| f.name.as_str()).collect();
        for old in place.files_matching(is_checkpoint_file).await? {
            if !ours.contains(old.as_str()) {
                if let Err(e) = place.remove(&old).await {
                    tracing::warn!(file = %place.describe(&old), error = %e, "could not remove an earlier checkpoint's file");
                }
            }
        }
        tracing::info!(at = %place.describe(MANIFEST), samples = counts.samples, "checkpoint saved");
        Ok(manifest)
    }

    async fn load_checkpoint_in(&self, place: Place) -> Result<CheckpointManifest> {
        let text = place.get(MANIFEST).await?;
        let text = String::from_utf8(text).map_err(|_| {
            Error::corrupted(format!(
                "checkpoint: `{}` is not UTF-8 text",
                place.describe(MANIFEST)
            ))
        })?;
        let manifest = CheckpointManifest::decode(&text, &place.describe(MANIFEST))?;
        self.check_checkpointable(manifest.kv_copy.is_some())?;
        if manifest.kv_copy.is_some() && self.storage().payload_copy().is_none() {
            return Err(Error::invalid(format!(
                "checkpoint: `{}` holds copied KV payloads, and this deployment's storage \
                 (`{}`) cannot take them; load it into a deployment with KV storage",
                place.describe(MANIFEST),
                self.storage().name()
            )));
        }
        let [file] = manifest.files.as_slice() else {
            return Err(Error::corrupted(format!(
                "checkpoint: `{}` lists {} controller state files, format {} has one",
                place.describe(MANIFEST),
                manifest.files.len(),
                manifest.format
            )));
        };
        let payloads = self.storage().payload_checkpoint();
        let parts = payloads.map_or(0, |p| p.parts());
        if manifest.units.len() != parts {
            return Err(Error::invalid(format!(
                "checkpoint: `{}` holds the cells of {} storage units, and this deployment's \
                 storage (`{}`) has {parts} units that take cells; load it into a deployment \
                 like the one that saved it (storage `{}`)",
                place.describe(MANIFEST),
                manifest.units.len(),
                self.storage().name(),
                manifest.storage
            )));
        }
        if manifest.kv_copy.is_none() {
            check_same_stores(
                &manifest.storage,
                self.storage().name(),
                &place.describe(MANIFEST),
            )?;
        }
        // Read and check everything before changing anything.
        let mut state = read_checked(&place, file, MANIFEST).await?;
        if manifest.kv_copy.is_some() {
            // Copied payloads are written back under a fresh epoch, where no store holds a
            // key yet: a store that went on writing in the checkpoint's epoch (the one the
            // copy came from, say) would otherwise hold generation keys the restored
            // allocator is behind, and refuse its writes as stale.
            state = tq_controller::snapshot_in_epoch(&state, tq_core::new_epoch())
                .map_err(|e| e.context(format!("checkpoint `{}`", place.describe(&file.name))))?;
        }
        let copied_pages = match &manifest.kv_copy {
            None => Vec::new(),
            Some(copied) => self.read_copied_payloads(&place, copied).await?,
        };
        let mut unit_cells = Vec::with_capacity(parts);
        for (part, unit) in manifest.units.iter().enumerate() {
            let mut cells = Vec::new();
            for f in &unit.files {
                let bytes = read_checked(&place, f, MANIFEST).await?;
                cells.extend(cells::decode(bytes.into(), &place.describe(&f.name))?);
            }
            let (n, b) = cells.iter().fold((0u64, 0u64), |(n, b), fc| {
                (n + fc.values.len() as u64, b + fc.nbytes())
            });
            if (n, b) != (unit.cells, unit.bytes) {
                return Err(Error::corrupted(format!(
                    "checkpoint: the files of storage unit {part} hold {n} cells of {b} bytes, \
                     `{}` says {} cells of {} bytes",
                    place.describe(MANIFEST),
                    unit.cells,
                    unit.bytes
                )));
            }
            unit_cells.push(cells);
        }
        if let Some(payloads) = payloads {
            let stored = payloads.stored_cells().await?;
            if let Some((part, n)) = stored.iter().enumerate().find(|(_, n)| **n > 0) {
                return Err(Error::invalid(format!(
                    "checkpoint: storage unit {part} already holds {n} cells; a checkpoint is \
                     loaded into empty storage (clear the partitions or start a fresh deployment)"
                )));
            }
        }
        // A checkpoint of shared storage restores the epoch its controller served: refused
        // while that controller lives, and taken once a dead one's claim lapses.
        let counts = tq_core::waiting_out_claims(|| self.control().restore(state.clone()))
            .await
            .map_err(|e| e.context(format!("checkpoint `{}`", place.describe(&file.name))))?;
        // The controller is in the checkpoint's epoch now (a fresh one with copied KV
        // payloads); this client's storage follows, to find the keys of that epoch, and
        // units in other processes, to accept its cells.
        self.storage().adopt_epoch(self.epoch());
        if let Some(payloads) = payloads {
            let loaded = async {
                payloads.enter_epoch(self.epoch()).await?;
                for (part, cells) in unit_cells.into_iter().enumerate() {
                    payloads.load(part, cells).await?;
                }
                Ok::<_, Error>(())
            };
            loaded.await.map_err(|e| {
                e.context(format!(
                    "checkpoint `{}`: the controller state was restored, but not every cell \
                     reached its storage unit; samples whose cells are missing read as not \
                     found (load again into a fresh deployment)",
                    place.describe(MANIFEST)
                ))
            })?;
        }
        if !copied_pages.is_empty() {
            self.write_copied_payloads(copied_pages)
                .await
                .map_err(|e| {
                    e.context(format!(
                        "checkpoint `{}`: the controller state was restored, but not every copied \
                     KV payload was written back; samples whose cells are missing read as \
                     DataLost (load again into a fresh deployment)",
                        place.describe(MANIFEST)
                    ))
                })?;
        }
        tracing::info!(at = %place.describe(MANIFEST), samples = counts.samples, "checkpoint loaded");
        Ok(manifest)
    }

    /// The pages of a checkpoint's copied KV payloads, every file and page checked against
    /// the manifest and by this deployment's storage.
    async fn read_copied_payloads(&self, place: &Place, copied: &UnitCells) -> Result<Vec<Bytes>> {
        let copy = self
            .storage()
            .payload_copy()
            .ok_or_else(|| Error::internal("checkpoint: the storage copies no payloads"))?;
        let mut pages = Vec::new();
        let mut total = (0u64, 0u64);
        for f in &copied.files {
            let bytes = read_checked(place, f, MANIFEST).await?;
            let (file_pages, counts) =
                kv_copy::decode(bytes.into(), copy, &place.describe(&f.name))?;
            total = (total.0 + counts.cells, total.1 + counts.bytes);
            pages.extend(file_pages);
        }
        if total != (copied.cells, copied.bytes) {
            return Err(Error::corrupted(format!(
                "checkpoint: the copied KV payloads hold {} cells of {} bytes, `{}` says {} cells \
                 of {} bytes",
                total.0,
                total.1,
                place.describe(MANIFEST),
                copied.cells,
                copied.bytes
            )));
        }
        Ok(pages)
    }

    /// Writes checked pages back into the store, under this controller's epoch (fresh, see
    /// the load).
    async fn write_copied_payloads(&self, pages: Vec<Bytes>) -> Result<()> {
        let copy = self
            .storage()
            .payload_copy()
            .ok_or_else(|| Error::internal("checkpoint: the storage stopped copying payloads"))?;
        let epoch = self.epoch();
        futures::stream::iter(
            pages.into_iter().enumerate().map(|(i, page)| async move {
                copy.import(page, epoch, &format!("page {i}")).await
            }),
        )
        .buffer_unordered(4)
        .try_collect::<Vec<_>>()
        .await
        .map(|_| ())
    }

    /// Refuses storage whose payloads a checkpoint would lose: a backend that neither copies
    /// its payloads ([`tq_core::StorageManager::payload_checkpoint`]) nor keeps them in a
    /// shared store, and KV stores in this process's memory unless `copied`.
    fn check_checkpointable(&self, copied: bool) -> Result<()> {
        let storage = &self.config().storage;
        if self.storage().payload_checkpoint().is_some() || copied {
            return Ok(());
        }
        if storage.backend != Backend::Kv {
            return Err(Error::unsupported(
                "checkpoint (this storage neither copies its payloads into checkpoints nor \
                 keeps them in a store that outlives the process)",
                self.storage().name(),
            ));
        }
        if let Some(url) = storage.in_process_kv_store() {
            return Err(Error::unsupported(
                format!(
                    "checkpoint (store `{url}` keeps its data in this process's memory; save with \
                     its payloads copied, `copy_payloads` / `--copy-payloads`)"
                ),
                self.storage().name(),
            ));
        }
        Ok(())
    }
}

impl CheckpointManifest {
    /// Every data file the manifest names.
    fn all_files(&self) -> impl Iterator<Item = &CheckpointFile> {
        self.files
            .iter()
            .chain(self.units.iter().flat_map(|u| u.files.iter()))
            .chain(self.kv_copy.iter().flat_map(|u| u.files.iter()))
    }
}

/// Reads `file` of a checkpoint and checks its name, size and CRC-32 against the manifest.
pub(crate) async fn read_checked(
    place: &Place,
    file: &CheckpointFile,
    manifest: &str,
) -> Result<Vec<u8>> {
    if file.name.contains(['/', '\\']) || file.name.starts_with('.') {
        return Err(Error::corrupted(format!(
            "`{}` names the file `{}` outside its directory",
            place.describe(manifest),
            file.name
        )));
    }
    let bytes = place.get(&file.name).await?;
    if bytes.len() as u64 != file.bytes || crc_hex(&bytes) != file.crc32 {
        return Err(Error::corrupted(format!(
            "`{}` is damaged: {} bytes with CRC-32 {}, the manifest says {} bytes with {}",
            place.describe(&file.name),
            bytes.len(),
            crc_hex(&bytes),
            file.bytes,
            file.crc32
        )));
    }
    Ok(bytes)
}
