//! Defects found by trying tq as a new user would (the adversarial-testing issue), each with a
//! test that failed before its fix. In process: the simple backend and the in-memory KV store.
//! The Redis ones are in `redis_defects.rs`, the restarted controller in tq-cli's `remote.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and examples may panic

use async_trait::async_trait;
use std::sync::Arc;
use tq_backend_kv::{KvOptions, KvStorageManager, KvStore, MemoryKvStore};
use tq_client::*;
use tq_controller::{ControlPlane, Controller, ControllerConfig};
use tq_core::{
    Batch, BatchMeta, Bytes, Capabilities, Column, ErrorKind, FieldFilter, MergeOp, PutReceipt,
    Result, StorageManager, Tensor,
};

fn ints(rows: usize, base: i64) -> Batch {
    let v: Vec<i64> = (0..rows as i64 * 3).map(|i| base + i).collect();
    Batch::from_columns([(
        "x",
        Column::Dense(Tensor::from_slice(vec![rows, 3], &v).unwrap()),
    )])
    .unwrap()
}

fn floats(rows: usize) -> Batch {
    let v: Vec<f32> = (0..rows * 3).map(|i| i as f32 + 0.5).collect();
    Batch::from_columns([(
        "x",
        Column::Dense(Tensor::from_slice(vec![rows, 3], &v).unwrap()),
    )])
    .unwrap()
}

fn objects(rows: usize) -> Batch {
    Batch::from_columns([(
        "x",
        Column::Objects(vec![Bytes::from_static(b"an object"); rows]),
    )])
    .unwrap()
}

fn kv_memory_config() -> Config {
    Config::from_toml("[storage]\nbackend = \"kv\"\n").unwrap()
}

/// A controller and a KV adapter over one in-memory store the test can inspect.
fn kv_client_with(
    wrap: impl FnOnce(Arc<dyn StorageManager>, Arc<Controller>) -> Arc<dyn StorageManager>,
) -> (Client, Arc<Controller>, Arc<MemoryKvStore>) {
    let store = Arc::new(MemoryKvStore::new());
    let kv: Arc<dyn StorageManager> =
        Arc::new(KvStorageManager::new(store.clone(), KvOptions::default()).unwrap());
    let controller = Arc::new(
        Controller::new(ControllerConfig {
            storage_units: 1,
            storage_backend: "kv".into(),
            ..ControllerConfig::default()
        })
        .unwrap(),
    );
    let storage = wrap(kv, controller.clone());
    let client = Client::from_parts(controller.clone(), storage, kv_memory_config());
    (client, controller, store)
}

async fn refused_writes_keep_the_stored_value(tq: &Client, backend: &str) {
    tq.partition("p")
        .kv_put("k", &ints(1, 7), None)
        .await
        .unwrap();
    for (what, wrong) in [("f32", floats(1)), ("object", objects(1))] {
        let e = tq
            .partition("p")
            .kv_put("k", &wrong, None)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), &ErrorKind::Invalid, "{backend}, {what}: {e}");
        let got = tq.partition("p").kv_batch_get(&["k"], None).await.unwrap();
        assert_eq!(
            got,
            ints(1, 7),
            "{backend}: a refused {what} put changed the value"
        );
    }
    // The metadata API, on existing samples.
    let meta = tq.partition("q").put_new(&ints(2, 100)).await.unwrap();
    for wrong in [floats(2), objects(2)] {
        let e = tq.put(&meta, &wrong).await.unwrap_err();
        assert_eq!(e.kind(), &ErrorKind::Invalid, "{backend}: {e}");
        assert_eq!(tq.get_data(&meta).await.unwrap(), ints(2, 100), "{backend}");
    }
}

#[tokio::test]
async fn defect_1_a_refused_put_does_not_overwrite_the_stored_value() {
    refused_writes_keep_the_stored_value(&Client::embedded(Config::default()).unwrap(), "simple")
        .await;
    refused_writes_keep_the_stored_value(&Client::embedded(kv_memory_config()).unwrap(), "kv")
        .await;
}

#[tokio::test]
async fn defect_1_a_read_that_disagrees_with_the_metadata_is_corrupted_not_data() {
    // Storage holding something else than what was published (here: bytes put behind the
    // controller's back) is refused at read time instead of handed out as data.
    let tq = Client::embedded(Config::default()).unwrap();
    let meta = tq.partition("p").put_new(&ints(2, 0)).await.unwrap();
    tq.storage().put(&meta, &floats(2)).await.unwrap();
    let e = tq.get_data(&meta).await.unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Corrupted, "{e}");
    assert!(e.message().contains("field `x`"), "{e}");
}

#[tokio::test]
async fn defect_3_a_get_without_fields_of_keys_with_no_data_is_not_an_empty_success() {
    for config in [Config::default(), kv_memory_config()] {
        let tq = Client::embedded(config).unwrap();
        // Tags only: the key exists, nothing is produced yet.
        tq.partition("p")
            .kv_set_tags(&["k"], vec![tq_core::Tags::new()])
            .await
            .unwrap();
        let e = tq
            .partition("p")
            .kv_batch_get(&["k"], None)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), &ErrorKind::NotFound, "{e}");
        assert!(e.message().contains("not produced"), "{e}");
        tq.partition("p")
            .kv_put("k", &ints(1, 0), None)
            .await
            .unwrap();
        assert_eq!(
            tq.partition("p").kv_batch_get(&["k"], None).await.unwrap(),
            ints(1, 0)
        );
    }
}

#[tokio::test]
async fn defect_4_a_stale_put_leaves_nothing_in_the_kv_store() {
    let (tq, controller, store) = kv_client_with(|s, _| s);
    for round in 0..20 {
        let meta = tq.partition("p").put_new(&ints(2, round)).await.unwrap();
        tq.clear_samples(&meta).await.unwrap();
        let e = tq.put(&meta, &ints(2, 999)).await.unwrap_err();
        assert_eq!(e.kind(), &ErrorKind::Conflict, "{e}");
    }
    assert_eq!(
        store.resident_keys(),
        0,
        "a refused stale put left keys behind"
    );
    assert_eq!(controller.samples_in_use(), 0);
}

/// Storage that clears the very samples of a put (or a get) just before it reaches the store:
/// the interleavings "check passed, then a clear, then the write lands" and "a read races a
/// clear of what it reads".
struct ClearFirst {
    inner: Arc<dyn StorageManager>,
    control: Arc<Controller>,
    before_put: bool,
    before_get: bool,
}

impl ClearFirst {
    async fn clear_samples_of(&self, meta: &BatchMeta) -> Result<()> {
        let marked = self
            .control
            .mark_clearing(meta.partition(), Some(meta.samples()))
            .await?;
        if !marked.is_empty() {
            self.inner.clear(&marked, &FieldFilter::All).await?;
            self.control
                .release(meta.partition(), marked.samples())
                .await?;
        }
        Ok(())
    }
}

#[async_trait]
impl StorageManager for ClearFirst {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn put(&self, meta: &BatchMeta, batch: &Batch) -> Result<PutReceipt> {
        if self.before_put {
            self.clear_samples_of(meta).await?;
        }
        self.inner.put(meta, batch).await
    }
    async fn get(&self, meta: &BatchMeta) -> Result<Batch> {
        if self.before_get {
            self.clear_samples_of(meta).await?;
        }
        self.inner.get(meta).await
    }
    async fn update(&self, meta: &BatchMeta, batch: &Batch, merge: &MergeOp) -> Result<PutReceipt> {
        self.inner.update(meta, batch, merge).await
    }
    async fn clear(&self, meta: &BatchMeta, fields: &FieldFilter) -> Result<()> {
        self.inner.clear(meta, fields).await
    }
}

#[tokio::test]
async fn defect_4_a_write_refused_after_a_racing_clear_deletes_what_it_wrote() {
    let (tq, controller, store) = kv_client_with(|inner, control| {
        Arc::new(ClearFirst {
            inner,
            control,
            before_put: true,
            before_get: false,
        })
    });
    // Existing keys: the put passes its check, the clear runs, then the write lands and its
    // notice is refused.
    controller
        .kv_retrieve_meta("p", &["a".to_string(), "b".to_string()], true)
        .await
        .unwrap();
    let e = tq
        .partition("p")
        .kv_batch_put(&["a", "b"], &ints(2, 0), None)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Conflict, "{e}");
    assert_eq!(store.resident_keys(), 0, "the refused write's cells stayed");
    assert_eq!(controller.samples_in_use(), 0);
}

#[tokio::test]
async fn defect_7_a_read_racing_a_clear_is_not_found_not_data_lost() {
    let (tq, _, store) = kv_client_with(|inner, control| {
        Arc::new(ClearFirst {
            inner,
            control,
            before_put: false,
            before_get: true,
        })
    });
    let meta = tq.partition("p").put_new(&ints(2, 0)).await.unwrap();
    let e = tq.get_data(&meta).await.unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::NotFound, "{e}");
    assert_eq!(store.resident_keys(), 0);
}

#[tokio::test]
async fn defect_7_data_that_is_really_gone_is_still_data_lost() {
    let (tq, _, store) = kv_client_with(|s, _| s);
    let meta = tq.partition("p").put_new(&ints(2, 0)).await.unwrap();
    // Delete one cell behind the controller's back: the sample is live, its data is gone.
    let cell = tq_backend_kv::codec::KeyScheme::new("tq", "p").cell(meta.samples()[0], "x");
    store.delete(&[cell]).await.unwrap();
    let e = tq.get_data(&meta).await.unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::DataLost, "{e}");
}

#[tokio::test(flavor = "current_thread")]
async fn defect_8_an_embedded_polling_loop_lets_the_producer_run() {
    let tq = Client::embedded(Config::default()).unwrap();
    let producer = tokio::spawn({
        let tq = tq.clone();
        async move { tq.partition("p").put_new(&ints(1, 0)).await.unwrap() }
    });
    let mut polls = 0u64;
    loop {
        let meta = tq
            .get_meta(GetMetaRequest::fetch("p", &["x"], "t", 1, Wait::NoWait))
            .await
            .unwrap();
        if !meta.is_empty() {
            break;
        }
        polls += 1;
        // Without yielding, the producer never runs and this loop spins forever.
        assert!(
            polls < 2_000_000,
            "the polling loop never let the producer run"
        );
    }
    producer.await.unwrap();
}

/// Storage whose puts reach the store and then never return: the writer "dies" after its
/// storage write and before its production notice (a process killed at that instruction).
struct DiesAfterWrite {
    inner: Arc<dyn StorageManager>,
    written: Arc<tokio::sync::Notify>,
}

#[async_trait]
impl StorageManager for DiesAfterWrite {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn put(&self, meta: &BatchMeta, batch: &Batch) -> Result<PutReceipt> {
        self.inner.put(meta, batch).await?;
        self.written.notify_one();
        std::future::pending().await
    }
    async fn get(&self, meta: &BatchMeta) -> Result<Batch> {
        self.inner.get(meta).await
    }
    async fn update(&self, meta: &BatchMeta, batch: &Batch, merge: &MergeOp) -> Result<PutReceipt> {
        self.inner.update(meta, batch, merge).await
    }
    async fn clear(&self, meta: &BatchMeta, fields: &FieldFilter) -> Result<()> {
        self.inner.clear(meta, fields).await
    }
}

/// Found by `tq soak` (Redis, a producer killed with SIGKILL): the cells of a writer that died
/// between its storage write and its production notice stayed in the store after the
/// partition was cleared, because the clear named only fields produced for those samples.
#[tokio::test]
async fn a_writer_killed_between_write_and_notice_leaves_nothing_after_a_clear() {
    let written = Arc::new(tokio::sync::Notify::new());
    let signal = written.clone();
    let (tq, controller, store) = kv_client_with(move |inner, _| {
        Arc::new(DiesAfterWrite {
            inner,
            written: signal,
        })
    });
    for put_new in [false, true] {
        let writer = {
            let tq = tq.clone();
            tokio::spawn(async move {
                let p = tq.partition("p");
                if put_new {
                    let _ = p.put_new(&ints(3, 0)).await;
                } else {
                    let _ = p.kv_batch_put(&["a", "b", "c"], &ints(3, 0), None).await;
                }
            })
        };
        written.notified().await;
        assert!(store.resident_keys() > 0, "the write reached the store");
        writer.abort();
        tq.partition("p").clear().await.unwrap();
        assert_eq!(
            store.resident_keys(),
            0,
            "a dead writer's cells stayed after the clear (put_new: {put_new})"
        );
        assert_eq!(controller.samples_in_use(), 0);
    }
}

/// `tq soak --storage redis` left overwritten cells in Redis for good: a field clear whose
/// first attempt reached the controller but whose answer was lost (a controller kill) was
/// repeated, the repeat named the field's cells without their write version, and storage
/// deleted a key that did not exist instead of the overwritten cell.
#[tokio::test]
async fn a_field_clear_repeated_after_a_lost_answer_deletes_the_overwritten_cells() {
    let (tq, controller, store) = kv_client_with(|s, _| s);
    let p = tq.partition("p");
    p.kv_put("k", &ints(1, 1), None).await.unwrap();
    p.kv_put("k", &ints(1, 2), None).await.unwrap();
    let written = store.live_keys();
    let beside = written
        .iter()
        .find(|k| k.contains("%v"))
        .unwrap_or_else(|| panic!("the overwrite is written beside the first cell: {written:?}"))
        .clone();
    // The first attempt's controller step, whose answer never came back.
    let kv = controller
        .kv_retrieve_meta("p", &["k".to_string()], false)
        .await
        .unwrap();
    controller
        .begin_clear_fields("p", kv.meta.samples(), &["x".to_string()])
        .await
        .unwrap();
    p.kv_clear_fields(&["k"], &["x"]).await.unwrap();
    let left = store.live_keys();
    assert!(
        !left.contains(&beside),
        "{beside} left in the store: {left:?}"
    );
    // The key stays, without the field, and takes it again.
    assert_eq!(p.kv_list().await.unwrap().entries.len(), 1);
    p.kv_put("k", &ints(1, 3), None).await.unwrap();
    assert_eq!(p.kv_batch_get(&["k"], None).await.unwrap(), ints(1, 3));
}
