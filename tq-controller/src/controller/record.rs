//! The controller-wide state as snapshots hold it (inside the snapshot body, formats 1-5).
//!
//! The layout is the format: postcard writes fields in declaration order without names, so
//! [`StateRecord`]'s field order and types are what a user's checkpoint decodes by (never
//! reorder, retype or remove one; a change is a new snapshot format, and the files in
//! `tests/data/` must keep loading). [`State`] itself holds locks and atomics and may be laid
//! out as its logic needs; it converts to and from this record. The parts have records of
//! their own: a partition's is `partition/record.rs`, the allocator's `allocator.rs`; a
//! client's remembered answers (`answers.rs`) are plain data already, saved field by field.

use super::*;

/// Public sample → the (partition, sample, field) cells that link to it.
type LinkedBy = HashMap<SampleId, HashSet<(String, SampleId, FieldName)>>;

/// The state as saved; the borrowed form writes the same bytes without copying the state.
#[derive(Serialize, Deserialize)]
struct StateRecord<P = Partitions, O = Vec<String>, A = IndexAllocator, L = LinkedBy> {
    partitions: P,
    order: O,
    alloc: A,
    next_lease: u64,
    linked_by: L,
}

impl Serialize for State {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        let alloc = self.alloc();
        StateRecord {
            partitions: &self.partitions,
            order: &self.order,
            alloc: &*alloc,
            next_lease: self.next_lease.load(std::sync::atomic::Ordering::SeqCst),
            linked_by: &self.linked_by,
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for State {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let r = StateRecord::<Partitions, Vec<String>, IndexAllocator, LinkedBy>::deserialize(d)?;
        Ok(State {
            partitions: r.partitions,
            order: r.order,
            alloc: Mutex::new(r.alloc),
            next_lease: AtomicU64::new(r.next_lease),
            linked_by: r.linked_by,
            answers: Mutex::default(),
        })
    }
}
