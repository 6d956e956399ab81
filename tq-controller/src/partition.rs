//! The state of one partition: a dense slot table with bitmaps for production, consumption and
//! row states, per-field schemas, tags, backend metadata and keys.
//!
//! Everything here is synchronous and runs inside the controller's critical section; costs grow
//! with the batch a call touches: a fetch takes its candidates from the front of the allocation
//! order (`order.rs`) and expires leases from the front of their deadline order (`leases.rs`);
//! counts are word-wise bitmap scans (64 slots a word).

use crate::allocator::IndexAllocator;
use crate::api::{ConsumptionStatus, ProductionNotice, ProductionStatus};
use crate::bitmap::{BitIter, Bitmap};
use crate::sampler::Candidate;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Instant;
mod clear;
mod consumption;
mod keys;
mod leases;
mod links;
mod order;
mod record;
mod status;
mod stored;
mod writes;

pub(crate) use leases::LeaseTable;
use order::AllocationOrder;
use tq_core::{
    BackendMeta, BatchMeta, DType, Error, FieldMeta, FieldName, LeaseId, Result, SampleId, Tags,
};

/// Per-sample shapes of a tensor field.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
enum Shapes {
    /// No member yet (or an object field).
    Unknown,
    /// Every member has this shape.
    Uniform(Vec<usize>),
    /// Members differ (ragged).
    PerSlot(RaggedShapes),
}

/// Shapes of a ragged field: one per member slot, plus how many members have each shape, so
/// that deciding whether the field is dense again costs O(1) instead of a scan of the members.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
struct RaggedShapes {
    by_slot: HashMap<u32, Vec<usize>>,
    counts: HashMap<Vec<usize>, usize>,
}

impl RaggedShapes {
    fn insert(&mut self, slot: u32, shape: Vec<usize>) {
        self.remove(slot);
        *self.counts.entry(shape.clone()).or_default() += 1;
        self.by_slot.insert(slot, shape);
    }

    fn remove(&mut self, slot: u32) {
        if let Some(old) = self.by_slot.remove(&slot) {
            if let Some(c) = self.counts.get_mut(&old) {
                *c -= 1;
                if *c == 0 {
                    self.counts.remove(&old);
                }
            }
        }
    }

    /// The one shape every member has, if there is exactly one.
    fn single_shape(&self) -> Option<&Vec<usize>> {
        match self.counts.len() {
            1 => self.counts.keys().next(),
            _ => None,
        }
    }
}

/// The schema and membership of one field in one partition. Fields keep their column number for
/// the partition's lifetime; a field with no members forgets its dtype and shapes.
#[derive(Debug, Serialize, Deserialize)]
struct FieldState {
    name: FieldName,
    produced: Bitmap,
    members: usize,
    dtype: Option<DType>,
    is_object: bool,
    shapes: Shapes,
}

impl FieldState {
    fn new(name: FieldName) -> Self {
        FieldState {
            name,
            produced: Bitmap::default(),
            members: 0,
            dtype: None,
            is_object: false,
            shapes: Shapes::Unknown,
        }
    }

    fn check(&self, incoming: &FieldMeta) -> Result<()> {
        if self.members == 0 {
            return Ok(());
        }
        let current = if self.is_object {
            FieldMeta::object()
        } else {
            FieldMeta::dense(self.dtype.unwrap_or(DType::U8), vec![])
        };
        current.check_compatible(&self.name, incoming)
    }

    fn add(&mut self, slots: &[u32], schema: &FieldMeta) {
        if self.members == 0 {
            self.dtype = schema.dtype();
            self.is_object = !schema.is_tensor();
            self.shapes = Shapes::Unknown;
        }
        for (row, &slot) in slots.iter().enumerate() {
            if !self.is_object {
                let shape = schema.row_shape(row).unwrap_or(&[]);
                match &mut self.shapes {
                    Shapes::Unknown => self.shapes = Shapes::Uniform(shape.to_vec()),
                    Shapes::Uniform(u) if u.as_slice() == shape => {}
                    Shapes::Uniform(u) => {
                        // Promotion to ragged: every existing member keeps the old shape.
                        let old = std::mem::take(u);
                        let mut ragged = RaggedShapes::default();
                        for s in self.produced.ones() {
                            ragged.insert(s as u32, old.clone());
                        }
                        ragged.insert(slot, shape.to_vec());
                        self.shapes = Shapes::PerSlot(ragged);
                    }
                    Shapes::PerSlot(ragged) => ragged.insert(slot, shape.to_vec()),
                }
            }
            if !self.produced.get(slot as usize) {
                self.produced.set(slot as usize, true);
                self.members += 1;
            }
        }
        // Overwrites may have given every member the same shape again.
        self.normalize();
    }

    /// Removes one cell; returns whether it was present. Call `normalize` after a batch.
    fn remove(&mut self, slot: u32) -> bool {
        if !self.produced.get(slot as usize) {
            return false;
        }
        self.produced.set(slot as usize, false);
        self.members -= 1;
        if let Shapes::PerSlot(ragged) = &mut self.shapes {
            ragged.remove(slot);
        }
        true
    }

    /// Forgets the schema of an empty field; demotes a ragged field whose members agree. O(1).
    fn normalize(&mut self) {
        if self.members == 0 {
            self.dtype = None;
            self.is_object = false;
            self.shapes = Shapes::Unknown;
            self.produced.clear_all();
            return;
        }
        if let Shapes::PerSlot(ragged) = &self.shapes {
            if let Some(shape) = ragged.single_shape() {
                self.shapes = Shapes::Uniform(shape.clone());
            }
        }
    }

    /// The schema of this field over `slots` (rows without the cell get an empty shape).
    fn schema(&self, slots: &[u32]) -> FieldMeta {
        if self.is_object {
            return FieldMeta::object();
        }
        let dtype = self.dtype.unwrap_or(DType::U8);
        match &self.shapes {
            Shapes::Unknown => FieldMeta::dense(dtype, vec![]),
            Shapes::Uniform(s) => FieldMeta::dense(dtype, s.clone()),
            Shapes::PerSlot(ragged) => FieldMeta::from_shapes(
                dtype,
                slots
                    .iter()
                    .map(|s| ragged.by_slot.get(s).cloned().unwrap_or_default())
                    .collect(),
            ),
        }
    }
}

/// What one task has taken from a partition.
///
/// Saved as consumed, leased, then one list of `(slot, lease, ms)`: the outstanding leases
/// with the time each had left, and (format 3 on) the acknowledged ones with `ms` =
/// [`crate::checkpoint::deadlines::ACKNOWLEDGED`].
#[derive(Debug, Default)]
struct TaskState {
    /// Consumed for good (at-most-once fetches, or acknowledged leases).
    consumed: Bitmap,
    /// Handed out under a lease that has not been acknowledged or expired yet.
    leased: Bitmap,
    /// Deadlines are saved as the time left, and restored from the time of loading.
    leases: LeaseTable,
    /// The lease that acknowledged each consumed slot, so that a retried acknowledgement
    /// (its first answer lost, say to a controller restart) answers as acknowledged again
    /// instead of 0. Kept until the slot is released or its consumption undone.
    acked_by: HashMap<u32, LeaseId>,
    /// Every sample allocated before this number is consumed by the task or gone, so a fetch
    /// starts its scan there (`order.rs`; not saved: 0 after a restore, moved on by the first
    /// fetch).
    scan_from: u64,
}

impl Serialize for TaskState {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        let leases = crate::checkpoint::deadlines::encode(&self.leases, &self.acked_by);
        (&self.consumed, &self.leased, leases).serialize(s)
    }
}

impl<'de> Deserialize<'de> for TaskState {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let (consumed, leased, saved) = <(Bitmap, Bitmap, _)>::deserialize(d)?;
        let (leases, acked_by) = crate::checkpoint::deadlines::decode(saved);
        Ok(TaskState {
            consumed,
            leased,
            leases,
            acked_by,
            scan_from: 0,
        })
    }
}

impl TaskState {
    fn forget(&mut self, slot: u32) {
        self.consumed.set(slot_u(slot), false);
        self.leased.set(slot_u(slot), false);
        self.leases.remove(&slot);
        self.acked_by.remove(&slot);
    }
}

/// How per-row production is reported in a built [`BatchMeta`].
pub(crate) enum Production {
    /// Every row is ready (fetch results).
    AllReady,
    /// No row is ready (fresh allocations).
    NoneReady,
    /// Computed per row over the batch's fields.
    Computed,
}

/// One partition's state. Saved as a [`record::PartitionRecord`] (its field order is the
/// format; this struct's is not).
pub(crate) struct Partition {
    pub name: String,
    /// Sample of each slot (meaningful where `live` is set).
    ids: Vec<SampleId>,
    /// Allocation order of each slot.
    seq: Vec<u64>,
    next_seq: u64,
    /// Slots holding a sample (visible or being cleared).
    live: Bitmap,
    /// Slots being cleared: hidden from every query, refused for writes.
    clearing: Bitmap,
    slot_of: HashMap<u32, u32>,
    free_slots: Vec<u32>,
    /// Rows owned per storage unit (for balanced allocation).
    pub unit_counts: Vec<u32>,
    fields: Vec<FieldState>,
    field_ids: HashMap<FieldName, usize>,
    tasks: HashMap<String, TaskState>,
    /// The producers declared that no more samples will be added: a task that has consumed
    /// every live sample is finished (its fetches end instead of waiting).
    pub complete: bool,
    tags: Vec<Tags>,
    backend_meta: Vec<BackendMeta>,
    keys: HashMap<String, u32>,
    slot_key: Vec<Option<String>>,
    /// Cells under a field-level clear: (slot, field id).
    clearing_cells: HashSet<(u32, usize)>,
    /// Destination side of `kv_link`: per slot, field id → the public sample it reads.
    links: HashMap<u32, BTreeMap<usize, SampleId>>,
    /// Public samples that were linked at least once (protects fresh payloads from sweeps).
    ever_linked: Bitmap,
    /// Live samples in allocation order, for fetches (derived: not saved).
    order: AllocationOrder,
}

/// The public partition (`__public__`) or a namespaced one (`__public__/<job>`): holds shared
/// payloads that other partitions link to.
pub const PUBLIC_PARTITION: &str = "__public__";

/// True for `__public__` and `__public__/<namespace>`.
pub fn is_public(partition: &str) -> bool {
    partition == PUBLIC_PARTITION
        || partition
            .strip_prefix(PUBLIC_PARTITION)
            .is_some_and(|rest| rest.starts_with('/') && rest.len() > 1)
}

/// A link that existed: destination sample and field, and the public sample it read.
pub(crate) type LinkRecord = (SampleId, FieldName, SampleId);

/// What `release` did, for the controller's cross-partition bookkeeping.
#[derive(Default)]
pub(crate) struct Released {
    pub samples: Vec<SampleId>,
    /// Links the released destination samples held.
    pub links: Vec<LinkRecord>,
}

fn slot_u(s: u32) -> usize {
    s as usize
}

impl Partition {
    pub fn new(name: String, units: u32) -> Self {
        Partition {
            name,
            ids: Vec::new(),
            seq: Vec::new(),
            next_seq: 0,
            live: Bitmap::default(),
            clearing: Bitmap::default(),
            slot_of: HashMap::new(),
            free_slots: Vec::new(),
            unit_counts: vec![0; units as usize],
            fields: Vec::new(),
            field_ids: HashMap::new(),
            tasks: HashMap::new(),
            complete: false,
            tags: Vec::new(),
            backend_meta: Vec::new(),
            keys: HashMap::new(),
            slot_key: Vec::new(),
            clearing_cells: HashSet::new(),
            links: HashMap::new(),
            ever_linked: Bitmap::default(),
            order: AllocationOrder::default(),
        }
    }

    /// Number of live samples (including those being cleared).
    /// Keys and outstanding leases (for snapshot counts).
    pub fn key_and_lease_counts(&self) -> (usize, usize) {
        let leases = self.tasks.values().map(|t| t.leases.len()).sum();
        (self.keys.len(), leases)
    }

    pub fn len(&self) -> usize {
        self.slot_of.len()
    }

    fn visible(&self, slot: u32) -> bool {
        self.live.get(slot_u(slot)) && !self.clearing.get(slot_u(slot))
    }

    /// The slot of `id` if this partition owns exactly that generation.
    fn slot_for(&self, id: SampleId) -> Option<u32> {
        self.slot_of
            .get(&id.index)
            .copied()
            .filter(|&s| self.ids[slot_u(s)] == id)
    }

    /// Visible slots in allocation order.
    fn visible_slots(&self) -> Vec<u32> {
        let mut slots: Vec<u32> = (0..self.live.num_words())
            .flat_map(|w| BitIter {
                word: self.live.word(w) & !self.clearing.word(w),
                base: w * 64,
            })
            .map(|s| s as u32)
            .collect();
        slots.sort_unstable_by_key(|&s| self.seq[slot_u(s)]);
        slots
    }

    /// Allocates `count` new samples, in one contiguous run of allocation order.
    pub fn allocate(&mut self, alloc: &mut IndexAllocator, count: usize) -> Vec<u32> {
        let mut out = Vec::with_capacity(count);
        for _ in 0..count {
            let id = alloc.allocate(&mut self.unit_counts);
            let slot = match self.free_slots.pop() {
                Some(s) => s,
                None => {
                    self.ids.push(id);
                    self.seq.push(0);
                    self.tags.push(Tags::new());
                    self.backend_meta.push(BackendMeta::new());
                    self.slot_key.push(None);
                    (self.ids.len() - 1) as u32
                }
            };
            let su = slot_u(slot);
            self.ids[su] = id;
            self.seq[su] = self.next_seq;
            self.next_seq += 1;
            self.live.set(su, true);
            self.slot_of.insert(id.index, slot);
            self.order_allocated(slot);
            out.push(slot);
        }
        out
    }

    /// Registers the fields a write is about to store (without schema or members), so that a
    /// clear of the written samples names their cells even if the writer never gets to its
    /// production notice (see [`Partition::mark_clearing`]).
    pub fn note_fields_written<'a>(&mut self, names: impl IntoIterator<Item = &'a FieldName>) {
        for name in names {
            self.field_id(name);
        }
    }

    fn field_id(&mut self, name: &str) -> usize {
        if let Some(&f) = self.field_ids.get(name) {
            return f;
        }
        self.fields.push(FieldState::new(name.to_string()));
        self.field_ids
            .insert(name.to_string(), self.fields.len() - 1);
        self.fields.len() - 1
    }

    /// Builds the metadata of `slots` for the fields `fids`.
    #[allow(clippy::expect_used)] // every per-row vector below is built from the same `slots`
    pub fn build_meta(&self, slots: &[u32], fids: &[usize], production: Production) -> BatchMeta {
        let samples = slots.iter().map(|&s| self.ids[slot_u(s)]).collect();
        let fields: BTreeMap<FieldName, FieldMeta> = fids
            .iter()
            .map(|&f| (self.fields[f].name.clone(), self.fields[f].schema(slots)))
            .collect();
        let production = match production {
            Production::AllReady => vec![true; slots.len()],
            Production::NoneReady => vec![false; slots.len()],
            Production::Computed => slots
                .iter()
                .map(|&s| {
                    !fids.is_empty()
                        && self.visible(s)
                        && fids.iter().all(|&f| self.fields[f].produced.get(slot_u(s)))
                })
                .collect(),
        };
        let names: HashSet<&str> = fids.iter().map(|&f| self.fields[f].name.as_str()).collect();
        let backend_meta = slots
            .iter()
            .map(|&s| {
                self.backend_meta[slot_u(s)]
                    .iter()
                    .filter(|(k, _)| names.contains(k.as_str()))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
            .collect();
        let links = slots
            .iter()
            .map(|s| {
                self.links
                    .get(s)
                    .map(|l| {
                        l.iter()
                            .filter(|(f, _)| fids.contains(f))
                            .map(|(&f, &src)| (self.fields[f].name.clone(), src))
                            .collect()
                    })
                    .unwrap_or_default()
            })
            .collect();
        BatchMeta::new(self.name.clone(), samples)
            .with_fields(fields)
            .and_then(|m| m.with_production(production))
            .and_then(|m| m.with_links(links))
            .and_then(|m| {
                m.with_tags(
                    slots
                        .iter()
                        .map(|&s| self.tags[slot_u(s)].clone())
                        .collect(),
                )
            })
            .and_then(|m| m.with_backend_meta(backend_meta))
            .expect("per-row vectors are built from the same slots")
    }

    /// Field ids of `names`, or `None` if any is not registered.
    pub fn known_fields(&self, names: &[FieldName]) -> Option<Vec<usize>> {
        names
            .iter()
            .map(|n| self.field_ids.get(n).copied())
            .collect()
    }

    /// Fields that currently have at least one member, in column order.
    fn populated_fields(&self) -> Vec<usize> {
        (0..self.fields.len())
            .filter(|&f| self.fields[f].members > 0)
            .collect()
    }

    /// Slots of `ids`, which must all be visible samples of this partition.
    pub fn slots_of(&self, ids: &[SampleId]) -> Result<Vec<u32>> {
        ids.iter()
            .map(|&id| {
                let slot = self.slot_for(id).ok_or_else(|| {
                    Error::conflict(format!(
                        "partition `{}`: sample {id} is not owned by this partition (cleared or reused)",
                        self.name
                    ))
                })?;
                if self.clearing.get(slot_u(slot)) {
                    return Err(Error::conflict(format!(
                        "partition `{}`: sample {id} is being cleared",
                        self.name
                    )));
                }
                Ok(slot)
            })
            .collect()
    }

    /// Applies a production notice: validates everything, then changes everything. Returns
    /// the backend meta entries it replaced (see [`crate::ControlPlane::notify_production`]).
    pub fn notify(&mut self, n: &ProductionNotice) -> Result<Vec<BackendMeta>> {
        let rows = n.samples.len();
        check_unique_ids(&self.name, &n.samples)?;
        for (name, s) in &n.schemas {
            s.check_rows(name, rows)?;
        }
        if n.tags.as_ref().is_some_and(|t| t.len() != rows)
            || n.backend_meta.as_ref().is_some_and(|b| b.len() != rows)
        {
            return Err(Error::invalid(format!(
                "partition `{}`: tags or backend meta do not match {rows} samples",
                self.name
            )));
        }
        let slots = self.slots_of(&n.samples)?;
        self.check_cells_writable(&slots, &n.schemas)?;
        for (name, schema) in &n.schemas {
            let f = self.field_id(name);
            self.fields[f].add(&slots, schema);
        }
        if let Some(tags) = &n.tags {
            for (&s, t) in slots.iter().zip(tags) {
                self.tags[slot_u(s)].extend(t.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
        }
        let mut replaced = Vec::new();
        if let Some(bm) = &n.backend_meta {
            for (r, (&s, m)) in slots.iter().zip(bm).enumerate() {
                let row = &mut self.backend_meta[slot_u(s)];
                for (k, v) in m {
                    if let Some(old) = row.insert(k.clone(), v.clone()).filter(|old| old != v) {
                        if replaced.is_empty() {
                            replaced = vec![BackendMeta::new(); rows];
                        }
                        replaced[r].insert(k.clone(), old);
                    }
                }
            }
        }
        Ok(replaced)
    }

    pub fn set_tags(&mut self, ids: &[SampleId], tags: &[Tags]) -> Result<()> {
        if ids.len() != tags.len() {
            return Err(Error::invalid(format!(
                "partition `{}`: {} tag maps for {} samples",
                self.name,
                tags.len(),
                ids.len()
            )));
        }
        check_unique_ids(&self.name, ids)?;
        let slots = self.slots_of(ids)?;
        for (&s, t) in slots.iter().zip(tags) {
            self.tags[slot_u(s)].extend(t.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        Ok(())
    }

    pub fn production_status(&self, names: &[FieldName]) -> ProductionStatus {
        let slots = self.visible_slots();
        let fids: Vec<Option<usize>> = names
            .iter()
            .map(|n| self.field_ids.get(n).copied())
            .collect();
        let mut produced = Vec::with_capacity(slots.len() * names.len());
        for &s in &slots {
            for f in &fids {
                produced.push(f.is_some_and(|f| self.fields[f].produced.get(slot_u(s))));
            }
        }
        ProductionStatus {
            samples: slots.iter().map(|&s| self.ids[slot_u(s)]).collect(),
            fields: names.to_vec(),
            produced,
        }
    }

    /// Field ids of `names` that exist in this partition.
    pub fn field_ids_of(&self, names: &[FieldName]) -> Vec<usize> {
        names
            .iter()
            .filter_map(|n| self.field_ids.get(n).copied())
            .collect()
    }

    /// The sample in `slot`.
    pub fn sample_of(&self, slot: u32) -> SampleId {
        self.ids[slot_u(slot)]
    }

    /// Fields produced for every one of `slots` (none when `slots` is empty).
    pub fn common_fields(&self, slots: &[u32]) -> Vec<usize> {
        if slots.is_empty() {
            return Vec::new();
        }
        self.populated_fields()
            .into_iter()
            .filter(|&f| {
                slots
                    .iter()
                    .all(|&s| self.fields[f].produced.get(slot_u(s)))
            })
            .collect()
    }

    /// Metadata of every visible sample for `names` (registered ones only), production per row.
    pub fn force_meta(&self, names: &[FieldName]) -> BatchMeta {
        let slots = self.visible_slots();
        let fids: Vec<usize> = names
            .iter()
            .filter_map(|n| self.field_ids.get(n).copied())
            .collect();
        self.build_meta(&slots, &fids, Production::Computed)
    }
}

pub(crate) fn check_unique_ids(partition: &str, ids: &[SampleId]) -> Result<()> {
    let mut seen = HashSet::with_capacity(ids.len());
    if let Some(dup) = ids.iter().find(|id| !seen.insert(id.index)) {
        return Err(Error::invalid(format!(
            "partition `{partition}`: sample {dup} appears twice"
        )));
    }
    Ok(())
}
