//! tq storage units: the [`StorageUnit`] interface and the in-process [`MemoryUnit`].
//!
//! A storage unit holds cells (one field of one sample) keyed by field and sample index. The
//! in-memory backend (tq-backend-simple) routes samples to a list of units, in process or over
//! the network; the SSD backend (tq-backend-ssd) is a unit that wraps a [`MemoryUnit`] and keeps
//! large cells on disk. Both build on this crate, and neither depends on the other.
//!
//! - [`StorageUnit`] is the one interface a manager uses to talk to a unit. Requests and
//!   replies ([`UnitPut`], [`UnitUpdate`], [`UnitUpdateReply`], [`UnitStats`]) are plain data, so
//!   an in-process unit and a remote stub are interchangeable.
//! - [`MemoryUnit`] is the in-process unit.
//! - [`GatedUnit`] wraps a unit where it is owned, so that a checkpoint can hold its writes for
//!   a moment and capture its cells (see [`tq_core::cells`]).
//!
//! # Safety rules a unit enforces
//!
//! Cells are keyed by field and sample index and carry the generation of their sample.
//! - A put with a generation older than the stored one is `Conflict`; a newer generation first
//!   purges every cell of the older one, so a reused index never shows the previous sample's data.
//! - A get or update needs every cell stored with exactly the requested generation, else
//!   `NotFound` — never empty data, never partial results.
//! - A clear removes only cells whose generation is at most the requested one, so a stale clear
//!   never deletes the sample that took the index over. Clears are idempotent.
//! - Every request is validated completely (row counts, duplicate indexes, generations,
//!   capacity, merge results) before anything changes: one request is all-or-nothing per unit.
//!
//! # Memory policy for shared allocations
//!
//! A dense column arrives as one allocation. Storing its rows as `Bytes` slices of that
//! allocation makes put zero-copy, but any one surviving row keeps the whole allocation alive:
//! after a partial clear the memory does not come back (upstream measured 11.9 GiB retained
//! against 4.0–4.8 GiB once large buffers were returned eagerly). Copying every row on ingest
//! would fix reclamation at the price of a full copy on the hot path.
//!
//! A [`MemoryUnit`] does both, each where it is cheap. It tracks every (request, field) allocation
//! it stores slices of as a *block*: the bytes the block pins and the bytes still referenced by
//! live cells. When a clear, an overwrite, a generation purge or an update makes the live
//! fraction of a block drop below the compaction threshold (default
//! [`DEFAULT_COMPACTION_THRESHOLD`] = 0.5) while it is not zero, the unit copies the surviving
//! rows into buffers of their own (outside its lock) and forgets the block, so the allocation is
//! freed. A block whose rows all went away is simply dropped.
//!
//! Consequences:
//! - Ingest never copies; each byte is copied at most once by compaction, and only when more
//!   than `1 - threshold` of its block is already gone. Clearing whole batches (the common case)
//!   never copies.
//! - An uncompacted block is at least `threshold` live, so a unit retains at most
//!   `1 / threshold` times the live bytes of each block (2x with the default).
//! - The accounting is per unit. In process, the manager hands every unit zero-copy slices of
//!   the same batch allocation (runs of rows by `tq_core::routing`), so that allocation is freed
//!   only once every unit holding part of it has compacted or dropped its part; across `N`
//!   in-process units the bound is therefore `N / threshold` for that allocation. A remote unit
//!   receives its own frame, so its bound is exact.
//! - Results of an update that are slices of the update's request buffer (e.g. `Replace` of a
//!   dense column) are tracked the same way.
//!
//! [`UnitStats`] reports the live bytes, the bytes retained by shared blocks and the compaction
//! counters, so that tests and benchmarks can see memory come back.
//!
//! A clear answers once its cells are out of the unit's maps; their buffers are freed behind
//! it by one thread per process, bounded ([`reclaim`]).

mod api;
mod block;
mod gate;
mod index;
mod layer;
mod memory;
mod metered;
#[cfg(feature = "net")]
pub mod net;
mod ops;

pub use api::{
    check_threshold, CellShape, Fetched, StorageUnit, UnitConfig, UnitPut, UnitRows, UnitStats,
    UnitUpdate, UnitUpdateReply, DEFAULT_COMPACTION_THRESHOLD,
};
pub use gate::{CheckpointGate, GatedUnit};
pub use index::{IndexHasher, IndexMap, IndexSet};
pub use layer::{CheckpointSteps, Layered, UnitCall, UnitLayer};
pub use memory::{reclaim, MemoryUnit};
pub use metered::{MeteredUnit, RequestMetering};
#[cfg(feature = "net")]
pub use net::{RemoteUnit, UnitFactory, UnitServer};
pub use ops::{UnitOp, UnitOpSpec};
pub use tq_core::Resend;
