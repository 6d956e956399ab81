//! tq SimpleStorage: the [`tq_core::StorageManager`] that routes samples to storage units.
//!
//! [`SimpleStorage`] implements the manager over an ordered list of units
//! ([`tq_unit::StorageUnit`]): sample index `i` lives on unit `i % N`, so the order of the units
//! is the routing table. Units are in-process [`tq_unit::MemoryUnit`]s, SSD units, or (feature
//! `net`) remote units reached through [`RemoteUnit`] and served by [`UnitServer`]. The units'
//! safety rules and memory policy are described in the tq-unit crate.

mod checkpoint;
mod manager;

pub use manager::{SimpleConfig, SimpleStorage, PLACE_MIN_ROW_BYTES};
#[cfg(feature = "net")]
pub use tq_unit::net::{RemoteUnit, UnitFactory, UnitServer};
/// The unit layer, re-exported so that users of this backend name one crate.
pub use tq_unit::{
    CellShape, Fetched, GatedUnit, MemoryUnit, StorageUnit, UnitConfig, UnitPut, UnitRows,
    UnitStats, UnitUpdate, UnitUpdateReply, DEFAULT_COMPACTION_THRESHOLD,
};
