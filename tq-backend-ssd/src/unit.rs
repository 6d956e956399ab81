//! [`SsdUnit`]: the hybrid memory/SSD storage unit.

use crate::config::SsdConfig;
use crate::engine::{build_engine, IoEngine, ReadOp, WriteOp};
use crate::run::{DiskFile, Run};
use async_trait::async_trait;
use bytes::Bytes;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::RwLock;
use tq_core::cells::FieldCells;
use tq_core::{
    apply_merge, Error, ErrorKind, FieldFilter, FieldName, MergeOp, MergeRegistry, Result,
    SampleId, Tensor, Value,
};
use tq_unit::{
    CellShape, MemoryUnit, StorageUnit, UnitConfig, UnitPut, UnitRows, UnitStats, UnitUpdate,
    UnitUpdateReply,
};

/// The [`UnitStats::counters`] entry of an SSD unit: values that should have gone to disk but
/// were kept in memory because the write failed and the unit's policy allows it (monotonic).
pub const FALLBACK_VALUES_TOTAL: &str = "ssd_fallback_values_total";

/// A cell kept on disk.
#[derive(Debug)]
struct DiskCell {
    generation: u32,
    file: Arc<DiskFile>,
    len: usize,
    shape: CellShape,
}

/// Which cells are on disk. The inner [`MemoryUnit`] holds every cell; for a disk cell it holds
/// an empty placeholder and this index holds the file. Both change together under the index's
/// write lock, so a cell is on disk exactly when the index has an entry for it.
#[derive(Debug, Default)]
struct DiskIndex {
    fields: HashMap<FieldName, HashMap<u32, DiskCell>>,
    cells: usize,
    bytes: u64,
    closed: bool,
}

impl DiskIndex {
    fn insert(&mut self, field: &str, index: u32, cell: DiskCell) -> Option<Arc<DiskFile>> {
        self.cells += 1;
        self.bytes += cell.len as u64;
        let old = match self.fields.get_mut(field) {
            Some(m) => m.insert(index, cell),
            None => self
                .fields
                .entry(field.to_string())
                .or_default()
                .insert(index, cell),
        };
        old.map(|c| self.forget(c))
    }

    fn forget(&mut self, cell: DiskCell) -> Arc<DiskFile> {
        self.cells -= 1;
        self.bytes -= cell.len as u64;
        cell.file
    }

    /// Removes the cell (field, index) if `remove` holds for its generation.
    fn remove_if(
        &mut self,
        field: &str,
        index: u32,
        remove: impl Fn(u32) -> bool,
    ) -> Option<Arc<DiskFile>> {
        let map = self.fields.get_mut(field)?;
        if !map.get(&index).is_some_and(|c| remove(c.generation)) {
            return None;
        }
        let cell = map.remove(&index)?;
        if map.is_empty() {
            self.fields.remove(field);
        }
        Some(self.forget(cell))
    }

    /// Removes every field's cell of `index` whose generation satisfies `remove`.
    fn remove_index_if(
        &mut self,
        index: u32,
        remove: impl Fn(u32) -> bool + Copy,
        dead: &mut Vec<Arc<DiskFile>>,
    ) {
        let fields: Vec<FieldName> = self
            .fields
            .iter()
            .filter(|(_, m)| m.get(&index).is_some_and(|c| remove(c.generation)))
            .map(|(f, _)| f.clone())
            .collect();
        for f in fields {
            dead.extend(self.remove_if(&f, index, remove));
        }
    }
}

/// Offload machinery of an enabled unit.
#[derive(Debug)]
struct Offload {
    threshold: usize,
    engine: Arc<dyn IoEngine>,
    dir: PathBuf,
    run: Mutex<Option<Arc<Run>>>,
    next_file: AtomicU64,
    memory_fallback: bool,
    trim_after_clear: bool,
}

impl Offload {
    fn new_path(&self, s: SampleId) -> PathBuf {
        let n = self.next_file.fetch_add(1, Ordering::Relaxed);
        self.dir
            .join(format!("{}-g{}-{n}.cell", s.index, s.generation))
    }
}

/// A cell of a put planned for disk.
struct Planned {
    field: FieldName,
    row: usize,
    sample: SampleId,
    shape: CellShape,
    len: usize,
    path: PathBuf,
}

/// A put whose files are written and which is ready to be committed.
struct Staged {
    /// The request for the inner unit: disk cells replaced by empty placeholders.
    inner: UnitPut,
    /// The new disk cells (field, index, cell).
    disk: Vec<(FieldName, u32, DiskCell)>,
}

/// A storage unit that keeps small cells in memory and cells of at least
/// [`SsdConfig::threshold_bytes`] in files on a local disk.
///
/// It is built around a [`MemoryUnit`], which holds every cell (an empty placeholder for a cell
/// on disk) and so applies the same generation, capacity and validation rules as the in-memory
/// unit. The unit adds an index of the disk cells, changed together with the inner unit under
/// one write lock. See the crate docs for the put protocol, file layout and memory policy.
#[derive(Debug)]
pub struct SsdUnit {
    id: String,
    inner: MemoryUnit,
    registry: MergeRegistry,
    offload: Option<Offload>,
    index: RwLock<DiskIndex>,
    fallback_total: AtomicU64,
    fallback_logged: AtomicBool,
}

fn unit_name(id: &str) -> String {
    format!("storage unit `{id}`")
}

/// A directory name for a unit id: characters other than `[A-Za-z0-9._-]` become `_`.
fn dir_name(id: &str) -> String {
    let s: String = id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.is_empty() || s == "." || s == ".." {
        format!("unit{s}")
    } else {
        s
    }
}

/// The error kind for an I/O error.
fn io_kind(e: &io::Error) -> ErrorKind {
    if e.raw_os_error() == Some(libc::ENOSPC) || e.raw_os_error() == Some(libc::EDQUOT) {
        ErrorKind::CapacityExceeded
    } else if e.kind() == io::ErrorKind::PermissionDenied {
        ErrorKind::PermissionDenied
    } else {
        ErrorKind::Internal
    }
}

impl SsdUnit {
    /// A unit with the memory settings of `unit` and the offload settings of `ssd`, using the
    /// engine `ssd.engine` selects. With offload disabled it behaves as a [`MemoryUnit`].
    pub fn new(id: impl Into<String>, unit: UnitConfig, ssd: SsdConfig) -> Result<Self> {
        let id = id.into();
        let engine = if ssd.enabled {
            Some(build_engine(ssd.engine).map_err(|e| {
                Error::new(
                    io_kind(&e),
                    format!(
                        "{}: cannot start the {:?} SSD I/O engine: {e}",
                        unit_name(&id),
                        ssd.engine
                    ),
                )
                .with_source(e)
            })?)
        } else {
            None
        };
        Self::build(id, unit, ssd, engine)
    }

    /// Like [`SsdUnit::new`] with a given engine (shared between units, or a custom one).
    pub fn with_engine(
        id: impl Into<String>,
        unit: UnitConfig,
        ssd: SsdConfig,
        engine: Arc<dyn IoEngine>,
    ) -> Result<Self> {
        Self::build(id.into(), unit, ssd, Some(engine))
    }

    fn build(
        id: String,
        unit: UnitConfig,
        ssd: SsdConfig,
        engine: Option<Arc<dyn IoEngine>>,
    ) -> Result<Self> {
        let registry = unit.merge_registry.clone();
        let inner = MemoryUnit::with_config(id.clone(), unit)?;
        let offload = match (ssd.enabled, engine) {
            (true, Some(engine)) => Some(Self::open(&id, &ssd, engine)?),
            _ => None,
        };
        if let Some(o) = &offload {
            tracing::info!(
                unit = %id,
                dir = %o.dir.display(),
                engine = o.engine.name(),
                threshold_bytes = o.threshold,
                "SSD offload enabled"
            );
        }
        Ok(SsdUnit {
            id,
            inner,
            registry,
            offload,
            index: RwLock::new(DiskIndex::default()),
            fallback_total: AtomicU64::new(0),
            fallback_logged: AtomicBool::new(false),
        })
    }

    fn open(id: &str, ssd: &SsdConfig, engine: Arc<dyn IoEngine>) -> Result<Offload> {
        let name = unit_name(id);
        let Some(path) = ssd.path.as_deref().filter(|p| !p.as_os_str().is_empty()) else {
            return Err(Error::invalid(format!(
                "{name}: ssd.path is required when ssd.enabled is true"
            )));
        };
        if ssd.threshold_bytes == 0 {
            return Err(Error::invalid(format!(
                "{name}: ssd.threshold_bytes must be at least 1"
            )));
        }
        let fail = |what: &str, p: &Path, e: io::Error| {
            Error::new(
                io_kind(&e),
                format!("{name}: cannot {what} `{}`: {e}", p.display()),
            )
            .with_source(e)
        };
        let run = Run::for_path(path).map_err(|e| fail("use the SSD offload path", path, e))?;
        let dir = run.dir().join(dir_name(id));
        std::fs::create_dir(&dir).map_err(|e| {
            if e.kind() == io::ErrorKind::AlreadyExists {
                Error::conflict(format!(
                    "{name}: another unit of this process already uses `{}`",
                    dir.display()
                ))
            } else {
                fail("create the unit's SSD directory", &dir, e)
            }
        })?;
        Ok(Offload {
            threshold: ssd.threshold_bytes,
            engine,
            dir,
            run: Mutex::new(Some(run)),
            next_file: AtomicU64::new(0),
            memory_fallback: ssd.memory_fallback,
            trim_after_clear: ssd.trim_after_clear,
        })
    }

    /// The directory holding this unit's cell files, when offload is enabled.
    pub fn dir(&self) -> Option<&Path> {
        self.offload.as_ref().map(|o| o.dir.as_path())
    }

    /// The I/O engine's name (`"uring"`, `"psync"`), when offload is enabled.
    pub fn engine_name(&self) -> Option<&'static str> {
        self.offload.as_ref().map(|o| o.engine.name())
    }

    /// Deletes every cell file and this unit's directory, and releases the run directory (which
    /// is deleted when no other unit of the process uses it). Afterwards every request fails
    /// with `Closed`. Dropping the unit does the same.
    pub async fn shutdown(&self) -> Result<()> {
        let mut idx = self.index.write().await;
        idx.closed = true;
        let dead: Vec<Arc<DiskFile>> = idx
            .fields
            .drain()
            .flat_map(|(_, m)| m.into_values().map(|c| c.file))
            .collect();
        idx.cells = 0;
        idx.bytes = 0;
        drop(idx);
        self.inner.clear(&[], &FieldFilter::All).await?;
        reclaim(dead).await;
        if let Some(o) = &self.offload {
            remove_unit_dir(o);
        }
        Ok(())
    }

    fn name(&self) -> String {
        unit_name(&self.id)
    }

    fn check_open(&self, idx: &DiskIndex) -> Result<()> {
        if idx.closed {
            return Err(Error::closed(format!("{} was shut down", self.name())));
        }
        Ok(())
    }

    /// Writes the disk cells of `req` and prepares the inner request. On failure every file
    /// this call created is deleted.
    async fn stage(&self, off: &Offload, mut req: UnitPut) -> Result<Staged> {
        let mut plan: Vec<Planned> = Vec::new();
        let mut ops: Vec<WriteOp> = Vec::new();
        for (field, rows) in &req.fields {
            for (row, (s, v)) in req.samples.iter().zip(&rows.values).enumerate() {
                if v.nbytes() >= off.threshold {
                    let path = off.new_path(*s);
                    ops.push(WriteOp {
                        path: path.clone(),
                        data: v.bytes().clone(),
                    });
                    plan.push(Planned {
                        field: field.clone(),
                        row,
                        sample: *s,
                        shape: CellShape::of(v),
                        len: v.nbytes(),
                        path,
                    });
                }
            }
        }
        if plan.is_empty() {
            return Ok(Staged {
                inner: req,
                disk: Vec::new(),
            });
        }
        let results = off.engine.write_files(ops).await;
        let mut first_err: Option<Error> = None;
        let mut disk = Vec::with_capacity(plan.len());
        let mut failed = Vec::new();
        for (p, res) in plan.into_iter().zip(results) {
            // From here on the handle deletes the file (also a partial one) when dropped.
            let file = Arc::new(DiskFile {
                path: p.path.clone(),
            });
            match res {
                Ok(()) => disk.push((p, file)),
                Err(e) => {
                    failed.push(file);
                    if off.memory_fallback {
                        self.count_fallback(&p, &e);
                    } else if first_err.is_none() {
                        first_err = Some(
                            Error::new(
                                io_kind(&e),
                                format!(
                                    "{}: cannot write field `{}` of sample {} to `{}`: {e}; the \
                                     put changed nothing",
                                    self.name(),
                                    p.field,
                                    p.sample,
                                    p.path.display()
                                ),
                            )
                            .with_source(e),
                        );
                    }
                }
            }
        }
        reclaim(failed).await;
        if let Some(e) = first_err {
            reclaim(disk.into_iter().map(|(_, f)| f).collect()).await;
            return Err(e);
        }
        // Replace the disk cells by placeholders; keep the memory rows of those fields from
        // pinning an allocation whose large rows now live on disk.
        let touched: HashSet<&str> = disk.iter().map(|(p, _)| p.field.as_str()).collect();
        for (field, rows) in req.fields.iter_mut() {
            if touched.contains(field.as_str()) && rows.shared_allocation {
                rows.values = rows.values.iter().map(owned_copy).collect();
                rows.shared_allocation = false;
            }
        }
        let disk = disk
            .into_iter()
            .map(|(p, file)| {
                #[allow(clippy::expect_used)] // the plan was made from these very fields
                let rows = req
                    .fields
                    .get_mut(&p.field)
                    .expect("planned from this field");
                rows.values[p.row] = Value::Object(Bytes::new());
                let cell = DiskCell {
                    generation: p.sample.generation,
                    file,
                    len: p.len,
                    shape: p.shape,
                };
                (p.field, p.sample.index, cell)
            })
            .collect();
        Ok(Staged { inner: req, disk })
    }

    fn count_fallback(&self, p: &Planned, e: &io::Error) {
        self.fallback_total.fetch_add(1, Ordering::Relaxed);
        if !self.fallback_logged.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                unit = %self.id,
                field = %p.field,
                sample = %p.sample,
                path = %p.path.display(),
                error = %e,
                "a value could not be written to disk and is kept in memory \
                 (counted in tq_storage_ssd_fallback_values_total; logged once per unit)"
            );
        }
    }

    /// Commits a staged put under the index's write lock. Returns the files that are no longer
    /// referenced. On failure the staged files are deleted and nothing changed.
    async fn commit(&self, idx: &mut DiskIndex, staged: Staged) -> Result<Vec<Arc<DiskFile>>> {
        let Staged { inner, disk } = staged;
        let samples = inner.samples.clone();
        let fields: Vec<FieldName> = inner.fields.keys().cloned().collect();
        if let Err(e) = self.check_open(idx) {
            reclaim(disk.into_iter().map(|(_, _, c)| c.file).collect()).await;
            return Err(e);
        }
        if let Err(e) = self.inner.put(inner).await {
            reclaim(disk.into_iter().map(|(_, _, c)| c.file).collect()).await;
            return Err(e);
        }
        let mut dead = Vec::new();
        if !fields.is_empty() {
            for s in &samples {
                // The inner unit purged every cell of an older generation of this index.
                let g = s.generation;
                idx.remove_index_if(s.index, |old| old < g, &mut dead);
                // Cells of this generation that the put replaced.
                for f in &fields {
                    dead.extend(idx.remove_if(f, s.index, |_| true));
                }
            }
        }
        for (field, index, cell) in disk {
            dead.extend(idx.insert(&field, index, cell));
        }
        Ok(dead)
    }

    /// Reads `fields` of `samples` (inner unit, then disk cells) under a held index lock.
    async fn read(
        &self,
        off: &Offload,
        idx: &DiskIndex,
        fields: &[FieldName],
        samples: &[SampleId],
    ) -> Result<(Vec<Vec<Value>>, Vec<Arc<DiskFile>>)> {
        let mut out = self.inner.get(fields, samples).await?;
        let mut ops = Vec::new();
        let mut slots = Vec::new();
        for (fi, field) in fields.iter().enumerate() {
            let Some(map) = idx.fields.get(field) else {
                continue;
            };
            for (si, s) in samples.iter().enumerate() {
                if let Some(c) = map.get(&s.index) {
                    debug_assert_eq!(c.generation, s.generation, "index out of step");
                    ops.push(ReadOp {
                        path: c.file.path.clone(),
                        len: c.len,
                    });
                    slots.push((fi, si, c.shape.clone(), c.file.clone()));
                }
            }
        }
        if ops.is_empty() {
            return Ok((out, Vec::new()));
        }
        let results = off.engine.read_files(ops).await;
        let mut held = Vec::with_capacity(slots.len());
        for (res, (fi, si, shape, file)) in results.into_iter().zip(slots) {
            let field = &fields[fi];
            let sample = samples[si];
            let bytes = res.map_err(|e| {
                let kind = if e.kind() == io::ErrorKind::NotFound {
                    ErrorKind::DataLost
                } else if e.kind() == io::ErrorKind::UnexpectedEof {
                    ErrorKind::Corrupted
                } else {
                    io_kind(&e)
                };
                Error::new(
                    kind,
                    format!(
                        "{}: cannot read field `{field}` of sample {sample} from `{}`: {e}",
                        self.name(),
                        file.path.display()
                    ),
                )
                .with_source(e)
            })?;
            out[fi][si] = match shape {
                CellShape::Object => Value::Object(bytes),
                CellShape::Tensor { dtype, shape } => {
                    Value::Tensor(Tensor::new(dtype, shape, bytes).map_err(|e| {
                        Error::corrupted(format!(
                            "{}: field `{field}` of sample {sample} in `{}`: {}",
                            self.name(),
                            file.path.display(),
                            e.message()
                        ))
                    })?)
                }
            };
            held.push(file);
        }
        Ok((out, held))
    }

    /// Checks an update's rows: names, row counts, distinct indexes.
    fn check_update(&self, req: &UnitUpdate) -> Result<()> {
        let name = self.name();
        for (field, rows) in &req.fields {
            if field.is_empty() {
                return Err(Error::invalid(format!(
                    "{name}: update with an empty field name"
                )));
            }
            if rows.values.len() != req.samples.len() {
                return Err(Error::invalid(format!(
                    "{name}: update of field `{field}` has {} rows for {} samples",
                    rows.values.len(),
                    req.samples.len()
                )));
            }
        }
        let mut seen = HashSet::new();
        if let Some(dup) = req.samples.iter().find(|s| !seen.insert(s.index)) {
            return Err(Error::invalid(format!(
                "{name}: update names sample index {} more than once",
                dup.index
            )));
        }
        Ok(())
    }
}

/// Deletes files no longer referenced (their last handles), off the async threads.
async fn reclaim(files: Vec<Arc<DiskFile>>) {
    if files.is_empty() {
        return;
    }
    if let Ok(h) = tokio::runtime::Handle::try_current() {
        let _ = h.spawn_blocking(move || drop(files)).await;
    }
}

fn remove_unit_dir(off: &Offload) {
    if let Err(e) = std::fs::remove_dir_all(&off.dir) {
        if e.kind() != io::ErrorKind::NotFound {
            tracing::warn!(dir = %off.dir.display(), error = %e, "could not remove a unit's SSD directory");
        }
    }
    off.run.lock().unwrap_or_else(|e| e.into_inner()).take();
}

/// Returns free heap memory to the operating system (glibc only; elsewhere nothing).
pub fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own structures.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Copies a value into a buffer of its own.
fn owned_copy(value: &Value) -> Value {
    match value {
        #[allow(clippy::expect_used)] // a copy has the same dtype, shape and length
        Value::Tensor(t) => Value::Tensor(
            Tensor::new(
                t.dtype(),
                t.shape().to_vec(),
                Bytes::copy_from_slice(t.data()),
            )
            .expect("same dtype, shape and length"),
        ),
        Value::Object(b) => Value::Object(Bytes::copy_from_slice(b)),
    }
}

impl Drop for SsdUnit {
    fn drop(&mut self) {
        if let Some(o) = &self.offload {
            // Deleting the directory deletes every cell file at once; the handles in the index
            // then find nothing left to delete.
            remove_unit_dir(o);
        }
    }
}

mod storage_impl;
