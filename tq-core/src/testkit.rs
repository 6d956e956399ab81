//! The conformance kit every [`StorageManager`] runs: one `pub async fn` per contract, and
//! [`run_all`] to run them all against fresh backends:
//!
//! ```ignore
//! #[tokio::test]
//! async fn conformance() {
//!     tq_core::testkit::run_all(|| async { Arc::new(MyStorage::new()) as Arc<dyn StorageManager> })
//!         .await;
//! }
//! ```
//!
//! The factory is async so that it can start servers or connect to them. Each case gets a fresh
//! backend from it and panics with a message naming the case on the first violated
//! expectation. [`run_all`] runs every case (a failing case does not hide the others) and then
//! fails listing each case that failed. Samples are addressed by hand-made [`SampleId`]s, so no
//! controller is involved.
//!
//! A backend that defers reclamation (`Capabilities::native_expire`) tells the kit how long an
//! `expire` takes to settle with [`run_all_with`] and [`KitOptions`].

// A conformance kit reports a violated contract by panicking with the case's name, like any
// test; `expect` on setup that cannot fail keeps the cases short.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::*;
use bytes::Bytes;
use std::sync::Arc;
use std::time::Duration;

mod concurrency;
mod edges;
pub use concurrency::*;
pub use edges::*;

/// What the kit needs to know about a backend beyond its [`Capabilities`].
#[derive(Debug, Clone, Copy)]
pub struct KitOptions {
    /// With `native_expire`, how long after `expire` the expired cells are gone for good. The
    /// `expire` case waits this long (plus a margin) before checking that the deadline did not
    /// reach a sample that reused the index.
    pub expire_settles_within: Duration,
    /// Cases not to run, by function name, for a known limit of the backend that is documented
    /// where the backend is (say which and why next to the call). Every skipped case is
    /// printed, so a skip is never silent.
    pub skip: &'static [&'static str],
}

impl Default for KitOptions {
    fn default() -> Self {
        KitOptions {
            expire_settles_within: Duration::ZERO,
            skip: &[],
        }
    }
}

/// Runs every conformance case against backends made by `make`, with default [`KitOptions`].
pub async fn run_all<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Arc<dyn StorageManager>>,
{
    run_all_with(KitOptions::default(), make).await;
}

/// Runs one case in its own task; returns why it failed (its panic message), if it did. Kits
/// (this one and the `KvStore` kit) use it so that one failing case does not hide the others.
pub async fn failure_of<F>(case: F) -> Option<String>
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let e = tokio::spawn(case).await.err()?;
    Some(match e.try_into_panic() {
        Ok(p) => p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "panicked".into()),
        Err(e) => e.to_string(),
    })
}

/// Runs every case, each on a fresh backend and in its own task, then panics naming every case
/// that failed (with its message), if any did.
pub async fn run_all_with<F, Fut>(options: KitOptions, make: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Arc<dyn StorageManager>>,
{
    let mut failed: Vec<String> = Vec::new();
    macro_rules! case {
        ($name:ident $(, $arg:expr)?) => {{
            if options.skip.contains(&stringify!($name)) {
                eprintln!("conformance: skipped `{}` (a known limit of this backend)", stringify!($name));
            } else {
            let s = make().await;
            if let Some(why) = failure_of(async move { $name(s.as_ref() $(, $arg)?).await }).await {
                failed.push(format!("{}: {why}", stringify!($name)));
            }
            }
        }};
    }
    case!(round_trip_of_every_column_kind);
    case!(adding_fields_to_existing_samples);
    case!(field_selection);
    case!(clear_whole_samples);
    case!(clear_chosen_fields);
    case!(clear_is_idempotent);
    case!(stale_generation_never_wins);
    case!(missing_cells_are_errors);
    case!(empty_and_mismatched_batches);
    case!(update_merges_in_place);
    case!(expire_hides_cells_and_spares_the_next_sample, options);
    case!(declared_capabilities_are_honoured);
    case!(a_put_racing_a_clear_leaves_all_or_nothing);
    case!(a_stale_writer_racing_index_reuse_never_wins);
    case!(zero_size_tensors_and_empty_objects);
    case!(duplicate_rows_in_one_get);
    assert!(
        failed.is_empty(),
        "{} conformance case(s) failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

/// Indexes that spread over units and are not contiguous.
const INDEXES: [u32; 5] = [0, 3, 7, 8, 101];

fn ids(generation: u32) -> Vec<SampleId> {
    INDEXES
        .iter()
        .map(|&i| SampleId::new(i, generation))
        .collect()
}

/// `meta` after a write that returned `receipt`, as the controller records it: the receipt's
/// schemas and backend meta are what later calls are handed (a backend may keep where it put a
/// cell there, and find it only through it).
pub fn recorded(meta: &BatchMeta, receipt: crate::PutReceipt) -> BatchMeta {
    let mut out = meta.clone();
    out.add_fields(receipt.schemas, receipt.backend_meta)
        .expect("a receipt for the written samples");
    out
}

fn meta_for(samples: Vec<SampleId>, batch: Option<&Batch>) -> BatchMeta {
    let m = BatchMeta::new("conformance", samples);
    match batch {
        Some(b) => m.with_fields(b.schemas()).expect("schemas match rows"),
        None => m,
    }
}

fn dense<T: Element>(shape: Vec<usize>, f: impl Fn(usize) -> T) -> Column {
    let n = numel(&shape);
    let v: Vec<T> = (0..n).map(f).collect();
    Column::Dense(Tensor::from_slice(shape, &v).expect("shape matches"))
}

/// A batch of `n` rows with dense columns of several dtypes, a ragged and an object column.
pub fn sample_batch(n: usize, seed: i64) -> Batch {
    let raw16 = |shape: Vec<usize>, dtype: DType| {
        let bytes: Vec<u8> = (0..numel(&shape) * 2)
            .map(|i| (i as i64 * 7 + seed) as u8)
            .collect();
        Column::Dense(Tensor::new(dtype, shape, Bytes::from(bytes)).expect("sized"))
    };
    let ragged = (0..n)
        .map(|i| {
            let len = i % 3 + 1;
            Tensor::from_slice(vec![len], &vec![seed as i32 + i as i32; len]).expect("sized")
        })
        .collect();
    let objects = (0..n)
        .map(|i| Bytes::from(format!("{{\"row\": {i}, \"seed\": {seed}}}")))
        .collect();
    Batch::from_columns([
        ("f32", dense(vec![n, 3], |i| i as f32 * 0.5 + seed as f32)),
        ("i64", dense(vec![n], |i| i as i64 * 1000 + seed)),
        ("u8", dense(vec![n, 2, 2], |i| (i as i64 + seed) as u8)),
        ("bool", dense(vec![n, 2], |i| (i as i64 + seed) % 2 == 0)),
        ("f64", dense(vec![n, 1], |i| i as f64 - seed as f64)),
        ("f16", raw16(vec![n, 4], DType::F16)),
        ("bf16", raw16(vec![n, 2], DType::Bf16)),
        ("ragged", Column::Ragged(ragged)),
        ("obj", Column::Objects(objects)),
    ])
    .expect("columns have n rows")
}

/// Asserts that `got` holds the same rows as `want` for every field of `want`.
pub fn assert_same_rows(case: &str, want: &Batch, got: &Batch) {
    assert_eq!(got.len(), want.len(), "{case}: row count");
    assert_eq!(
        got.field_names().collect::<Vec<_>>(),
        want.field_names().collect::<Vec<_>>(),
        "{case}: fields"
    );
    for (name, w) in want.columns() {
        let g = got.column(name).expect("field present");
        assert_eq!(g.values(), w.values(), "{case}: values of field `{name}`");
        if matches!(w, Column::Dense(_)) {
            assert!(
                matches!(g, Column::Dense(_)),
                "{case}: equal-shaped field `{name}` must come back dense"
            );
        }
    }
}

fn assert_missing(case: &str, r: Result<Batch>) {
    match r {
        Ok(b) => panic!(
            "{case}: expected a missing-cell error, got {} rows",
            b.len()
        ),
        Err(e) => assert!(
            matches!(e.kind(), ErrorKind::NotFound | ErrorKind::DataLost),
            "{case}: expected NotFound/DataLost, got {e}"
        ),
    }
}

pub async fn round_trip_of_every_column_kind(s: &dyn StorageManager) {
    let batch = sample_batch(INDEXES.len(), 1);
    let meta = meta_for(ids(0), Some(&batch));
    let receipt = s.put(&meta, &batch).await.expect("put");
    assert_eq!(
        receipt.schemas,
        batch.schemas(),
        "round trip: receipt schemas"
    );
    let got = s.get(&meta).await.expect("get");
    assert_same_rows("round trip", &batch, &got);
    // A subset of rows in another order.
    let sub = meta.select_samples(&[4, 0, 2]).unwrap();
    let got = s.get(&sub).await.expect("get subset");
    assert_same_rows(
        "round trip subset",
        &batch.select_rows(&[4, 0, 2]).unwrap(),
        &got,
    );
}

pub async fn adding_fields_to_existing_samples(s: &dyn StorageManager) {
    let full = sample_batch(INDEXES.len(), 2);
    let first = full.select_fields(&["f32", "obj"]).unwrap();
    let second = full.select_fields(&["i64", "ragged"]).unwrap();
    s.put(&meta_for(ids(0), Some(&first)), &first)
        .await
        .expect("put first");
    s.put(&meta_for(ids(0), Some(&second)), &second)
        .await
        .expect("put second");
    let both = full
        .select_fields(&["f32", "i64", "obj", "ragged"])
        .unwrap();
    let got = s.get(&meta_for(ids(0), Some(&both))).await.expect("get");
    assert_same_rows("add fields", &both, &got);
    // Overwriting a field with the same generation replaces it.
    let newer = sample_batch(INDEXES.len(), 3)
        .select_fields(&["f32"])
        .unwrap();
    s.put(&meta_for(ids(0), Some(&newer)), &newer)
        .await
        .expect("overwrite");
    let got = s.get(&meta_for(ids(0), Some(&newer))).await.expect("get");
    assert_same_rows("overwrite", &newer, &got);
}

pub async fn field_selection(s: &dyn StorageManager) {
    let batch = sample_batch(INDEXES.len(), 4);
    let meta = meta_for(ids(0), Some(&batch));
    s.put(&meta, &batch).await.expect("put");
    let got = s
        .get(&meta.select_fields(&["ragged", "u8"]).unwrap())
        .await
        .expect("get");
    assert_same_rows(
        "field selection",
        &batch.select_fields(&["ragged", "u8"]).unwrap(),
        &got,
    );
}

pub async fn clear_whole_samples(s: &dyn StorageManager) {
    let batch = sample_batch(INDEXES.len(), 5);
    let meta = meta_for(ids(0), Some(&batch));
    s.put(&meta, &batch).await.expect("put");
    let gone = meta.select_samples(&[0, 3]).unwrap();
    s.clear(&gone, &FieldFilter::All).await.expect("clear");
    for pos in [0, 3] {
        let one = meta.select_samples(&[pos]).unwrap();
        assert_missing("clear whole samples", s.get(&one).await);
    }
    let kept = meta.select_samples(&[1, 2, 4]).unwrap();
    let got = s.get(&kept).await.expect("others intact");
    assert_same_rows(
        "clear whole samples",
        &batch.select_rows(&[1, 2, 4]).unwrap(),
        &got,
    );
}

pub async fn clear_chosen_fields(s: &dyn StorageManager) {
    let batch = sample_batch(INDEXES.len(), 6);
    let meta = meta_for(ids(0), Some(&batch));
    s.put(&meta, &batch).await.expect("put");
    let target = meta.select_samples(&[1, 2]).unwrap();
    s.clear(
        &target,
        &FieldFilter::Only(vec!["obj".into(), "f32".into()]),
    )
    .await
    .expect("clear fields");
    assert_missing(
        "clear fields",
        s.get(&target.select_fields(&["obj"]).unwrap()).await,
    );
    assert_missing(
        "clear fields",
        s.get(&target.select_fields(&["f32"]).unwrap()).await,
    );
    // Other fields of the same samples, and the same fields of other samples, stay.
    let rest = ["i64", "ragged", "u8"];
    let got = s
        .get(&target.select_fields(&rest).unwrap())
        .await
        .expect("other fields");
    assert_same_rows(
        "clear fields",
        &batch
            .select_rows(&[1, 2])
            .unwrap()
            .select_fields(&rest)
            .unwrap(),
        &got,
    );
    let others = meta.select_samples(&[0, 3, 4]).unwrap();
    let got = s.get(&others).await.expect("other samples");
    assert_same_rows(
        "clear fields",
        &batch.select_rows(&[0, 3, 4]).unwrap(),
        &got,
    );
}

pub async fn clear_is_idempotent(s: &dyn StorageManager) {
    let batch = sample_batch(INDEXES.len(), 7);
    let meta = meta_for(ids(0), Some(&batch));
    s.put(&meta, &batch).await.expect("put");
    s.clear(&meta, &FieldFilter::All).await.expect("clear");
    s.clear(&meta, &FieldFilter::All)
        .await
        .expect("clear again");
    s.clear(&meta, &FieldFilter::Only(vec!["f32".into()]))
        .await
        .expect("field clear of cleared samples");
    let never = meta_for(vec![SampleId::new(999, 0)], None);
    s.clear(&never, &FieldFilter::All)
        .await
        .expect("clear of never-written sample");
    assert_missing("idempotent clear", s.get(&meta).await);
}

pub async fn stale_generation_never_wins(s: &dyn StorageManager) {
    let old = sample_batch(INDEXES.len(), 8);
    let new = sample_batch(INDEXES.len(), 9)
        .select_fields(&["f32"])
        .unwrap();
    s.put(&meta_for(ids(0), Some(&old)), &old)
        .await
        .expect("put gen 0");
    s.put(&meta_for(ids(1), Some(&new)), &new)
        .await
        .expect("put gen 1");
    // gen 1 sees its own field, never gen 0's other fields.
    let got = s
        .get(&meta_for(ids(1), Some(&new)))
        .await
        .expect("get gen 1");
    assert_same_rows("generation", &new, &got);
    let old_field = old.select_fields(&["i64"]).unwrap();
    assert_missing(
        "older generation's cell is not visible to the new one",
        s.get(&meta_for(ids(1), Some(&old_field))).await,
    );
    // A stale writer is refused and changes nothing.
    let stale = sample_batch(INDEXES.len(), 10)
        .select_fields(&["f32"])
        .unwrap();
    let e = s
        .put(&meta_for(ids(0), Some(&stale)), &stale)
        .await
        .expect_err("stale put must fail");
    assert_eq!(e.kind(), &ErrorKind::Conflict, "stale put: {e}");
    // A stale reader gets no data.
    assert_missing("stale read", s.get(&meta_for(ids(0), Some(&stale))).await);
    // A stale clear deletes nothing.
    s.clear(&meta_for(ids(0), None), &FieldFilter::All)
        .await
        .expect("stale clear is a no-op");
    s.clear(
        &meta_for(ids(0), None),
        &FieldFilter::Only(vec!["f32".into()]),
    )
    .await
    .expect("stale field clear is a no-op");
    let got = s
        .get(&meta_for(ids(1), Some(&new)))
        .await
        .expect("gen 1 intact");
    assert_same_rows("generation after stale ops", &new, &got);
}

pub async fn missing_cells_are_errors(s: &dyn StorageManager) {
    let batch = sample_batch(INDEXES.len(), 11)
        .select_fields(&["f32"])
        .unwrap();
    let meta = meta_for(ids(0), Some(&batch));
    assert_missing("never written", s.get(&meta).await);
    // One of the samples written, the others not: still an error, never partial data.
    let one = meta.select_samples(&[0]).unwrap();
    s.put(&one, &batch.select_rows(&[0]).unwrap())
        .await
        .expect("put one");
    assert_missing("partially written", s.get(&meta).await);
    // A field that was never written for a written sample.
    let other = sample_batch(INDEXES.len(), 11)
        .select_fields(&["obj"])
        .unwrap();
    assert_missing(
        "unwritten field",
        s.get(&meta_for(ids(0), Some(&other)).select_samples(&[0]).unwrap())
            .await,
    );
}

pub async fn empty_and_mismatched_batches(s: &dyn StorageManager) {
    let empty = BatchMeta::empty("conformance");
    let r = s.put(&empty, &Batch::empty(0)).await.expect("empty put");
    assert!(r.schemas.is_empty(), "empty put writes no schemas");
    assert_eq!(s.get(&empty).await.expect("empty get").len(), 0);
    s.clear(&empty, &FieldFilter::All)
        .await
        .expect("empty clear");
    let batch = sample_batch(3, 12);
    let meta = meta_for(ids(0), None);
    let e = s.put(&meta, &batch).await.expect_err("row count mismatch");
    assert_eq!(e.kind(), &ErrorKind::Invalid, "{e}");
    assert_missing(
        "nothing written after a rejected put",
        s.get(&meta_for(
            ids(0)[..1].to_vec(),
            Some(&batch.select_rows(&[0]).unwrap()),
        ))
        .await,
    );
}

pub async fn update_merges_in_place(s: &dyn StorageManager) {
    if !s.capabilities().update {
        let e = s
            .update(
                &BatchMeta::empty("conformance"),
                &Batch::empty(0),
                &MergeOp::Add,
            )
            .await;
        if let Err(e) = e {
            assert!(
                matches!(e.kind(), ErrorKind::Unsupported { .. }),
                "update without the capability must be Unsupported, got {e}"
            );
        }
        return;
    }
    let base = Batch::from_columns([(
        "x",
        Column::Dense(Tensor::from_slice(vec![5, 2], &[1i64; 10]).unwrap()),
    )])
    .unwrap();
    let meta = meta_for(ids(0), Some(&base));
    let meta = recorded(&meta, s.put(&meta, &base).await.expect("put"));
    let delta = Batch::from_columns([(
        "x",
        Column::Dense(Tensor::from_slice(vec![5, 2], &[2i64; 10]).unwrap()),
    )])
    .unwrap();
    let r = s.update(&meta, &delta, &MergeOp::Add).await.expect("add");
    let meta = recorded(&meta, r);
    let got = s.get(&meta).await.expect("get");
    let Column::Dense(t) = got.column("x").unwrap() else {
        panic!("update: dense field came back ragged")
    };
    assert_eq!(t.to_vec::<i64>().unwrap(), vec![3i64; 10], "update: add");
    // Concat changes shapes; the receipt reports them.
    let tail = Batch::from_columns([(
        "x",
        Column::Dense(Tensor::from_slice(vec![5, 1], &[9i64; 5]).unwrap()),
    )])
    .unwrap();
    let r = s
        .update(&meta, &tail, &MergeOp::Concat { dim: 0 })
        .await
        .expect("concat");
    assert_eq!(
        r.schemas["x"],
        FieldMeta::dense(DType::I64, vec![3]),
        "update: receipt"
    );
    let meta = recorded(&meta, r);
    // A merge that fails on one cell leaves every cell unchanged.
    let wrong = Batch::from_columns([(
        "x",
        Column::Dense(Tensor::from_slice(vec![5, 2], &[1.0f32; 10]).unwrap()),
    )])
    .unwrap();
    s.update(&meta, &wrong, &MergeOp::Add)
        .await
        .expect_err("dtype change");
    let got = s.get(&meta).await.expect("get");
    let Column::Dense(t) = got.column("x").unwrap() else {
        panic!("update: dense field came back ragged")
    };
    assert_eq!(t.shape(), &[5, 3], "update: failed merge changed nothing");
    // Updating a cell that does not exist fails.
    let absent = meta_for(
        vec![SampleId::new(555, 0)],
        Some(&base.select_rows(&[0]).unwrap()),
    );
    let e = s
        .update(&absent, &delta.select_rows(&[0]).unwrap(), &MergeOp::Add)
        .await
        .expect_err("update of a missing cell");
    assert!(
        matches!(e.kind(), ErrorKind::NotFound | ErrorKind::DataLost),
        "update of missing cell: {e}"
    );
}

pub(crate) fn i64_column(rows: usize, base: i64) -> Batch {
    let v: Vec<i64> = (0..rows as i64 * 2).map(|i| base + i).collect();
    Batch::from_columns([(
        "x",
        Column::Dense(Tensor::from_slice(vec![rows, 2], &v).expect("sized")),
    )])
    .expect("one column")
}
