//! The client: one implementation of every operation over a [`ControlPlane`] handle and a
//! [`StorageManager`]; embedded and remote deployments differ only in the handles plugged in.

use crate::clear::UnfinishedClears;
use crate::key_cache::{KeyCache, KeyCacheStats};
use crate::{ClientBuilder, Config};
use std::collections::HashSet;
use std::sync::Arc;

/// How long [`Client::retire_replaced`] keeps asking a storage that is not available now.
const RETIRE_RETRY_BUDGET: std::time::Duration = std::time::Duration::from_secs(3);
use tq_controller::{
    ConsumptionStatus, ControlPlane, GetMetaMode, GetMetaRequest, ProductionNotice,
    ProductionStatus, Wait,
};
use tq_core::{
    BackendMeta, Batch, BatchMeta, Error, FieldFilter, FieldName, PutReceipt, Result,
    StorageManager, Tags,
};

/// What a KV write returns.
#[derive(Debug, Clone, PartialEq)]
pub struct KvBatchMeta {
    pub partition: String,
    pub keys: Vec<String>,
    /// Each key's tags after the write.
    pub tags: Vec<Tags>,
    /// Fields every key now holds, sorted.
    pub fields: Vec<FieldName>,
}

/// A handle to tq. Cheap to clone; all clones share one controller and one storage.
#[derive(Clone)]
pub struct Client {
    control: Arc<dyn ControlPlane>,
    storage: Arc<dyn StorageManager>,
    config: Arc<Config>,
    /// Remote clients only (see [`Client::with_key_cache`]).
    pub(crate) key_cache: Option<Arc<KeyCache>>,
    /// Clears whose storage step failed, retried in the background (`clear.rs`).
    unfinished: Arc<UnfinishedClears>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("storage", &self.storage.name())
            .finish_non_exhaustive()
    }
}

pub(crate) fn owned_keys<K: AsRef<str>>(partition: &str, keys: &[K]) -> Result<Vec<String>> {
    if partition.is_empty() {
        return Err(Error::invalid("partition names must not be empty"));
    }
    if keys.is_empty() {
        return Err(Error::invalid(format!(
            "partition `{partition}`: empty key list"
        )));
    }
    let mut seen = HashSet::with_capacity(keys.len());
    let mut out = Vec::with_capacity(keys.len());
    for k in keys {
        let k = k.as_ref();
        if k.is_empty() {
            return Err(Error::invalid(format!(
                "partition `{partition}`: empty key"
            )));
        }
        if !seen.insert(k) {
            return Err(Error::invalid(format!(
                "partition `{partition}`: key `{k}` appears twice"
            )));
        }
        out.push(k.to_string());
    }
    Ok(out)
}

pub(crate) fn owned_fields<F: AsRef<str>>(partition: &str, fields: &[F]) -> Result<Vec<FieldName>> {
    if fields.is_empty() {
        return Err(Error::invalid(format!(
            "partition `{partition}`: empty field list"
        )));
    }
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(fields.len());
    for f in fields {
        let f = f.as_ref();
        if !seen.insert(f) {
            return Err(Error::invalid(format!(
                "partition `{partition}`: field `{f}` appears twice"
            )));
        }
        out.push(f.to_string());
    }
    Ok(out)
}

impl Client {
    /// Starts building a client: embedded ([`ClientBuilder::build`]) or connected
    /// ([`ClientBuilder::connect`]).
    pub fn builder() -> ClientBuilder {
        ClientBuilder::default()
    }

    /// Runs the controller and the storage units inside this process: calls are direct, nothing
    /// is serialized and nothing listens on a port. Shortcut for
    /// `Client::builder().config(config).build()`.
    pub fn embedded(config: Config) -> Result<Client> {
        Client::builder().config(config).build()
    }

    /// [`Client::embedded`] with named merge functions for `kv_update` (`MergeOp::Named`),
    /// registered on the storage (every built-in backend). Shortcut for
    /// `Client::builder().config(config).merges(&merges).build()`.
    pub fn embedded_with_merges(config: Config, merges: tq_core::MergeRegistry) -> Result<Client> {
        Client::builder().config(config).merges(&merges).build()
    }

    /// A client over any control plane and storage (custom backends, tests).
    pub fn from_parts(
        control: Arc<dyn ControlPlane>,
        storage: Arc<dyn StorageManager>,
        config: Config,
    ) -> Client {
        Client {
            control,
            storage,
            config: Arc::new(config),
            key_cache: None,
            unfinished: Arc::default(),
        }
    }

    /// Remembers the metadata of up to `entries` keys, so that a small `kv_batch_get` (up to 64
    /// keys, 1 MiB) of keys this client has written or read before reads storage in parallel
    /// with the controller's key lookup, and uses that read only if the lookup confirms the
    /// metadata it was made with (module `key_cache`). Saves one round trip per get when the
    /// controller is remote; pointless in-process. `0` turns it off. [`Client::connect`] sets
    /// it from `net.key_cache_entries`.
    pub fn with_key_cache(mut self, entries: usize) -> Client {
        self.key_cache = (entries > 0).then(|| Arc::new(KeyCache::new(entries)));
        self
    }

    /// How many speculative reads were confirmed and dropped; `None` without a key cache.
    pub fn key_cache_stats(&self) -> Option<KeyCacheStats> {
        self.key_cache.as_ref().map(|c| c.stats())
    }

    /// The controller this client talks to (what [`Client::from_parts`] was given): for
    /// crates that extend the client, such as tq-checkpoint.
    pub fn control(&self) -> &Arc<dyn ControlPlane> {
        &self.control
    }
    pub fn storage(&self) -> &Arc<dyn StorageManager> {
        &self.storage
    }
    /// The epoch of the controller's state this client works in: a controller restarted
    /// without its state has another, and refuses this client's requests.
    pub fn epoch(&self) -> u64 {
        self.control.epoch()
    }
    pub fn config(&self) -> &Config {
        &self.config
    }
    pub(crate) fn unfinished(&self) -> &UnfinishedClears {
        &self.unfinished
    }
    /// Drops what the key cache knows of `keys` (every key of `partition` with `None`).
    pub(crate) fn forget_cached(&self, partition: &str, keys: Option<&[String]>) {
        if let Some(cache) = &self.key_cache {
            cache.forget(partition, keys);
        }
    }

    // ----------------------------------------------------------------------------------------
    // Metadata API

    /// Metadata for a batch (fetch, insert or force mode); see [`GetMetaRequest`].
    pub async fn get_meta(&self, req: GetMetaRequest) -> Result<BatchMeta> {
        self.control.get_meta(req).await
    }

    /// Fetches up to `batch_size` samples produced for `fields` and not yet consumed by `task`,
    /// waiting up to the configured fetch timeout. The samples are consumed by `task`.
    pub(crate) async fn fetch(
        &self,
        partition: &str,
        fields: &[&str],
        task: &str,
        batch_size: usize,
    ) -> Result<BatchMeta> {
        let wait = Wait::For(self.config.fetch_timeout());
        self.get_meta(GetMetaRequest::fetch(
            partition, fields, task, batch_size, wait,
        ))
        .await
    }

    /// Writes `batch` into new samples of `partition` and returns their metadata. If the write
    /// fails, the new samples are removed again.
    pub(crate) async fn put_new(&self, partition: &str, batch: &Batch) -> Result<BatchMeta> {
        check_batch(partition, batch)?;
        let meta = self
            .get_meta(GetMetaRequest {
                partition: partition.to_string(),
                // Named so that a clear finds the cells even if this writer dies before it
                // publishes them.
                fields: batch.field_names().map(FieldName::from).collect(),
                mode: GetMetaMode::Insert { count: batch.len() },
                sampler: None,
                dp_rank: None,
                batch_index: None,
                sampler_args: None,
            })
            .await?;
        // Fresh samples hold nothing a refused write could overwrite: no check needed first.
        let published = match check_put(&meta, batch) {
            Ok(()) => {
                self.store_and_publish(&meta, meta.tags().to_vec(), batch, true)
                    .await
            }
            Err(e) => Err(e),
        };
        match published {
            Ok(receipt) => {
                let mut out = meta;
                let receipt = receipt.ok_or_else(lost_receipt)?;
                out.add_fields(receipt.schemas, receipt.backend_meta)?;
                Ok(out)
            }
            Err(e) => {
                if let Err(cleanup) = self.clear_samples(&meta).await {
                    tracing::warn!(partition, error = %cleanup, "could not remove samples of a failed put");
                }
                Err(e)
            }
        }
    }

    /// Writes `batch` (rows aligned with `meta`'s samples) to storage, then publishes the cells
    /// with `meta`'s tags in one controller message. Returns `meta` with the new fields, ready.
    ///
    /// The controller checks the write first (samples still owned, not being cleared, dtype and
    /// kind of every field compatible with the partition's): a put it would refuse never
    /// reaches storage, so it cannot overwrite the stored value.
    pub async fn put(&self, meta: &BatchMeta, batch: &Batch) -> Result<BatchMeta> {
        check_put(meta, batch)?;
        let target = self
            .control
            .prepare_write(meta.partition(), meta.samples(), &batch.type_schemas())
            .await?;
        let receipt = self
            .store_and_publish(&target, meta.tags().to_vec(), batch, true)
            .await?
            .ok_or_else(lost_receipt)?;
        let mut out = meta.clone();
        out.add_fields(receipt.schemas, receipt.backend_meta)?;
        Ok(out)
    }

    /// Writes `batch` to storage for `target`'s samples (checked by the caller) and publishes
    /// it with `tags`. Returns the receipt only when `keep_receipt`; the KV path does not use
    /// it, and handing the schemas to the controller by value saves cloning them (one shape
    /// vector per row for ragged fields). Without the receipt, the checks `add_fields` would
    /// have made still apply: an inconsistent receipt is an error, returned after publishing.
    ///
    /// If the controller refuses the notice (a clear or index reuse raced the write), the cells
    /// written for samples that are gone are deleted again, so a refused write leaves nothing.
    pub(crate) async fn store_and_publish(
        &self,
        target: &BatchMeta,
        tags: Vec<tq_core::Tags>,
        batch: &Batch,
        keep_receipt: bool,
    ) -> Result<Option<PutReceipt>> {
        let partition = target.partition();
        let receipt = self.storage.put(target, batch).await?;
        // An overwrite (the samples already describe cells) may have written beside the old
        // cells: keep the new places, to remove them if the controller refuses the write.
        let placed = receipt
            .backend_meta
            .as_ref()
            .filter(|_| target.backend_meta().iter().any(|m| !m.is_empty()))
            .cloned();
        let (schemas, backend_meta, kept, consistent) = if keep_receipt {
            let (s, b) = (receipt.schemas.clone(), receipt.backend_meta.clone());
            (s, b, Some(receipt), Ok(()))
        } else {
            let consistent =
                target.check_new_fields(&receipt.schemas, receipt.backend_meta.as_deref());
            (receipt.schemas, receipt.backend_meta, None, consistent)
        };
        let notified = self
            .control
            .notify_production(ProductionNotice {
                partition: partition.to_string(),
                samples: target.samples().to_vec(),
                schemas,
                tags: Some(tags),
                backend_meta,
            })
            .await;
        match notified {
            Ok(replaced) => self.retire_replaced(target, replaced).await,
            Err(e) => {
                self.discard_unpublished(target, batch, placed.as_deref(), &e)
                    .await;
                return Err(
                    e.context("data reached storage but was not published, so it stays invisible")
                );
            }
        }
        consistent?;
        Ok(kept)
    }

    /// After a published write of `target`'s samples: lets storage reclaim the cells the
    /// controller answered it `replaced`.
    ///
    /// Nothing but this call names those cells any more (the controller describes the new
    /// ones), so a failure here leaks them for good: a storage that says "not now" (a Redis
    /// loading its data after a restart, a dropped connection) is asked again, with backoff,
    /// for up to [`RETIRE_RETRY_BUDGET`] — `tq soak` found 76 keys left in Redis by one
    /// `BusyLoading` answer here. A failure that persists is logged with what leaks.
    /// Retried here, in the writer's call, rather than later in the background: a cell of
    /// version 0 can be written again under the same key after a field clear, and a late delete
    /// would remove the new value.
    pub(crate) async fn retire_replaced(&self, target: &BatchMeta, replaced: Vec<BackendMeta>) {
        if replaced.is_empty() {
            return;
        }
        let cells = match target.clone().with_backend_meta(replaced) {
            Ok(cells) => cells,
            Err(e) => {
                return tracing::warn!(
                    partition = target.partition(),
                    error = %e,
                    "could not reclaim the cells an overwrite replaced"
                )
            }
        };
        let started = std::time::Instant::now();
        let mut pause = std::time::Duration::from_millis(25);
        loop {
            let Err(e) = self.storage.retire_replaced(&cells).await else {
                return;
            };
            // A delete repeated is harmless, so an unknown outcome is asked again too.
            let again = e.retry() != tq_core::Retry::Never;
            if !again || started.elapsed() + pause > RETIRE_RETRY_BUDGET {
                return tracing::warn!(
                    partition = target.partition(),
                    samples = cells.len(),
                    error = %e,
                    "could not reclaim the cells an overwrite replaced; they stay in storage"
                );
            }
            tracing::debug!(partition = target.partition(), error = %e, "retrying the reclaim of replaced cells");
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(std::time::Duration::from_millis(400));
        }
    }

    /// After a refused production notice: deletes the cells just written for samples that are
    /// no longer live (cleared, or their index reused — storage clears check the generation,
    /// so a newer sample's cells are never touched), and, when the refusal is certain (not a
    /// lost answer), the cells an overwrite wrote beside those the controller still describes.
    /// `placed`: where the write put its cells, when it overwrote. Best effort: failures are
    /// logged.
    async fn discard_unpublished(
        &self,
        target: &BatchMeta,
        batch: &Batch,
        placed: Option<&[BackendMeta]>,
        refusal: &Error,
    ) {
        let partition = target.partition();
        // One row per sample, or (a backend's bug) nothing is known of where cells went.
        let placed = placed.filter(|p| p.len() == target.len());
        if refusal.retry() != tq_core::Retry::OutcomeUnknown {
            if let Some(placed) = placed {
                // The other way round from a publish: the cells written beside described ones
                // go, the described ones stay.
                self.retire_replaced(target, written_beside(target.backend_meta(), placed))
                    .await;
            }
        }
        let holds = match self
            .control
            .still_hold(partition, target.samples(), &[])
            .await
        {
            Ok(h) => h,
            Err(e) => {
                tracing::warn!(partition, error = %e, "cannot tell which cells of a refused write to delete");
                return;
            }
        };
        let gone: Vec<usize> = (0..holds.len()).filter(|&i| !holds[i]).collect();
        if gone.is_empty() {
            return;
        }
        let samples = gone.iter().map(|&i| target.samples()[i]).collect();
        let mut written = BatchMeta::new(partition, samples).with_fields(batch.type_schemas());
        if let Some(placed) = placed {
            let rows = gone.iter().map(|&i| placed[i].clone()).collect();
            written = written.and_then(|m| m.with_backend_meta(rows));
        }
        let result = match written {
            Ok(m) => self.storage.clear(&m, &FieldFilter::All).await,
            Err(e) => Err(e),
        };
        match result {
            Ok(()) => tracing::debug!(
                partition,
                samples = gone.len(),
                "deleted the cells of a refused write"
            ),
            Err(e) => {
                tracing::warn!(partition, error = %e, "could not delete the cells of a refused write")
            }
        }
    }

    /// Reads the fields of `meta` for its samples, in order. The controller is not involved,
    /// except to tell what missing cells mean: cells of samples (or fields) cleared since
    /// `meta` was made are `NotFound`; `DataLost` means cells the controller still counts as
    /// produced are gone. Values that do not match `meta`'s dtype, kind or shapes are
    /// `Corrupted`, never returned.
    pub async fn get_data(&self, meta: &BatchMeta) -> Result<Batch> {
        if meta.is_empty() || meta.fields().is_empty() {
            return Ok(Batch::empty(meta.len()));
        }
        match self.storage.get(meta).await {
            Ok(batch) => {
                meta.check_batch(&batch)?;
                Ok(batch)
            }
            Err(e) if e.kind() == &tq_core::ErrorKind::DataLost => {
                Err(self.explain_loss(meta, e).await)
            }
            Err(e) => Err(e),
        }
    }

    /// A read found cells missing: `NotFound` if the controller no longer counts every sample
    /// of `meta` as holding its fields (a clear raced the read), else the `DataLost` as it is.
    async fn explain_loss(&self, meta: &BatchMeta, lost: Error) -> Error {
        let fields: Vec<FieldName> = meta.field_names().map(str::to_string).collect();
        match self
            .control
            .still_hold(meta.partition(), meta.samples(), &fields)
            .await
        {
            Ok(holds) => match holds.iter().position(|h| !h) {
                Some(i) => Error::not_found(format!(
                    "partition `{}`: sample {} (or one of its fields {fields:?}) was cleared while \
                     being read",
                    meta.partition(),
                    meta.samples()[i]
                )),
                None => lost,
            },
            Err(e) => lost.context(format!(
                "(could not ask the controller whether a clear raced the read: {e})"
            )),
        }
    }

    pub(crate) async fn production_status(
        &self,
        partition: &str,
        fields: &[&str],
    ) -> Result<ProductionStatus> {
        let fields: Vec<FieldName> = fields.iter().map(|s| s.to_string()).collect();
        self.control.production_status(partition, &fields).await
    }

    pub(crate) async fn consumption_status(
        &self,
        partition: &str,
        task: &str,
    ) -> Result<ConsumptionStatus> {
        self.control.consumption_status(partition, task).await
    }

    /// Forgets what `task` (or every task, with `None`) consumed in `partition`.
    pub(crate) async fn reset_consumption(
        &self,
        partition: &str,
        task: Option<&str>,
    ) -> Result<()> {
        self.control.reset_consumption(partition, task).await
    }

    pub async fn list_partitions(&self) -> Result<Vec<String>> {
        self.control.list_partitions().await
    }

    /// Merges `meta`'s tags into its samples without writing data (TransferQueue's
    /// `set_custom_meta`). Samples cleared since `meta` was made are ignored.
    pub async fn set_tags(&self, meta: &BatchMeta) -> Result<()> {
        if meta.is_empty() {
            return Ok(());
        }
        self.control
            .set_tags(meta.partition(), meta.samples(), meta.tags().to_vec())
            .await
    }
}

/// `store_and_publish` keeps the receipt when asked to; a missing one is a bug in this crate.
fn lost_receipt() -> Error {
    Error::internal("the storage receipt of a put was not kept")
}

/// The shape checks of a put of `batch` for `meta`'s samples (before anything is sent).
fn check_put(meta: &BatchMeta, batch: &Batch) -> Result<()> {
    let partition = meta.partition();
    if meta.is_empty() {
        return Err(Error::invalid(format!(
            "partition `{partition}`: put needs a non-empty batch meta"
        )));
    }
    check_batch(partition, batch)?;
    if batch.len() != meta.len() {
        return Err(Error::invalid(format!(
            "partition `{partition}`: batch has {} rows for {} samples",
            batch.len(),
            meta.len()
        )));
    }
    let mut seen = HashSet::with_capacity(meta.len());
    if let Some(d) = meta.samples().iter().find(|s| !seen.insert(s.index)) {
        return Err(Error::invalid(format!(
            "partition `{partition}`: sample {d} appears twice"
        )));
    }
    Ok(())
}

pub(crate) fn check_batch(partition: &str, batch: &Batch) -> Result<()> {
    if batch.is_empty() || batch.columns().is_empty() {
        return Err(Error::invalid(format!(
            "partition `{partition}`: put needs at least one row and one field"
        )));
    }
    Ok(())
}

/// Of the cells a write `placed`, those it wrote beside cells the samples already described
/// (`before`) at another place, per sample; empty when there are none.
pub(crate) fn written_beside(before: &[BackendMeta], placed: &[BackendMeta]) -> Vec<BackendMeta> {
    let rows: Vec<BackendMeta> = before
        .iter()
        .zip(placed)
        .map(|(old, new)| {
            new.iter()
                .filter(|(f, v)| old.get(*f).is_some_and(|o| o != *v))
                .map(|(f, v)| (f.clone(), v.clone()))
                .collect()
        })
        .collect();
    if rows.iter().all(BackendMeta::is_empty) {
        Vec::new()
    } else {
        rows
    }
}
