//! tq-checkpoint: the two file formats of tq, written and read through a client.
//!
//! - **Checkpoints** ([`Checkpoints`] on a [`tq_client::Client`]): the controller's whole
//!   state and a copy of every storage unit's cells (and, if asked, of the KV payloads), in a
//!   directory or under a prefix of an object store, described by a manifest written last;
//!   a deployment like the one that saved it loads it back (`checkpoint.rs`).
//! - **Dumps** ([`Dumps`] on a [`tq_client::Partition`]): one partition's keys, their tags,
//!   cells and links, loadable into any partition of any deployment (`dump.rs`).
//!
//! Both are extension traits, so the client crate carries no file format: `use
//! tq::checkpoint::{Checkpoints, Dumps}` (or their `Blocking` forms) and call
//! `client.save_checkpoint(dir)` / `partition.kv_dump(url, None, &options)`. Each format has a
//! version ([`CHECKPOINT_FORMAT`], [`DUMP_FORMAT`]); files of every version that exists are
//! committed under `tests/data/` and must keep loading.

mod blocking;
mod checkpoint;
mod dump;
mod place;

pub use blocking::{BlockingCheckpoints, BlockingDumps};
pub use checkpoint::{
    CheckpointFile, CheckpointManifest, CheckpointOptions, Checkpoints, UnitCells,
    CHECKPOINT_FORMAT,
};
pub use dump::{DumpManifest, DumpOptions, Dumps, DUMP_FORMAT};

/// A client or partition handle seen by this crate's own steps: inherent methods cannot be
/// added to another crate's type, so the steps behind the traits' methods are written on this
/// wrapper, which reads as the handle it wraps.
pub(crate) struct On<'a, T>(pub(crate) &'a T);

impl<T> std::ops::Deref for On<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.0
    }
}
