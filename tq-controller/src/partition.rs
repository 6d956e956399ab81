//! The state of one partition: a dense slot table with bitmaps for production, consumption and
//! row states, per-field schemas, tags, backend metadata and keys.
//!
//! Everything here is synchronous and runs inside the controller's critical section; costs grow
//! with the batch a call touches (plus a word-wise bitmap scan for fetches).

use crate::allocator::IndexAllocator;
use crate::api::{ConsumptionStatus, ProductionNotice, ProductionStatus};
use crate::bitmap::{BitIter, Bitmap};
use crate::sampler::Candidate;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Instant;
mod writes;

use tq_core::{
    BackendMeta, BatchMeta, DType, Error, FieldMeta, FieldName, LeaseId, Result, SampleId, Tags,
};

/// Per-sample shapes of a tensor field.
#[derive(Debug, Clone, PartialEq)]
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
#[derive(Debug, Clone, PartialEq, Default)]
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
#[derive(Debug)]
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
#[derive(Debug, Default)]
struct TaskState {
    /// Consumed for good (at-most-once fetches, or acknowledged leases).
    consumed: Bitmap,
    /// Handed out under a lease that has not been acknowledged or expired yet.
    leased: Bitmap,
    leases: HashMap<u32, (LeaseId, Instant)>,
}

impl TaskState {
    fn forget(&mut self, slot: u32) {
        self.consumed.set(slot_u(slot), false);
        self.leased.set(slot_u(slot), false);
        self.leases.remove(&slot);
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
        }
    }

    /// Number of live samples (including those being cleared).
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
            out.push(slot);
        }
        out
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

    /// Samples produced for all of `fids` and neither consumed nor leased by `task`, in
    /// allocation order.
    pub fn ready(&self, fids: &[usize], task: &str) -> Vec<Candidate<'_>> {
        let state = self.tasks.get(task);
        let mut slots: Vec<usize> = Vec::new();
        for w in 0..self.live.num_words() {
            let mut word = self.live.word(w) & !self.clearing.word(w);
            if let Some(t) = state {
                word &= !(t.consumed.word(w) | t.leased.word(w));
            }
            for &f in fids {
                word &= self.fields[f].produced.word(w);
            }
            slots.extend(BitIter { word, base: w * 64 });
        }
        slots.sort_unstable_by_key(|&s| self.seq[s]);
        slots
            .into_iter()
            .map(|s| Candidate {
                id: self.ids[s],
                seq: self.seq[s],
                tags: &self.tags[s],
            })
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

    pub fn mark_consumed(&mut self, task: &str, ids: &[SampleId]) {
        let t = self.tasks.entry(task.to_string()).or_default();
        for id in ids {
            if let Some(&s) = self.slot_of.get(&id.index) {
                t.consumed.set(slot_u(s), true);
                t.leased.set(slot_u(s), false);
                t.leases.remove(&s);
            }
        }
    }

    /// Leases samples to `task` until `expiry`, skipping those already consumed or leased.
    pub fn lease(&mut self, task: &str, ids: &[SampleId], lease: LeaseId, expiry: Instant) {
        let t = self.tasks.entry(task.to_string()).or_default();
        for id in ids {
            if let Some(&s) = self.slot_of.get(&id.index) {
                if !t.consumed.get(slot_u(s)) && !t.leased.get(slot_u(s)) {
                    t.leased.set(slot_u(s), true);
                    t.leases.insert(s, (lease, expiry));
                }
            }
        }
    }

    /// The lease `task` holds on `id`, if any.
    pub fn lease_of(&self, task: &str, id: SampleId) -> Option<LeaseId> {
        let s = self.slot_for(id)?;
        self.tasks.get(task)?.leases.get(&s).map(|(l, _)| *l)
    }

    /// Consumes the samples `task` holds under `lease`; returns how many. Samples whose lease
    /// expired (and may have been handed to someone else) are left alone.
    pub fn ack(&mut self, task: &str, lease: LeaseId, ids: &[SampleId]) -> usize {
        let slots: Vec<u32> = ids.iter().filter_map(|&id| self.slot_for(id)).collect();
        let Some(t) = self.tasks.get_mut(task) else {
            return 0;
        };
        let mut acked = 0;
        for s in slots {
            if t.leases.get(&s).is_some_and(|(l, _)| *l == lease) {
                t.leases.remove(&s);
                t.leased.set(slot_u(s), false);
                t.consumed.set(slot_u(s), true);
                acked += 1;
            }
        }
        acked
    }

    /// Returns expired leases to the ready set; gives the earliest expiry still pending.
    pub fn expire_leases(&mut self, now: Instant) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        for t in self.tasks.values_mut() {
            if t.leases.is_empty() {
                continue;
            }
            let leased = &mut t.leased;
            t.leases.retain(|&s, &mut (_, expiry)| {
                if expiry <= now {
                    leased.set(slot_u(s), false);
                    false
                } else {
                    next = Some(next.map_or(expiry, |n| n.min(expiry)));
                    true
                }
            });
        }
        next
    }

    /// Live samples `task` has not consumed (leased ones included).
    pub fn unconsumed(&self, task: &str) -> usize {
        let t = self.tasks.get(task);
        (0..self.live.num_words())
            .map(|w| {
                let mut word = self.live.word(w) & !self.clearing.word(w);
                if let Some(t) = t {
                    word &= !t.consumed.word(w);
                }
                word.count_ones() as usize
            })
            .sum()
    }

    /// True when the partition is complete and `task` has consumed every live sample (leased
    /// samples are not consumed yet).
    pub fn finished_for(&self, task: &str) -> bool {
        if !self.complete {
            return false;
        }
        let Some(t) = self.tasks.get(task) else {
            return self.live.count_ones() == 0;
        };
        (0..self.live.num_words())
            .all(|w| self.live.word(w) & !self.clearing.word(w) & !t.consumed.word(w) == 0)
    }

    /// Applies a production notice: validates everything, then changes everything.
    pub fn notify(&mut self, n: &ProductionNotice) -> Result<()> {
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
        if let Some(bm) = &n.backend_meta {
            for (&s, m) in slots.iter().zip(bm) {
                self.backend_meta[slot_u(s)].extend(m.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
        }
        Ok(())
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

    /// Hides the samples in `slots` (from [`Partition::select`]) and returns their metadata
    /// with every field any of them holds.
    pub fn mark_clearing(&mut self, slots: &[u32]) -> BatchMeta {
        let fids: Vec<usize> = (0..self.fields.len())
            .filter(|&f| {
                slots
                    .iter()
                    .any(|&s| self.fields[f].produced.get(slot_u(s)))
            })
            .collect();
        let meta = self.build_meta(slots, &fids, Production::Computed);
        for &s in slots {
            self.clearing.set(slot_u(s), true);
        }
        meta
    }

    /// The samples a clear of `ids` (or of everything) would touch.
    pub fn selected_samples(&self, ids: Option<&[SampleId]>) -> Vec<SampleId> {
        self.select(ids)
            .iter()
            .map(|&s| self.ids[slot_u(s)])
            .collect()
    }

    /// The slots a clear of `ids` (all live samples when `None`) touches. Samples already being
    /// cleared are included again, so a retried clear finds them; samples not owned are ignored.
    pub fn select(&self, ids: Option<&[SampleId]>) -> Vec<u32> {
        match ids {
            None => {
                let mut s: Vec<u32> = self.live.ones().map(|s| s as u32).collect();
                s.sort_unstable_by_key(|&s| self.seq[slot_u(s)]);
                s
            }
            Some(ids) => {
                let mut seen = HashSet::new();
                ids.iter()
                    .filter_map(|&id| self.slot_for(id))
                    .filter(|s| seen.insert(*s))
                    .collect()
            }
        }
    }

    /// Releases samples that were marked clearing; reports them and the links they held.
    pub fn release(&mut self, alloc: &mut IndexAllocator, ids: &[SampleId]) -> Released {
        let mut released = Released::default();
        for &id in ids {
            let Some(slot) = self.slot_for(id) else {
                continue;
            };
            let su = slot_u(slot);
            if !self.clearing.get(su) {
                tracing::warn!(partition = %self.name, sample = %id, "release of a sample that was not marked clearing; ignored");
                continue;
            }
            if let Some(links) = self.links.remove(&slot) {
                for (f, src) in links {
                    released.links.push((id, self.fields[f].name.clone(), src));
                }
            }
            self.ever_linked.set(su, false);
            for f in &mut self.fields {
                f.remove(slot);
            }
            for t in self.tasks.values_mut() {
                t.forget(slot);
            }
            self.clearing_cells.retain(|&(s, _)| s != slot);
            self.tags[su].clear();
            self.backend_meta[su].clear();
            if let Some(k) = self.slot_key[su].take() {
                self.keys.remove(&k);
            }
            self.live.set(su, false);
            self.clearing.set(su, false);
            self.slot_of.remove(&id.index);
            self.free_slots.push(slot);
            alloc.release(id, &mut self.unit_counts);
            released.samples.push(id);
        }
        if !released.samples.is_empty() {
            self.fields.iter_mut().for_each(FieldState::normalize);
        }
        released
    }

    /// Removes the given fields' cells of the given samples from the metadata and blocks writes
    /// to them until `finish_clear_fields`. Returns the affected samples' metadata.
    /// Linked cells only lose their link (no storage cell to delete); those links are returned.
    pub fn begin_clear_fields(
        &mut self,
        ids: &[SampleId],
        names: &[FieldName],
    ) -> (BatchMeta, Vec<LinkRecord>) {
        let fids: Vec<usize> = names
            .iter()
            .filter_map(|n| self.field_ids.get(n).copied())
            .collect();
        let mut seen = HashSet::new();
        let slots: Vec<u32> = ids
            .iter()
            .filter_map(|&id| self.slot_for(id))
            .filter(|&s| self.visible(s) && seen.insert(s))
            .filter(|&s| {
                fids.iter().any(|&f| {
                    self.fields[f].produced.get(slot_u(s)) || self.clearing_cells.contains(&(s, f))
                })
            })
            .collect();
        let meta = self.build_meta(&slots, &fids, Production::Computed);
        let mut dropped = Vec::new();
        for &s in &slots {
            for &f in &fids {
                if let Some(src) = self.unlink(s, f) {
                    dropped.push((self.ids[slot_u(s)], self.fields[f].name.clone(), src));
                } else if self.fields[f].remove(s) || self.clearing_cells.contains(&(s, f)) {
                    self.clearing_cells.insert((s, f));
                    self.backend_meta[slot_u(s)].remove(&self.fields[f].name);
                }
            }
        }
        for &f in &fids {
            self.fields[f].normalize();
        }
        (meta, dropped)
    }

    /// Drops the link of field `name` of `id`, if any (the cell reads as never written).
    pub fn unlink_by_id(&mut self, id: SampleId, name: &str) -> Option<SampleId> {
        let slot = self.slot_for(id)?;
        let &f = self.field_ids.get(name)?;
        self.unlink(slot, f)
    }

    /// The public sample `slot`'s field `f` reads, if it is a link.
    pub fn link_of(&self, slot: u32, f: usize) -> Option<SampleId> {
        self.links.get(&slot).and_then(|l| l.get(&f)).copied()
    }

    /// Drops a link: the cell reads as never written. Returns the source it pointed to.
    pub fn unlink(&mut self, slot: u32, f: usize) -> Option<SampleId> {
        let links = self.links.get_mut(&slot)?;
        let src = links.remove(&f)?;
        if links.is_empty() {
            self.links.remove(&slot);
        }
        self.fields[f].remove(slot);
        self.fields[f].normalize();
        Some(src)
    }

    /// Makes field `name` of `slot` read `source`'s payload, described by `schema` (one row).
    /// Returns the source it pointed to before, if it was already a link.
    pub fn link(
        &mut self,
        slot: u32,
        name: &str,
        source: SampleId,
        schema: &FieldMeta,
    ) -> Option<SampleId> {
        let f = self.field_id(name);
        let previous = self.unlink(slot, f);
        self.fields[f].add(&[slot], schema);
        self.links.entry(slot).or_default().insert(f, source);
        previous
    }

    /// The one-row schema of field `name` of `id`, when produced (not counting links).
    pub fn produced_schema(&self, id: SampleId, name: &str) -> Option<FieldMeta> {
        let slot = self.slot_for(id)?;
        let &f = self.field_ids.get(name)?;
        if !self.visible(slot) || !self.fields[f].produced.get(slot_u(slot)) {
            return None;
        }
        Some(self.fields[f].schema(&[slot]))
    }

    /// Checks that `schema` may be stored in field `name` of this partition (dtype and kind).
    pub fn check_field(&self, name: &str, schema: &FieldMeta) -> Result<()> {
        match self.field_ids.get(name) {
            Some(&f) => self.fields[f].check(schema),
            None => Ok(()),
        }
    }

    /// True when field `name` of `id` holds a private (written, not linked) payload.
    pub fn has_private(&self, id: SampleId, name: &str) -> bool {
        let (Some(slot), Some(&f)) = (self.slot_for(id), self.field_ids.get(name)) else {
            return false;
        };
        self.fields[f].produced.get(slot_u(slot)) && self.link_of(slot, f).is_none()
    }

    /// Records that public sample `id` was linked (it may be swept once unlinked again).
    pub fn mark_ever_linked(&mut self, id: SampleId) {
        if let Some(s) = self.slot_for(id) {
            self.ever_linked.set(slot_u(s), true);
        }
    }

    /// Visible keys (with their samples) starting with `prefix` that were linked at least once.
    pub fn swept_candidates(&self, prefix: &str) -> Vec<(String, SampleId)> {
        let mut out: Vec<(u64, String, SampleId)> = self
            .keys
            .iter()
            .filter(|(k, &s)| {
                k.starts_with(prefix) && self.visible(s) && self.ever_linked.get(slot_u(s))
            })
            .map(|(k, &s)| (self.seq[slot_u(s)], k.clone(), self.ids[slot_u(s)]))
            .collect();
        out.sort_unstable_by_key(|e| e.0);
        out.into_iter().map(|(_, k, id)| (k, id)).collect()
    }

    pub fn finish_clear_fields(&mut self, ids: &[SampleId], names: &[FieldName]) {
        let fids: Vec<usize> = names
            .iter()
            .filter_map(|n| self.field_ids.get(n).copied())
            .collect();
        for &id in ids {
            if let Some(s) = self.slot_for(id) {
                for &f in &fids {
                    self.clearing_cells.remove(&(s, f));
                }
            }
        }
    }

    /// Forgets what `task` (or every task) consumed or holds leased.
    pub fn reset_consumption(&mut self, task: Option<&str>) {
        match task {
            Some(t) => {
                self.tasks.remove(t);
            }
            None => self.tasks.clear(),
        }
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

    pub fn consumption_status(&self, task: &str) -> ConsumptionStatus {
        let slots = self.visible_slots();
        let t = self.tasks.get(task);
        let bit = |s: u32, f: fn(&TaskState) -> &Bitmap| t.is_some_and(|t| f(t).get(slot_u(s)));
        ConsumptionStatus {
            samples: slots.iter().map(|&s| self.ids[slot_u(s)]).collect(),
            consumed: slots.iter().map(|&s| bit(s, |t| &t.consumed)).collect(),
            leased: slots.iter().map(|&s| bit(s, |t| &t.leased)).collect(),
        }
    }

    /// Resolves keys to visible slots. Missing keys are returned separately; keys whose sample
    /// is being cleared count as missing, unless `create` is set, which refuses them.
    pub fn resolve_keys(
        &self,
        keys: &[String],
        create: bool,
    ) -> Result<(Vec<Option<u32>>, Vec<String>)> {
        let mut slots = Vec::with_capacity(keys.len());
        let mut missing = Vec::new();
        for k in keys {
            match self.keys.get(k) {
                Some(&s) if self.visible(s) => slots.push(Some(s)),
                Some(_) if create => {
                    return Err(Error::conflict(format!(
                        "partition `{}`: key `{k}` is being cleared",
                        self.name
                    )))
                }
                _ => {
                    slots.push(None);
                    missing.push(k.clone());
                }
            }
        }
        Ok((slots, missing))
    }

    /// Resolves `keys`, creating the missing ones (refusing keys being cleared). Returns the
    /// slots in key order and the keys that were created.
    pub fn resolve_or_create(
        &mut self,
        alloc: &mut IndexAllocator,
        keys: &[String],
    ) -> Result<(Vec<u32>, Vec<String>)> {
        let (mut slots, missing) = self.resolve_keys(keys, true)?;
        if !missing.is_empty() {
            if missing.len() as u64 > alloc.available() {
                return Err(Error::capacity_exceeded(format!(
                    "partition `{}`: {} new keys, but only {} sample indexes are left (clear \
                     keys to reuse theirs)",
                    self.name,
                    missing.len(),
                    alloc.available()
                )));
            }
            // `allocate` hands out exactly one slot per missing key, so every key gets one.
            let mut fresh = self.allocate(alloc, missing.len()).into_iter();
            for (k, s) in keys.iter().zip(slots.iter_mut()) {
                if s.is_none() {
                    if let Some(slot) = fresh.next() {
                        self.bind_key(k, slot);
                        *s = Some(slot);
                    }
                }
            }
        }
        Ok((slots.into_iter().flatten().collect(), missing))
    }

    /// The sample behind `key`: `Ok(Some(id))` when visible, `Ok(None)` when missing,
    /// `Conflict` when it is being cleared.
    pub fn key_sample(&self, key: &str) -> Result<Option<SampleId>> {
        match self.keys.get(key) {
            None => Ok(None),
            Some(&s) if self.visible(s) => Ok(Some(self.ids[slot_u(s)])),
            Some(&s) => Err(Error::conflict(format!(
                "partition `{}`: key `{key}` (sample {}) is being cleared",
                self.name,
                self.ids[slot_u(s)]
            ))),
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

    pub fn bind_key(&mut self, key: &str, slot: u32) {
        self.keys.insert(key.to_string(), slot);
        self.slot_key[slot_u(slot)] = Some(key.to_string());
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

    /// Visible keys with their tags, in allocation order.
    pub fn key_listing(&self) -> Vec<(String, Tags)> {
        let mut entries: Vec<(u64, String, Tags)> = self
            .keys
            .iter()
            .filter(|(_, &s)| self.visible(s))
            .map(|(k, &s)| (self.seq[slot_u(s)], k.clone(), self.tags[slot_u(s)].clone()))
            .collect();
        entries.sort_unstable_by_key(|e| e.0);
        entries.into_iter().map(|(_, k, t)| (k, t)).collect()
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
