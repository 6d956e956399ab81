//! [`MemoryUnit`]: the in-process storage unit.

use crate::api::{
    check_threshold, CellShape, StorageUnit, UnitConfig, UnitPut, UnitRows, UnitStats, UnitUpdate,
    UnitUpdateReply,
};
use crate::block::BlockTable;
use crate::index::{IndexMap, IndexSet};
use async_trait::async_trait;
use bytes::Bytes;
use reclaim::{free_behind, ReclaimCounters};
use state::{Cell, State};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use tq_core::{
    apply_merge, Error, FieldFilter, FieldName, MergeOp, MergeRegistry, Result, SampleId, Tensor,
    Value,
};

/// How many times [`MemoryUnit`] recomputes an update whose cells were rewritten concurrently
/// while the merge ran outside the lock, before giving up with `Conflict`.
const UPDATE_ATTEMPTS: usize = 4;

/// The members (sample index, bytes) and total bytes of a block a put is about to open.
type BlockMembers = (Vec<(u32, u64)>, u64);

/// Copies a value into a buffer of its own, so that it no longer pins a shared allocation.
fn owned_copy(value: &Value) -> Value {
    match value {
        #[allow(clippy::expect_used)] // a copy has the same dtype, shape and length as its source
        Value::Tensor(t) => Value::Tensor(
            Tensor::new(
                t.dtype(),
                t.shape().to_vec(),
                Bytes::copy_from_slice(t.data()),
            )
            .expect("same dtype, shape and length"),
        ),
        Value::Object(b) => Value::Object(Bytes::copy_from_slice(b)),
    }
}

/// The address range covered by `values` (all slices of one allocation), if any bytes.
fn address_span(values: &[Value]) -> Option<(usize, usize)> {
    values
        .iter()
        .map(Value::bytes)
        .filter(|b| !b.is_empty())
        .map(|b| (b.as_ptr() as usize, b.as_ptr() as usize + b.len()))
        .reduce(|(lo, hi), (l, h)| (lo.min(l), hi.max(h)))
}

/// An in-process storage unit: cells in hash maps behind one mutex.
///
/// Critical sections are short and never span an `.await`: puts and clears only move `Bytes`
/// handles, gets clone them (reference counts, no payload copy). The expensive parts — computing
/// merge results and copying survivors during compaction — run outside the lock and are
/// committed afterwards (an update whose cells changed meanwhile is recomputed).
///
/// Rows of a put that come from one allocation ([`UnitRows::shared_allocation`]) are stored as
/// slices of it and tracked as a block; see the crate docs for the compaction policy.
#[derive(Debug)]
pub struct MemoryUnit {
    id: String,
    capacity: Option<usize>,
    registry: MergeRegistry,
    state: Mutex<State>,
    /// Whether large clears free their buffers behind the answer ([`reclaim`]).
    free_behind: bool,
    /// This unit's share of the bytes freed, behind its clears or inline.
    reclaimed: Arc<ReclaimCounters>,
}

impl MemoryUnit {
    /// A unit with no capacity limit, the default compaction threshold and no named merges.
    pub fn new(id: impl Into<String>) -> Self {
        #[allow(clippy::expect_used)] // the default threshold is within 0..=1
        Self::with_config(id, UnitConfig::default()).expect("the default config is valid")
    }

    /// A unit with the given capacity, compaction threshold and merge registry. A threshold
    /// outside `0..=1` is `Invalid`.
    pub fn with_config(id: impl Into<String>, config: UnitConfig) -> Result<Self> {
        let id = id.into();
        check_threshold(config.compaction_threshold).map_err(|e| e.context(unit_name(&id)))?;
        Ok(MemoryUnit {
            id,
            capacity: config.capacity,
            registry: config.merge_registry,
            state: Mutex::new(State {
                fields: HashMap::new(),
                spare_maps: Vec::new(),
                rows: IndexMap::default(),
                blocks: BlockTable::new(config.compaction_threshold),
                cells: 0,
                live_bytes: 0,
                next_stamp: 0,
            }),
            free_behind: false,
            reclaimed: Arc::default(),
        })
    }

    /// Whether clears of 32 MiB or more (or of cells in shared-memory segments, with the `net`
    /// feature) answer once their cells are unreachable and free the
    /// buffers behind the answer (see [`reclaim`]); off by default. Worth it where the unit
    /// owns its buffers, as a unit served over the network does (its cells are slices of the
    /// frames it received): not for a unit storing slices of its caller's batches.
    pub fn free_cleared_behind(mut self, on: bool) -> Self {
        self.free_behind = on;
        self
    }

    /// The capacity in samples, if limited.
    pub fn capacity(&self) -> Option<usize> {
        self.capacity
    }

    /// The reclaimer's counters of this unit, by their [`UnitStats::counters`] names.
    fn reclaim_counters(&self) -> BTreeMap<String, u64> {
        let (pending, behind, inline) = self.reclaimed.read();
        [
            (reclaim::RECLAIM_PENDING, pending),
            (reclaim::RECLAIMED_BEHIND, behind),
            (reclaim::RECLAIMED_INLINE, inline),
        ]
        .into_iter()
        .map(|(name, v)| (name.to_string(), v))
        .collect()
    }

    fn name(&self) -> String {
        unit_name(&self.id)
    }

    /// Locks the state. A poisoned lock means a panic interrupted a mutation; the state may be
    /// inconsistent, so the unit refuses to serve rather than return wrong data.
    fn lock(&self) -> Result<MutexGuard<'_, State>> {
        self.state.lock().map_err(|_| {
            Error::internal(format!(
                "{}: state lock poisoned by an earlier panic; the unit no longer serves",
                self.name()
            ))
        })
    }

    /// Checks the shape of a request: one row per sample for every field, distinct indexes,
    /// non-empty field names.
    fn check_request(
        &self,
        op: &str,
        samples: &[SampleId],
        fields: &BTreeMap<FieldName, UnitRows>,
    ) -> Result<()> {
        for (name, rows) in fields {
            if name.is_empty() {
                return Err(Error::invalid(format!(
                    "{}: {op} with an empty field name",
                    self.name()
                )));
            }
            if rows.values.len() != samples.len() {
                return Err(Error::invalid(format!(
                    "{}: {op} of field `{name}` has {} rows for {} samples",
                    self.name(),
                    rows.values.len(),
                    samples.len()
                )));
            }
        }
        let mut seen = IndexSet::with_capacity_and_hasher(samples.len(), Default::default());
        if let Some(dup) = samples.iter().find(|s| !seen.insert(s.index)) {
            return Err(Error::invalid(format!(
                "{}: {op} names sample index {} more than once",
                self.name(),
                dup.index
            )));
        }
        Ok(())
    }

    /// The error for a cell that is not stored with the requested generation.
    fn missing(&self, st: &State, op: &str, field: &str, sample: SampleId) -> Error {
        let detail = match (st.rows.get(&sample.index), st.fields.get(field)) {
            (None, _) => format!("index {} holds nothing on this unit", sample.index),
            (Some(row), _) if row.generation != sample.generation => format!(
                "the unit holds generation {} of index {}",
                row.generation, sample.index
            ),
            _ => format!("index {} does not hold this field", sample.index),
        };
        Error::not_found(format!(
            "{}: {op}: field `{field}` of sample {sample} is not stored ({detail})",
            self.name()
        ))
    }

    /// Copies the survivors of every sparse block into owned buffers. Each block is gathered
    /// under the lock, copied without it, and swapped in under the lock again; a cell that was
    /// rewritten meanwhile has already left the block and is skipped.
    fn compact_pending(&self) {
        loop {
            let (id, field, survivors) = {
                let Ok(mut st) = self.lock() else { return };
                let Some((id, job)) = st.blocks.next_job() else {
                    return;
                };
                let survivors: Vec<(u32, Value)> = match st.fields.get(&job.field) {
                    Some(map) => job
                        .members
                        .iter()
                        .filter_map(|i| {
                            map.get(i)
                                .filter(|c| c.block == Some(id))
                                .map(|c| (*i, c.value.clone()))
                        })
                        .collect(),
                    None => Vec::new(),
                };
                (id, job.field, survivors)
            };
            let copies: Vec<(u32, Value)> = survivors
                .into_iter()
                .map(|(i, v)| (i, owned_copy(&v)))
                .collect();
            let Ok(mut guard) = self.lock() else { return };
            let st = &mut *guard;
            let mut copied = 0u64;
            let mut rows = 0usize;
            if let Some(map) = st.fields.get_mut(&field) {
                for (i, v) in copies {
                    if let Some(cell) = map.get_mut(&i).filter(|c| c.block == Some(id)) {
                        let n = v.nbytes() as u64;
                        cell.value = v;
                        cell.block = None;
                        st.blocks.release(id, n);
                        copied += n;
                        rows += 1;
                    }
                }
            }
            st.blocks.record_compaction(copied);
            debug_assert!(!st.blocks.contains(id), "compacted block still tracked");
            tracing::debug!(
                unit = %self.id,
                field = %field,
                rows,
                bytes = copied,
                "compacted a sparse shared allocation"
            );
        }
    }

    /// Runs pending compactions, if any, after a mutation released the lock.
    fn after_mutation(&self) {
        let pending = self.lock().map(|st| st.blocks.has_pending());
        if pending.unwrap_or(false) {
            self.compact_pending();
        }
    }

    /// Per field of `req` (in its order), the members and total bytes of the block its rows
    /// form, if they share an allocation. Depends only on the request, so it is computed
    /// before taking the lock.
    fn block_members(req: &UnitPut) -> Vec<Option<BlockMembers>> {
        req.fields
            .values()
            .map(|rows| {
                rows.shared_allocation.then(|| {
                    let members: Vec<(u32, u64)> = req
                        .samples
                        .iter()
                        .zip(&rows.values)
                        .map(|(s, v)| (s.index, v.nbytes() as u64))
                        .collect();
                    let total = members.iter().map(|&(_, b)| b).sum();
                    (members, total)
                })
            })
            .collect()
    }

    fn put_locked(
        &self,
        st: &mut State,
        req: UnitPut,
        block_members: Vec<Option<BlockMembers>>,
        freed: &mut Vec<Value>,
    ) -> Result<()> {
        // Validate everything before touching anything.
        for s in &req.samples {
            if let Some(row) = st.rows.get(&s.index) {
                if row.generation > s.generation {
                    return Err(Error::conflict(format!(
                        "{}: put of sample index {} with generation {} is stale; the unit holds \
                         generation {}",
                        self.name(),
                        s.index,
                        s.generation,
                        row.generation
                    )));
                }
            }
        }
        if req.fields.is_empty() {
            return Ok(());
        }
        if let Some(capacity) = self.capacity {
            let existing = st.rows.len();
            let new = req
                .samples
                .iter()
                .filter(|s| !st.rows.contains_key(&s.index))
                .count();
            if existing + new > capacity {
                return Err(Error::capacity_exceeded(format!(
                    "{}: storage capacity exceeded: {existing} existing + {new} new > {capacity} \
                     samples",
                    self.name()
                )));
            }
        }
        // A newer generation takes the index over: nothing of the old sample may stay readable.
        let older: Vec<u32> = req
            .samples
            .iter()
            .filter(|s| {
                st.rows
                    .get(&s.index)
                    .is_some_and(|r| r.generation < s.generation)
            })
            .map(|s| s.index)
            .collect();
        if !older.is_empty() {
            st.purge(&older, freed);
        }
        let stamp = st.stamp();
        for ((field, rows), members) in req.fields.into_iter().zip(block_members) {
            let block = members.and_then(|(members, total)| st.blocks.open(&field, members, total));
            let cells = req.samples.iter().zip(rows.values).map(|(s, value)| {
                let cell = Cell {
                    generation: s.generation,
                    value,
                    block,
                    stamp,
                };
                (*s, cell)
            });
            st.insert_field(&field, cells);
        }
        Ok(())
    }

    /// Snapshot of the cells an update reads: per field, (stored value, stamp) per sample.
    fn update_snapshot(
        &self,
        samples: &[SampleId],
        fields: &BTreeMap<FieldName, UnitRows>,
    ) -> Result<Vec<Vec<(Value, u64)>>> {
        let st = self.lock()?;
        let mut out = Vec::with_capacity(fields.len());
        for field in fields.keys() {
            let map = st.fields.get(field);
            let mut col = Vec::with_capacity(samples.len());
            for s in samples {
                match map.and_then(|m| m.get(&s.index)) {
                    Some(c) if c.generation == s.generation => col.push((c.value.clone(), c.stamp)),
                    _ => return Err(self.missing(&st, "update", field, *s)),
                }
            }
            out.push(col);
        }
        Ok(out)
    }

    /// Computes every merge result; the first failure aborts with nothing changed.
    fn compute_merges(
        &self,
        samples: &[SampleId],
        fields: &BTreeMap<FieldName, UnitRows>,
        stored: &[Vec<(Value, u64)>],
        merge: &MergeOp,
    ) -> Result<Vec<Vec<Value>>> {
        fields
            .iter()
            .zip(stored)
            .map(|((field, rows), olds)| {
                samples
                    .iter()
                    .zip(rows.values.iter().zip(olds))
                    .map(|(s, (new, (old, _)))| {
                        apply_merge(merge, &self.registry, old, new).map_err(|e| {
                            e.context(format!(
                                "{}: update of field `{field}` of sample {s}",
                                self.name()
                            ))
                        })
                    })
                    .collect()
            })
            .collect()
    }

    /// Commits merge results if no cell changed since the snapshot. Returns false (nothing
    /// written) when one did.
    fn update_commit(
        &self,
        req: &UnitUpdate,
        stored: &[Vec<(Value, u64)>],
        results: Vec<Vec<Value>>,
    ) -> Result<bool> {
        let mut guard = self.lock()?;
        let st = &mut *guard;
        for (field, olds) in req.fields.keys().zip(stored) {
            let map = st.fields.get(field);
            for (s, (_, stamp)) in req.samples.iter().zip(olds) {
                if map.and_then(|m| m.get(&s.index)).map(|c| c.stamp) != Some(*stamp) {
                    return Ok(false);
                }
            }
        }
        let stamp = st.stamp();
        for ((field, rows), results) in req.fields.iter().zip(results) {
            // Results that are slices of the request's allocation (e.g. `Replace` of a dense
            // column) pin it just like a put does: track them as a block.
            let span = rows
                .shared_allocation
                .then(|| address_span(&rows.values))
                .flatten();
            let aliases = |v: &Value| {
                let b = v.bytes();
                let p = b.as_ptr() as usize;
                span.is_some_and(|(lo, hi)| !b.is_empty() && p >= lo && p + b.len() <= hi)
            };
            let members: Vec<(u32, u64)> = req
                .samples
                .iter()
                .zip(&results)
                .filter(|(_, v)| aliases(v))
                .map(|(s, v)| (s.index, v.nbytes() as u64))
                .collect();
            let block = if members.is_empty() {
                None
            } else {
                let total = rows.values.iter().map(|v| v.nbytes() as u64).sum();
                st.blocks.open(field, members, total)
            };
            let cells = req.samples.iter().zip(results).map(|(s, value)| {
                let block = if aliases(&value) { block } else { None };
                let cell = Cell {
                    generation: s.generation,
                    value,
                    block,
                    stamp,
                };
                (*s, cell)
            });
            st.insert_field(field, cells);
        }
        Ok(true)
    }
}

fn unit_name(id: &str) -> String {
    format!("storage unit `{id}`")
}

pub mod reclaim;
mod state;
mod unit_impl;
