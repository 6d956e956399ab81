//! [`SimpleStorage`]: the [`StorageManager`] that routes samples to storage units.

mod placed;

use async_trait::async_trait;
use bytes::BytesMut;
use futures::future::join_all;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use tq_core::{
    Batch, BatchMeta, Capabilities, Column, DType, Error, FieldFilter, FieldKind, FieldMeta,
    FieldName, MergeOp, MergeRegistry, PutReceipt, Result, SampleId, StorageManager, Tensor, Value,
};
use tq_unit::{
    check_threshold, CellShape, Fetched, IndexSet, MemoryUnit, StorageUnit, UnitConfig, UnitPut,
    UnitRows, UnitStats, UnitUpdate,
};

/// Rows at least this large are read from remote units straight into their column's final
/// buffer (see `SimpleStorage::get_placed`). Smaller rows are cheaper to copy once than to
/// receive one by one.
pub const PLACE_MIN_ROW_BYTES: usize = 16 << 10;

/// Configuration of [`SimpleStorage::in_memory`].
#[derive(Debug, Clone)]
pub struct SimpleConfig {
    /// Capacity of each unit in samples (distinct indexes); `None` is unlimited. Routing is by
    /// runs of indexes ([`tq_core::routing`]), so a unit can fill up before the total is reached when indexes are not
    /// spread evenly.
    pub capacity_per_unit: Option<usize>,
    /// Live fraction of a shared allocation below which units copy its survivors out
    /// (see the crate docs).
    pub compaction_threshold: f64,
    /// Merge functions available to [`MergeOp::Named`] on every unit.
    pub merge_registry: MergeRegistry,
}

impl Default for SimpleConfig {
    fn default() -> Self {
        let unit = UnitConfig::default();
        SimpleConfig {
            capacity_per_unit: unit.capacity,
            compaction_threshold: unit.compaction_threshold,
            merge_registry: unit.merge_registry,
        }
    }
}

/// The default storage backend: samples spread over storage units by index.
///
/// The order of the units given to [`SimpleStorage::new`] is the routing table: the sample with
/// index `i` lives on unit `(i / ROUTING_RUN) % units.len()` ([`tq_core::routing`]: runs of
/// consecutive indexes share a unit). Every process that talks to the same units must
/// use the same order (the controller hands it out), and changing the number of units without
/// moving data makes stored samples unreachable.
///
/// Each operation splits the batch per unit without copying payloads, talks to the units
/// concurrently, and is all-or-nothing per unit (not across units: a failed put or update may
/// leave other units' parts written; the error says which units committed).
pub struct SimpleStorage {
    units: Vec<Arc<dyn StorageUnit>>,
}

impl std::fmt::Debug for SimpleStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimpleStorage")
            .field(
                "units",
                &self.units.iter().map(|u| u.id()).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// Sample positions of a batch, grouped by the unit that holds them (index = unit position).
type Routes = Vec<Vec<usize>>;

impl SimpleStorage {
    /// A manager over `units`, in routing order. At least one unit is needed and unit ids must
    /// be distinct (they name the unit in errors and stats).
    pub fn new(units: Vec<Arc<dyn StorageUnit>>) -> Result<Self> {
        if units.is_empty() {
            return Err(Error::invalid(
                "SimpleStorage needs at least one storage unit",
            ));
        }
        let mut seen = HashSet::new();
        if let Some(dup) = units.iter().find(|u| !seen.insert(u.id())) {
            return Err(Error::invalid(format!(
                "storage unit id `{}` appears more than once in the routing table",
                dup.id()
            )));
        }
        Ok(SimpleStorage { units })
    }

    /// `num_units` in-process [`MemoryUnit`]s named `unit-0`, `unit-1`, ..., each recording the
    /// storage role's request metrics ([`tq_unit::MeteredUnit`]).
    pub fn in_memory(num_units: usize, config: SimpleConfig) -> Result<Self> {
        check_threshold(config.compaction_threshold)?;
        let units = (0..num_units)
            .map(|i| {
                let unit = MemoryUnit::with_config(
                    format!("unit-{i}"),
                    UnitConfig {
                        capacity: config.capacity_per_unit,
                        compaction_threshold: config.compaction_threshold,
                        merge_registry: config.merge_registry.clone(),
                    },
                )?;
                Ok(tq_unit::MeteredUnit::wrap(tq_unit::GatedUnit::wrap(
                    Arc::new(unit),
                )))
            })
            .collect::<Result<Vec<_>>>()?;
        SimpleStorage::new(units)
    }

    /// The units in routing order.
    pub fn units(&self) -> &[Arc<dyn StorageUnit>] {
        &self.units
    }

    /// The position of the unit that holds sample index `index` ([`tq_core::routing`]).
    pub fn unit_for(&self, index: u32) -> usize {
        tq_core::routing::unit_of(index, self.units.len() as u32)
    }

    /// Every unit's counters, in routing order.
    pub async fn stats(&self) -> Result<Vec<UnitStats>> {
        let results = join_all(self.units.iter().map(|u| u.stats())).await;
        results
            .into_iter()
            .zip(&self.units)
            .map(|(r, u)| r.map_err(|e| name_unit(e, u.id())))
            .collect()
    }

    /// Reads `fields` of `samples` from their units (one concurrent call per unit) and returns,
    /// per field, the stored handles in `samples` order. No payload is copied.
    async fn read(
        &self,
        meta: &BatchMeta,
        samples: &[SampleId],
        fields: &[FieldName],
    ) -> Result<Vec<Vec<Value>>> {
        let routes = self.route(samples);
        let calls = routes
            .iter()
            .enumerate()
            .filter(|(_, positions)| !positions.is_empty())
            .map(|(u, positions)| {
                let unit_samples: Vec<SampleId> = positions.iter().map(|&p| samples[p]).collect();
                let unit = &self.units[u];
                async move { (u, unit.get(fields, &unit_samples).await) }
            });
        let replies = self.collect("get", meta, join_all(calls).await)?;

        // Each reply column holds its unit's rows in request order (routes are ascending), so a
        // field's values come out in order by walking the positions and taking the next value
        // of the unit that owns each one: no intermediate slot table, one move per handle.
        let mut owner = vec![0usize; samples.len()];
        for (u, positions) in routes.iter().enumerate() {
            for &pos in positions {
                owner[pos] = u;
            }
        }
        let mut columns: Vec<Vec<std::vec::IntoIter<Value>>> = (0..fields.len())
            .map(|_| {
                (0..self.units.len())
                    .map(|_| Vec::new().into_iter())
                    .collect()
            })
            .collect();
        for (u, reply) in replies {
            let positions = &routes[u];
            self.check_get_reply(meta, u, fields.len(), positions.len(), &reply)?;
            for (per_unit, col) in columns.iter_mut().zip(reply) {
                per_unit[u] = col.into_iter();
            }
        }
        Ok(columns
            .into_iter()
            .map(|mut per_unit| {
                owner
                    .iter()
                    .map(|&u| {
                        #[allow(clippy::expect_used)] // each position is routed to one unit
                        per_unit[u]
                            .next()
                            .expect("every position is routed to exactly one unit")
                    })
                    .collect()
            })
            .collect())
    }

    /// Reads a batch some of whose fields are links to shared payloads. Fields that read the
    /// same physical samples are fetched together, and each physical sample is read once
    /// however many rows link to it; the handles are then scattered to every row.
    async fn read_linked(&self, meta: &BatchMeta, fields: &[FieldName]) -> Result<Vec<Vec<Value>>> {
        let mut groups: HashMap<Vec<SampleId>, Vec<usize>> = HashMap::new();
        let mut order: Vec<Vec<SampleId>> = Vec::new();
        for (f, field) in fields.iter().enumerate() {
            let physical: Vec<SampleId> = meta
                .samples()
                .iter()
                .zip(meta.links())
                .map(|(&own, links)| links.get(field).copied().unwrap_or(own))
                .collect();
            let members = groups.entry(physical.clone()).or_default();
            if members.is_empty() {
                order.push(physical);
            }
            members.push(f);
        }
        let mut out: Vec<Vec<Value>> = vec![Vec::new(); fields.len()];
        for physical in order {
            let members = &groups[&physical];
            // Distinct samples in first-seen order, and where each row finds its sample.
            let mut position: HashMap<SampleId, usize> = HashMap::new();
            let mut distinct = Vec::new();
            let rows: Vec<usize> = physical
                .iter()
                .map(|s| {
                    *position.entry(*s).or_insert_with(|| {
                        distinct.push(*s);
                        distinct.len() - 1
                    })
                })
                .collect();
            let names: Vec<FieldName> = members.iter().map(|&f| fields[f].clone()).collect();
            let read = self.read(meta, &distinct, &names).await?;
            for (&f, values) in members.iter().zip(read) {
                out[f] = rows.iter().map(|&r| values[r].clone()).collect();
            }
        }
        Ok(out)
    }

    /// Each unit's share of a write: its samples and, per field, its rows (zero-copy slices).
    fn unit_slices<'a>(
        &self,
        routes: &'a Routes,
        meta: &'a BatchMeta,
        batch: &'a Batch,
    ) -> impl Iterator<Item = (usize, Vec<SampleId>, BTreeMap<FieldName, UnitRows>)> + 'a {
        routes
            .iter()
            .enumerate()
            .filter(|(_, positions)| !positions.is_empty())
            .map(|(u, positions)| (u, samples_at(meta, positions), split_rows(batch, positions)))
    }

    /// Positions of `samples`, grouped by the unit that holds each.
    pub(crate) fn route(&self, samples: &[SampleId]) -> Routes {
        let mut routes = vec![Vec::new(); self.units.len()];
        for (pos, s) in samples.iter().enumerate() {
            routes[self.unit_for(s.index)].push(pos);
        }
        routes
    }

    /// A unit's get reply must hold one column per field and one cell per sample routed to it.
    fn check_get_reply<T>(
        &self,
        meta: &BatchMeta,
        u: usize,
        fields: usize,
        samples: usize,
        reply: &[Vec<T>],
    ) -> Result<()> {
        if reply.len() != fields || reply.iter().any(|col| col.len() != samples) {
            return Err(Error::internal(format!(
                "partition `{}`: storage unit `{}` answered a get of {fields} fields x {samples} \
                 samples with a reply of another shape",
                meta.partition(),
                self.units[u].id(),
            )));
        }
        Ok(())
    }

    /// Collects per-unit results. On failure, logs every failed unit and returns the first
    /// error, prefixed with the operation, the partition and which units did commit.
    fn collect<T>(
        &self,
        op: &str,
        meta: &BatchMeta,
        results: Vec<(usize, Result<T>)>,
    ) -> Result<Vec<(usize, T)>> {
        let asked = results.len();
        let mut ok = Vec::with_capacity(asked);
        let mut failed = Vec::new();
        for (u, r) in results {
            match r {
                Ok(v) => ok.push((u, v)),
                Err(e) => failed.push((u, e)),
            }
        }
        if failed.is_empty() {
            return Ok(ok);
        }
        for (u, e) in &failed {
            tracing::warn!(
                op,
                partition = meta.partition(),
                unit = self.units[*u].id(),
                error = %e,
                "storage unit request failed"
            );
        }
        let n_failed = failed.len();
        let Some((u, e)) = failed.into_iter().next() else {
            return Ok(ok); // not reached: `failed` is not empty here
        };
        let mut prefix = format!(
            "partition `{}`: {op} on {asked} storage units: {n_failed} failed",
            meta.partition()
        );
        if !ok.is_empty() && op != "get" {
            let committed: Vec<&str> = ok.iter().map(|(u, _)| self.units[*u].id()).collect();
            prefix.push_str(&format!(
                " (units {committed:?} did commit their part; {op} is atomic per unit only)"
            ));
        }
        Err(name_unit(e, self.units[u].id()).context(prefix))
    }

    /// Put and update need exactly one row per sample and distinct sample indexes; checked
    /// before any unit is contacted so that a bad request leaves no trace anywhere.
    fn check_write(op: &str, meta: &BatchMeta, batch: &Batch) -> Result<()> {
        if batch.len() != meta.len() {
            return Err(Error::invalid(format!(
                "partition `{}`: {op} of a batch of {} rows for {} samples",
                meta.partition(),
                batch.len(),
                meta.len()
            )));
        }
        let mut seen = IndexSet::with_capacity_and_hasher(meta.len(), Default::default());
        if let Some(dup) = meta.samples().iter().find(|s| !seen.insert(s.index)) {
            return Err(Error::invalid(format!(
                "partition `{}`: {op} names sample index {} more than once",
                meta.partition(),
                dup.index
            )));
        }
        Ok(())
    }
}

/// Makes sure a unit's error names the unit (units are required to, this is a safety net).
fn name_unit(e: Error, id: &str) -> Error {
    if e.message().contains(id) {
        e
    } else {
        e.context(format!("storage unit `{id}`"))
    }
}

/// The rows at `positions` of every column, without copying payloads: dense rows are slices of
/// the column's one allocation (and flagged so), ragged and object rows are shared handles.
fn split_rows(batch: &Batch, positions: &[usize]) -> BTreeMap<FieldName, UnitRows> {
    batch
        .columns()
        .iter()
        .map(|(name, col)| {
            let values: Vec<Value> = positions.iter().map(|&p| col.value(p)).collect();
            let rows = match col {
                Column::Dense(_) => UnitRows::shared(values),
                Column::Ragged(_) | Column::Objects(_) => UnitRows::separate(values),
            };
            (name.clone(), rows)
        })
        .collect()
}

fn samples_at(meta: &BatchMeta, positions: &[usize]) -> Vec<SampleId> {
    positions.iter().map(|&p| meta.samples()[p]).collect()
}

/// The schema of a field from the shapes of its stored cells, in batch order.
fn schema_of(partition: &str, field: &str, shapes: Vec<CellShape>) -> Result<FieldMeta> {
    let mut dtype = None;
    let mut tensor_shapes = Vec::with_capacity(shapes.len());
    let mut objects = 0;
    for s in shapes {
        match s {
            CellShape::Object => objects += 1,
            CellShape::Tensor { dtype: d, shape } => {
                if dtype.is_some_and(|x| x != d) {
                    return Err(mixed(partition, field));
                }
                dtype = Some(d);
                tensor_shapes.push(shape);
            }
        }
    }
    match dtype {
        None => Ok(FieldMeta::object()),
        Some(_) if objects > 0 => Err(mixed(partition, field)),
        Some(d) => Ok(FieldMeta::from_shapes(d, tensor_shapes)),
    }
}

fn mixed(partition: &str, field: &str) -> Error {
    Error::invalid(format!(
        "partition `{partition}`: update of field `{field}` was committed, but the stored cells \
         mix objects and tensors or dtypes and cannot be described by one schema"
    ))
}

#[async_trait]
impl StorageManager for SimpleStorage {
    fn name(&self) -> &str {
        "simple"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            update: true,
            native_expire: false,
            links: true,
        }
    }

    async fn put(&self, meta: &BatchMeta, batch: &Batch) -> Result<PutReceipt> {
        Self::check_write("put", meta, batch)?;
        if meta.is_empty() {
            return Ok(PutReceipt::default());
        }
        let routes = self.route(meta.samples());
        let calls = self
            .unit_slices(&routes, meta, batch)
            .map(|(u, samples, fields)| {
                let unit = &self.units[u];
                async move { (u, unit.put(UnitPut { samples, fields }).await) }
            });
        let results = join_all(calls).await;
        self.collect("put", meta, results)?;
        Ok(PutReceipt {
            schemas: batch.schemas(),
            backend_meta: None,
        })
    }

    async fn get(&self, meta: &BatchMeta) -> Result<Batch> {
        let len = meta.len();
        if len == 0 {
            return Ok(Batch::empty(0));
        }
        let fields: Vec<FieldName> = meta.field_names().map(str::to_string).collect();
        if fields.is_empty() {
            return Ok(Batch::empty(len));
        }
        if let Some(batch) = self.get_placed(meta, &fields).await? {
            return Ok(batch);
        }
        let values = if meta.has_links() {
            self.read_linked(meta, &fields).await?
        } else {
            self.read(meta, meta.samples(), &fields).await?
        };
        // Pack each field once: equal-shaped tensors are copied exactly once into one pre-sized
        // contiguous buffer (a dense column), or not at all when they are same-host views that
        // map side by side (`placed::column_of`); anything else keeps the shared handles.
        let mut batch = Batch::empty(len);
        for (field, values) in fields.into_iter().zip(values) {
            let column = placed::column_of(&field, values)
                .map_err(|e| e.context(format!("partition `{}`: get", meta.partition())))?;
            batch.insert(field, column)?;
        }
        Ok(batch)
    }

    async fn update(&self, meta: &BatchMeta, batch: &Batch, merge: &MergeOp) -> Result<PutReceipt> {
        Self::check_write("update", meta, batch)?;
        if meta.is_empty() {
            return Ok(PutReceipt::default());
        }
        let routes = self.route(meta.samples());
        let calls = self
            .unit_slices(&routes, meta, batch)
            .map(|(u, samples, fields)| {
                let unit = &self.units[u];
                async move { (u, unit.update(UnitUpdate { samples, fields }, merge).await) }
            });
        let replies = self.collect("update", meta, join_all(calls).await)?;

        let mut shapes: BTreeMap<&str, Vec<Option<CellShape>>> = batch
            .field_names()
            .map(|f| (f, vec![None; meta.len()]))
            .collect();
        for (u, reply) in replies {
            let positions = &routes[u];
            for (field, slot) in shapes.iter_mut() {
                let got = reply
                    .fields
                    .get(*field)
                    .filter(|s| s.len() == positions.len())
                    .ok_or_else(|| {
                        Error::internal(format!(
                            "partition `{}`: storage unit `{}` committed an update but did not \
                             report the {} result shapes of field `{field}`",
                            meta.partition(),
                            self.units[u].id(),
                            positions.len()
                        ))
                    })?;
                for (shape, &pos) in got.iter().zip(positions) {
                    slot[pos] = Some(shape.clone());
                }
            }
        }
        let mut schemas = BTreeMap::new();
        for (field, slot) in shapes {
            let slot = slot
                .into_iter()
                .collect::<Option<_>>()
                .ok_or_else(|| unrouted(meta, field))?;
            schemas.insert(field.to_string(), schema_of(meta.partition(), field, slot)?);
        }
        Ok(PutReceipt {
            schemas,
            backend_meta: None,
        })
    }

    async fn clear(&self, meta: &BatchMeta, fields: &FieldFilter) -> Result<()> {
        if meta.is_empty() {
            return Ok(());
        }
        let routes = self.route(meta.samples());
        let calls = routes
            .iter()
            .enumerate()
            .filter(|(_, positions)| !positions.is_empty())
            .map(|(u, positions)| {
                let samples = samples_at(meta, positions);
                let unit = &self.units[u];
                async move { (u, unit.clear(&samples, fields).await) }
            });
        // Unlike the original, a failed clear is reported: the caller must not release the
        // indexes of samples whose data may still be stored.
        self.collect("clear", meta, join_all(calls).await)?;
        Ok(())
    }

    fn payload_checkpoint(&self) -> Option<&dyn tq_core::cells::PayloadCheckpoint> {
        Some(self)
    }

    /// Every unit answers its stats request.
    async fn check_health(&self) -> Result<()> {
        self.stats().await.map(drop)
    }

    /// Every unit's status; a unit that does not answer is listed as down (with the error)
    /// instead of failing the whole status, so `tq stats` shows the rest.
    async fn status(&self) -> Result<Vec<tq_core::telemetry::UnitStatus>> {
        let results = join_all(self.units.iter().map(|u| u.stats())).await;
        Ok(results
            .into_iter()
            .zip(&self.units)
            .map(|(r, u)| match r {
                Ok(stats) => stats.to_status(),
                Err(e) => {
                    tq_core::telemetry::UnitStatus::unreachable(u.id(), &name_unit(e, u.id()))
                }
            })
            .collect())
    }
}

/// A row no unit answered for: every position is routed to exactly one unit, so this is a bug,
/// reported instead of a panic.
fn unrouted(meta: &BatchMeta, field: &str) -> Error {
    Error::internal(format!(
        "partition `{}`: field `{field}`: a row was routed to no storage unit",
        meta.partition()
    ))
}
