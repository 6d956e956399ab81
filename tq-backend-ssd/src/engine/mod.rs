//! I/O engines: how a request's cell files are written and read.
//!
//! An engine gets the whole batch of a request at once and completes its operations
//! concurrently; results come back one per operation, in order. Engines only move bytes: they
//! do not know about units, fields or generations, and they never delete files (the unit does).

mod buf;
mod metered;
mod psync;
#[cfg(target_os = "linux")]
mod uring;

pub use buf::ReadBuf;
pub use metered::MeteredEngine;
pub use psync::PsyncEngine;
#[cfg(target_os = "linux")]
pub use uring::UringEngine;

use crate::config::EngineKind;
use async_trait::async_trait;
use bytes::Bytes;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;

/// Create `path` (it must not exist) and write `data` into it.
#[derive(Debug, Clone)]
pub struct WriteOp {
    pub path: PathBuf,
    pub data: Bytes,
}

/// Read the first `len` bytes of `path`; a shorter file is an `UnexpectedEof` error.
#[derive(Debug, Clone)]
pub struct ReadOp {
    pub path: PathBuf,
    pub len: usize,
}

/// Moves cell files between memory and disk.
///
/// A failed write may leave its file behind (created, partially written): the caller removes
/// it. Writes are not synced: offload files are scratch data of one run.
#[async_trait]
pub trait IoEngine: Send + Sync + std::fmt::Debug + 'static {
    /// `"uring"` or `"psync"` (or a custom engine's name), for logs and stats.
    fn name(&self) -> &'static str;

    /// Performs every write; one result per op, in order.
    async fn write_files(&self, ops: Vec<WriteOp>) -> Vec<io::Result<()>>;

    /// Performs every read; one result per op, in order.
    async fn read_files(&self, ops: Vec<ReadOp>) -> Vec<io::Result<Bytes>>;
}

/// True when this kernel lets the process create an io_uring (checked by creating one).
pub fn uring_available() -> bool {
    #[cfg(target_os = "linux")]
    {
        uring::probe().is_ok()
    }
    #[cfg(not(target_os = "linux"))]
    {
        false
    }
}

/// Builds the engine `kind` asks for, recording its metrics ([`MeteredEngine`]). `Auto` falls
/// back to psync (logged) when io_uring is not available; `Uring` is an error then.
pub fn build_engine(kind: EngineKind) -> io::Result<Arc<dyn IoEngine>> {
    build_bare_engine(kind).map(MeteredEngine::wrap)
}

fn build_bare_engine(kind: EngineKind) -> io::Result<Arc<dyn IoEngine>> {
    match kind {
        EngineKind::Psync => Ok(Arc::new(PsyncEngine::new())),
        EngineKind::Uring => build_uring(),
        EngineKind::Auto => match build_uring() {
            Ok(e) => Ok(e),
            Err(err) => {
                tracing::info!(error = %err, "io_uring is not available; using the psync engine");
                Ok(Arc::new(PsyncEngine::new()))
            }
        },
    }
}

fn build_uring() -> io::Result<Arc<dyn IoEngine>> {
    #[cfg(target_os = "linux")]
    {
        Ok(Arc::new(UringEngine::new()?))
    }
    #[cfg(not(target_os = "linux"))]
    {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "io_uring exists only on Linux",
        ))
    }
}
