//! The state of one partition: a dense slot table with bitmaps for production, consumption and
//! row states, per-field schemas, tags, backend metadata and keys.
//!
//! Everything here is synchronous and runs inside the controller's critical section; costs grow
//! with the batch a call touches: a fetch takes its candidates from the front of the allocation
//! order (`order.rs`) and expires leases from the front of their deadline order (`leases.rs`);
//! counts are word-wise bitmap scans (64 slots a word).

use crate::allocator::IndexAllocator;
use crate::api::{ConsumptionStatus, ProductionNotice, ProductionStatus};
use crate::sampler::Candidate;
use components::fields::FieldTable;
use components::keys::KeyTable;
use components::links::LinkTable;
use components::slots::SlotTable;
use components::tasks::TaskTable;
use std::collections::{BTreeMap, HashSet};
use std::time::Instant;
mod clear;
mod components;
mod consumption;
mod keys;
mod links;
mod order;
mod record;
mod status;
mod stored;
mod writes;

pub(crate) use components::leases::LeaseTable;
use order::AllocationOrder;
use tq_core::{
    BackendMeta, BatchMeta, BatchMetaParts, Error, FieldMeta, FieldName, LeaseId, Result, SampleId,
    Tags,
};

/// How per-row production is reported in a built [`BatchMeta`].
pub(crate) enum Production {
    /// Every row is ready (fetch results).
    AllReady,
    /// No row is ready (fresh allocations).
    NoneReady,
    /// Computed per row over the batch's fields.
    Computed,
}

/// One partition's state: its components (each keeping its own invariants, see
/// `components.rs`) and the steps that coordinate them. Saved as a [`record::PartitionRecord`]
/// (its field order is the format; this struct's is not).
pub(crate) struct Partition {
    pub name: String,
    /// The producers declared that no more samples will be added: a task that has consumed
    /// every live sample is finished (its fetches end instead of waiting).
    pub complete: bool,
    slots: SlotTable,
    fields: FieldTable,
    tasks: TaskTable,
    keys: KeyTable,
    links: LinkTable,
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

impl Partition {
    pub fn new(name: String, units: u32) -> Self {
        Partition {
            name,
            complete: false,
            slots: SlotTable::new(units),
            fields: FieldTable::default(),
            tasks: TaskTable::default(),
            keys: KeyTable::default(),
            links: LinkTable::default(),
            order: AllocationOrder::default(),
        }
    }

    /// Keys and outstanding leases (for snapshot counts).
    pub fn key_and_lease_counts(&self) -> (usize, usize) {
        (self.keys.len(), self.tasks.lease_count())
    }

    /// Number of live samples (including those being cleared).
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Allocates `count` new samples, in one contiguous run of allocation order.
    pub fn allocate(&mut self, alloc: &mut IndexAllocator, count: usize) -> Vec<u32> {
        let mut out = Vec::with_capacity(count);
        self.slots.reserve(count);
        for _ in 0..count {
            let slot = self.slots.allocate(alloc);
            self.order_allocated(slot);
            out.push(slot);
        }
        self.keys.grow_to(self.slots.capacity());
        out
    }

    /// Registers the fields a write is about to store (without schema or members), so that a
    /// clear of the written samples names their cells even if the writer never gets to its
    /// production notice (see [`Partition::mark_clearing`]).
    pub fn note_fields_written<'a>(&mut self, names: impl IntoIterator<Item = &'a FieldName>) {
        for name in names {
            self.fields.register(name);
        }
    }

    /// Builds the metadata of `slots` for the fields `fids`.
    #[allow(clippy::expect_used)] // every per-row vector below is built from the same `slots`
    pub fn build_meta(&self, slots: &[u32], fids: &[usize], production: Production) -> BatchMeta {
        let samples = slots.iter().map(|&s| self.slots.id(s)).collect();
        let fields: BTreeMap<FieldName, FieldMeta> = fids
            .iter()
            .map(|&f| {
                (
                    self.fields.name(f).clone(),
                    self.fields.get(f).schema(slots),
                )
            })
            .collect();
        let production = match production {
            Production::AllReady => vec![true; slots.len()],
            Production::NoneReady => vec![false; slots.len()],
            Production::Computed => slots
                .iter()
                .map(|&s| {
                    !fids.is_empty()
                        && self.slots.visible(s)
                        && fids.iter().all(|&f| self.fields.produced(f, s))
                })
                .collect(),
        };
        let names: HashSet<&str> = fids.iter().map(|&f| self.fields.name(f).as_str()).collect();
        let backend_meta = slots
            .iter()
            .map(|&s| {
                self.slots
                    .backend_meta(s)
                    .iter()
                    .filter(|(k, _)| names.contains(k.as_str()))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
            .collect();
        let links = slots
            .iter()
            .map(|&s| {
                self.links
                    .of_slot(s)
                    .map(|l| {
                        l.iter()
                            .filter(|(f, _)| fids.contains(f))
                            .map(|(&f, &src)| (self.fields.name(f).clone(), src))
                            .collect()
                    })
                    .unwrap_or_default()
            })
            .collect();
        BatchMeta::from_parts(BatchMetaParts {
            partition: self.name.clone(),
            samples,
            fields,
            production,
            tags: slots.iter().map(|&s| self.slots.tags(s).clone()).collect(),
            backend_meta,
            lease: None,
            links,
        })
        .expect("per-row vectors are built from the same slots")
    }

    /// Field ids of `names`, or `None` if any is not registered.
    pub fn known_fields(&self, names: &[FieldName]) -> Option<Vec<usize>> {
        self.fields.known(names)
    }

    /// Slots of `ids`, which must all be visible samples of this partition.
    pub fn slots_of(&self, ids: &[SampleId]) -> Result<Vec<u32>> {
        ids.iter()
            .map(|&id| {
                let slot = self.slots.slot_for(id).ok_or_else(|| {
                    Error::conflict(format!(
                        "partition `{}`: sample {id} is not owned by this partition (cleared or reused)",
                        self.name
                    ))
                })?;
                if self.slots.is_clearing(slot) {
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
            let f = self.fields.register(name);
            self.fields.get_mut(f).add(&slots, schema);
        }
        if let Some(tags) = &n.tags {
            self.extend_tags(&slots, tags);
        }
        let mut replaced = Vec::new();
        if let Some(bm) = &n.backend_meta {
            for (r, (&s, m)) in slots.iter().zip(bm).enumerate() {
                let row = self.slots.backend_meta_mut(s);
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

    fn extend_tags(&mut self, slots: &[u32], tags: &[Tags]) {
        for (&s, t) in slots.iter().zip(tags) {
            self.slots
                .tags_mut(s)
                .extend(t.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
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
        self.extend_tags(&slots, tags);
        Ok(())
    }

    pub fn production_status(&self, names: &[FieldName]) -> ProductionStatus {
        let slots = self.slots.visible_in_order();
        let fids: Vec<Option<usize>> = names.iter().map(|n| self.fields.id(n)).collect();
        let mut produced = Vec::with_capacity(slots.len() * names.len());
        for &s in &slots {
            for f in &fids {
                produced.push(f.is_some_and(|f| self.fields.produced(f, s)));
            }
        }
        ProductionStatus {
            samples: slots.iter().map(|&s| self.slots.id(s)).collect(),
            fields: names.to_vec(),
            produced,
        }
    }

    /// Field ids of `names` that exist in this partition.
    pub fn field_ids_of(&self, names: &[FieldName]) -> Vec<usize> {
        self.fields.ids_of(names)
    }

    /// The sample in `slot`.
    pub fn sample_of(&self, slot: u32) -> SampleId {
        self.slots.id(slot)
    }

    /// Fields produced for every one of `slots` (none when `slots` is empty).
    pub fn common_fields(&self, slots: &[u32]) -> Vec<usize> {
        if slots.is_empty() {
            return Vec::new();
        }
        self.fields
            .populated()
            .map(|(f, _)| f)
            .filter(|&f| slots.iter().all(|&s| self.fields.produced(f, s)))
            .collect()
    }

    /// Metadata of every visible sample for `names` (registered ones only), production per row.
    pub fn force_meta(&self, names: &[FieldName]) -> BatchMeta {
        let slots = self.slots.visible_in_order();
        let fids = self.fields.ids_of(names);
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
