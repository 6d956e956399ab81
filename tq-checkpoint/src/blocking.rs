//! The blocking forms of [`Checkpoints`] and [`Dumps`], for [`BlockingClient`] and
//! [`BlockingPartition`]: each method runs its async counterpart on the wrapper's runtime. A
//! test (`tests/blocking_parity.rs`) fails when an async method has no blocking one here.

use crate::{CheckpointManifest, CheckpointOptions, Checkpoints, DumpManifest, DumpOptions, Dumps};
use std::path::Path;
use tq_client::{BlockingClient, BlockingPartition};
use tq_core::Result;

/// [`Checkpoints`] for callers without an async runtime.
pub trait BlockingCheckpoints {
    /// [`Checkpoints::save_checkpoint`].
    fn save_checkpoint(&self, dir: impl AsRef<Path> + Send) -> Result<CheckpointManifest>;
    /// [`Checkpoints::save_checkpoint_to_url`].
    fn save_checkpoint_to_url(&self, url: &str) -> Result<CheckpointManifest>;
    /// [`Checkpoints::save_checkpoint_with`].
    fn save_checkpoint_with(
        &self,
        url: &str,
        options: CheckpointOptions,
    ) -> Result<CheckpointManifest>;
    /// [`Checkpoints::save_checkpoint_to_store`].
    #[cfg(feature = "object-store")]
    fn save_checkpoint_to_store(
        &self,
        store: std::sync::Arc<dyn object_store::ObjectStore>,
        prefix: &str,
    ) -> Result<CheckpointManifest>;
    /// [`Checkpoints::load_checkpoint`].
    fn load_checkpoint(&self, dir: impl AsRef<Path> + Send) -> Result<CheckpointManifest>;
    /// [`Checkpoints::load_checkpoint_from_url`].
    fn load_checkpoint_from_url(&self, url: &str) -> Result<CheckpointManifest>;
    /// [`Checkpoints::load_checkpoint_from_store`].
    #[cfg(feature = "object-store")]
    fn load_checkpoint_from_store(
        &self,
        store: std::sync::Arc<dyn object_store::ObjectStore>,
        prefix: &str,
    ) -> Result<CheckpointManifest>;
}

impl BlockingCheckpoints for BlockingClient {
    fn save_checkpoint(&self, dir: impl AsRef<Path> + Send) -> Result<CheckpointManifest> {
        self.block_on(self.client().save_checkpoint(dir))
    }
    fn save_checkpoint_to_url(&self, url: &str) -> Result<CheckpointManifest> {
        self.block_on(self.client().save_checkpoint_to_url(url))
    }
    fn save_checkpoint_with(
        &self,
        url: &str,
        options: CheckpointOptions,
    ) -> Result<CheckpointManifest> {
        self.block_on(self.client().save_checkpoint_with(url, options))
    }
    #[cfg(feature = "object-store")]
    fn save_checkpoint_to_store(
        &self,
        store: std::sync::Arc<dyn object_store::ObjectStore>,
        prefix: &str,
    ) -> Result<CheckpointManifest> {
        self.block_on(self.client().save_checkpoint_to_store(store, prefix))
    }
    fn load_checkpoint(&self, dir: impl AsRef<Path> + Send) -> Result<CheckpointManifest> {
        self.block_on(self.client().load_checkpoint(dir))
    }
    fn load_checkpoint_from_url(&self, url: &str) -> Result<CheckpointManifest> {
        self.block_on(self.client().load_checkpoint_from_url(url))
    }
    #[cfg(feature = "object-store")]
    fn load_checkpoint_from_store(
        &self,
        store: std::sync::Arc<dyn object_store::ObjectStore>,
        prefix: &str,
    ) -> Result<CheckpointManifest> {
        self.block_on(self.client().load_checkpoint_from_store(store, prefix))
    }
}

/// [`Dumps`] for callers without an async runtime.
pub trait BlockingDumps {
    /// [`Dumps::kv_dump`].
    fn kv_dump(
        &self,
        url: &str,
        keys: Option<&[&str]>,
        options: &DumpOptions,
    ) -> Result<DumpManifest>;
    /// [`Dumps::kv_load`].
    fn kv_load(&self, url: &str) -> Result<DumpManifest>;
}

impl BlockingDumps for BlockingPartition {
    fn kv_dump(
        &self,
        url: &str,
        keys: Option<&[&str]>,
        options: &DumpOptions,
    ) -> Result<DumpManifest> {
        self.block_on(self.handle().kv_dump(url, keys, options))
    }
    fn kv_load(&self, url: &str) -> Result<DumpManifest> {
        self.block_on(self.handle().kv_load(url))
    }
}
