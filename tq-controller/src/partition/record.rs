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

use super::*;

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
    tasks: HashMap<String, TaskState>,
    complete: bool,
    tags: Vec<Tags>,
    backend_meta: Vec<BackendMeta>,
    keys: HashMap<String, u32>,
    slot_key: Vec<Option<String>>,
    clearing_cells: HashSet<(u32, usize)>,
    links: HashMap<u32, BTreeMap<usize, SampleId>>,
    ever_linked: Bitmap,
}

/// [`PartitionRecord`] borrowing a live partition's fields, in the same order and types.
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
    tasks: &'a HashMap<String, TaskState>,
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
        PartitionRecordRef {
            name: &self.name,
            ids: &self.ids,
            seq: &self.seq,
            next_seq: self.next_seq,
            live: &self.live,
            clearing: &self.clearing,
            slot_of: &self.slot_of,
            free_slots: &self.free_slots,
            unit_counts: &self.unit_counts,
            fields: &self.fields,
            field_ids: &self.field_ids,
            tasks: &self.tasks,
            complete: self.complete,
            tags: &self.tags,
            backend_meta: &self.backend_meta,
            keys: &self.keys,
            slot_key: &self.slot_key,
            clearing_cells: &self.clearing_cells,
            links: &self.links,
            ever_linked: &self.ever_linked,
        }
    }

    /// The partition a record saved; the allocation order is built again on the first fetch.
    pub(super) fn from_record(r: PartitionRecord) -> Partition {
        Partition {
            name: r.name,
            ids: r.ids,
            seq: r.seq,
            next_seq: r.next_seq,
            live: r.live,
            clearing: r.clearing,
            slot_of: r.slot_of,
            free_slots: r.free_slots,
            unit_counts: r.unit_counts,
            fields: r.fields,
            field_ids: r.field_ids,
            tasks: r.tasks,
            complete: r.complete,
            tags: r.tags,
            backend_meta: r.backend_meta,
            keys: r.keys,
            slot_key: r.slot_key,
            clearing_cells: r.clearing_cells,
            links: r.links,
            ever_linked: r.ever_linked,
            order: AllocationOrder::default(),
        }
    }
}

impl Partition {
    /// Checks what a decoded record must hold for the partition's logic to work on it, so
    /// that a snapshot or state-dir record that decodes (its checksum matched) but describes
    /// an impossible partition is refused by name instead of failing later: one row count per
    /// storage unit, per-slot tables of the same length, every slot's field and task
    /// bitmaps within it.
    pub(crate) fn check_restored(&self, units: u32) -> Result<()> {
        let bad = |why: String| {
            Err(Error::corrupted(format!(
                "controller state: partition `{}`: {why}",
                self.name
            )))
        };
        if self.unit_counts.len() != units as usize {
            return bad(format!(
                "{} row counts for {units} storage units",
                self.unit_counts.len()
            ));
        }
        let slots = self.ids.len();
        for (what, len) in [
            ("allocation numbers", self.seq.len()),
            ("tag sets", self.tags.len()),
            ("backend metas", self.backend_meta.len()),
            ("key slots", self.slot_key.len()),
        ] {
            if len != slots {
                return bad(format!("{len} {what} for {slots} slots"));
            }
        }
        if self.field_ids.len() != self.fields.len()
            || self.field_ids.values().any(|&f| f >= self.fields.len())
        {
            return bad("its field index does not match its fields".into());
        }
        if self.slot_of.values().any(|&s| s as usize >= slots)
            || self.free_slots.iter().any(|&s| s as usize >= slots)
            || self.keys.values().any(|&s| s as usize >= slots)
        {
            return bad("a sample, free slot or key names a slot it does not have".into());
        }
        Ok(())
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
        // (Map order in the bytes follows each map's hasher: compare the fields instead.)
        assert_eq!(
            (
                &back.ids,
                &back.seq,
                &back.unit_counts,
                &back.slot_of,
                &back.free_slots
            ),
            (&p.ids, &p.seq, &p.unit_counts, &p.slot_of, &p.free_slots)
        );

        let e = p.check_restored(3).unwrap_err();
        assert_eq!(e.kind(), &tq_core::ErrorKind::Corrupted);
        assert!(e.message().contains("partition `p`"), "{e}");
        let mut short = two_samples();
        short.slot_key.pop();
        let e = short.check_restored(2).unwrap_err();
        assert!(e.message().contains("1 key slots for 2 slots"), "{e}");
        let mut stray = two_samples();
        stray.free_slots.push(7);
        assert!(stray.check_restored(2).is_err());
    }
}
