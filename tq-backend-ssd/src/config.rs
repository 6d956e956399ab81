//! [`SsdConfig`]: the offload settings of one storage unit.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The default threshold: cells of at least 1 MiB go to disk.
pub const DEFAULT_THRESHOLD_BYTES: usize = 1 << 20;

/// Which I/O engine moves cells to and from disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineKind {
    /// io_uring when the kernel allows creating a ring, else psync (the default).
    #[default]
    Auto,
    /// io_uring on a dedicated thread (Linux only; an error where unavailable).
    Uring,
    /// pread/pwrite on tokio's blocking threads.
    Psync,
}

/// SSD offload settings of a storage unit (`ssd.*` in configuration files).
///
/// | key | default | meaning |
/// |---|---|---|
/// | `enabled` | `false` | master switch; when false the unit keeps everything in memory |
/// | `path` | none | directory on a local disk, required when enabled; created with its parents |
/// | `threshold_bytes` | 1 MiB | a cell whose payload is at least this large goes to disk |
/// | `engine` | `auto` | `auto`, `uring` or `psync` |
/// | `memory_fallback` | `false` | keep a value in memory when its write fails, instead of failing the put |
/// | `trim_after_clear` | `true` | ask the C allocator to return free memory to the OS after a clear (glibc `malloc_trim`) |
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SsdConfig {
    pub enabled: bool,
    pub path: Option<PathBuf>,
    pub threshold_bytes: usize,
    pub engine: EngineKind,
    pub memory_fallback: bool,
    pub trim_after_clear: bool,
}

impl Default for SsdConfig {
    fn default() -> Self {
        SsdConfig {
            enabled: false,
            path: None,
            threshold_bytes: DEFAULT_THRESHOLD_BYTES,
            engine: EngineKind::Auto,
            memory_fallback: false,
            trim_after_clear: true,
        }
    }
}

impl SsdConfig {
    /// Offload enabled under `path` with the other settings at their defaults.
    pub fn enabled_at(path: impl Into<PathBuf>) -> Self {
        SsdConfig {
            enabled: true,
            path: Some(path.into()),
            ..SsdConfig::default()
        }
    }

    /// The same settings with another threshold.
    pub fn with_threshold(mut self, threshold_bytes: usize) -> Self {
        self.threshold_bytes = threshold_bytes;
        self
    }

    /// The same settings with another engine.
    pub fn with_engine(mut self, engine: EngineKind) -> Self {
        self.engine = engine;
        self
    }
}
