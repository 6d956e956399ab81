//! The slot table: which sample each slot holds, in what allocation order, whether it is
//! visible, and the per-sample rows (tags, backend meta) every slot carries.
//!
//! Invariants, kept by the methods here and checked on a restore ([`SlotTable::check`]):
//! every per-slot vector has one entry per slot; `slot_of` maps the index of exactly the live
//! slots' samples to their slot; a slot is either live or in `free_slots`; `clearing` is a
//! subset of `live`; `unit_counts` has one row count per storage unit.

use crate::allocator::IndexAllocator;
use crate::bitmap::{BitIter, Bitmap};
use std::collections::HashMap;
use tq_core::{routing, BackendMeta, SampleId, Tags};

/// Slots of one partition and the samples in them.
#[derive(Debug)]
pub(in crate::partition) struct SlotTable {
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
    unit_counts: Vec<u32>,
    tags: Vec<Tags>,
    backend_meta: Vec<BackendMeta>,
}

/// The slot table as a record holds it (see `record.rs`): owned for decoding, borrowed for
/// encoding.
pub(in crate::partition) struct SlotParts<
    Ids = Vec<SampleId>,
    Seq = Vec<u64>,
    Bits = Bitmap,
    Map = HashMap<u32, u32>,
    Free = Vec<u32>,
    Units = Vec<u32>,
    T = Vec<Tags>,
    Meta = Vec<BackendMeta>,
> {
    pub ids: Ids,
    pub seq: Seq,
    pub next_seq: u64,
    pub live: Bits,
    pub clearing: Bits,
    pub slot_of: Map,
    pub free_slots: Free,
    pub unit_counts: Units,
    pub tags: T,
    pub backend_meta: Meta,
}

/// [`SlotParts`] borrowing a live table.
pub(in crate::partition) type SlotPartsRef<'a> = SlotParts<
    &'a Vec<SampleId>,
    &'a Vec<u64>,
    &'a Bitmap,
    &'a HashMap<u32, u32>,
    &'a Vec<u32>,
    &'a Vec<u32>,
    &'a Vec<Tags>,
    &'a Vec<BackendMeta>,
>;

fn su(slot: u32) -> usize {
    slot as usize
}

impl SlotTable {
    pub fn new(units: u32) -> Self {
        SlotTable {
            ids: Vec::new(),
            seq: Vec::new(),
            next_seq: 0,
            live: Bitmap::default(),
            clearing: Bitmap::default(),
            slot_of: HashMap::new(),
            free_slots: Vec::new(),
            unit_counts: vec![0; units as usize],
            tags: Vec::new(),
            backend_meta: Vec::new(),
        }
    }

    pub fn parts(&self) -> SlotPartsRef<'_> {
        SlotParts {
            ids: &self.ids,
            seq: &self.seq,
            next_seq: self.next_seq,
            live: &self.live,
            clearing: &self.clearing,
            slot_of: &self.slot_of,
            free_slots: &self.free_slots,
            unit_counts: &self.unit_counts,
            tags: &self.tags,
            backend_meta: &self.backend_meta,
        }
    }

    /// The table a record holds. The per-unit row counts are counted again from the live
    /// samples by [`tq_core::routing::unit_of`]: a record written before routing by runs
    /// (snapshot formats 1-4) counted them by `index % units`.
    pub fn from_parts(p: SlotParts) -> Self {
        let mut table = SlotTable {
            ids: p.ids,
            seq: p.seq,
            next_seq: p.next_seq,
            live: p.live,
            clearing: p.clearing,
            slot_of: p.slot_of,
            free_slots: p.free_slots,
            unit_counts: p.unit_counts,
            tags: p.tags,
            backend_meta: p.backend_meta,
        };
        table.recount_units();
        table
    }

    /// Counts the live samples of each unit into `unit_counts` (which keeps its length: a
    /// wrong one is for [`SlotTable::check`] to refuse). A live slot whose index is not in
    /// `ids` is left to `check` as well.
    fn recount_units(&mut self) {
        let units = self.unit_counts.len() as u32;
        if units == 0 {
            return;
        }
        let mut counts = vec![0u32; units as usize];
        for s in self.live.ones() {
            if let Some(id) = self.ids.get(s) {
                counts[routing::unit_of(id.index, units)] += 1;
            }
        }
        self.unit_counts = counts;
    }

    /// What is wrong with a restored table, if anything (see the module's invariants).
    pub fn check(&self, units: u32) -> Option<String> {
        if self.unit_counts.len() != units as usize {
            return Some(format!(
                "{} row counts for {units} storage units",
                self.unit_counts.len()
            ));
        }
        let slots = self.ids.len();
        for (what, len) in [
            ("allocation numbers", self.seq.len()),
            ("tag sets", self.tags.len()),
            ("backend metas", self.backend_meta.len()),
        ] {
            if len != slots {
                return Some(format!("{len} {what} for {slots} slots"));
            }
        }
        if self.slot_of.values().any(|&s| su(s) >= slots)
            || self.free_slots.iter().any(|&s| su(s) >= slots)
        {
            return Some("a sample or free slot names a slot it does not have".into());
        }
        None
    }

    /// Makes room for `count` more live slots at once, so that allocating them one by one
    /// grows no vector or map on the way (a batch of new keys into an empty partition rehashed
    /// `slot_of` ten times for 1024 of them).
    pub fn reserve(&mut self, count: usize) {
        let new_slots = count.saturating_sub(self.free_slots.len());
        self.ids.reserve(new_slots);
        self.seq.reserve(new_slots);
        self.tags.reserve(new_slots);
        self.backend_meta.reserve(new_slots);
        self.slot_of.reserve(count);
    }

    /// Allocates one sample in a free slot (or a new one); returns the slot.
    pub fn allocate(&mut self, alloc: &mut IndexAllocator) -> u32 {
        let id = alloc.allocate(&mut self.unit_counts);
        let slot = match self.free_slots.pop() {
            Some(s) => s,
            None => {
                self.ids.push(id);
                self.seq.push(0);
                self.tags.push(Tags::new());
                self.backend_meta.push(BackendMeta::new());
                (self.ids.len() - 1) as u32
            }
        };
        let s = su(slot);
        self.ids[s] = id;
        self.seq[s] = self.next_seq;
        self.next_seq += 1;
        self.live.set(s, true);
        self.slot_of.insert(id.index, slot);
        slot
    }

    /// Frees the slot of `id` (which must be live in `slot`), giving its index back.
    pub fn release(&mut self, alloc: &mut IndexAllocator, slot: u32, id: SampleId) {
        let s = su(slot);
        self.tags[s].clear();
        self.backend_meta[s].clear();
        self.live.set(s, false);
        self.clearing.set(s, false);
        self.slot_of.remove(&id.index);
        self.free_slots.push(slot);
        alloc.release(id, &mut self.unit_counts);
    }

    /// Number of slots (live or free).
    pub fn capacity(&self) -> usize {
        self.ids.len()
    }

    /// Number of live samples (including those being cleared).
    pub fn len(&self) -> usize {
        self.slot_of.len()
    }

    pub fn id(&self, slot: u32) -> SampleId {
        self.ids[su(slot)]
    }

    pub fn seq(&self, slot: u32) -> u64 {
        self.seq[su(slot)]
    }

    pub fn tags(&self, slot: u32) -> &Tags {
        &self.tags[su(slot)]
    }

    pub fn tags_mut(&mut self, slot: u32) -> &mut Tags {
        &mut self.tags[su(slot)]
    }

    pub fn backend_meta(&self, slot: u32) -> &BackendMeta {
        &self.backend_meta[su(slot)]
    }

    pub fn backend_meta_mut(&mut self, slot: u32) -> &mut BackendMeta {
        &mut self.backend_meta[su(slot)]
    }

    pub fn is_live(&self, slot: u32) -> bool {
        self.live.get(su(slot))
    }

    pub fn is_clearing(&self, slot: u32) -> bool {
        self.clearing.get(su(slot))
    }

    /// Hides a live slot from every query and refuses writes to it, until it is released.
    pub fn set_clearing(&mut self, slot: u32) {
        self.clearing.set(su(slot), true);
    }

    pub fn visible(&self, slot: u32) -> bool {
        self.is_live(slot) && !self.is_clearing(slot)
    }

    /// Whether `(seq, slot)` still names the sample allocated then.
    pub fn still_allocated(&self, (seq, slot): (u64, u32)) -> bool {
        self.is_live(slot) && self.seq(slot) == seq
    }

    /// The slot of `id` if this partition owns exactly that generation.
    pub fn slot_for(&self, id: SampleId) -> Option<u32> {
        self.slot_of
            .get(&id.index)
            .copied()
            .filter(|&s| self.ids[su(s)] == id)
    }

    /// The slot holding a sample with `id`'s index, whatever its generation.
    pub fn slot_of_index(&self, id: SampleId) -> Option<u32> {
        self.slot_of.get(&id.index).copied()
    }

    /// Every live slot, in no particular order.
    pub fn live_slots(&self) -> impl Iterator<Item = u32> + '_ {
        self.slot_of.values().copied()
    }

    /// Live slots (visible or being cleared) in allocation order.
    pub fn live_in_order(&self) -> Vec<u32> {
        let mut s: Vec<u32> = self.live.ones().map(|s| s as u32).collect();
        s.sort_unstable_by_key(|&s| self.seq(s));
        s
    }

    /// Visible slots in allocation order.
    pub fn visible_in_order(&self) -> Vec<u32> {
        let mut slots: Vec<u32> = (0..self.num_words())
            .flat_map(|w| BitIter {
                word: self.visible_word(w),
                base: w * 64,
            })
            .map(|s| s as u32)
            .collect();
        slots.sort_unstable_by_key(|&s| self.seq(s));
        slots
    }

    /// Words of 64 slots, for word-wise counts.
    pub fn num_words(&self) -> usize {
        self.live.num_words()
    }

    /// The visible slots of word `w`.
    pub fn visible_word(&self, w: usize) -> u64 {
        self.live.word(w) & !self.clearing.word(w)
    }

    /// Live samples, visible or not.
    pub fn live_count(&self) -> usize {
        self.live.count_ones()
    }
}
