//! Writing and removing cells: batches per store, TTL re-arm, clears and expiry.

use super::*;

impl KvStorageManager {
    pub(super) fn check_rows(&self, meta: &BatchMeta, batch: &Batch) -> Result<()> {
        if batch.len() != meta.len() && !batch.columns().is_empty() {
            return Err(Error::invalid(format!(
                "{}: a batch of {} rows for {} samples",
                self.ctx(meta),
                batch.len(),
                meta.len()
            )));
        }
        let mut seen = HashSet::with_capacity(meta.len());
        if let Some(s) = meta.samples().iter().find(|s| !seen.insert(s.index)) {
            return Err(Error::invalid(format!(
                "{}: sample index {} appears twice in one request",
                self.ctx(meta),
                s.index
            )));
        }
        Ok(())
    }

    /// Deletes the cells a put wrote (`written`: their places) for samples it lost to a reuse
    /// of their index (best effort: they are keyed by the stale generation, so nothing reads
    /// them either way).
    pub(super) async fn discard(
        &self,
        ks: &KeyScheme,
        samples: &[SampleId],
        written: &[BackendMeta],
        lost: &[(SampleId, u32)],
    ) {
        let rows = samples
            .iter()
            .zip(written)
            .filter(|(s, _)| lost.iter().any(|(l, _)| l == *s));
        self.delete_written(ks, rows, |_| true).await;
    }

    /// After a failed write: deletes the cells it wrote under a nonzero version (beside cells
    /// the controller still describes; nothing reads them). Best effort. Version-0 cells stay:
    /// they may be the only copy of a sample whose backend meta this manager was not given, and
    /// repeating the write replaces them.
    pub(super) async fn discard_versions(
        &self,
        ks: &KeyScheme,
        samples: &[SampleId],
        written: &[BackendMeta],
    ) {
        self.delete_written(ks, samples.iter().zip(written), |loc| loc.version != 0)
            .await;
    }

    async fn delete_written<'a>(
        &self,
        ks: &KeyScheme,
        rows: impl Iterator<Item = (&'a SampleId, &'a BackendMeta)>,
        pick: impl Fn(&CellLoc) -> bool,
    ) {
        let mut plan = Plan::new(self.stores.len());
        let mut tags = self.tags();
        for (s, row) in rows {
            for (field, raw) in row {
                let Ok(loc) = CellLoc::decode(raw) else {
                    continue;
                };
                if !pick(&loc) {
                    continue;
                }
                if let Ok(i) = tags.resolve(&loc.tag) {
                    plan.push(i, ks.cell_at(*s, field, loc.version), 0);
                }
            }
        }
        if let Err(e) = self.remove(&plan, false).await {
            let keys: usize = plan.keys.iter().map(Vec::len).sum();
            tracing::warn!(error = %e, keys, "could not remove the cells of a failed or stale write");
        }
    }

    /// Writes `items` grouped per store; generation keys go with the primary store's batch.
    pub(super) async fn write(&self, per_store: Vec<Vec<(String, KvValue)>>) -> Result<()> {
        let ttl = self.options.data_ttl;
        let writes = per_store
            .into_iter()
            .enumerate()
            .filter(|(_, items)| !items.is_empty())
            .map(|(i, items)| self.stores[i].store.mset_all(items, ttl));
        futures::future::try_join_all(writes).await.map(|_| ())
    }

    /// With a TTL configured: the keys of every cell a sample of `meta` holds (its backend meta
    /// lists them) that this write does not rewrite, so their deadline can be re-armed with the
    /// written ones. A sample being written must not lose a field it wrote earlier to expiry.
    pub(super) fn rearm_plan(&self, meta: &BatchMeta, written: &[&str]) -> Result<Option<Plan>> {
        if self.options.data_ttl.is_none() {
            return Ok(None);
        }
        let ks = self.keys(meta.partition());
        let mut plan = Plan::new(self.stores.len());
        let mut tags = self.tags();
        let mut any = false;
        for (s, row) in meta.samples().iter().zip(meta.backend_meta()) {
            for field in row.keys().filter(|f| !written.contains(&f.as_str())) {
                self.plan_existing(&mut plan, &mut tags, &ks, *s, Some(row), field, 0)?;
                any = true;
            }
        }
        Ok(any.then_some(plan))
    }

    /// Writes `per_store` and re-arms the deadlines of `rearm` (see [`Self::rearm_plan`]).
    pub(super) async fn write_rearming(
        &self,
        per_store: Vec<Vec<(String, KvValue)>>,
        rearm: Option<Plan>,
    ) -> Result<()> {
        futures::future::try_join(self.write(per_store), self.rearm_calls(rearm.as_ref()))
            .await
            .map(|_| ())
    }

    /// Re-arms the deadlines of `rearm` (nothing without a plan or a TTL).
    pub(super) async fn rearm_calls(&self, rearm: Option<&Plan>) -> Result<()> {
        let Some((plan, ttl)) = rearm.zip(self.options.data_ttl) else {
            return Ok(());
        };
        let rearms = plan
            .keys
            .iter()
            .enumerate()
            .filter(|(_, k)| !k.is_empty())
            .map(|(i, keys)| self.stores[i].store.expire_all(keys, ttl));
        futures::future::try_join_all(rearms).await.map(|_| ())
    }

    /// Removes keys: deletes them, or with `expire` marks them to disappear shortly.
    pub(super) async fn remove(&self, plan: &Plan, expire: bool) -> Result<()> {
        let after = self.options.clear_expire_after;
        let ops = plan
            .keys
            .iter()
            .enumerate()
            .filter(|(_, k)| !k.is_empty())
            .map(|(i, keys)| {
                let store = &self.stores[i].store;
                async move {
                    if expire {
                        store.expire_all(keys, after).await
                    } else {
                        store.delete_all(keys).await
                    }
                }
            });
        futures::future::try_join_all(ops).await.map(|_| ())
    }

    /// Removes the cells of `filter` and, for whole samples, the generation keys. Cells are
    /// expired instead of deleted when `expire` is set and a TTL is configured.
    pub(super) async fn clear_impl(
        &self,
        meta: &BatchMeta,
        filter: &FieldFilter,
        expire: bool,
    ) -> Result<()> {
        let expire = expire && self.options.data_ttl.is_some();
        if meta.is_empty() {
            return Ok(());
        }
        let ks = self.keys(meta.partition());
        let fields: Vec<&str> = match filter {
            FieldFilter::All => meta.field_names().collect(),
            FieldFilter::Only(f) => f.iter().map(String::as_str).collect(),
        };
        let mut plan = Plan::new(self.stores.len());
        let mut tags = self.tags();
        // Sample-major, in the order `put` writes (see there).
        for (r, s) in meta.samples().iter().enumerate() {
            for field in &fields {
                self.plan_existing(
                    &mut plan,
                    &mut tags,
                    &ks,
                    *s,
                    meta.backend_meta().get(r),
                    field,
                    0,
                )?;
            }
        }
        // A whole-sample clear also deletes the generation keys — at once, with the cells:
        // it is what makes the samples unreadable — unless a newer generation raised them (a
        // check-and-delete in one step where the store can, see `clear_generations`).
        let mut gens: Vec<(String, u32)> = Vec::new();
        if matches!(filter, FieldFilter::All) {
            let mut newest: BTreeMap<u32, u32> = BTreeMap::new();
            for s in meta.samples() {
                let g = newest.entry(s.index).or_insert(s.generation);
                *g = (*g).max(s.generation);
            }
            gens = newest
                .into_iter()
                .map(|(index, g)| (ks.generation(index), g))
                .collect();
        }
        futures::future::try_join(
            self.stores[0].store.clear_generations_all(gens),
            self.remove(&plan, expire),
        )
        .await
        .map(|_| ())
        .map_err(|e| e.context(self.ctx(meta)))
    }
}
