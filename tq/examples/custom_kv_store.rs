//! A complete `KvStore` in one file: [`BTreeStore`], an ordered map behind a mutex, with no
//! TTL support of its own (it says so in its capabilities, and the KV adapter copes). The KV
//! adapter turns it into a full storage backend (docs/backends-guide.md walks through it).
//!
//! Run it: `cargo run -p tq --example custom_kv_store --features kv,testkit`. Its conformance
//! test — the `KvStore` kit, in one call — runs with
//! `cargo test -p tq --example custom_kv_store --features kv,testkit`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and examples may panic
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tq::storage::{async_trait, KvCapabilities, KvOptions, KvStorageManager, KvStore, KvValue};
use tq::{Batch, Bytes, Column, Result};

#[derive(Default)]
pub struct BTreeStore {
    map: Mutex<BTreeMap<String, Bytes>>,
}

impl BTreeStore {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Bytes>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait]
impl KvStore for BTreeStore {
    fn name(&self) -> &str {
        "btree"
    }

    fn capabilities(&self) -> KvCapabilities {
        KvCapabilities {
            // No deadlines: TTLs are ignored and `expire` deletes at once (the default method).
            native_ttl: false,
            native_expire: false,
            max_keys_per_call: 512,
            max_concurrent_calls: 1,
            atomic_generations: false,
        }
    }

    async fn mset(&self, items: Vec<(String, KvValue)>, _ttl: Option<Duration>) -> Result<()> {
        let mut map = self.lock();
        for (key, value) in items {
            map.insert(key, value.to_bytes());
        }
        Ok(())
    }

    async fn mget(&self, keys: &[String]) -> Result<Vec<Option<Bytes>>> {
        let map = self.lock();
        Ok(keys.iter().map(|k| map.get(k).cloned()).collect())
    }

    async fn delete(&self, keys: &[String]) -> Result<()> {
        let mut map = self.lock();
        for k in keys {
            map.remove(k);
        }
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let store: Arc<dyn KvStore> = Arc::new(BTreeStore::default());
    let storage = KvStorageManager::new(store, KvOptions::default())?;
    let tq = tq::Client::builder()
        .config(tq::Config::default())
        .storage(Arc::new(storage))
        .build()?;
    let batch = Batch::from_columns([(
        "x",
        Column::Dense(tq::Tensor::from_slice(vec![2, 2], &[1i64, 2, 3, 4])?),
    )])?;
    let p = tq.partition("demo");
    p.kv_batch_put(&["a", "b"], &batch, None).await?;
    let back = p.kv_batch_get(&["b", "a"], None).await?;
    println!(
        "custom_kv_store: read {} rows back through the KV adapter",
        back.len()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn btree_store_passes_the_kv_store_kit() {
        tq::testkit::kv::run_all(|| async { Arc::new(BTreeStore::default()) as Arc<dyn KvStore> })
            .await;
    }
}
