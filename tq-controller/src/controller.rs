//! The in-process controller: all state behind one mutex with short critical sections (never
//! held across an `.await`); fetches that must wait park on a per-partition `Notify` with a
//! deadline, so a waiting consumer never holds up anyone else.

use crate::allocator::IndexAllocator;
use crate::api::*;
use crate::partition::{check_unique_ids, is_public, Partition, Production, PUBLIC_PARTITION};
use crate::sampler::{Sampled, Sampler, SamplerContext, SamplerSpec};
use crate::{ControlAdmin, ControlPlane};
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

mod answers;
mod changes;
mod fetch;
mod hold;
mod once;
mod partitions;
mod plane;
mod record;
mod snapshot;
pub use answers::{ANSWER_MEMORY, MAX_ANSWERS_PER_CLIENT};
use partitions::Partitions;
pub use snapshot::{snapshot_cells, snapshot_epoch, snapshot_in_epoch, StoredCells};
use tq_core::{BatchMeta, Error, FieldMeta, FieldName, LeaseId, Result, SampleId, Tags};

/// The largest `Insert` one request may ask for: bigger requests are refused before anything is
/// allocated (they would otherwise reserve memory for any number a caller or peer sends).
pub const MAX_INSERT_COUNT: usize = 1 << 24;

/// Controller settings.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ControllerConfig {
    /// Number of storage units samples are balanced across (index `i` lives on unit
    /// `tq_core::routing::unit_of(i, n)`).
    pub storage_units: u32,
    /// Samples held at once over all partitions (`None`: the index space is the limit). A
    /// request for more new samples is refused before anything is allocated.
    pub max_samples: Option<u64>,
    /// The sampler used when a fetch names none (written as in configuration: `"sequential"`,
    /// `"grpo:4"`, ...).
    pub default_sampler: SamplerSpec,
    /// The storage backend's name, for error messages (`"simple"`, `"redis"`, ...).
    pub storage_backend: String,
    /// Whether the storage backend resolves shared-payload links (`kv_link`). The controller
    /// refuses links otherwise, so no client path can create links a backend cannot read.
    pub links_supported: bool,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            storage_units: 2,
            max_samples: None,
            default_sampler: SamplerSpec::Sequential,
            storage_backend: "simple".into(),
            links_supported: true,
        }
    }
}

/// The sampler a configuration string names (see [`SamplerSpec`] for the forms).
pub fn sampler_from_name(name: &str) -> Result<Arc<dyn Sampler>> {
    name.parse::<SamplerSpec>()?.build()
}

/// A partition the caller checked exists under the same lock; `Internal` if it does not (a
/// bug, reported instead of a panic).
fn present<'a>(partitions: &'a mut Partitions, name: &str) -> Result<&'a mut Partition> {
    partitions
        .get_mut(name)
        .ok_or_else(|| Error::internal(format!("partition `{name}` vanished under the lock")))
}

/// The controller-wide state. Saved as a `record::StateRecord` (its field order is the format;
/// this struct's is not).
struct State {
    partitions: Partitions,
    /// Partition names in creation order.
    order: Vec<String>,
    /// Its own lock, taken after a partition's (inserts into existing partitions allocate
    /// under the shared state lock).
    alloc: Mutex<IndexAllocator>,
    /// Last lease id handed out (ids are unique across partitions). Atomic, so that fetches
    /// under the shared lock take ids without a lock of their own.
    next_lease: AtomicU64,
    /// Public sample → the (partition, sample, field) cells linking to it. Never holds an
    /// empty set: "linked" means a non-empty entry.
    linked_by: HashMap<SampleId, HashSet<(String, SampleId, FieldName)>>,
    /// Answers remembered for requests that must not be applied twice (see `answers`).
    /// Snapshots carry them beside the state (format 4 on), so formats 1-3 decode as before.
    /// Their own lock, taken after a partition's (a fetch remembers its answer while it holds
    /// the partition).
    answers: Mutex<answers::Answers>,
}

impl State {
    /// The remembered answers, under their lock.
    fn answers(&self) -> MutexGuard<'_, answers::Answers> {
        self.answers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The index allocator, under its lock.
    fn alloc(&self) -> MutexGuard<'_, IndexAllocator> {
        self.alloc.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The index allocator, while the state is held exclusively.
    fn alloc_mut(&mut self) -> &mut IndexAllocator {
        self.alloc.get_mut().unwrap_or_else(|p| p.into_inner())
    }

    /// The remembered answers, while the state is held exclusively.
    fn answers_mut(&mut self) -> &mut answers::Answers {
        self.answers.get_mut().unwrap_or_else(|p| p.into_inner())
    }

    fn is_linked(&self, source: SampleId) -> bool {
        self.linked_by.contains_key(&source)
    }

    fn add_link(&mut self, source: SampleId, dest: (String, SampleId, FieldName)) {
        self.linked_by.entry(source).or_default().insert(dest);
    }

    fn remove_link(&mut self, source: SampleId, dest: &(String, SampleId, FieldName)) {
        if let Some(set) = self.linked_by.get_mut(&source) {
            set.remove(dest);
            if set.is_empty() {
                self.linked_by.remove(&source);
            }
        }
    }

    /// Refuses to clear or write public samples that other samples still link to.
    fn refuse_linked(&self, partition: &str, samples: &[SampleId], what: &str) -> Result<()> {
        if let Some((id, users)) = samples
            .iter()
            .find_map(|id| self.linked_by.get(id).map(|u| (id, u)))
        {
            return Err(Error::conflict(format!(
                "partition `{partition}`: cannot {what} sample {id}: {} linked cells still read it \
                 (clear or unlink them first)",
                users.len()
            )));
        }
        Ok(())
    }

    /// Step 1 of every whole-sample clear: hides the slots `select` picks in `partition` and
    /// returns their metadata. Refused (nothing marked) while a picked public sample is still
    /// linked. A missing partition has nothing to clear. Needs the state shared only: links
    /// change under the exclusive lock.
    fn mark_clearing_where(
        &self,
        partition: &str,
        select: impl FnOnce(&Partition) -> Vec<u32>,
    ) -> Result<BatchMeta> {
        let Some(mut p) = self.partitions.lock_mut(partition) else {
            return Ok(BatchMeta::empty(partition));
        };
        let slots = select(&p);
        let selected: Vec<SampleId> = slots.iter().map(|&s| p.sample_of(s)).collect();
        self.refuse_linked(partition, &selected, "clear")?;
        Ok(p.mark_clearing(&slots))
    }

    /// Bookkeeping after samples of `partition` were released: forget the links they held,
    /// and (defence in depth) drop links that still pointed at a released public sample.
    fn after_release(&mut self, partition: &str, released: crate::partition::Released) {
        for (dest, field, src) in released.links {
            self.remove_link(src, &(partition.to_string(), dest, field));
        }
        for id in released.samples {
            let Some(users) = self.linked_by.remove(&id) else {
                continue;
            };
            tracing::error!(partition, sample = %id, links = users.len(), "released a public sample that was still linked; dropping the links");
            for (dp, dest, field) in users {
                if let Some(p) = self.partitions.get_mut(&dp) {
                    p.unlink_by_id(dest, &field);
                }
            }
        }
    }
}

impl State {
    fn partition(&self, name: &str) -> Result<MutexGuard<'_, Partition>> {
        self.partitions
            .get(name)
            .ok_or_else(|| Error::not_found(format!("partition `{name}` does not exist")))
    }

    /// A partition to change while the state is shared, under its lock.
    fn partition_locked(&self, name: &str) -> Result<MutexGuard<'_, Partition>> {
        self.partitions
            .lock_mut(name)
            .ok_or_else(|| Error::not_found(format!("partition `{name}` does not exist")))
    }

    /// The partition, created on first use; returns it with the allocator.
    fn partition_or_create(&mut self, name: &str) -> Result<(&mut Partition, &mut IndexAllocator)> {
        if name.is_empty() {
            return Err(Error::invalid("partition names must not be empty"));
        }
        if !self.partitions.contains_key(name) {
            tracing::debug!(partition = name, "creating partition");
            let units = self.alloc_mut().units();
            self.partitions
                .insert(name.to_string(), Partition::new(name.to_string(), units));
            self.order.push(name.to_string());
        }
        let p = present(&mut self.partitions, name)?;
        Ok((p, self.alloc.get_mut().unwrap_or_else(|p| p.into_inner())))
    }

    /// Removes a partition that holds no samples and was not declared complete (a complete
    /// one keeps its mark until `drop_partition`, so late consumers still see the end).
    fn drop_if_empty(&mut self, name: &str) -> bool {
        if self
            .partitions
            .get(name)
            .is_some_and(|p| p.len() == 0 && !p.complete)
        {
            self.partitions.remove(name);
            self.order.retain(|n| n != name);
            return true;
        }
        false
    }
}

/// The control plane, in process. Cheap to share behind an `Arc`.
///
/// Two levels of locking, so that requests for different partitions run side by side:
/// - the state as a whole behind a read-write lock: requests that touch one partition's
///   bookkeeping only (fetch, production notice, ack, return, status queries) take it
///   *shared* and then that partition's own mutex; requests that change what spans partitions
///   (inserts and KV puts that allocate indexes, clears that release them, links, partition
///   creation and removal, snapshots and change records, which need one instant of everything)
///   take it *exclusively*;
/// - inside, each partition's mutex, then the remembered answers' mutex, always in this order.
///
/// No lock is held across an `.await`, and none across I/O: the state dir writes records
/// after the lock is released.
pub struct Controller {
    state: RwLock<State>,
    waiters: Mutex<HashMap<String, Arc<Notify>>>,
    samplers: RwLock<HashMap<String, Arc<dyn Sampler>>>,
    default_sampler: Arc<dyn Sampler>,
    storage_backend: String,
    links_supported: bool,
    /// `ControllerConfig::max_samples`, kept to apply to an allocator a restore brings.
    max_samples: Option<u64>,
    /// Which life of this controller's state its metadata belongs to (see `tq_core::new_epoch`).
    epoch: std::sync::atomic::AtomicU64,
    /// A checkpoint's hold on removals while it copies payloads (see `hold`).
    removals: hold::RemovalHold,
    /// Request ids being answered now (see `answers::RequestTurn`).
    in_flight: answers::InFlight,
    telemetry: Telemetry,
}

/// Counters for [`Controller::status`] that the state does not hold.
struct Telemetry {
    started: Instant,
    /// Fetches parked waiting for samples.
    waiting_fetches: std::sync::atomic::AtomicU64,
    leases_expired: std::sync::atomic::AtomicU64,
}

/// Counts a parked fetch for as long as it waits, however its future ends (answered, timed
/// out, or dropped by a caller that gave up).
struct Waiting<'a>(&'a std::sync::atomic::AtomicU64);

impl<'a> Waiting<'a> {
    fn new(counter: &'a std::sync::atomic::AtomicU64) -> Self {
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Waiting(counter)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Controller {
    pub fn new(config: ControllerConfig) -> Result<Self> {
        if config.storage_units == 0 {
            return Err(Error::invalid("controller needs at least one storage unit"));
        }
        let mut alloc = IndexAllocator::new(config.storage_units);
        alloc.set_limit(config.max_samples);
        Ok(Controller {
            state: RwLock::new(State {
                partitions: Partitions::default(),
                order: Vec::new(),
                alloc: Mutex::new(alloc),
                next_lease: AtomicU64::new(0),
                linked_by: HashMap::new(),
                answers: Default::default(),
            }),
            waiters: Mutex::new(HashMap::new()),
            samplers: RwLock::new(HashMap::new()),
            default_sampler: config.default_sampler.build()?,
            storage_backend: config.storage_backend,
            links_supported: config.links_supported,
            max_samples: config.max_samples,
            epoch: std::sync::atomic::AtomicU64::new(tq_core::new_epoch()),
            removals: hold::RemovalHold::default(),
            in_flight: Mutex::new(HashMap::new()),
            telemetry: Telemetry {
                started: Instant::now(),
                waiting_fetches: Default::default(),
                leases_expired: Default::default(),
            },
        })
    }

    /// The same controller in epoch `epoch` (an embedded client picks the epoch before it
    /// builds its storage, whose KV keys carry it).
    pub fn with_epoch(self, epoch: u64) -> Self {
        self.epoch
            .store(epoch.max(1), std::sync::atomic::Ordering::Relaxed);
        self
    }

    /// The epoch of this controller's state: a controller started without its state has a
    /// new one, and requests or keys of another epoch are refused.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Makes `sampler` available to fetches that name it.
    pub fn register_sampler(&self, name: impl Into<String>, sampler: Arc<dyn Sampler>) {
        self.samplers
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.into(), sampler);
    }

    /// The whole state, exclusively: for changes that span partitions (see [`Controller`]).
    fn exclusive(&self) -> RwLockWriteGuard<'_, State> {
        // A panic inside a critical section is a bug; the state is still structurally valid
        // because every mutation validates first, so keep serving.
        self.state.write().unwrap_or_else(|p| p.into_inner())
    }

    /// The state shared with other requests: for reading, and for changing one partition
    /// under its own lock (see [`Controller`]).
    fn shared(&self) -> RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }

    fn waiter(&self, partition: &str) -> Arc<Notify> {
        let mut w = self.waiters.lock().unwrap_or_else(|p| p.into_inner());
        w.entry(partition.to_string()).or_default().clone()
    }

    /// Wakes fetches waiting on `partition` to re-check readiness.
    fn wake(&self, partition: &str) {
        let w = self.waiters.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = w.get(partition) {
            n.notify_waiters();
        }
    }

    fn sampler(&self, name: Option<&str>) -> Result<Arc<dyn Sampler>> {
        match name {
            None => Ok(self.default_sampler.clone()),
            Some(n) => self
                .samplers
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .get(n)
                .cloned()
                .ok_or_else(|| Error::invalid(format!("no sampler named `{n}` is registered"))),
        }
    }

    /// Every sampler's saved state ([`Sampler::save_state`]), by the name it is registered
    /// under; the default sampler is `""`. Samplers that keep nothing are left out.
    fn sampler_states(&self) -> Result<Vec<(String, Vec<u8>)>> {
        let mut out = Vec::new();
        if let Some(state) = self.default_sampler.save_state()? {
            out.push((String::new(), state));
        }
        let samplers = self.samplers.read().unwrap_or_else(|p| p.into_inner());
        let mut names: Vec<&String> = samplers.keys().collect();
        names.sort();
        for name in names {
            if let Some(state) = samplers[name].save_state()? {
                out.push((name.clone(), state));
            }
        }
        Ok(out)
    }

    /// Loads saved sampler states into the samplers registered under the same names. A state
    /// for a name nobody registered here is skipped with a warning: its samplers start afresh.
    /// On an error, the samplers loaded before it are cleared for `partitions` again, so that
    /// nothing of the saved state stays behind.
    fn load_sampler_states(
        &self,
        states: &[(String, Vec<u8>)],
        partitions: &[String],
    ) -> Result<()> {
        let mut loaded: Vec<Arc<dyn Sampler>> = Vec::new();
        for (name, state) in states {
            let sampler = if name.is_empty() {
                Some(self.default_sampler.clone())
            } else {
                self.samplers
                    .read()
                    .unwrap_or_else(|p| p.into_inner())
                    .get(name)
                    .cloned()
            };
            let Some(sampler) = sampler else {
                tracing::warn!(sampler = %name, "the saved state has a sampler that is not registered here; its cached answers are not restored");
                continue;
            };
            if let Err(e) = sampler.load_state(state) {
                for s in &loaded {
                    for p in partitions {
                        s.clear_partition(p);
                    }
                }
                let which = if name.is_empty() {
                    "the default sampler".to_string()
                } else {
                    format!("sampler `{name}`")
                };
                return Err(e.context(which));
            }
            loaded.push(sampler);
        }
        Ok(())
    }

    /// Drops sampler state and the waiter of a partition that was removed.
    fn forget_partition(&self, partition: &str) {
        for s in self
            .samplers
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
        {
            s.clear_partition(partition);
        }
        self.default_sampler.clear_partition(partition);
        let mut w = self.waiters.lock().unwrap_or_else(|p| p.into_inner());
        if w.get(partition).is_some_and(|n| Arc::strong_count(n) == 1) {
            w.remove(partition);
        }
    }

    /// What the controller holds, for `tq stats` and the state gauges (see
    /// [`ControllerStatus`]). Takes the state lock once; costs a bitmap scan per partition.
    pub fn status(&self) -> ControllerStatus {
        use std::sync::atomic::Ordering::Relaxed;
        let (partitions, index_allocated, index_reusable) = {
            let st = self.shared();
            let partitions = st
                .order
                .iter()
                .filter_map(|name| st.partitions.get(name).map(|p| p.status()))
                .collect();
            let alloc = st.alloc();
            (partitions, alloc.in_use() as u64, alloc.reusable() as u64)
        };
        ControllerStatus {
            epoch: self.epoch(),
            uptime_seconds: self.telemetry.started.elapsed().as_secs_f64(),
            partitions,
            index_allocated,
            index_reusable,
            leases_expired_total: self.telemetry.leases_expired.load(Relaxed),
            waiting_fetches: self.telemetry.waiting_fetches.load(Relaxed),
            connections: 0,
            memory_rss_bytes: tq_core::telemetry::process_rss_bytes(),
        }
    }

    /// Indexes handed out and not yet released, over all partitions.
    pub fn samples_in_use(&self) -> usize {
        let in_use = self.shared().alloc().in_use();
        in_use
    }

    /// Runs `step` on partition `name` under the shared state lock and the partition's own,
    /// creating the partition first (under the exclusive lock, for a moment) if it does not
    /// exist yet; `before_create` may refuse the request before anything is created. (A
    /// partition removed between the two, its last samples cleared, is created again.)
    fn in_partition<T>(
        &self,
        name: &str,
        before_create: impl Fn(&State) -> Result<()>,
        mut step: impl FnMut(&State, &mut Partition) -> Result<T>,
    ) -> Result<T> {
        loop {
            {
                let st = self.shared();
                let done = st.partitions.lock_mut(name).map(|mut p| step(&st, &mut p));
                if let Some(done) = done {
                    return done;
                }
            }
            let mut st = self.exclusive();
            before_create(&st)?;
            st.partition_or_create(name)?;
        }
    }
}

/// A write to samples of a partition that no longer exists: its samples were all cleared (and
/// the partition removed), so the writer's metadata is stale.
fn gone_partition(partition: &str) -> Error {
    Error::conflict(format!(
        "partition `{partition}` does not exist any more: its samples were cleared"
    ))
}

fn check_keys(partition: &str, keys: &[String]) -> Result<()> {
    if keys.is_empty() {
        return Err(Error::invalid(format!(
            "partition `{partition}`: empty key list"
        )));
    }
    let mut seen = HashSet::with_capacity(keys.len());
    for k in keys {
        if k.is_empty() {
            return Err(Error::invalid(format!(
                "partition `{partition}`: empty key"
            )));
        }
        if !seen.insert(k.as_str()) {
            return Err(Error::invalid(format!(
                "partition `{partition}`: key `{k}` appears twice"
            )));
        }
    }
    Ok(())
}

fn check_field_list(partition: &str, fields: &[FieldName]) -> Result<()> {
    if fields.is_empty() {
        return Err(Error::invalid(format!(
            "partition `{partition}`: empty field list (use a whole-sample clear to clear everything)"
        )));
    }
    let mut seen = HashSet::new();
    if let Some(d) = fields.iter().find(|f| !seen.insert(f.as_str())) {
        return Err(Error::invalid(format!(
            "partition `{partition}`: field `{d}` appears twice"
        )));
    }
    Ok(())
}
