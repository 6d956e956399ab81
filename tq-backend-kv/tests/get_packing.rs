//! How `KvStorageManager::get` builds columns: dense fields are packed as store calls complete
//! (in any order), and rows that disagree with the metadata fall back to the values.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and examples may panic
use async_trait::async_trait;
use bytes::Bytes;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tq_backend_kv::{KvCapabilities, KvOptions, KvStorageManager, KvStore, KvValue, MemoryKvStore};
use tq_core::{
    Batch, BatchMeta, Column, DType, FieldMeta, Result, SampleId, StorageManager, Tensor,
};

/// A memory store that answers small calls, later calls first: every multi-call get sees its
/// answers out of order.
struct Reversing {
    inner: MemoryKvStore,
}

const KEYS_PER_CALL: usize = 3;

#[async_trait]
impl KvStore for Reversing {
    fn name(&self) -> &str {
        "reversing"
    }
    fn capabilities(&self) -> KvCapabilities {
        KvCapabilities {
            max_keys_per_call: KEYS_PER_CALL,
            max_concurrent_calls: 64,
            ..self.inner.capabilities()
        }
    }
    async fn mset(&self, items: Vec<(String, KvValue)>, ttl: Option<Duration>) -> Result<()> {
        self.inner.mset(items, ttl).await
    }
    async fn mget(&self, keys: &[String]) -> Result<Vec<Option<Bytes>>> {
        // Keys arrive sample by sample; the larger the sample index, the sooner the answer.
        let index: u64 = keys[0]
            .split('/')
            .nth(2)
            .and_then(|s| s.trim_end_matches('}').parse().ok())
            .unwrap_or(0);
        tokio::time::sleep(Duration::from_millis(40u64.saturating_sub(index))).await;
        self.inner.mget(keys).await
    }
    async fn delete(&self, keys: &[String]) -> Result<()> {
        self.inner.delete(keys).await
    }
}

fn dense_i64(rows: usize, width: usize, base: i64) -> Column {
    let v: Vec<i64> = (0..rows * width).map(|i| base + i as i64).collect();
    Column::Dense(Tensor::from_slice(vec![rows, width], &v).expect("tensor"))
}

fn meta(samples: Vec<SampleId>, fields: &[(&str, FieldMeta)]) -> BatchMeta {
    let schemas: BTreeMap<String, FieldMeta> = fields
        .iter()
        .map(|(f, s)| (f.to_string(), s.clone()))
        .collect();
    BatchMeta::new("p", samples)
        .with_fields(schemas)
        .expect("meta")
}

#[tokio::test]
async fn dense_columns_are_packed_from_answers_in_any_order() {
    let m = KvStorageManager::new(
        Arc::new(Reversing {
            inner: MemoryKvStore::new(),
        }),
        KvOptions::default(),
    )
    .expect("manager");
    let n = 10;
    let batch = Batch::from_columns([
        ("a", dense_i64(n, 4, 0)),
        ("b", dense_i64(n, 2, 1000)),
        (
            "c",
            Column::Objects((0..n).map(|i| Bytes::from(format!("row {i}"))).collect()),
        ),
    ])
    .expect("batch");
    let samples: Vec<SampleId> = (0..n as u32).map(|i| SampleId::new(i, 1)).collect();
    let put_meta = BatchMeta::new("p", samples.clone());
    let receipt = m.put(&put_meta, &batch).await.expect("put");
    let mut get_meta = put_meta.clone();
    get_meta
        .add_fields(receipt.schemas, receipt.backend_meta)
        .expect("fields");
    let got = m.get(&get_meta).await.expect("get");
    assert_eq!(got, batch, "every row in its place, objects untouched");
    // Samples in another order than written: rows follow the metadata's order.
    let order = [7usize, 2, 9, 0];
    let picked = get_meta.select_samples(&order).expect("select");
    let got = m.get(&picked).await.expect("get");
    let want = batch.select_rows(&order).expect("rows");
    assert_eq!(got, want);
}

#[tokio::test]
async fn rows_that_disagree_with_the_metadata_fall_back_to_the_values() {
    let m = KvStorageManager::new(Arc::new(MemoryKvStore::new()), KvOptions::default())
        .expect("manager");
    let (s0, s1) = (SampleId::new(0, 1), SampleId::new(1, 1));
    // Sample 0 holds x of width 2, sample 1 of width 3.
    for (s, width) in [(s0, 2), (s1, 3)] {
        let one = Batch::from_columns([("x", dense_i64(1, width, 10))]).expect("batch");
        m.put(&BatchMeta::new("p", vec![s]), &one)
            .await
            .expect("put");
    }
    // Metadata claiming a dense width 2 for both: the values decide (ragged), nothing is
    // packed with the wrong size.
    let claims = meta(
        vec![s0, s1],
        &[("x", FieldMeta::dense(DType::I64, vec![2]))],
    );
    let got = m.get(&claims).await.expect("get");
    let Column::Ragged(rows) = got.column("x").expect("x") else {
        panic!("rows of different widths come back ragged: {got:?}")
    };
    assert_eq!(rows[0].to_vec::<i64>().unwrap(), vec![10, 11]);
    assert_eq!(rows[1].to_vec::<i64>().unwrap(), vec![10, 11, 12]);
    // A claimed dtype that differs from every stored row: the stored dense column comes back.
    let claims = meta(vec![s0], &[("x", FieldMeta::dense(DType::F32, vec![2]))]);
    let got = m.get(&claims).await.expect("get");
    assert_eq!(got.column("x"), Some(&dense_i64(1, 2, 10)));
}
