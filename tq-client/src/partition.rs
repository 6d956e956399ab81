//! [`Partition`]: a handle to one partition, carrying every partition-scoped operation.
//!
//! Operations on a partition used to take the partition name as a first `&str` next to other
//! names (a key, a task, a prefix), where swapping two arguments compiled and did the wrong
//! thing. With the handle the partition is named once, and each operation takes only what
//! differs between calls.

use crate::{Client, KvBatchMeta, LinkOptions};
use std::future::Future;
use tq_controller::{ConsumptionStatus, KeyListing, ProductionStatus};
use tq_core::{Batch, BatchMeta, MergeOp, Result, Tags};

/// One partition of a [`Client`]: `client.partition("train")`. Cheap to make and to clone; it
/// makes no call by itself, and a partition that does not exist yet is created by its first
/// write.
#[derive(Clone, Debug)]
pub struct Partition {
    client: Client,
    name: String,
}

impl Client {
    /// A handle to partition `name` (see [`Partition`]).
    pub fn partition(&self, name: impl Into<String>) -> Partition {
        Partition {
            client: self.clone(),
            name: name.into(),
        }
    }

    /// The keys and tags of every partition.
    pub async fn kv_list_all(&self) -> Result<Vec<KeyListing>> {
        self.kv_list(None).await
    }
}

impl Partition {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The client this handle belongs to.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Runs one operation under one request id (the caller's, from
    /// `tq_core::telemetry::with_trace_id`, or a fresh one) and a `debug` span naming it, so
    /// every request it sends, and the servers' log lines for them, carry the same id.
    async fn traced<T>(&self, op: &'static str, work: impl Future<Output = T>) -> T {
        use tracing::Instrument;
        let id = tq_core::telemetry::current_or_new_trace_id();
        let span = tracing::debug_span!(
            "tq",
            op,
            partition = %self.name,
            trace = %format_args!("{id:08x}")
        );
        tq_core::telemetry::with_trace_id(id, work)
            .instrument(span)
            .await
    }

    // ----------------------------------------------------------------------------------------
    // Metadata API

    /// Fetches up to `batch_size` samples produced for `fields` and not yet consumed by `task`,
    /// waiting up to the configured fetch timeout. The samples are consumed by `task`.
    pub async fn fetch(&self, fields: &[&str], task: &str, batch_size: usize) -> Result<BatchMeta> {
        self.traced(
            "fetch",
            self.client.fetch(&self.name, fields, task, batch_size),
        )
        .await
    }

    /// Writes `batch` into new samples and returns their metadata. If the write fails, the new
    /// samples are removed again.
    pub async fn put_new(&self, batch: &Batch) -> Result<BatchMeta> {
        self.traced("put_new", self.client.put_new(&self.name, batch))
            .await
    }

    pub async fn production_status(&self, fields: &[&str]) -> Result<ProductionStatus> {
        self.client.production_status(&self.name, fields).await
    }

    pub async fn consumption_status(&self, task: &str) -> Result<ConsumptionStatus> {
        self.client.consumption_status(&self.name, task).await
    }

    /// Forgets what `task` consumed, so it sees every sample again.
    pub async fn reset_consumption(&self, task: &str) -> Result<()> {
        self.client.reset_consumption(&self.name, Some(task)).await
    }

    /// Forgets what every task consumed.
    pub async fn reset_all_consumption(&self) -> Result<()> {
        self.client.reset_consumption(&self.name, None).await
    }

    /// Streams ready batches of this partition for a consumer task, fetching ahead while the
    /// caller works (see [`crate::StreamConfig`] and the delivery guarantees of
    /// [`crate::Delivery`]). Must be called inside a tokio runtime.
    pub fn stream(&self, config: crate::StreamConfig) -> Result<crate::BatchStream> {
        self.client.stream(&self.name, config)
    }

    /// Declares that no more samples will be added: streams over it end once they have
    /// delivered everything.
    pub async fn complete(&self) -> Result<()> {
        self.client.complete_partition(&self.name).await
    }

    /// Clears every sample and drops the partition.
    pub async fn clear(&self) -> Result<()> {
        self.traced("clear", self.client.clear_partition(&self.name))
            .await
    }

    /// Clears every sample. A complete partition stays, with its mark, what its tasks consumed
    /// and its sampler state (so late consumers still see the end); an incomplete one left
    /// empty is removed, as after any clear.
    pub async fn clear_samples(&self) -> Result<()> {
        self.traced("clear_samples", self.client.clear_all_samples(&self.name))
            .await
    }

    // ----------------------------------------------------------------------------------------
    // KV API

    /// Writes one key: `fields` is a one-row batch; `tags` are merged into the key's tags.
    pub async fn kv_put(
        &self,
        key: &str,
        fields: &Batch,
        tags: Option<Tags>,
    ) -> Result<KvBatchMeta> {
        self.traced(
            "kv_put",
            self.client.kv_put(&self.name, key, Some(fields), tags),
        )
        .await
    }

    /// Writes several keys at once (created on first use). Row `i` of `fields` and `tags[i]`
    /// belong to `keys[i]`. Everything is validated before anything changes; if the storage
    /// write fails, keys this call created are removed again.
    pub async fn kv_batch_put<K: AsRef<str>>(
        &self,
        keys: &[K],
        fields: &Batch,
        tags: Option<Vec<Tags>>,
    ) -> Result<KvBatchMeta> {
        self.traced(
            "kv_batch_put",
            self.client
                .kv_batch_put(&self.name, keys, Some(fields), tags),
        )
        .await
    }

    /// Merges `tags[i]` into the tags of `keys[i]` (creating keys that do not exist), writing
    /// no field.
    pub async fn kv_set_tags<K: AsRef<str>>(
        &self,
        keys: &[K],
        tags: Vec<Tags>,
    ) -> Result<KvBatchMeta> {
        self.traced(
            "kv_set_tags",
            self.client.kv_batch_put(&self.name, keys, None, Some(tags)),
        )
        .await
    }

    /// Reads keys. Every key must exist and every requested field be produced for every key;
    /// without `fields`, the fields all keys hold are returned (`NotFound` when they hold none
    /// in common yet). Rows follow `keys`' order.
    pub async fn kv_batch_get<K: AsRef<str>>(
        &self,
        keys: &[K],
        fields: Option<&[&str]>,
    ) -> Result<Batch> {
        self.traced(
            "kv_batch_get",
            self.client.kv_batch_get(&self.name, keys, fields),
        )
        .await
    }

    /// The metadata of `keys` (their samples, produced fields and tags), rows in `keys`' order,
    /// for the metadata API (`get_data`, `put`, `clear_samples`). `NotFound` names the keys
    /// that do not exist.
    pub async fn kv_meta<K: AsRef<str>>(&self, keys: &[K]) -> Result<BatchMeta> {
        self.traced("kv_meta", self.client.kv_meta(&self.name, keys))
            .await
    }

    /// The metadata of `keys` like [`Partition::kv_meta`], except that keys the partition does
    /// not hold get new samples (holding nothing yet), for a caller that writes them through
    /// the metadata API ([`Client::put`]). Rows in `keys`' order.
    pub async fn kv_meta_or_create<K: AsRef<str>>(&self, keys: &[K]) -> Result<BatchMeta> {
        let keys = crate::client::owned_keys(&self.name, keys)?;
        let kv = self
            .traced(
                "kv_meta_or_create",
                self.client
                    .control()
                    .kv_retrieve_meta(&self.name, &keys, true),
            )
            .await?;
        Ok(kv.meta)
    }

    /// The keys and tags of this partition (none when it does not exist).
    pub async fn kv_list(&self) -> Result<KeyListing> {
        let listing = self.client.kv_list(Some(&self.name)).await?;
        Ok(listing.into_iter().next().unwrap_or_else(|| KeyListing {
            partition: self.name.clone(),
            entries: Vec::new(),
        }))
    }

    /// The tags of `keys`, in order; `NotFound` naming the first key the partition does not
    /// hold.
    pub async fn kv_tags<K: AsRef<str>>(&self, keys: &[K]) -> Result<Vec<Tags>> {
        self.client.kv_tags(&self.name, keys).await
    }

    /// Removes keys (their fields, tags and consumption). Keys that do not exist are skipped,
    /// so clearing twice is harmless; a key whose earlier clear failed half-way is cleared for
    /// good.
    pub async fn kv_clear<K: AsRef<str>>(&self, keys: &[K]) -> Result<()> {
        self.traced("kv_clear", self.client.kv_clear(&self.name, keys, None))
            .await
    }

    /// Removes the cells of `fields` of `keys`; keys, other fields, tags and consumption stay.
    /// An empty field list is `Invalid`.
    pub async fn kv_clear_fields<K: AsRef<str>>(&self, keys: &[K], fields: &[&str]) -> Result<()> {
        self.traced(
            "kv_clear_fields",
            self.client.kv_clear(&self.name, keys, Some(fields)),
        )
        .await
    }

    /// Merges a one-row batch into the stored fields of `key` (`merge(stored, incoming)`).
    pub async fn kv_update(
        &self,
        key: &str,
        fields: &Batch,
        merge: &MergeOp,
    ) -> Result<KvBatchMeta> {
        self.traced(
            "kv_update",
            self.client.kv_update(&self.name, key, fields, merge),
        )
        .await
    }

    /// [`Partition::kv_update`] of several keys; row `i` belongs to `keys[i]`.
    pub async fn kv_batch_update<K: AsRef<str>>(
        &self,
        keys: &[K],
        fields: &Batch,
        merge: &MergeOp,
    ) -> Result<KvBatchMeta> {
        self.traced(
            "kv_batch_update",
            self.client.kv_batch_update(&self.name, keys, fields, merge),
        )
        .await
    }

    /// Makes `fields` of `keys[i]` read the cells of `public_keys[i]` in the public partition
    /// (`options.public_partition`), without copying the payloads.
    pub async fn kv_link<K: AsRef<str>, P: AsRef<str>>(
        &self,
        keys: &[K],
        public_keys: &[P],
        fields: &[&str],
        options: &LinkOptions,
    ) -> Result<KvBatchMeta> {
        self.traced(
            "kv_link",
            self.client
                .kv_link(&self.name, keys, public_keys, fields, options),
        )
        .await
    }

    /// Removes the links of `fields` of `keys`; returns how many links went away.
    pub async fn kv_unlink<K: AsRef<str>>(&self, keys: &[K], fields: &[&str]) -> Result<usize> {
        self.traced("kv_unlink", self.client.kv_unlink(&self.name, keys, fields))
            .await
    }

    /// On a public partition: clears the keys starting with `prefix` that no private key links
    /// to any more, and returns them.
    pub async fn kv_clear_unlinked_public(&self, prefix: &str) -> Result<Vec<String>> {
        self.traced(
            "kv_clear_unlinked_public",
            self.client.kv_clear_unlinked_public(&self.name, prefix),
        )
        .await
    }
}
