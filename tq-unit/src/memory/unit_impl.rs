//! [`StorageUnit`] for [`MemoryUnit`]: each operation validates the whole request, then applies
//! it under the unit's lock (or computes outside it and re-checks, for updates).

use super::*;
use tq_core::cells::FieldCells;

#[async_trait]
impl StorageUnit for MemoryUnit {
    fn id(&self) -> &str {
        &self.id
    }

    async fn put(&self, req: UnitPut) -> Result<()> {
        self.check_request("put", &req.samples, &req.fields)?;
        if req.samples.is_empty() {
            return Ok(());
        }
        let block_members = Self::block_members(&req);
        let mut freed = Vec::new();
        {
            let mut st = self.lock()?;
            self.put_locked(&mut st, req, block_members, &mut freed)?;
        }
        // The cells of older samples the put took the index from: freed outside the lock.
        drop(freed);
        self.after_mutation();
        Ok(())
    }

    async fn get(&self, fields: &[FieldName], samples: &[SampleId]) -> Result<Vec<Vec<Value>>> {
        // The reply vectors are allocated before taking the lock; under it only handles are
        // cloned.
        let mut out: Vec<Vec<Value>> = fields
            .iter()
            .map(|_| Vec::with_capacity(samples.len()))
            .collect();
        let st = self.lock()?;
        for (field, col) in fields.iter().zip(&mut out) {
            let map = st.fields.get(field);
            for s in samples {
                match map.and_then(|m| m.get(&s.index)) {
                    Some(c) if c.generation == s.generation => col.push(c.value.clone()),
                    _ => return Err(self.missing(&st, "get", field, *s)),
                }
            }
        }
        Ok(out)
    }

    async fn update(&self, req: UnitUpdate, merge: &MergeOp) -> Result<UnitUpdateReply> {
        self.check_request("update", &req.samples, &req.fields)?;
        if req.samples.is_empty() || req.fields.is_empty() {
            return Ok(UnitUpdateReply {
                fields: req.fields.keys().map(|f| (f.clone(), Vec::new())).collect(),
            });
        }
        for attempt in 1..=UPDATE_ATTEMPTS {
            let stored = self.update_snapshot(&req.samples, &req.fields)?;
            let results = self.compute_merges(&req.samples, &req.fields, &stored, merge)?;
            let shapes: BTreeMap<FieldName, Vec<CellShape>> = req
                .fields
                .keys()
                .zip(&results)
                .map(|(f, col)| (f.clone(), col.iter().map(CellShape::of).collect()))
                .collect();
            if self.update_commit(&req, &stored, results)? {
                self.after_mutation();
                return Ok(UnitUpdateReply { fields: shapes });
            }
            tracing::debug!(unit = %self.id, attempt, "cells changed during update; recomputing");
        }
        Err(Error::conflict(format!(
            "{}: update of {} samples: the cells were rewritten concurrently {UPDATE_ATTEMPTS} \
             times while merging; nothing was merged",
            self.name(),
            req.samples.len()
        )))
    }

    /// Takes the cells out of the maps under the lock (from then on no get finds them), then
    /// frees their buffers outside it: behind the reply, if the unit is set to (see
    /// [`super::reclaim`]).
    async fn clear(&self, samples: &[SampleId], fields: &FieldFilter) -> Result<()> {
        let mut freed = Vec::new();
        let freed_bytes = {
            let mut st = self.lock()?;
            let before = st.live_bytes;
            // Only cells of this generation or older: a stale clear never deletes the sample
            // that took the index over.
            let indexes: Vec<u32> = samples
                .iter()
                .filter(|s| {
                    st.rows
                        .get(&s.index)
                        .is_some_and(|row| row.generation <= s.generation)
                })
                .map(|s| s.index)
                .collect();
            match fields {
                FieldFilter::All => st.purge(&indexes, &mut freed),
                // Field by field, for the reason `purge` gives.
                FieldFilter::Only(names) => {
                    for name in names {
                        for &index in &indexes {
                            freed.extend(st.remove(name, index));
                        }
                    }
                }
            }
            before - st.live_bytes
        };
        free_behind(freed, freed_bytes, self.free_behind, &self.reclaimed);
        self.after_mutation();
        Ok(())
    }

    /// Clones every cell under the lock: values are reference-counted buffers, so this walks
    /// the maps without copying payload bytes.
    async fn all_cells(&self) -> Result<Vec<FieldCells>> {
        let st = self.lock()?;
        let mut names: Vec<&FieldName> = st.fields.keys().collect();
        names.sort();
        Ok(names
            .into_iter()
            .map(|name| {
                let map = &st.fields[name];
                let mut indexes: Vec<u32> = map.keys().copied().collect();
                indexes.sort_unstable();
                let mut cells = FieldCells {
                    field: name.clone(),
                    samples: Vec::with_capacity(indexes.len()),
                    values: Vec::with_capacity(indexes.len()),
                };
                for index in indexes {
                    let cell = &map[&index];
                    cells.samples.push(SampleId::new(index, cell.generation));
                    cells.values.push(cell.value.clone());
                }
                cells
            })
            .collect())
    }

    async fn stats(&self) -> Result<UnitStats> {
        let st = self.lock()?;
        let b = st.blocks.counters();
        Ok(UnitStats {
            unit_id: self.id.clone(),
            rows: st.rows.len(),
            cells: st.cells,
            live_bytes: st.live_bytes,
            shared_blocks: b.blocks,
            shared_retained_bytes: b.retained_bytes,
            shared_live_bytes: b.live_bytes,
            compactions: b.compactions,
            compacted_bytes: b.compacted_bytes,
            capacity: self.capacity,
            counters: self.reclaim_counters(),
            ..UnitStats::default()
        })
    }
}
