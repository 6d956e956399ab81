//! `--state-dir`: the controller's state on disk, so a controller killed and started again on
//! the same directory carries on where it stopped.
//!
//! Every change is durable before it is acknowledged, with group commit: a request that changed
//! the state bumps a version and waits until a snapshot taken after its change is on disk; one
//! committer thread writes the whole state (the checkpoint snapshot: CRC-32, format version)
//! to `controller.state` through a synced temporary file and a rename, and each write covers
//! every request that finished before it began. On start, the snapshot found there is
//! restored — epoch included, so storage units and clients of that life carry on.
//!
//! The cost is one full snapshot per commit, so it grows with the state (see
//! docs/checkpoints.md): a log of changes would make a commit cost its changes only.

use crate::Controller;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use tokio::sync::watch;
use tq_core::{Error, Result};

const STATE_FILE: &str = "controller.state";

/// Writes the controller's state after changes; see the module documentation.
pub struct StateDir {
    dir: PathBuf,
    /// Version of the newest change (bumped after a change is made).
    requested: AtomicU64,
    /// Wakes the committer.
    wake: (Mutex<()>, Condvar),
    /// The newest version on disk, or the error of the last failed commit.
    durable: watch::Sender<std::result::Result<u64, String>>,
    stop: AtomicBool,
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
        let dir = dir.into();
        std::fs::create_dir_all(&dir).map_err(|e| io_error("create", &dir, e))?;
        let path = dir.join(STATE_FILE);
        match std::fs::read(&path) {
            Ok(bytes) => {
                let counts = controller
                    .restore(&bytes)
                    .map_err(|e| e.context(format!("state dir `{}`", path.display())))?;
                tracing::info!(
                    dir = %dir.display(),
                    partitions = counts.partitions,
                    samples = counts.samples,
                    "controller state recovered"
                );
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_error("read", &path, e)),
        }
        let (durable, _) = watch::channel(Ok(0));
        let state = Arc::new(StateDir {
            dir,
            requested: AtomicU64::new(0),
            wake: (Mutex::new(()), Condvar::new()),
            durable,
            stop: AtomicBool::new(false),
        });
        // The recovered (or empty) state is written once, so the directory holds this
        // controller's epoch from the start.
        state.commit(&controller)?;
        let committer = Arc::downgrade(&state);
        std::thread::Builder::new()
            .name("tq-state-dir".into())
            .spawn(move || run(&committer, &controller))
            .map_err(|e| Error::internal(format!("cannot start the state-dir thread: {e}")))?;
        Ok(state)
    }

    /// After a change to the controller's state: returns once a snapshot that includes it is
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

    /// One round of the committer: waits (up to 50 ms) for a change, then writes a snapshot
    /// that covers every change made so far. Returns the version now on disk.
    fn round(&self, controller: &Controller, done: u64) -> u64 {
        {
            let guard = self.wake.0.lock().unwrap_or_else(|p| p.into_inner());
            if self.requested.load(Ordering::SeqCst) == done {
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
        // Every change that bumped to `version` or below was made before this snapshot.
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
        use std::io::Write;
        let (bytes, _) = controller.snapshot()?;
        let path = self.dir.join(STATE_FILE);
        let tmp = self.dir.join("controller.state.tmp");
        let mut f = std::fs::File::create(&tmp).map_err(|e| io_error("create", &tmp, e))?;
        f.write_all(&bytes)
            .map_err(|e| io_error("write", &tmp, e))?;
        f.sync_all().map_err(|e| io_error("sync", &tmp, e))?;
        drop(f);
        std::fs::rename(&tmp, &path).map_err(|e| io_error("rename into", &path, e))?;
        // The rename itself is durable once the directory is synced.
        std::fs::File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| io_error("sync", &self.dir, e))
    }
}

/// The committer thread: runs rounds until the [`StateDir`] is dropped.
fn run(state: &std::sync::Weak<StateDir>, controller: &Controller) {
    let mut done = 0;
    while let Some(state) = state.upgrade() {
        if state.stop.load(Ordering::SeqCst) {
            return;
        }
        done = state.round(controller, done);
    }
}

impl Drop for StateDir {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.wake.1.notify_one();
    }
}
