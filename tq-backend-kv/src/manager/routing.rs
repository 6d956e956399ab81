//! Where cells go: the plan of one request (per store, keys and cell positions), and the routing
//! of new and existing cells to stores, by size or by tag (with the tags of a request resolved
//! once each).

use super::*;

/// Where the cells of one request go: per store, the keys and the cell positions they fill.
pub(super) struct Plan {
    pub(super) keys: Vec<Vec<String>>,
    pub(super) slots: Vec<Vec<usize>>,
}

impl Plan {
    pub(super) fn new(stores: usize) -> Self {
        Plan {
            keys: vec![Vec::new(); stores],
            slots: vec![Vec::new(); stores],
        }
    }
    pub(super) fn push(&mut self, store: usize, key: String, slot: usize) {
        self.keys[store].push(key);
        self.slots[store].push(slot);
    }
}

/// Resolves routing tags to stores once per distinct tag of a request, not once per cell.
pub(super) struct TagCache<'a> {
    pub(super) manager: &'a KvStorageManager,
    pub(super) seen: Vec<(Bytes, usize)>,
}

impl TagCache<'_> {
    pub(super) fn resolve(&mut self, tag: &Bytes) -> Result<usize> {
        if let Some((_, i)) = self.seen.iter().find(|(t, _)| t == tag) {
            return Ok(*i);
        }
        let i = self
            .manager
            .stores
            .iter()
            .position(|s| s.tag == tag)
            .ok_or_else(|| {
                Error::invalid(format!(
                    "kv backend meta names store `{}`, which is not configured (stores: {:?})",
                    String::from_utf8_lossy(tag),
                    self.manager.store_names()
                ))
            })?;
        self.seen.push((tag.clone(), i));
        Ok(i)
    }
}

impl KvStorageManager {
    pub(super) fn tags(&self) -> TagCache<'_> {
        TagCache {
            manager: self,
            seen: Vec::new(),
        }
    }

    /// The store a new cell of `field` with `nbytes` of payload goes to.
    pub(super) fn route_new(&self, field: &str, nbytes: usize) -> usize {
        match &self.route {
            Route::First => 0,
            Route::ByField { fields, default } => fields.get(field).copied().unwrap_or(*default),
            Route::BySize {
                threshold,
                small,
                large,
            } => {
                if nbytes <= *threshold {
                    *small
                } else {
                    *large
                }
            }
        }
    }

    /// Where an existing cell without a routing tag may be: one store, or (size routing) all.
    pub(super) fn route_untagged(&self, field: &str) -> Option<usize> {
        match &self.route {
            Route::First => Some(0),
            Route::ByField { fields, default } => {
                Some(fields.get(field).copied().unwrap_or(*default))
            }
            Route::BySize { .. } => None,
        }
    }

    /// Adds the existing cell of `field` of `sample` at `slot` to `plan`: to the store and
    /// version its backend meta names, else (no backend meta) version 0 wherever it can be.
    #[allow(clippy::too_many_arguments)] // one cell's coordinates; a struct would only rename them
    pub(super) fn plan_existing(
        &self,
        plan: &mut Plan,
        tags: &mut TagCache<'_>,
        ks: &KeyScheme,
        sample: SampleId,
        row_meta: Option<&BackendMeta>,
        field: &str,
        slot: usize,
    ) -> Result<()> {
        match row_meta.and_then(|m| m.get(field)) {
            Some(raw) => {
                let loc = CellLoc::decode(raw)?;
                plan.push(
                    tags.resolve(&loc.tag)?,
                    ks.cell_at(sample, field, loc.version),
                    slot,
                )
            }
            None => {
                let key = ks.cell(sample, field);
                match self.route_untagged(field) {
                    Some(i) => plan.push(i, key, slot),
                    None => {
                        for i in 0..self.stores.len() {
                            plan.push(i, key.clone(), slot);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// The key of the existing cell of `field` of `sample` (for messages).
    pub(super) fn existing_key(
        ks: &KeyScheme,
        sample: SampleId,
        row_meta: Option<&BackendMeta>,
        field: &str,
    ) -> String {
        let version = row_meta
            .and_then(|m| m.get(field))
            .and_then(|raw| CellLoc::decode(raw).ok())
            .map_or(0, |l| l.version);
        ks.cell_at(sample, field, version)
    }
}
