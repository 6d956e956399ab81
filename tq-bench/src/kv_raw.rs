//! The raw baseline of a KV store: the same cells (header + payload, keyed sample by sample as
//! the adapter keys them) written with pipelined `mset`, read with `mget` and removed with
//! `delete`, through the store itself with its own per-call limit and calls in flight — what
//! moving the workload through that store costs without tq.

use crate::measure::Stats;
use std::sync::Arc;
use std::time::Instant;
use tq_backend_kv::codec::{encode_header, KeyScheme};
use tq_backend_kv::{KvStore, KvStoreExt, KvValue};
use tq_core::{Batch, Error, Result, SampleId};

pub use tq_backend_kv::redact_url;

/// A KV store used directly, for the raw baseline.
pub struct RawKv {
    store: Arc<dyn KvStore>,
}

impl RawKv {
    /// The store `url` names, with default options (the adapter's defaults too).
    pub fn open(url: &str) -> Result<RawKv> {
        let config = tq_backend_kv::KvConfig {
            stores: vec![tq_backend_kv::StoreConfig {
                name: None,
                url: url.to_string(),
            }],
            ..tq_backend_kv::KvConfig::default()
        };
        Ok(RawKv {
            store: config.build_store(&config.stores[0])?,
        })
    }

    /// The store's name and how it splits work (`redis: 1024 keys/call, 16 in flight`).
    pub fn describe(&self) -> String {
        let caps = self.store.capabilities();
        format!(
            "{}: {} keys/call, {} in flight",
            self.store.name(),
            caps.max_keys_per_call,
            caps.max_concurrent_calls
        )
    }

    /// See [`raw_kv`].
    pub async fn run(&self, batch: &Batch, reps: usize) -> Result<[Stats; 3]> {
        raw_kv(&self.store, batch, reps).await
    }
}

/// The cells of a batch as raw KV items, keyed as the adapter keys them.
pub struct RawCells {
    items: Vec<(String, KvValue)>,
    keys: Vec<String>,
}

impl RawKv {
    /// `batch`'s cells, ready for [`RawKv::put`], [`RawKv::get`] and [`RawKv::delete`].
    pub fn cells(&self, batch: &Batch) -> RawCells {
        let items = raw_items(batch);
        let keys = items.iter().map(|(k, _)| k.clone()).collect();
        RawCells { items, keys }
    }

    /// Writes every cell with pipelined `mset`s.
    pub async fn put(&self, cells: &RawCells) -> Result<()> {
        self.store.mset_all(cells.items.clone(), None).await
    }

    /// Reads every cell with pipelined `mget`s; a missing cell is an error.
    pub async fn get(&self, cells: &RawCells) -> Result<usize> {
        let values = self.store.mget_all(&cells.keys).await?;
        if !values.iter().all(Option::is_some) {
            return Err(Error::internal(
                "raw baseline: a written key was not read back",
            ));
        }
        Ok(values.len())
    }

    /// Reads every cell with pipelined `mget`s and returns the values; a missing cell is an
    /// error.
    pub async fn get_values(&self, cells: &RawCells) -> Result<Vec<tq_core::Bytes>> {
        self.store
            .mget_all(&cells.keys)
            .await?
            .into_iter()
            .map(|v| {
                v.ok_or_else(|| Error::internal("raw baseline: a written key was not read back"))
            })
            .collect()
    }

    /// Removes every cell.
    pub async fn delete(&self, cells: &RawCells) -> Result<()> {
        self.store.delete_all(&cells.keys).await
    }
}

fn raw_items(batch: &Batch) -> Vec<(String, KvValue)> {
    let ks = KeyScheme::new("tq-bench-raw", "bench");
    let mut items = Vec::with_capacity(batch.len() * batch.columns().len());
    for r in 0..batch.len() {
        for (field, column) in batch.columns() {
            let v = column.value(r);
            let head = encode_header(&v);
            let body = match v {
                tq_core::Value::Tensor(t) => t.into_data(),
                tq_core::Value::Object(b) => b,
            };
            items.push((
                ks.cell(SampleId::new(r as u32, 0), field),
                KvValue::new(head, body),
            ));
        }
    }
    items
}

/// Put, get and delete of `batch`'s cells as raw keys, `reps` times after one verified round.
pub async fn raw_kv(store: &Arc<dyn KvStore>, batch: &Batch, reps: usize) -> Result<[Stats; 3]> {
    let items = raw_items(batch);
    let keys: Vec<String> = items.iter().map(|(k, _)| k.clone()).collect();
    let (mut put, mut get, mut delete) = (Vec::new(), Vec::new(), Vec::new());
    for rep in 0..=reps.max(1) {
        let batch_items = items.clone();
        let t = Instant::now();
        store.mset_all(batch_items, None).await?;
        let p = t.elapsed();
        let t = Instant::now();
        let values = store.mget_all(&keys).await?;
        let g = t.elapsed();
        if rep == 0 && !values.iter().all(Option::is_some) {
            return Err(Error::internal(
                "raw baseline: keys written were not read back",
            ));
        }
        drop(std::hint::black_box(values));
        let t = Instant::now();
        store.delete_all(&keys).await?;
        let d = t.elapsed();
        if rep > 0 {
            put.push(p);
            get.push(g);
            delete.push(d);
        }
    }
    Ok([
        Stats::from_samples(put),
        Stats::from_samples(get),
        Stats::from_samples(delete),
    ])
}
