//! The persisted form of a partition: what snapshots (formats 1–4, inside checkpoints) and
//! state-dir records hold of it.
//!
//! The layout is the format. postcard writes fields in declaration order without names, so
//! the order and the types of [`PartitionRecord`]'s fields are what a user's checkpoint
//! decodes by: never reorder, retype or remove one; a change is a new snapshot format with a
//! decoder for the old one, and the files in `tests/data/` must keep loading. [`Partition`]
//! itself may be laid out as its logic needs: it converts to and from this record
//! ([`Partition::record`], [`Partition::from_record`]), and what it derives (the allocation
//! order) is rebuilt after loading.

use super::components::fields::{FieldState, FieldTable};
use super::components::keys::KeyTable;
use super::components::links::LinkTable;
use super::components::slots::{SlotParts, SlotTable};
use super::components::tasks::TaskTable;
use super::*;
use crate::bitmap::Bitmap;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// A partition as saved. The borrowed form ([`PartitionRecordRef`]) writes the same bytes
/// without copying the partition.
#[derive(Deserialize)]
pub(super) struct PartitionRecord {
    name: String,
    ids: Vec<SampleId>,
    seq: Vec<u64>,
    next_seq: u64,
    live: Bitmap,
    clearing: Bitmap,
    slot_of: HashMap<u32, u32>,
    free_slots: Vec<u32>,
    unit_counts: Vec<u32>,
    fields: Vec<FieldState>,
    field_ids: HashMap<FieldName, usize>,
    tasks: TaskTable,
    complete: bool,
    tags: Vec<Tags>,
    backend_meta: Vec<BackendMeta>,
    keys: HashMap<String, u32>,
    slot_key: Vec<Option<String>>,
    clearing_cells: HashSet<(u32, usize)>,
    links: HashMap<u32, BTreeMap<usize, SampleId>>,
    ever_linked: Bitmap,
}

/// [`PartitionRecord`] borrowing a live partition's components, in the same order and types.
#[derive(Serialize)]
pub(super) struct PartitionRecordRef<'a> {
    name: &'a String,
    ids: &'a Vec<SampleId>,
    seq: &'a Vec<u64>,
    next_seq: u64,
    live: &'a Bitmap,
    clearing: &'a Bitmap,
    slot_of: &'a HashMap<u32, u32>,
    free_slots: &'a Vec<u32>,
    unit_counts: &'a Vec<u32>,
    fields: &'a Vec<FieldState>,
    field_ids: &'a HashMap<FieldName, usize>,
    tasks: &'a TaskTable,
    complete: bool,
    tags: &'a Vec<Tags>,
    backend_meta: &'a Vec<BackendMeta>,
    keys: &'a HashMap<String, u32>,
    slot_key: &'a Vec<Option<String>>,
    clearing_cells: &'a HashSet<(u32, usize)>,
    links: &'a HashMap<u32, BTreeMap<usize, SampleId>>,
    ever_linked: &'a Bitmap,
}

impl Partition {
    /// This partition as saved.
    pub(super) fn record(&self) -> PartitionRecordRef<'_> {
        let slots = self.slots.parts();
        let (fields, field_ids, clearing_cells) = self.fields.parts();
        let (keys, slot_key) = self.keys.parts();
        let (links, ever_linked) = self.links.parts();
        PartitionRecordRef {
            name: &self.name,
            ids: slots.ids,
            seq: slots.seq,
            next_seq: slots.next_seq,
            live: slots.live,
            clearing: slots.clearing,
            slot_of: slots.slot_of,
            free_slots: slots.free_slots,
            unit_counts: slots.unit_counts,
            fields,
            field_ids,
            tasks: &self.tasks,
            complete: self.complete,
            tags: slots.tags,
            backend_meta: slots.backend_meta,
            keys,
            slot_key,
            clearing_cells,
            links,
            ever_linked,
        }
    }

    /// The partition a record saved; the allocation order is built again on the first fetch.
    pub(super) fn from_record(r: PartitionRecord) -> Partition {
        Partition {
            name: r.name,
            complete: r.complete,
            slots: SlotTable::from_parts(SlotParts {
                ids: r.ids,
                seq: r.seq,
                next_seq: r.next_seq,
                live: r.live,
                clearing: r.clearing,
                slot_of: r.slot_of,
                free_slots: r.free_slots,
                unit_counts: r.unit_counts,
                tags: r.tags,
                backend_meta: r.backend_meta,
            }),
            fields: FieldTable::from_parts(r.fields, r.field_ids, r.clearing_cells),
            tasks: r.tasks,
            keys: KeyTable::from_parts(r.keys, r.slot_key),
            links: LinkTable::from_parts(r.links, r.ever_linked),
            order: AllocationOrder::default(),
        }
    }

    /// Checks what a decoded record must hold for the partition's logic to work on it, so
    /// that a snapshot or state-dir record that decodes (its checksum matched) but describes
    /// an impossible partition is refused by name instead of failing later: each component's
    /// invariants (one row count per storage unit, per-slot tables of the same length, a
    /// field index that matches the fields, keys and free slots within the table).
    pub(crate) fn check_restored(&self, units: u32) -> Result<()> {
        let problem = self
            .slots
            .check(units)
            .or_else(|| self.keys.check(self.slots.capacity()))
            .or_else(|| self.fields.check());
        match problem {
            None => Ok(()),
            Some(why) => Err(Error::corrupted(format!(
                "controller state: partition `{}`: {why}",
                self.name
            ))),
        }
    }
}

impl Serialize for Partition {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        self.record().serialize(s)
    }
}

impl<'de> Deserialize<'de> for Partition {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        PartitionRecord::deserialize(d).map(Partition::from_record)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::allocator::IndexAllocator;

    fn two_samples() -> Partition {
        let mut p = Partition::new("p".into(), 2);
        let mut alloc = IndexAllocator::new(2);
        p.allocate(&mut alloc, 2);
        p
    }

    #[test]
    fn a_record_round_trips_and_an_impossible_one_is_refused_by_name() {
        let p = two_samples();
        p.check_restored(2).unwrap();
        let bytes = postcard::to_allocvec(&p).unwrap();
        let back: Partition = postcard::from_bytes(&bytes).unwrap();
        back.check_restored(2).unwrap();
        // (Map order in the bytes follows each map's hasher: compare the parts instead.)
        let (a, b) = (p.slots.parts(), back.slots.parts());
        assert_eq!(
            (a.ids, a.seq, a.unit_counts, a.slot_of, a.free_slots),
            (b.ids, b.seq, b.unit_counts, b.slot_of, b.free_slots)
        );

        let e = p.check_restored(3).unwrap_err();
        assert_eq!(e.kind(), &tq_core::ErrorKind::Corrupted);
        assert!(e.message().contains("partition `p`"), "{e}");

        let record = |p: &Partition| -> PartitionRecord {
            postcard::from_bytes(&postcard::to_allocvec(p).unwrap()).unwrap()
        };
        let mut short = record(&two_samples());
        short.slot_key.pop();
        let e = Partition::from_record(short).check_restored(2).unwrap_err();
        assert!(e.message().contains("1 key slots for 2 slots"), "{e}");
        let mut stray = record(&two_samples());
        stray.free_slots.push(7);
        assert!(Partition::from_record(stray).check_restored(2).is_err());
        let mut renamed = record(&two_samples());
        renamed.field_ids.insert("ghost".into(), 0);
        assert!(Partition::from_record(renamed).check_restored(2).is_err());
    }
}
