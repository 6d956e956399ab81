//! [`StorageUnit`] for [`SsdUnit`]: each operation goes to the inner memory unit, with disk
//! cells staged, read and reclaimed around it under the disk index's lock.

use super::*;

#[async_trait]
impl StorageUnit for SsdUnit {
    fn id(&self) -> &str {
        &self.id
    }

    async fn put(&self, req: UnitPut) -> Result<()> {
        let Some(off) = &self.offload else {
            return self.inner.put(req).await;
        };
        if req
            .fields
            .values()
            .any(|r| r.values.len() != req.samples.len())
        {
            // The inner unit reports the malformed request without changing anything.
            return self.inner.put(req).await;
        }
        self.check_open(&*self.index.read().await)?;
        let staged = self.stage(off, req).await?;
        let mut idx = self.index.write().await;
        let dead = self.commit(&mut idx, staged).await?;
        drop(idx);
        reclaim(dead).await;
        Ok(())
    }

    async fn get(&self, fields: &[FieldName], samples: &[SampleId]) -> Result<Vec<Vec<Value>>> {
        let Some(off) = &self.offload else {
            return self.inner.get(fields, samples).await;
        };
        let idx = self.index.read().await;
        self.check_open(&idx)?;
        // The read lock is held while the files are read, so a concurrent put or clear of these
        // cells waits; the file handles would keep a cleared cell's file alive anyway.
        let (out, held) = self.read(off, &idx, fields, samples).await?;
        drop(idx);
        reclaim(held).await;
        Ok(out)
    }

    /// Every cell, disk cells read back into memory (a checkpoint's capture: its write pause
    /// lasts as long as reading the disk cells takes).
    async fn all_cells(&self) -> Result<Vec<FieldCells>> {
        let Some(off) = &self.offload else {
            return self.inner.all_cells().await;
        };
        let idx = self.index.read().await;
        self.check_open(&idx)?;
        let mut cells = self.inner.all_cells().await?;
        let mut held = Vec::new();
        for fc in &mut cells {
            if !idx.fields.contains_key(&fc.field) {
                continue;
            }
            let (mut columns, files) = self
                .read(off, &idx, std::slice::from_ref(&fc.field), &fc.samples)
                .await?;
            fc.values = columns.pop().unwrap_or_default();
            held.extend(files);
        }
        drop(idx);
        reclaim(held).await;
        Ok(cells)
    }

    async fn update(&self, req: UnitUpdate, merge: &MergeOp) -> Result<UnitUpdateReply> {
        let Some(off) = &self.offload else {
            return self.inner.update(req, merge).await;
        };
        self.check_update(&req)?;
        if req.samples.is_empty() || req.fields.is_empty() {
            return self.inner.update(req, merge).await;
        }
        // The whole update runs under the write lock: read, merge, write, commit.
        let mut idx = self.index.write().await;
        self.check_open(&idx)?;
        let names: Vec<FieldName> = req.fields.keys().cloned().collect();
        let (stored, held) = self.read(off, &idx, &names, &req.samples).await?;
        let mut fields = BTreeMap::new();
        let mut shapes = BTreeMap::new();
        for ((field, rows), olds) in req.fields.into_iter().zip(stored) {
            let results = req
                .samples
                .iter()
                .zip(rows.values.iter().zip(&olds))
                .map(|(s, (new, old))| {
                    let v = apply_merge(merge, &self.registry, old, new).map_err(|e| {
                        e.context(format!(
                            "{}: update of field `{field}` of sample {s}",
                            self.name()
                        ))
                    })?;
                    // A result may be a slice of the request's allocation (`Replace`); small
                    // ones stay in memory, so give them their own buffer.
                    Ok(if rows.shared_allocation && v.nbytes() < off.threshold {
                        owned_copy(&v)
                    } else {
                        v
                    })
                })
                .collect::<Result<Vec<Value>>>()?;
            shapes.insert(field.clone(), results.iter().map(CellShape::of).collect());
            fields.insert(field, UnitRows::separate(results));
        }
        drop(held);
        let put = UnitPut {
            samples: req.samples,
            fields,
        };
        let staged = self.stage(off, put).await?;
        let dead = self.commit(&mut idx, staged).await?;
        drop(idx);
        reclaim(dead).await;
        Ok(UnitUpdateReply { fields: shapes })
    }

    async fn clear(&self, samples: &[SampleId], fields: &FieldFilter) -> Result<()> {
        let Some(off) = &self.offload else {
            return self.inner.clear(samples, fields).await;
        };
        let mut idx = self.index.write().await;
        self.check_open(&idx)?;
        self.inner.clear(samples, fields).await?;
        let mut dead = Vec::new();
        for s in samples {
            let g = s.generation;
            match fields {
                FieldFilter::All => idx.remove_index_if(s.index, |old| old <= g, &mut dead),
                FieldFilter::Only(names) => {
                    for f in names {
                        dead.extend(idx.remove_if(f, s.index, |old| old <= g));
                    }
                }
            }
        }
        drop(idx);
        reclaim(dead).await;
        if off.trim_after_clear && !samples.is_empty() {
            if let Ok(h) = tokio::runtime::Handle::try_current() {
                let _ = h.spawn_blocking(trim_heap).await;
            }
        }
        Ok(())
    }

    async fn stats(&self) -> Result<UnitStats> {
        let idx = self.index.read().await;
        let mut s = self.inner.stats().await?;
        s.live_bytes += idx.bytes;
        s.offloaded_cells = idx.cells;
        s.offloaded_bytes = idx.bytes;
        s.counters.insert(
            FALLBACK_VALUES_TOTAL.to_string(),
            self.fallback_total.load(Ordering::Relaxed),
        );
        Ok(s)
    }
}
