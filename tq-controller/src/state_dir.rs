//! `--state-dir`: the controller's state on disk, so a controller killed and started again on
//! the same directory carries on where it stopped.
//!
//! Two files:
//! - `controller.state`, a whole snapshot (the checkpoint snapshot format: CRC-32, format
//!   version), written through a synced temporary file and a rename;
//! - `controller.log`, change records appended since that snapshot: each holds the partitions
//!   changed since the previous record and the controller-wide state (framed and checksummed
//!   like a snapshot; see `controller/changes.rs`).
//!
//! Every change is durable before it is acknowledged, with group commit: a request that changed
//! the state bumps a version and waits until a record taken after its change is synced
//! (`fdatasync`); one committer thread appends the records, and each covers every request that
//! finished before it was taken. So a commit costs the partitions it changed and one sync, not
//! the whole state. When the log outgrows [`COMPACT_MIN_BYTES`] and half the snapshot,
//! the committer writes a new snapshot and empties the log.
//!
//! On start, the snapshot is restored (epoch included, so storage units and clients of that
//! life carry on) and the log replayed on it. A record cut short at the end of the log (a crash
//! during its write: it was never acknowledged) is dropped; a damaged record with more after it
//! is refused, naming the file and offset. The controller then serves at once: the log is cut
//! back to its whole records and appended to, and the snapshot is rewritten only by the next
//! compaction, so a restart costs the restore and the replay, not a rewrite of the state.
//!
//! Crash safety of compaction: the record that ends the old log and the new snapshot are taken
//! under one lock, so they hold the same state. A crash after the new snapshot is in place but
//! before the log is emptied leaves that snapshot with the old log, and replaying the old log
//! on it gives the same state again (records set what they carry).

use crate::checkpoint::{frame_len, unframe};
use crate::Controller;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use tokio::sync::watch;
use tq_core::{Error, Result};

const STATE_FILE: &str = "controller.state";
const LOG_FILE: &str = "controller.log";

/// The log is compacted into a new snapshot once it is larger than this and than half the
/// snapshot. The bound is for restarts: replaying a log costs about what restoring as many
/// snapshot bytes does, so a restart costs at most about 1.5 restores. The price is a
/// snapshot written per half a snapshot of records appended.
pub const COMPACT_MIN_BYTES: u64 = 16 << 20;

/// How a [`StateDir`] manages its files.
#[derive(Debug, Clone)]
pub struct StateDirOptions {
    /// The log is compacted once it is larger than this and than half the snapshot
    /// (default [`COMPACT_MIN_BYTES`]).
    pub compact_min_bytes: u64,
}

impl Default for StateDirOptions {
    fn default() -> Self {
        StateDirOptions {
            compact_min_bytes: COMPACT_MIN_BYTES,
        }
    }
}

/// Writes the controller's state after changes; see the module documentation.
///
/// It holds the directory's lock file (`controller.lock`, `flock`ed, with the holder's pid in
/// it) for its whole life, so a second controller started on the same directory is refused
/// instead of appending to the same log. Dropping it stops the committer thread and waits for
/// it, so the lock is free once the drop returns.
pub struct StateDir {
    inner: Arc<Inner>,
    committer: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Held (locked) while this value lives; released by closing it.
    _lock: File,
}

/// What the committer thread shares with [`StateDir`].
struct Inner {
    dir: PathBuf,
    /// Version of the newest change (bumped after a change is made).
    requested: AtomicU64,
    /// Wakes the committer.
    wake: (Mutex<()>, Condvar),
    /// The newest version on disk, or the error of the last failed commit.
    durable: watch::Sender<std::result::Result<u64, String>>,
    stop: AtomicBool,
    options: StateDirOptions,
    /// The log, used by the committer thread only.
    log: Mutex<Log>,
}

struct Log {
    file: File,
    /// Bytes of whole records in the log.
    len: u64,
    /// Bytes of the snapshot it follows.
    snapshot_len: u64,
    /// A commit failed after its changes were taken: the next commit writes a whole
    /// snapshot (which covers them) instead of a record.
    must_compact: bool,
}

fn io_error(what: &str, path: &Path, e: std::io::Error) -> Error {
    Error::unavailable(format!(
        "state dir: cannot {what} `{}`: {e}",
        path.display()
    ))
    .with_source(e)
}

impl StateDir {
    /// Opens `dir` (created if missing) for `controller`, which must be new: the state found
    /// there is restored into it (refused, naming the file, if it is damaged or newer than this
    /// build reads). Then a committer thread keeps the directory up to date.
    pub fn open(dir: impl Into<PathBuf>, controller: Arc<Controller>) -> Result<Arc<StateDir>> {
        Self::open_with(dir, controller, StateDirOptions::default())
    }

    /// [`StateDir::open`] with options.
    pub fn open_with(
        dir: impl Into<PathBuf>,
        controller: Arc<Controller>,
        options: StateDirOptions,
    ) -> Result<Arc<StateDir>> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir).map_err(|e| io_error("create", &dir, e))?;
        // Before anything is read: a directory another controller writes to is not ours.
        let lock = lock_dir(&dir)?;
        let log_path = dir.join(LOG_FILE);
        let (snapshot_len, log_len) = match recover(&dir, &controller)? {
            Some(found) => {
                // The files hold the recovered state already: nothing to write before serving
                // but a cut-short record to cut off, so that the next record follows whole ones.
                controller.forget_changes();
                found
            }
            None => {
                // A new directory: this controller's (empty) state and epoch from the start.
                let (_, snapshot) = controller.take_changes_and_snapshot()?;
                write_snapshot(&dir, &snapshot)?;
                (snapshot.len() as u64, 0)
            }
        };
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| io_error("open", &log_path, e))?;
        let on_disk = file
            .metadata()
            .map_err(|e| io_error("inspect", &log_path, e))?
            .len();
        if on_disk != log_len {
            file.set_len(log_len)
                .and_then(|()| file.sync_all())
                .map_err(|e| io_error("cut", &log_path, e))?;
        }
        sync_dir(&dir)?;
        let (durable, _) = watch::channel(Ok(0));
        let inner = Arc::new(Inner {
            dir,
            requested: AtomicU64::new(0),
            wake: (Mutex::new(()), Condvar::new()),
            durable,
            stop: AtomicBool::new(false),
            options,
            log: Mutex::new(Log {
                file,
                len: log_len,
                snapshot_len,
                must_compact: false,
            }),
        });
        let shared = inner.clone();
        let committer = std::thread::Builder::new()
            .name("tq-state-dir".into())
            .spawn(move || run(&shared, &controller))
            .map_err(|e| Error::internal(format!("cannot start the state-dir thread: {e}")))?;
        Ok(Arc::new(StateDir {
            inner,
            committer: Mutex::new(Some(committer)),
            _lock: lock,
        }))
    }

    /// After a change to the controller's state: returns once a record that includes it is
    /// on disk. An error means the change is in memory but may not survive a restart
    /// (`OutcomeUnknown`).
    pub async fn changed(&self) -> Result<()> {
        self.inner.changed().await
    }
}

impl Inner {
    /// After a change to the controller's state: returns once a record that includes it is
    /// on disk. An error means the change is in memory but may not survive a restart
    /// (`OutcomeUnknown`).
    pub async fn changed(&self) -> Result<()> {
        let version = self.requested.fetch_add(1, Ordering::SeqCst) + 1;
        let mut rx = self.durable.subscribe();
        self.wake.1.notify_one();
        loop {
            match &*rx.borrow_and_update() {
                Ok(v) if *v >= version => return Ok(()),
                Ok(_) => {}
                Err(e) => {
                    return Err(Error::unavailable(format!(
                        "the change was made but could not be made durable: {e}"
                    ))
                    .with_retry(tq_core::Retry::OutcomeUnknown))
                }
            }
            if rx.changed().await.is_err() {
                return Err(Error::closed("the state-dir committer stopped"));
            }
        }
    }

    /// One round of the committer: waits (up to 50 ms) for a change, then writes a record
    /// that covers every change made so far. Returns the version now on disk.
    fn round(&self, controller: &Controller, done: u64) -> u64 {
        {
            let guard = self.wake.0.lock().unwrap_or_else(|p| p.into_inner());
            if self.requested.load(Ordering::SeqCst) == done && !self.stop.load(Ordering::SeqCst) {
                // Woken by `changed` (or, at worst, by the timeout: a missed wake-up costs
                // latency, never durability).
                let _ = self
                    .wake
                    .1
                    .wait_timeout(guard, std::time::Duration::from_millis(50));
            }
        }
        let version = self.requested.load(Ordering::SeqCst);
        if version == done {
            return done;
        }
        // Every change that bumped to `version` or below was made before this record.
        match self.commit(controller) {
            Ok(()) => {
                let _previous = self.durable.send_replace(Ok(version));
                version
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot write the controller state");
                let _previous = self.durable.send_replace(Err(e.to_string()));
                std::thread::sleep(std::time::Duration::from_millis(200));
                done
            }
        }
    }

    fn commit(&self, controller: &Controller) -> Result<()> {
        let mut log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        let compact = log.must_compact
            || (log.len > self.options.compact_min_bytes && log.len > log.snapshot_len / 2);
        if !compact {
            let record = controller.take_changes()?;
            return self.append(&mut log, &record).inspect_err(|_| {
                log.must_compact = true;
            });
        }
        log.must_compact = true;
        let (record, snapshot) = controller.take_changes_and_snapshot()?;
        // The record first: until the new snapshot is in place, the old one and the log
        // (ending with this record) hold the state.
        self.append(&mut log, &record)?;
        write_snapshot(&self.dir, &snapshot)?;
        let path = self.dir.join(LOG_FILE);
        log.file
            .set_len(0)
            .and_then(|()| log.file.sync_all())
            .map_err(|e| io_error("empty", &path, e))?;
        tracing::debug!(
            log_bytes = log.len,
            snapshot_bytes = snapshot.len(),
            "state dir compacted"
        );
        log.len = 0;
        log.snapshot_len = snapshot.len() as u64;
        log.must_compact = false;
        Ok(())
    }

    /// Appends one record and syncs it. On a failed write the log is cut back to its whole
    /// records, so that a later record never follows a partial one.
    fn append(&self, log: &mut Log, record: &[u8]) -> Result<()> {
        let path = self.dir.join(LOG_FILE);
        if let Err(e) = log
            .file
            .write_all(record)
            .and_then(|()| log.file.sync_data())
        {
            if let Err(cut) = log.file.set_len(log.len) {
                tracing::error!(error = %cut, path = %path.display(), "cannot cut a partial record off the state-dir log");
            }
            return Err(io_error("append to", &path, e));
        }
        log.len += record.len() as u64;
        Ok(())
    }
}

/// Restores the snapshot in `dir` (if any) into `controller` and replays the log on it.
/// Returns the sizes of the snapshot and of the log's whole records, or `None` for a
/// directory with no state yet.
fn recover(dir: &Path, controller: &Controller) -> Result<Option<(u64, u64)>> {
    let path = dir.join(STATE_FILE);
    let log_path = dir.join(LOG_FILE);
    let snapshot = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if log_path.exists() {
                return Err(Error::corrupted(format!(
                    "state dir `{}`: `{LOG_FILE}` without `{STATE_FILE}`: the log has no \
                     snapshot to start from",
                    dir.display()
                )));
            }
            return Ok(None);
        }
        Err(e) => return Err(io_error("read", &path, e)),
    };
    let counts = controller
        .restore(&snapshot)
        .map_err(|e| e.context(format!("state dir `{}`", path.display())))?;
    let log = match std::fs::read(&log_path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(io_error("read", &log_path, e)),
    };
    let (records, dropped) = replay(&log, controller)
        .map_err(|e| e.context(format!("state dir `{}`", log_path.display())))?;
    if dropped > 0 {
        tracing::warn!(
            path = %log_path.display(),
            bytes = dropped,
            "dropped a change record cut short at the end of the log (written when the \
             controller stopped; never acknowledged)"
        );
    }
    tracing::info!(
        dir = %dir.display(),
        partitions = counts.partitions,
        samples = counts.samples,
        records,
        "controller state recovered"
    );
    Ok(Some((snapshot.len() as u64, (log.len() - dropped) as u64)))
}

/// Applies the records of `log` in order. Returns how many were applied and how many bytes
/// at the end were dropped (a record cut short by a crash).
fn replay(log: &[u8], controller: &Controller) -> Result<(u64, usize)> {
    let mut at = 0usize;
    let mut records = 0u64;
    while at < log.len() {
        let rest = &log[at..];
        let whole = frame_len(rest)
            .and_then(|n| usize::try_from(n).ok())
            .filter(|&n| n <= rest.len());
        let Some(n) = whole else {
            // A header or body that does not fit: only the last record can be cut short.
            return Ok((records, rest.len()));
        };
        let framed = &rest[..n];
        if let Err(e) = unframe(framed) {
            if at + n == log.len() {
                // A damaged last record: a write the crash left half on disk.
                return Ok((records, rest.len()));
            }
            return Err(e.context(format!(
                "record {} at byte {at} (more records follow, so it is not a write cut short \
                 by a crash)",
                records + 1
            )));
        }
        // A whole, checksummed record that does not apply is refused wherever it is.
        controller
            .apply_changes(framed)
            .map_err(|e| e.context(format!("record {} at byte {at}", records + 1)))?;
        records += 1;
        at += n;
    }
    Ok((records, 0))
}

/// Writes a whole snapshot through a synced temporary file and a rename.
fn write_snapshot(dir: &Path, snapshot: &[u8]) -> Result<()> {
    let path = dir.join(STATE_FILE);
    let tmp = dir.join("controller.state.tmp");
    let mut f = File::create(&tmp).map_err(|e| io_error("create", &tmp, e))?;
    f.write_all(snapshot)
        .map_err(|e| io_error("write", &tmp, e))?;
    f.sync_all().map_err(|e| io_error("sync", &tmp, e))?;
    drop(f);
    std::fs::rename(&tmp, &path).map_err(|e| io_error("rename into", &path, e))?;
    sync_dir(dir)
}

/// Makes renames and new files in `dir` durable.
fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_error("sync", dir, e))
}

/// The committer thread: runs rounds until the [`StateDir`] is dropped.
fn run(state: &Inner, controller: &Controller) {
    let mut done = 0;
    while !state.stop.load(Ordering::SeqCst) {
        done = state.round(controller, done);
    }
}

impl Drop for StateDir {
    fn drop(&mut self) {
        {
            // Under the wake mutex, so the committer either sees `stop` before it waits or is
            // waiting and gets the notification.
            let _guard = self.inner.wake.0.lock().unwrap_or_else(|p| p.into_inner());
            self.inner.stop.store(true, Ordering::SeqCst);
            self.inner.wake.1.notify_all();
        }
        let committer = self
            .committer
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(thread) = committer {
            // At most one round: the thread checks `stop` after each.
            if thread.join().is_err() {
                tracing::error!("the state-dir committer thread panicked");
            }
        }
    }
}

/// The lock file of a state directory.
const LOCK_FILE: &str = "controller.lock";

/// Takes the lock of `dir`, or refuses with the pid the lock file names. The lock is an
/// `flock` on `controller.lock` (released by the kernel when the holder exits, even by
/// `kill -9`); the pid written into it is for the message only.
fn lock_dir(dir: &Path) -> Result<File> {
    let path = dir.join(LOCK_FILE);
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| io_error("open", &path, e))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let holder = std::fs::read_to_string(&path).unwrap_or_default();
            let holder = holder.trim();
            let who = if holder.is_empty() {
                "another controller".to_string()
            } else {
                format!("another controller (pid {holder})")
            };
            return Err(Error::conflict(format!(
                "state dir `{}` is in use by {who}: two controllers on one state dir would \
                 overwrite each other's state; stop it first or give this one another --state-dir",
                dir.display()
            )));
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(io_error("lock", &path, e)),
    }
    let pid = std::process::id().to_string();
    file.set_len(0)
        .and_then(|()| file.write_all(pid.as_bytes()))
        .and_then(|()| file.sync_data())
        .map_err(|e| io_error("write", &path, e))?;
    Ok(file)
}
