//! Run directories: where a process keeps its offload files, and how leftovers of dead runs are
//! found and removed.
//!
//! Layout under the configured `path`:
//!
//! ```text
//! <path>/tq-ssd/                          created if missing; removed when empty at shutdown
//! <path>/tq-ssd/run-<pid>-<nanos>.lock    held with flock(LOCK_EX) for the life of the run
//! <path>/tq-ssd/run-<pid>-<nanos>/        the run directory
//! <path>/tq-ssd/run-<pid>-<nanos>/<unit>/ one directory per storage unit, one file per cell
//! ```
//!
//! All units of one process that use the same path share one run (the run directory goes away
//! with the last of them). A run whose lock file can be locked by somebody else has no living
//! owner: its directory and lock are removed when the next run starts under the same path.
//! The lock file is created under a temporary name, locked, and only then renamed into place,
//! so a starting run is never mistaken for a dead one.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{SystemTime, UNIX_EPOCH};

/// The directory created inside the user's path.
pub const ROOT_DIR: &str = "tq-ssd";

/// Live runs of this process, by canonical root directory.
fn registry() -> &'static Mutex<HashMap<PathBuf, Weak<Run>>> {
    static RUNS: OnceLock<Mutex<HashMap<PathBuf, Weak<Run>>>> = OnceLock::new();
    RUNS.get_or_init(Default::default)
}

/// A run directory owned by this process. Dropping the last handle deletes it.
#[derive(Debug)]
pub(crate) struct Run {
    root: PathBuf,
    dir: PathBuf,
    lock_path: PathBuf,
    _lock: File,
}

impl Run {
    /// The run of this process under `path` (created with its parents if needed), shared with
    /// other units of this process that use the same path.
    pub(crate) fn for_path(path: &Path) -> io::Result<Arc<Run>> {
        fs::create_dir_all(path)?;
        let root = path.join(ROOT_DIR);
        match fs::symlink_metadata(&root) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("{} exists and is not a directory", root.display()),
                ))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                fs::create_dir(&root).or_else(|e| {
                    if e.kind() == io::ErrorKind::AlreadyExists {
                        Ok(())
                    } else {
                        Err(e)
                    }
                })?
            }
            Err(e) => return Err(e),
        }
        let root = fs::canonicalize(&root)?;
        let mut runs = registry().lock().unwrap_or_else(|e| e.into_inner());
        if let Some(run) = runs.get(&root).and_then(Weak::upgrade) {
            return Ok(run);
        }
        remove_dead_runs(&root);
        let run = Arc::new(Run::create(root.clone())?);
        runs.retain(|_, w| w.strong_count() > 0);
        runs.insert(root, Arc::downgrade(&run));
        Ok(run)
    }

    fn create(root: PathBuf) -> io::Result<Run> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let id = format!("run-{}-{nanos:x}", std::process::id());
        let tmp = root.join(format!(".{id}.lock.tmp"));
        let lock = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
        if !try_lock(&lock)? {
            let _ = fs::remove_file(&tmp);
            return Err(io::Error::other("could not lock a fresh run lock file"));
        }
        let lock_path = root.join(format!("{id}.lock"));
        fs::rename(&tmp, &lock_path)?;
        let dir = root.join(&id);
        if let Err(e) = fs::create_dir(&dir) {
            let _ = fs::remove_file(&lock_path);
            return Err(e);
        }
        tracing::debug!(dir = %dir.display(), "created SSD offload run directory");
        Ok(Run {
            root,
            dir,
            lock_path,
            _lock: lock,
        })
    }

    /// The run directory.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        if let Err(e) = fs::remove_dir_all(&self.dir) {
            if e.kind() != io::ErrorKind::NotFound {
                tracing::warn!(dir = %self.dir.display(), error = %e, "could not remove the SSD offload run directory");
            }
        }
        let _ = fs::remove_file(&self.lock_path);
        // Leaves the user's directory; removes our child of it when no other run uses it.
        let _ = fs::remove_dir(&self.root);
        let mut runs = registry().lock().unwrap_or_else(|e| e.into_inner());
        runs.retain(|_, w| w.strong_count() > 0);
    }
}

/// Tries to take an exclusive lock without waiting. `Ok(false)`: somebody holds it.
fn try_lock(file: &File) -> io::Result<bool> {
    #[cfg(unix)]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: flock on a valid descriptor.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc == 0 {
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            Ok(false)
        } else {
            Err(e)
        }
    }
    #[cfg(not(unix))]
    {
        let _ = file;
        Ok(true)
    }
}

/// Removes the run directories (and lock files) under `root` whose owner no longer exists.
/// Returns the directories removed.
pub(crate) fn remove_dead_runs(root: &Path) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    let Ok(entries) = fs::read_dir(root) else {
        return removed;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("run-") {
            continue;
        }
        let (run_id, is_lock) = match name.strip_suffix(".lock") {
            Some(id) => (id.to_string(), true),
            None => (name.clone(), false),
        };
        let dir = root.join(&run_id);
        let lock_path = root.join(format!("{run_id}.lock"));
        if is_lock && dir.exists() {
            continue; // handled through its directory
        }
        let dead = match File::open(&lock_path) {
            Ok(f) => matches!(try_lock(&f), Ok(true)),
            Err(e) => e.kind() == io::ErrorKind::NotFound,
        };
        if !dead {
            continue;
        }
        if !is_lock {
            match fs::remove_dir_all(&dir) {
                Ok(()) => {
                    tracing::warn!(
                        dir = %dir.display(),
                        "removed SSD offload files left by a run that no longer exists"
                    );
                    removed.push(dir);
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(dir = %dir.display(), error = %e, "could not remove a dead run's SSD offload files");
                    continue;
                }
            }
        }
        let _ = fs::remove_file(&lock_path);
    }
    removed
}

/// One cell file. Dropping the last handle deletes the file, so a read that is still using it
/// when the cell is cleared finishes first.
#[derive(Debug)]
pub(crate) struct DiskFile {
    pub(crate) path: PathBuf,
}

impl Drop for DiskFile {
    fn drop(&mut self) {
        if let Err(e) = fs::remove_file(&self.path) {
            if e.kind() != io::ErrorKind::NotFound {
                tracing::warn!(path = %self.path.display(), error = %e, "could not delete an SSD offload file");
            }
        }
    }
}
