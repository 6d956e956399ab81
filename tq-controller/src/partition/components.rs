//! The parts a partition is made of, each owning its state and keeping its invariants (each
//! module says which). The partition's own files (`partition.rs` and its method files) hold
//! the steps that coordinate them: an allocation touches the slot table, the key table and the
//! allocation order; a release touches all of them.

pub(super) mod fields;
pub(super) mod keys;
pub(super) mod leases;
pub(super) mod links;
pub(super) mod slots;
pub(super) mod tasks;
