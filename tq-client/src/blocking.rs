//! A blocking wrapper for callers without an async runtime.

use crate::{Client, Config, KvBatchMeta};
use tq_controller::{ConsumptionStatus, GetMetaRequest, KeyListing, ProductionStatus};
use tq_core::{Batch, BatchMeta, Error, Result, Tags};

/// [`Client`] with blocking methods. It owns a small tokio runtime; do not call it from inside
/// an async task (use [`Client`] there).
pub struct BlockingClient {
    runtime: tokio::runtime::Runtime,
    client: Client,
}

impl BlockingClient {
    /// An embedded deployment, like [`Client::embedded`].
    pub fn embedded(config: Config) -> Result<BlockingClient> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| Error::internal("cannot start the client runtime").with_source(e))?;
        let client = Client::embedded(config)?;
        Ok(BlockingClient { runtime, client })
    }

    /// The async client inside.
    pub fn client(&self) -> &Client {
        &self.client
    }

    pub fn get_meta(&self, req: GetMetaRequest) -> Result<BatchMeta> {
        self.runtime.block_on(self.client.get_meta(req))
    }
    pub fn fetch(
        &self,
        partition: &str,
        fields: &[&str],
        task: &str,
        batch_size: usize,
    ) -> Result<BatchMeta> {
        self.runtime
            .block_on(self.client.fetch(partition, fields, task, batch_size))
    }
    pub fn put_new(&self, partition: &str, batch: &Batch) -> Result<BatchMeta> {
        self.runtime.block_on(self.client.put_new(partition, batch))
    }
    pub fn put(&self, meta: &BatchMeta, batch: &Batch) -> Result<BatchMeta> {
        self.runtime.block_on(self.client.put(meta, batch))
    }
    pub fn get_data(&self, meta: &BatchMeta) -> Result<Batch> {
        self.runtime.block_on(self.client.get_data(meta))
    }
    pub fn clear_samples(&self, meta: &BatchMeta) -> Result<()> {
        self.runtime.block_on(self.client.clear_samples(meta))
    }
    pub fn clear_partition(&self, partition: &str) -> Result<()> {
        self.runtime
            .block_on(self.client.clear_partition(partition))
    }
    pub fn production_status(&self, partition: &str, fields: &[&str]) -> Result<ProductionStatus> {
        self.runtime
            .block_on(self.client.production_status(partition, fields))
    }
    pub fn consumption_status(&self, partition: &str, task: &str) -> Result<ConsumptionStatus> {
        self.runtime
            .block_on(self.client.consumption_status(partition, task))
    }
    pub fn reset_consumption(&self, partition: &str, task: Option<&str>) -> Result<()> {
        self.runtime
            .block_on(self.client.reset_consumption(partition, task))
    }
    pub fn list_partitions(&self) -> Result<Vec<String>> {
        self.runtime.block_on(self.client.list_partitions())
    }
    pub fn kv_put(
        &self,
        partition: &str,
        key: &str,
        fields: Option<&Batch>,
        tags: Option<Tags>,
    ) -> Result<KvBatchMeta> {
        self.runtime
            .block_on(self.client.kv_put(partition, key, fields, tags))
    }
    pub fn kv_batch_put<K: AsRef<str>>(
        &self,
        partition: &str,
        keys: &[K],
        fields: Option<&Batch>,
        tags: Option<Vec<Tags>>,
    ) -> Result<KvBatchMeta> {
        self.runtime
            .block_on(self.client.kv_batch_put(partition, keys, fields, tags))
    }
    pub fn kv_batch_get<K: AsRef<str>>(
        &self,
        partition: &str,
        keys: &[K],
        fields: Option<&[&str]>,
    ) -> Result<Batch> {
        self.runtime
            .block_on(self.client.kv_batch_get(partition, keys, fields))
    }
    pub fn kv_list(&self, partition: Option<&str>) -> Result<Vec<KeyListing>> {
        self.runtime.block_on(self.client.kv_list(partition))
    }
    pub fn kv_clear<K: AsRef<str>>(
        &self,
        partition: &str,
        keys: &[K],
        fields: Option<&[&str]>,
    ) -> Result<()> {
        self.runtime
            .block_on(self.client.kv_clear(partition, keys, fields))
    }
}
