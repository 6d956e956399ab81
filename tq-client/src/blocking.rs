//! Blocking wrappers for callers without an async runtime: [`BlockingClient`],
//! [`BlockingPartition`] and [`BlockingBatchStream`].
//!
//! Every async operation of [`Client`], [`Partition`] and [`BatchStream`] has a blocking
//! counterpart of the same name here; a test (`tests/blocking_parity.rs`) reads the sources and
//! fails when one is missing, so the two cannot drift apart silently.

use crate::{
    BatchStream, Client, ClientBuilder, Config, KvBatchMeta, LinkOptions, Partition, StreamConfig,
    StreamItem, StreamProgress,
};
use futures::StreamExt;
use std::sync::Arc;
use std::time::Duration;
use tokio::runtime::Runtime;
use tq_controller::{ConsumptionStatus, GetMetaRequest, KeyListing, ProductionStatus};
use tq_core::{Batch, BatchMeta, Error, MergeOp, MergeRegistry, Result, Tags};

fn runtime() -> Result<Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Error::internal("cannot start the client runtime").with_source(e))
}

/// [`Client`] with blocking methods. It owns a small tokio runtime (shared by the partitions and
/// streams it hands out); do not call it from inside an async task (use [`Client`] there).
#[derive(Clone)]
pub struct BlockingClient {
    runtime: Arc<ClientRuntime>,
    client: Client,
}

/// The runtime of a blocking client and of the partitions and streams it hands out. When the
/// last of them goes, it lets the requests the client sent without waiting for their answer
/// (a clear's release, [`Client::settle`]) finish before the runtime stops and drops them.
struct ClientRuntime {
    runtime: Runtime,
    client: Client,
}

impl ClientRuntime {
    /// Runs `work` to its end from the calling thread ([`crate::wait::wait_for`]: awake for a
    /// moment before it parks, so a quick answer needs no wake-up). A thread inside a runtime's
    /// context goes through `block_on`, which tells a caller inside a task that it must not
    /// block there (tokio's panic) rather than blocking the runtime's worker.
    fn wait<F: std::future::Future>(&self, work: F) -> F::Output {
        if tokio::runtime::Handle::try_current().is_ok() {
            return self.runtime.block_on(work);
        }
        crate::wait::wait_for(self.runtime.handle(), work)
    }
}

impl Drop for ClientRuntime {
    fn drop(&mut self) {
        // Inside another runtime blocking is not allowed (and dropping this one would panic
        // there anyway).
        if tokio::runtime::Handle::try_current().is_err() {
            self.runtime.block_on(self.client.settle());
        }
    }
}

impl std::fmt::Debug for BlockingClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockingClient")
            .field("client", &self.client)
            .finish_non_exhaustive()
    }
}

impl BlockingClient {
    fn on(runtime: Runtime, client: Client) -> BlockingClient {
        let runtime = Arc::new(ClientRuntime {
            runtime,
            client: client.clone(),
        });
        BlockingClient { runtime, client }
    }

    /// An embedded deployment, like [`Client::embedded`].
    pub fn embedded(config: Config) -> Result<BlockingClient> {
        BlockingClient::build(Client::builder().config(config))
    }

    /// An embedded deployment with merge functions, like [`Client::embedded_with_merges`].
    pub fn embedded_with_merges(config: Config, merges: MergeRegistry) -> Result<BlockingClient> {
        BlockingClient::build(Client::builder().config(config).merges(&merges))
    }

    /// An embedded client from a builder ([`ClientBuilder::build`]).
    pub fn build(builder: ClientBuilder) -> Result<BlockingClient> {
        let runtime = runtime()?;
        let client = {
            let _entered = runtime.enter();
            builder.build()?
        };
        Ok(BlockingClient::on(runtime, client))
    }

    /// Connects to a controller, like [`Client::connect`].
    #[cfg(feature = "remote")]
    pub fn connect(url: &str) -> Result<BlockingClient> {
        BlockingClient::connect_builder(Client::builder(), url)
    }

    /// Connects with this configuration, like [`Client::connect_with`].
    #[cfg(feature = "remote")]
    pub fn connect_with(url: &str, config: Config) -> Result<BlockingClient> {
        BlockingClient::connect_builder(Client::builder().config(config), url)
    }

    /// Connects with a builder ([`ClientBuilder::connect`]).
    #[cfg(feature = "remote")]
    pub fn connect_builder(builder: ClientBuilder, url: &str) -> Result<BlockingClient> {
        let runtime = runtime()?;
        let client = runtime.block_on(builder.connect(url))?;
        Ok(BlockingClient::on(runtime, client))
    }

    /// The async client inside.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Runs `work` (an async call on [`BlockingClient::client`]) to completion on this
    /// client's runtime: how crates that extend [`Client`] give their calls a blocking form.
    pub fn block_on<F: std::future::Future>(&self, work: F) -> F::Output {
        self.runtime.wait(work)
    }

    /// A blocking handle to partition `name`.
    pub fn partition(&self, name: impl Into<String>) -> BlockingPartition {
        BlockingPartition {
            runtime: self.runtime.clone(),
            partition: self.client.partition(name),
        }
    }

    pub fn get_meta(&self, req: GetMetaRequest) -> Result<BatchMeta> {
        self.runtime.wait(self.client.get_meta(req))
    }
    pub fn put(&self, meta: &BatchMeta, batch: &Batch) -> Result<BatchMeta> {
        self.runtime.wait(self.client.put(meta, batch))
    }
    pub fn get_data(&self, meta: &BatchMeta) -> Result<Batch> {
        self.runtime.wait(self.client.get_data(meta))
    }
    pub fn clear_samples(&self, meta: &BatchMeta) -> Result<()> {
        self.runtime.wait(self.client.clear_samples(meta))
    }
    pub fn list_partitions(&self) -> Result<Vec<String>> {
        self.runtime.wait(self.client.list_partitions())
    }
    /// [`Client::settle`]; dropping the last handle of this client does it too.
    pub fn settle(&self) {
        self.runtime.wait(self.client.settle())
    }
    pub fn set_tags(&self, meta: &BatchMeta) -> Result<()> {
        self.runtime.wait(self.client.set_tags(meta))
    }
    pub fn kv_list_all(&self) -> Result<Vec<KeyListing>> {
        self.runtime.wait(self.client.kv_list_all())
    }
    pub fn retry_unfinished_clears(&self) -> Result<usize> {
        self.runtime.wait(self.client.retry_unfinished_clears())
    }
    pub fn ack(&self, task: &str, meta: &BatchMeta) -> Result<usize> {
        self.runtime.wait(self.client.ack(task, meta))
    }
    pub fn renew_lease(&self, task: &str, meta: &BatchMeta, extend: Duration) -> Result<usize> {
        self.runtime
            .wait(self.client.renew_lease(task, meta, extend))
    }
}

/// [`Partition`] with blocking methods (from [`BlockingClient::partition`]).
#[derive(Clone)]
pub struct BlockingPartition {
    runtime: Arc<ClientRuntime>,
    partition: Partition,
}

impl std::fmt::Debug for BlockingPartition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockingPartition")
            .field("name", &self.partition.name())
            .finish_non_exhaustive()
    }
}

impl BlockingPartition {
    pub fn name(&self) -> &str {
        self.partition.name()
    }

    /// The async handle this one wraps.
    pub fn handle(&self) -> &Partition {
        &self.partition
    }

    /// Runs `work` (an async call on [`BlockingPartition::handle`]) to completion on this
    /// partition's runtime, like [`BlockingClient::block_on`].
    pub fn block_on<F: std::future::Future>(&self, work: F) -> F::Output {
        self.runtime.wait(work)
    }

    /// A blocking iterator over ready batches ([`Partition::stream`]).
    pub fn stream(&self, config: StreamConfig) -> Result<BlockingBatchStream> {
        let stream = {
            let _entered = self.runtime.runtime.enter();
            self.partition.stream(config)?
        };
        Ok(BlockingBatchStream {
            runtime: self.runtime.clone(),
            stream,
        })
    }
    pub fn fetch(&self, fields: &[&str], task: &str, batch_size: usize) -> Result<BatchMeta> {
        self.runtime
            .wait(self.partition.fetch(fields, task, batch_size))
    }
    pub fn put_new(&self, batch: &Batch) -> Result<BatchMeta> {
        self.runtime.wait(self.partition.put_new(batch))
    }
    pub fn production_status(&self, fields: &[&str]) -> Result<ProductionStatus> {
        self.runtime.wait(self.partition.production_status(fields))
    }
    pub fn consumption_status(&self, task: &str) -> Result<ConsumptionStatus> {
        self.runtime.wait(self.partition.consumption_status(task))
    }
    pub fn reset_consumption(&self, task: &str) -> Result<()> {
        self.runtime.wait(self.partition.reset_consumption(task))
    }
    pub fn reset_all_consumption(&self) -> Result<()> {
        self.runtime.wait(self.partition.reset_all_consumption())
    }
    pub fn complete(&self) -> Result<()> {
        self.runtime.wait(self.partition.complete())
    }
    pub fn clear(&self) -> Result<()> {
        self.runtime.wait(self.partition.clear())
    }
    pub fn clear_samples(&self) -> Result<()> {
        self.runtime.wait(self.partition.clear_samples())
    }
    pub fn kv_put(&self, key: &str, fields: &Batch, tags: Option<Tags>) -> Result<KvBatchMeta> {
        self.runtime.wait(self.partition.kv_put(key, fields, tags))
    }
    pub fn kv_batch_put<K: AsRef<str>>(
        &self,
        keys: &[K],
        fields: &Batch,
        tags: Option<Vec<Tags>>,
    ) -> Result<KvBatchMeta> {
        self.runtime
            .wait(self.partition.kv_batch_put(keys, fields, tags))
    }
    pub fn kv_set_tags<K: AsRef<str>>(&self, keys: &[K], tags: Vec<Tags>) -> Result<KvBatchMeta> {
        self.runtime.wait(self.partition.kv_set_tags(keys, tags))
    }
    pub fn kv_batch_get<K: AsRef<str>>(
        &self,
        keys: &[K],
        fields: Option<&[&str]>,
    ) -> Result<Batch> {
        self.runtime.wait(self.partition.kv_batch_get(keys, fields))
    }
    pub fn kv_meta<K: AsRef<str>>(&self, keys: &[K]) -> Result<BatchMeta> {
        self.runtime.wait(self.partition.kv_meta(keys))
    }
    pub fn kv_meta_or_create<K: AsRef<str>>(&self, keys: &[K]) -> Result<BatchMeta> {
        self.runtime.wait(self.partition.kv_meta_or_create(keys))
    }
    pub fn kv_list(&self) -> Result<KeyListing> {
        self.runtime.wait(self.partition.kv_list())
    }
    pub fn kv_tags<K: AsRef<str>>(&self, keys: &[K]) -> Result<Vec<Tags>> {
        self.runtime.wait(self.partition.kv_tags(keys))
    }
    pub fn kv_clear<K: AsRef<str>>(&self, keys: &[K]) -> Result<()> {
        self.runtime.wait(self.partition.kv_clear(keys))
    }
    pub fn kv_clear_fields<K: AsRef<str>>(&self, keys: &[K], fields: &[&str]) -> Result<()> {
        self.runtime
            .wait(self.partition.kv_clear_fields(keys, fields))
    }
    pub fn kv_update(&self, key: &str, fields: &Batch, merge: &MergeOp) -> Result<KvBatchMeta> {
        self.runtime
            .wait(self.partition.kv_update(key, fields, merge))
    }
    pub fn kv_batch_update<K: AsRef<str>>(
        &self,
        keys: &[K],
        fields: &Batch,
        merge: &MergeOp,
    ) -> Result<KvBatchMeta> {
        self.runtime
            .wait(self.partition.kv_batch_update(keys, fields, merge))
    }
    pub fn kv_link<K: AsRef<str>, P: AsRef<str>>(
        &self,
        keys: &[K],
        public_keys: &[P],
        fields: &[&str],
        options: &LinkOptions,
    ) -> Result<KvBatchMeta> {
        self.runtime
            .wait(self.partition.kv_link(keys, public_keys, fields, options))
    }
    pub fn kv_unlink<K: AsRef<str>>(&self, keys: &[K], fields: &[&str]) -> Result<usize> {
        self.runtime.wait(self.partition.kv_unlink(keys, fields))
    }
    pub fn kv_clear_unlinked_public(&self, prefix: &str) -> Result<Vec<String>> {
        self.runtime
            .wait(self.partition.kv_clear_unlinked_public(prefix))
    }
}

/// A [`BatchStream`] as a blocking iterator (from [`BlockingPartition::stream`]). Like the
/// stream, it ends cleanly when the partition is complete and yields a `Timeout` error before
/// ending when it stops waiting.
pub struct BlockingBatchStream {
    runtime: Arc<ClientRuntime>,
    stream: BatchStream,
}

impl std::fmt::Debug for BlockingBatchStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockingBatchStream")
            .field("partition", &self.stream.partition())
            .field("progress", &self.stream.progress())
            .finish_non_exhaustive()
    }
}

impl BlockingBatchStream {
    /// Acknowledges an item of an acknowledged-mode stream ([`BatchStream::ack`]).
    pub fn ack(&self, item: &StreamItem) -> Result<usize> {
        self.runtime.wait(self.stream.ack(item))
    }
    pub fn renew(&self, item: &StreamItem, extend: Duration) -> Result<usize> {
        self.runtime.wait(self.stream.renew(item, extend))
    }
    pub fn progress(&self) -> StreamProgress {
        self.stream.progress()
    }
    pub fn partition(&self) -> &str {
        self.stream.partition()
    }
}

impl Iterator for BlockingBatchStream {
    type Item = Result<StreamItem>;

    fn next(&mut self) -> Option<Self::Item> {
        self.runtime.wait(self.stream.next())
    }
}
