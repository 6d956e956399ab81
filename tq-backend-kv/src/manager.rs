//! [`KvStorageManager`]: [`StorageManager`] over one or more [`KvStore`]s.

use crate::codec::{
    decode_generation, decode_value, encode_header, encode_tensor_header, KeyScheme,
};
use crate::store::{KvStore, KvStoreExt, KvValue};

mod cells;
mod copy;
mod read;
mod routing;
mod write;
use async_trait::async_trait;
use bytes::Bytes;
pub use cells::VERSION_MARK;
use cells::{fresh_version, CellLoc};
use futures::TryStreamExt;
use read::DenseSink;
use routing::Plan;
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tq_core::{
    apply_merge, BackendMeta, Batch, BatchMeta, Capabilities, Column, DType, Error, FieldFilter,
    FieldKind, FieldMeta, MergeOp, MergeRegistry, PutReceipt, Result, SampleId, StorageManager,
    Tensor, Value,
};

/// The largest put (payload and headers of its cells) whose cells and generation keys go to
/// the store in one round trip ([`KvStore::mset_then_raise`]). Above it, round trips are a
/// small part of a put, and the cells go in chunks whose encoding overlaps their sending.
const ONE_TRIP_PUT_MAX_BYTES: usize = 4 << 20;

/// How long a cleared key lives on when clear expires instead of deleting (upstream's
/// `CLEAR_EXPIRE_SECOND`).
pub const DEFAULT_CLEAR_EXPIRE_AFTER: Duration = Duration::from_secs(1);

/// Which store a cell goes to when several are configured. Stores are named by
/// [`KvStorageManager::with_stores`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Routing {
    /// Every cell goes to the first store.
    #[default]
    First,
    /// Cells of the listed fields go to the named store; every other field to `default`.
    ByField {
        fields: BTreeMap<String, String>,
        default: String,
    },
    /// Cells whose payload is at most `threshold` bytes go to `small`; larger ones to `large`.
    BySize {
        threshold: usize,
        small: String,
        large: String,
    },
}

/// Settings of a [`KvStorageManager`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvOptions {
    /// First component of every key, so several deployments can share one engine.
    pub namespace: String,
    /// `None` (the default): no TTL; clear deletes. `Some(ttl)`: every write states `ttl`
    /// (re-arming it), and clear/expire mark keys to disappear after `clear_expire_after`.
    /// Must exceed the lifetime of any batch: reads do not refresh it.
    pub data_ttl: Option<Duration>,
    /// How long cleared keys stay when `data_ttl` is set.
    pub clear_expire_after: Duration,
    pub routing: Routing,
    /// The controller epoch the keys belong to (0: none). Keys carry it after the namespace,
    /// so a controller restarted without its state (a new epoch) starts on fresh keys instead
    /// of meeting generation keys its earlier life left at the same indexes.
    pub epoch: u64,
}

impl Default for KvOptions {
    fn default() -> Self {
        KvOptions {
            namespace: "tq".into(),
            data_ttl: None,
            clear_expire_after: DEFAULT_CLEAR_EXPIRE_AFTER,
            routing: Routing::First,
            epoch: 0,
        }
    }
}

/// The routing rule with store names resolved to positions.
#[derive(Debug, Clone)]
enum Route {
    First,
    ByField {
        fields: BTreeMap<String, usize>,
        default: usize,
    },
    BySize {
        threshold: usize,
        small: usize,
        large: usize,
    },
}

struct NamedStore {
    tag: Bytes,
    store: Arc<dyn KvStore>,
}

/// The generic KV adapter. See the crate documentation for the key scheme, value format and TTL
/// design.
pub struct KvStorageManager {
    name: String,
    stores: Vec<NamedStore>,
    route: Route,
    options: KvOptions,
    /// The controller epoch keys carry (from `options.epoch`; a loaded checkpoint changes it).
    epoch: std::sync::atomic::AtomicU64,
    merges: MergeRegistry,
}

impl KvStorageManager {
    /// An adapter over one store.
    pub fn new(store: Arc<dyn KvStore>, options: KvOptions) -> Result<Self> {
        let name = store.name().to_string();
        Self::with_stores(vec![(name, store)], options)
    }

    /// An adapter over several named stores; `options.routing` names them. The names are the
    /// routing tags kept in the controller, so keep them stable across restarts.
    pub fn with_stores(
        stores: Vec<(String, Arc<dyn KvStore>)>,
        options: KvOptions,
    ) -> Result<Self> {
        if stores.is_empty() {
            return Err(Error::invalid(
                "a kv storage manager needs at least one store",
            ));
        }
        let mut names = HashSet::new();
        for (n, _) in &stores {
            if !names.insert(n.as_str()) {
                return Err(Error::invalid(format!("kv store name `{n}` is used twice")));
            }
            if n.as_bytes().contains(&VERSION_MARK) {
                return Err(Error::invalid(format!(
                    "kv store name `{}` contains the byte 0x1f, which tq reserves",
                    n.escape_debug()
                )));
            }
        }
        if options.data_ttl == Some(Duration::ZERO) {
            return Err(Error::invalid(
                "kv data_ttl must be positive (omit it for no TTL)",
            ));
        }
        let find = |n: &str| {
            stores.iter().position(|(m, _)| m == n).ok_or_else(|| {
                Error::invalid(format!(
                    "kv routing names store `{n}`, which is not configured"
                ))
            })
        };
        let route = match &options.routing {
            Routing::First => Route::First,
            Routing::ByField { fields, default } => Route::ByField {
                fields: fields
                    .iter()
                    .map(|(f, s)| Ok((f.clone(), find(s)?)))
                    .collect::<Result<_>>()?,
                default: find(default)?,
            },
            Routing::BySize {
                threshold,
                small,
                large,
            } => Route::BySize {
                threshold: *threshold,
                small: find(small)?,
                large: find(large)?,
            },
        };
        let name = format!(
            "kv({})",
            stores
                .iter()
                .map(|(n, s)| if n == s.name() {
                    n.clone()
                } else {
                    format!("{n}={}", s.name())
                })
                .collect::<Vec<_>>()
                .join(",")
        );
        Ok(KvStorageManager {
            name,
            stores: stores
                .into_iter()
                .map(|(n, store)| NamedStore {
                    store: crate::metered::MeteredStore::wrap(&n, store),
                    tag: Bytes::from(n),
                })
                .collect(),
            route,
            epoch: std::sync::atomic::AtomicU64::new(options.epoch),
            options,
            merges: MergeRegistry::default(),
        })
    }

    /// Merge functions `update` can name ([`MergeOp::Named`]).
    pub fn with_merge_registry(mut self, merges: MergeRegistry) -> Self {
        self.merges = merges;
        self
    }

    pub fn options(&self) -> &KvOptions {
        &self.options
    }

    /// The configured stores, in order.
    pub fn store_names(&self) -> Vec<String> {
        self.stores
            .iter()
            .map(|s| String::from_utf8_lossy(&s.tag).into_owned())
            .collect()
    }

    /// The store at position `i`.
    pub fn store(&self, i: usize) -> Option<&Arc<dyn KvStore>> {
        self.stores.get(i).map(|s| &s.store)
    }

    /// The key scheme of `partition` (namespace and epoch of this manager).
    fn keys(&self, partition: &str) -> KeyScheme {
        let epoch = self.epoch.load(std::sync::atomic::Ordering::Relaxed);
        KeyScheme::in_epoch(&self.options.namespace, epoch, partition)
    }

    fn ctx(&self, meta: &BatchMeta) -> String {
        format!("{} partition `{}`", self.name, meta.partition())
    }
}

#[async_trait]
impl StorageManager for KvStorageManager {
    fn name(&self) -> &str {
        &self.name
    }

    /// The claim is a key `<namespace>/<epoch>/__owner__` in the first store holding the
    /// owner and when it renewed, written with a TTL of the lease: present means owned. A
    /// read then a write, not a compare-and-set: two controllers claiming an unowned epoch in
    /// the same instant could both pass, which no operator action does (a load or a restart
    /// meets a controller that has renewed for seconds).
    async fn claim_epoch(&self, epoch: u64, owner: u64) -> Result<()> {
        let Some(first) = self.stores.first() else {
            return Ok(());
        };
        let key = format!("{}/{epoch:016x}/__owner__", self.options.namespace);
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let found = first.store.mget(std::slice::from_ref(&key)).await?;
        if let Some(Some(held)) = found.first() {
            let text = String::from_utf8_lossy(held);
            let mut parts = text.split_whitespace();
            let holder = parts.next().and_then(|h| u64::from_str_radix(h, 16).ok());
            let renewed = parts.next().and_then(|t| t.parse::<u64>().ok());
            if holder != Some(owner) {
                let ago = renewed.map_or("unknown".to_string(), |t| {
                    format!("{} ms ago", now_ms.saturating_sub(t))
                });
                return Err(Error::conflict(format!(
                    "namespace `{}`, epoch {epoch:016x} of kv store `{}` {} (it renewed its \
                     claim {ago}): two controllers in one epoch would overwrite each other's \
                     cells. Stop it first; a dead controller's claim lapses {} s after it \
                     stopped",
                    self.options.namespace,
                    String::from_utf8_lossy(&first.tag),
                    tq_core::EPOCH_CLAIMED,
                    tq_core::EPOCH_CLAIM_LEASE.as_secs()
                )));
            }
        }
        let value = KvValue::new(Bytes::from(format!("{owner:016x} {now_ms}")), Bytes::new());
        first
            .store
            .mset(vec![(key, value)], Some(tq_core::EPOCH_CLAIM_LEASE))
            .await
    }

    /// One read of a key nobody writes, per store (concurrently); the first store that fails
    /// is named.
    async fn check_health(&self) -> Result<()> {
        let probe = [format!("{}/__tq_health__", self.options.namespace)];
        let results =
            futures::future::join_all(self.stores.iter().map(|s| s.store.mget(&probe))).await;
        for (s, r) in self.stores.iter().zip(results) {
            if let Err(e) = r {
                return Err(e.context(format!(
                    "kv store `{}` is down",
                    String::from_utf8_lossy(&s.tag)
                )));
            }
        }
        Ok(())
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            update: true,
            native_expire: self.options.data_ttl.is_some()
                && self
                    .stores
                    .iter()
                    .all(|s| s.store.capabilities().native_expire),
            links: false,
        }
    }

    fn payload_copy(&self) -> Option<&dyn tq_core::cells::PayloadCopy> {
        Some(self)
    }

    fn adopt_epoch(&self, epoch: u64) {
        self.epoch
            .store(epoch, std::sync::atomic::Ordering::Relaxed);
    }

    async fn put(&self, meta: &BatchMeta, batch: &Batch) -> Result<PutReceipt> {
        self.check_rows(meta, batch)?;
        if batch.columns().is_empty() || meta.is_empty() {
            return Ok(PutReceipt {
                schemas: batch.schemas(),
                backend_meta: None,
            });
        }
        let ks = self.keys(meta.partition());
        // No read of the generation keys first: a stale put is caught by the compare-and-set
        // that raises them after the cells are written (its cells, keyed by its own older
        // generation, are never readable and are removed then). Reading first would only
        // refuse that rare put earlier, at the price of one more store round trip on every put.
        let n = meta.len();
        let mut per_store: Vec<Vec<(String, KvValue)>> = vec![Vec::new(); self.stores.len()];
        per_store[0].reserve(n);
        let mut backend_meta: Vec<BackendMeta> = vec![BackendMeta::new(); n];
        // Every row of a dense column has the same header: build it once.
        let columns: Vec<_> = batch
            .columns()
            .iter()
            .map(|(field, column)| {
                let shared_head = match column {
                    Column::Dense(_) if n > 0 => Some(encode_header(&column.value(0))),
                    Column::Objects(_) => Some(encode_header(&Value::Object(Bytes::new()))),
                    _ => None,
                };
                (field, column, shared_head)
            })
            .collect();
        // Sample-major, like get and clear: the keys of a sample share a Redis Cluster hash
        // slot, so a store call covers ~max_keys_per_call/fields slots with one multi-key
        // command each (field-major order puts every key of a call in its own slot, one
        // command per key); and a clear that removes keys in the order they were written
        // touches the server's memory in that order (measured ~30% less Redis CPU per key
        // than removing them across the grain).
        //
        // A cell the controller already describes is replaced beside itself, under a fresh
        // version (see `cells`): until this write is published, readers keep reading the old
        // cells, all of them.
        let version = fresh_version();
        let mut overwrites = false;
        for (r, s) in meta.samples().iter().enumerate() {
            let existing = meta.backend_meta().get(r);
            for (field, column, shared_head) in &columns {
                let v = column.value(r);
                let head = shared_head.clone().unwrap_or_else(|| encode_header(&v));
                let i = self.route_new(field, v.nbytes());
                let body = match v {
                    Value::Tensor(t) => t.into_data(),
                    Value::Object(b) => b,
                };
                let loc = CellLoc {
                    tag: self.stores[i].tag.clone(),
                    version: if existing.is_some_and(|m| m.contains_key(field.as_str())) {
                        overwrites = true;
                        version
                    } else {
                        0
                    },
                };
                per_store[i].push((ks.cell_at(*s, field, loc.version), KvValue::new(head, body)));
                backend_meta[r].insert((*field).clone(), loc.encode());
            }
        }
        // Cells first, the generation key last: a sample becomes readable under a generation
        // only once its cells are written, and the key is raised with a compare-and-set, so a
        // writer that lost a race with the index's reuse can never move it back.
        let raise: Vec<(usize, (String, u32))> = meta
            .samples()
            .iter()
            .enumerate()
            .map(|(r, s)| (r, (ks.generation(s.index), s.generation)))
            .collect();
        let written: Vec<&str> = batch.field_names().collect();
        let rearm = self.rearm_plan(meta, &written)?;
        let (rows, items): (Vec<usize>, Vec<(String, u32)>) = raise.into_iter().unzip();
        // A small put whose cells all go to the first store sends cells and generation keys
        // in one store round trip (round trips are most of its time); a large one writes
        // the cells in chunks, overlapping their encoding with the sending, then raises.
        let cell_bytes: usize = per_store[0].iter().map(|(_, v)| v.len()).sum();
        let one_trip =
            per_store[1..].iter().all(Vec::is_empty) && cell_bytes <= ONE_TRIP_PUT_MAX_BYTES;
        let held = if one_trip {
            let cells = std::mem::take(&mut per_store[0]);
            let ttl = self.options.data_ttl;
            let store = &self.stores[0].store;
            let rearms = self.rearm_calls(rearm.as_ref());
            futures::future::try_join(store.mset_then_raise(cells, items, ttl), rearms)
                .await
                .map(|(held, ())| held)
        } else {
            match self.write_rearming(per_store, rearm).await {
                Ok(()) => {
                    self.stores[0]
                        .store
                        .raise_generations_all(items, self.options.data_ttl)
                        .await
                }
                Err(e) => Err(e),
            }
        };
        let held = match held {
            Ok(held) => held,
            Err(e) => {
                if overwrites {
                    self.discard_versions(&ks, meta.samples(), &backend_meta)
                        .await;
                }
                return Err(e.context(self.ctx(meta)));
            }
        };
        let lost: Vec<(SampleId, u32)> = rows
            .iter()
            .zip(held)
            .map(|(&r, h)| (meta.samples()[r], h))
            .filter(|(s, h)| *h > s.generation)
            .collect();
        if let Some(&(s, h)) = lost.first() {
            // The index was reused while this put was in flight: its cells (keyed by the
            // old generation) are unreadable; remove them rather than leave them behind.
            self.discard(&ks, meta.samples(), &backend_meta, &lost)
                .await;
            return Err(Error::conflict(format!(
                "{}: put of sample index {} with generation {} is stale; the index was \
                 reused by generation {h} while the put was in flight",
                self.ctx(meta),
                s.index,
                s.generation
            )));
        }
        Ok(PutReceipt {
            schemas: batch.schemas(),
            backend_meta: Some(backend_meta),
        })
    }

    async fn get(&self, meta: &BatchMeta) -> Result<Batch> {
        // Links are not resolved here (capabilities say so; the controller refuses to make
        // them): reading the sample's own cells instead would return the wrong data.
        if meta.has_links() {
            return Err(Error::unsupported(
                format!("read of linked fields in partition `{}`", meta.partition()),
                self.name(),
            ));
        }
        if meta.fields().is_empty() || meta.is_empty() {
            return Ok(Batch::empty(meta.len()));
        }
        let fields: Vec<&str> = meta.field_names().collect();
        let n = meta.len();
        // Rows of dense fields are copied into their column as each store call completes,
        // overlapping the copy with the calls still in flight instead of packing at the end.
        let mut sinks: Vec<Option<DenseSink>> = fields
            .iter()
            .map(|f| DenseSink::for_field(&meta.fields()[*f], n))
            .collect();
        let (raw, _) = self
            .read_cells(meta, &fields, &mut |slot, value| {
                if let Some(sink) = &mut sinks[slot / n] {
                    sink.copy_row(slot % n, value);
                }
            })
            .await?;
        let ks = self.keys(meta.partition());
        let mut out = Batch::empty(n);
        // `raw` is field-major: field `f`'s cells are `raw[f * n..(f + 1) * n]`.
        for ((field, sink), cells) in fields.into_iter().zip(sinks).zip(raw.chunks(n)) {
            let column = match sink.and_then(DenseSink::finish) {
                Some(tensor) => Column::Dense(tensor),
                // Not dense in the metadata, or some row disagreed with it: infer the column
                // from the values (with errors that name the cell), as the values decide.
                None => {
                    let values = meta
                        .samples()
                        .iter()
                        .zip(cells)
                        .map(|(s, cell)| decode_value(&ks.cell(*s, field), cell.clone()))
                        .collect::<Result<Vec<_>>>()?;
                    Column::from_values(field, values)?
                }
            };
            out.insert(field, column)?;
        }
        Ok(out)
    }

    /// Read → merge → write through the stores. Every merge is computed before anything is
    /// written, so a merge that fails changes nothing; the merged cells are written under a
    /// fresh version beside the old ones, so a write that fails midway leaves every old cell
    /// readable. Two concurrent updates of one cell both read the same old value: the one
    /// published last wins (no read-modify-write lock across processes).
    async fn update(&self, meta: &BatchMeta, batch: &Batch, merge: &MergeOp) -> Result<PutReceipt> {
        self.check_rows(meta, batch)?;
        if batch.columns().is_empty() || meta.is_empty() {
            return Ok(PutReceipt::default());
        }
        let fields: Vec<&str> = batch.field_names().collect();
        let (raw, where_) = self.read_cells(meta, &fields, &mut |_, _| {}).await?;
        let ks = self.keys(meta.partition());
        let n = meta.len();
        let mut per_store: Vec<Vec<(String, KvValue)>> = vec![Vec::new(); self.stores.len()];
        let mut backend_meta: Vec<BackendMeta> = vec![BackendMeta::new(); n];
        let mut schemas = BTreeMap::new();
        let version = fresh_version();
        for (f, (field, column)) in batch.columns().iter().enumerate() {
            let mut merged = Vec::with_capacity(n);
            for (r, s) in meta.samples().iter().enumerate() {
                let key = ks.cell(*s, field);
                let old = decode_value(&key, raw[f * n + r].clone())?;
                let new =
                    apply_merge(merge, &self.merges, &old, &column.value(r)).map_err(|e| {
                        e.context(format!("{}: update of cell `{key}`", self.ctx(meta)))
                    })?;
                merged.push(new);
            }
            schemas.insert(
                field.clone(),
                Column::from_values(field, merged.clone())?.schema(),
            );
            for (r, (s, v)) in meta.samples().iter().zip(merged).enumerate() {
                let i = where_[f * n + r];
                let head = encode_header(&v);
                // Beside the cells it merges, never over them: a failed update leaves them.
                let loc = CellLoc {
                    tag: self.stores[i].tag.clone(),
                    version,
                };
                per_store[i].push((
                    ks.cell_at(*s, field, version),
                    KvValue::new(head, v.bytes().clone()),
                ));
                backend_meta[r].insert(field.clone(), loc.encode());
            }
        }
        let rearm = self.rearm_plan(meta, &fields)?;
        if let Err(e) = self.write_rearming(per_store, rearm).await {
            self.discard_versions(&ks, meta.samples(), &backend_meta)
                .await;
            return Err(e.context(self.ctx(meta)));
        }
        Ok(PutReceipt {
            schemas,
            backend_meta: Some(backend_meta),
        })
    }

    /// Whole samples: the generation keys are deleted at once (the samples are unreadable from
    /// then on) and, with a TTL configured, the cells are marked to expire after
    /// `clear_expire_after` instead of being deleted. Chosen fields: their cells are deleted
    /// (there is no per-field key to make them unreadable otherwise).
    async fn clear(&self, meta: &BatchMeta, fields: &FieldFilter) -> Result<()> {
        self.clear_impl(meta, fields, matches!(fields, FieldFilter::All))
            .await
    }

    /// The cells are marked to expire after `clear_expire_after` (deleted on stores without
    /// expiry), so a reader that fetched metadata just before the publish still reads them.
    async fn retire_replaced(&self, replaced: &BatchMeta) -> Result<()> {
        let ks = self.keys(replaced.partition());
        let mut plan = Plan::new(self.stores.len());
        let mut tags = self.tags();
        for (s, row) in replaced.samples().iter().zip(replaced.backend_meta()) {
            for field in row.keys() {
                self.plan_existing(&mut plan, &mut tags, &ks, *s, Some(row), field, 0)?;
            }
        }
        self.remove(&plan, true)
            .await
            .map_err(|e| e.context(self.ctx(replaced)))
    }

    /// Like `clear`, but chosen fields are expired too (they stay readable until they expire).
    /// Without a TTL configured this is a clear: an expire left on a key is only safe when every
    /// write re-arms the deadline.
    async fn expire(&self, meta: &BatchMeta, fields: &FieldFilter) -> Result<()> {
        self.clear_impl(meta, fields, true).await
    }
}
