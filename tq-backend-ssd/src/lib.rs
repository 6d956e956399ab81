//! tq hybrid memory/SSD storage unit.
//!
//! [`SsdUnit`] implements [`tq_unit::StorageUnit`], so
//! the in-memory backend's `SimpleStorage`, `UnitServer` and the whole client stack use it
//! unchanged. Cells whose payload is at least [`SsdConfig::threshold_bytes`] (default 1 MiB) are
//! kept in files on a local disk, one file per cell; smaller cells stay in memory.
//!
//! # Design
//!
//! - **Reuse of the memory unit.** An `SsdUnit` wraps a [`tq_unit::MemoryUnit`] that
//!   holds every cell; a disk cell is an empty placeholder there and an entry (file, length,
//!   dtype and shape) in the unit's disk index. Generations, capacity, validation, `NotFound`
//!   messages and the compaction of shared allocations are therefore exactly the memory unit's.
//!   Inner unit and disk index change together under one write lock.
//! - **All-or-nothing put.** A put first writes every disk cell of the request to a new file
//!   (names are unique per write, so the old files are untouched), without any lock. If a write
//!   fails, the files this request created are deleted and the error (naming the unit, field,
//!   sample and path) is returned: nothing changed. Then, under the write lock, the inner unit
//!   validates and stores the request (placeholders for the disk cells); if it refuses
//!   (`Conflict`, `CapacityExceeded`), this request's files are deleted. Only after that are
//!   the references switched and the superseded files deleted. **Headroom:** while a put is in
//!   flight, the old files of the cells it replaces and all of its new files exist at the same
//!   time, so the disk needs free space for the request's disk bytes on top of what is stored.
//! - **Engines.** [`IoEngine`] moves a request's files as one batch: [`UringEngine`] (io_uring
//!   on a dedicated thread, up to 32 operations in flight) and [`PsyncEngine`] (pread/pwrite on
//!   tokio's blocking threads, 4 at a time). [`EngineKind::Auto`] probes by creating a ring.
//! - **Cleanup.** Clearing a cell deletes its file at once (a read in progress keeps it until it
//!   finishes). Dropping a unit or [`SsdUnit::shutdown`] deletes its directory; the run
//!   directory goes with the last unit of the process, the user's directory stays. Runs that
//!   died leave their directory; the next run under the same path removes it (see
//!   [Layout](crate#layout)) and logs a warning.
//! - **Memory.** Read buffers of large cells are anonymous mappings, unmapped when dropped,
//!   so they never stay in the C allocator's heap; after a clear the unit calls glibc's
//!   `malloc_trim` (configurable). Offloaded writes keep no reference to the caller's buffer.
//!
//! # Layout
//!
//! ```text
//! <path>/tq-ssd/run-<pid>-<nanos>.lock      flock'ed while the run lives
//! <path>/tq-ssd/run-<pid>-<nanos>/<unit>/<index>-g<generation>-<n>.cell
//! ```

mod config;
pub mod engine;
mod run;
mod unit;

pub use config::{EngineKind, SsdConfig, DEFAULT_THRESHOLD_BYTES};
#[cfg(target_os = "linux")]
pub use engine::UringEngine;
pub use engine::{build_engine, uring_available, IoEngine, PsyncEngine, ReadOp, WriteOp};
pub use run::ROOT_DIR;
pub use unit::{trim_heap, SsdUnit, FALLBACK_VALUES_TOTAL};

/// The process's resident set size in bytes (kept here for callers of this crate; the one
/// implementation is `tq_core::telemetry::process_rss_bytes`).
pub use tq_core::telemetry::process_rss_bytes;
