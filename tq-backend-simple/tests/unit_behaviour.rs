//! Behaviour of storage units and of SimpleStorage beyond the conformance suite: capacity,
//! all-or-nothing requests, zero copy, compaction, routing, update and error reporting.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and examples may panic
use async_trait::async_trait;
use std::sync::Arc;
use tq_backend_simple::{
    MemoryUnit, SimpleConfig, SimpleStorage, StorageUnit, UnitConfig, UnitPut, UnitRows, UnitStats,
    UnitUpdate, UnitUpdateReply,
};
use tq_core::{
    Batch, BatchMeta, Bytes, Column, DType, Error, ErrorKind, FieldFilter, FieldKind, FieldMeta,
    FieldName, MergeOp, MergeRegistry, Result, SampleId, StorageManager, Tensor, Value,
};

// ---------------------------------------------------------------------------------------------
// helpers

fn ids(indexes: impl IntoIterator<Item = u32>, generation: u32) -> Vec<SampleId> {
    indexes
        .into_iter()
        .map(|i| SampleId::new(i, generation))
        .collect()
}

/// A `rows x row_bytes` u8 tensor whose bytes depend on row, column and seed.
fn dense_u8(rows: usize, row_bytes: usize, seed: u8) -> Tensor {
    let data: Vec<u8> = (0..rows * row_bytes)
        .map(|k| ((k / row_bytes) as u8).wrapping_mul(31) ^ (k % row_bytes) as u8 ^ seed)
        .collect();
    Tensor::new(DType::U8, vec![rows, row_bytes], Bytes::from(data)).unwrap()
}

/// A put of one field whose rows are the rows of `t` (zero-copy slices, flagged shared).
fn dense_put(field: &str, samples: Vec<SampleId>, t: &Tensor) -> UnitPut {
    let values = (0..t.rows()).map(|i| Value::Tensor(t.row(i))).collect();
    UnitPut {
        samples,
        fields: [(field.to_string(), UnitRows::shared(values))].into(),
    }
}

fn obj(s: &str) -> Value {
    Value::Object(Bytes::copy_from_slice(s.as_bytes()))
}

/// A put of object fields: `fields[f][r]` is the text of row `r`.
fn object_put(samples: Vec<SampleId>, fields: &[(&str, Vec<&str>)]) -> UnitPut {
    UnitPut {
        samples,
        fields: fields
            .iter()
            .map(|(name, rows)| {
                let values = rows.iter().map(|s| obj(s)).collect();
                (name.to_string(), UnitRows::separate(values))
            })
            .collect(),
    }
}

fn names(fields: &[&str]) -> Vec<FieldName> {
    fields.iter().map(|f| f.to_string()).collect()
}

async fn get_obj(unit: &dyn StorageUnit, field: &str, s: SampleId) -> Result<String> {
    let v = unit.get(&names(&[field]), &[s]).await?;
    let b = v[0][0].as_object().expect("object cell").clone();
    Ok(String::from_utf8(b.to_vec()).unwrap())
}

fn assert_kind<T: std::fmt::Debug>(r: Result<T>, kind: ErrorKind) -> Error {
    match r {
        Ok(v) => panic!("expected {kind:?}, got Ok({v:?})"),
        Err(e) => {
            assert_eq!(e.kind(), &kind, "{e}");
            e
        }
    }
}

async fn stats(unit: &dyn StorageUnit) -> UnitStats {
    unit.stats().await.unwrap()
}

fn capped(id: &str, capacity: usize) -> MemoryUnit {
    MemoryUnit::with_config(
        id,
        UnitConfig {
            capacity: Some(capacity),
            ..UnitConfig::default()
        },
    )
    .unwrap()
}

fn within(b: &Bytes, base: &Bytes) -> bool {
    let (p, lo) = (b.as_ptr() as usize, base.as_ptr() as usize);
    p >= lo && p + b.len() <= lo + base.len()
}

fn meta_for(samples: Vec<SampleId>, batch: &Batch) -> BatchMeta {
    BatchMeta::new("test", samples)
        .with_fields(batch.schemas())
        .unwrap()
}

// ---------------------------------------------------------------------------------------------
// capacity

#[tokio::test]
async fn capacity_exceeded_writes_nothing() {
    let unit = capped("cap", 3);
    unit.put(object_put(ids([0, 1], 0), &[("a", vec!["a0", "a1"])]))
        .await
        .unwrap();
    let e = assert_kind(
        unit.put(object_put(
            ids([1, 2, 3], 0),
            &[("a", vec!["new1", "new2", "new3"])],
        ))
        .await,
        ErrorKind::CapacityExceeded,
    );
    assert!(e.message().contains("2 existing + 2 new > 3"), "{e}");
    assert!(e.message().contains("`cap`"), "{e}");
    // Nothing of the refused request is readable, not even the overwrite of index 1.
    assert_eq!(
        get_obj(&unit, "a", SampleId::new(1, 0)).await.unwrap(),
        "a1"
    );
    for i in [2, 3] {
        assert_kind(
            get_obj(&unit, "a", SampleId::new(i, 0)).await,
            ErrorKind::NotFound,
        );
    }
    assert_eq!(stats(&unit).await.rows, 2);
}

#[tokio::test]
async fn overwrites_and_new_fields_do_not_consume_capacity() {
    let unit = capped("cap", 2);
    unit.put(object_put(ids([0, 1], 0), &[("a", vec!["x", "y"])]))
        .await
        .unwrap();
    unit.put(object_put(ids([0, 1], 0), &[("a", vec!["x2", "y2"])]))
        .await
        .expect("overwrite");
    unit.put(object_put(ids([0, 1], 0), &[("b", vec!["p", "q"])]))
        .await
        .expect("new field");
    unit.put(object_put(ids([1], 1), &[("a", vec!["y3"])]))
        .await
        .expect("newer generation of a stored index");
    let s = stats(&unit).await;
    assert_eq!((s.rows, s.cells, s.capacity), (2, 3, Some(2)));
    assert_kind(
        unit.put(object_put(ids([2], 0), &[("a", vec!["z"])])).await,
        ErrorKind::CapacityExceeded,
    );
}

#[tokio::test]
async fn clearing_frees_capacity() {
    let unit = capped("cap", 2);
    unit.put(object_put(
        ids([0, 1], 0),
        &[("a", vec!["a0", "a1"]), ("b", vec!["b0", "b1"])],
    ))
    .await
    .unwrap();
    let third = || object_put(ids([2], 0), &[("a", vec!["a2"])]);
    assert_kind(unit.put(third()).await, ErrorKind::CapacityExceeded);
    // Clearing one field keeps the sample (it still holds `b`).
    unit.clear(&ids([0], 0), &FieldFilter::Only(names(&["a"])))
        .await
        .unwrap();
    assert_kind(unit.put(third()).await, ErrorKind::CapacityExceeded);
    // Once the row has no cells left it no longer counts.
    unit.clear(&ids([0], 0), &FieldFilter::Only(names(&["b"])))
        .await
        .unwrap();
    assert_eq!(stats(&unit).await.rows, 1);
    unit.put(third()).await.expect("room after clear");
    assert_eq!(
        get_obj(&unit, "a", SampleId::new(2, 0)).await.unwrap(),
        "a2"
    );
}

#[tokio::test]
async fn manager_capacity_is_per_unit_and_names_the_unit() {
    let config = SimpleConfig {
        capacity_per_unit: Some(1),
        ..SimpleConfig::default()
    };
    let s = SimpleStorage::in_memory(2, config).unwrap();
    let batch = |n: usize| {
        Batch::from_columns([("x", Column::Objects(vec![Bytes::from_static(b"v"); n]))]).unwrap()
    };
    // One sample on each unit (runs of 16 indexes share a unit).
    s.put(&meta_for(ids([0, 16], 0), &batch(2)), &batch(2))
        .await
        .unwrap();
    // Index 1 routes to unit 0, which is full.
    let e = assert_kind(
        s.put(&meta_for(ids([1], 0), &batch(1)), &batch(1)).await,
        ErrorKind::CapacityExceeded,
    );
    assert!(e.message().contains("unit-0"), "{e}");
}

// ---------------------------------------------------------------------------------------------
// all or nothing

#[tokio::test]
async fn put_with_a_short_field_changes_nothing() {
    let unit = MemoryUnit::new("u");
    unit.put(object_put(ids([0, 1], 0), &[("a", vec!["old0", "old1"])]))
        .await
        .unwrap();
    let before = stats(&unit).await;
    // `a` is fine, `z` has one row too few: neither may be written.
    let e = assert_kind(
        unit.put(object_put(
            ids([0, 1, 2], 0),
            &[("a", vec!["n0", "n1", "n2"]), ("z", vec!["z0", "z1"])],
        ))
        .await,
        ErrorKind::Invalid,
    );
    assert!(
        e.message().contains("`z`") && e.message().contains("`u`"),
        "{e}"
    );
    assert_eq!(
        get_obj(&unit, "a", SampleId::new(0, 0)).await.unwrap(),
        "old0"
    );
    assert_kind(
        get_obj(&unit, "a", SampleId::new(2, 0)).await,
        ErrorKind::NotFound,
    );
    assert_eq!(stats(&unit).await, before);
}

#[tokio::test]
async fn put_with_a_stale_sample_changes_nothing() {
    let unit = MemoryUnit::new("u");
    unit.put(object_put(
        vec![SampleId::new(5, 2)],
        &[("a", vec!["five"])],
    ))
    .await
    .unwrap();
    unit.put(object_put(vec![SampleId::new(6, 0)], &[("a", vec!["six"])]))
        .await
        .unwrap();
    let before = stats(&unit).await;
    // 4 is new and 6 moves to a newer generation, but 5 is stale: nothing happens at all.
    let req = object_put(
        vec![
            SampleId::new(4, 1),
            SampleId::new(6, 1),
            SampleId::new(5, 1),
        ],
        &[("a", vec!["x", "y", "z"])],
    );
    let e = assert_kind(unit.put(req).await, ErrorKind::Conflict);
    let m = e.message();
    assert!(
        m.contains("`u`") && m.contains("index 5") && m.contains("generation 1"),
        "{e}"
    );
    assert!(m.contains("generation 2"), "{e}");
    assert_kind(
        get_obj(&unit, "a", SampleId::new(4, 1)).await,
        ErrorKind::NotFound,
    );
    assert_eq!(
        get_obj(&unit, "a", SampleId::new(6, 0)).await.unwrap(),
        "six",
        "the older generation of 6 must not be purged by a refused put"
    );
    assert_eq!(
        get_obj(&unit, "a", SampleId::new(5, 2)).await.unwrap(),
        "five"
    );
    assert_eq!(stats(&unit).await, before);
}

#[tokio::test]
async fn duplicate_indexes_are_invalid() {
    let unit = MemoryUnit::new("u");
    let req = object_put(
        vec![SampleId::new(3, 0), SampleId::new(3, 1)],
        &[("a", vec!["x", "y"])],
    );
    let e = assert_kind(unit.put(req).await, ErrorKind::Invalid);
    assert!(e.message().contains("index 3"), "{e}");
    assert_eq!(stats(&unit).await.cells, 0);
    // The manager refuses before contacting any unit.
    let s = SimpleStorage::in_memory(2, SimpleConfig::default()).unwrap();
    let batch =
        Batch::from_columns([("x", Column::Objects(vec![Bytes::from_static(b"v"); 3]))]).unwrap();
    let meta = meta_for(ids([0, 1, 0], 0), &batch);
    assert_kind(s.put(&meta, &batch).await, ErrorKind::Invalid);
    let total: usize = s.stats().await.unwrap().iter().map(|u| u.cells).sum();
    assert_eq!(total, 0);
}

#[tokio::test]
async fn a_newer_generation_purges_every_field_of_the_older_one() {
    let unit = MemoryUnit::new("u");
    unit.put(object_put(
        ids([1], 0),
        &[("a", vec!["a-g0"]), ("b", vec!["b-g0"])],
    ))
    .await
    .unwrap();
    unit.put(object_put(ids([1], 1), &[("a", vec!["a-g1"])]))
        .await
        .unwrap();
    assert_eq!(
        get_obj(&unit, "a", SampleId::new(1, 1)).await.unwrap(),
        "a-g1"
    );
    let e = assert_kind(
        get_obj(&unit, "b", SampleId::new(1, 1)).await,
        ErrorKind::NotFound,
    );
    assert!(
        e.message().contains("`b`") && e.message().contains("1@g1") && e.message().contains("`u`"),
        "{e}"
    );
    assert_kind(
        get_obj(&unit, "b", SampleId::new(1, 0)).await,
        ErrorKind::NotFound,
    );
    assert_eq!(stats(&unit).await.cells, 1);
}

#[tokio::test]
async fn update_failing_on_one_cell_changes_nothing() {
    let mut registry = MergeRegistry::default();
    registry.register(
        "append_unless_bad",
        Arc::new(|old: &Value, new: &Value| {
            let (o, n) = (old.as_object().unwrap(), new.as_object().unwrap());
            if n.as_ref() == b"bad" {
                return Err(Error::invalid("refusing `bad`"));
            }
            Ok(Value::Object(Bytes::from(
                [o.as_ref(), n.as_ref()].concat(),
            )))
        }),
    );
    let unit = MemoryUnit::with_config(
        "u",
        UnitConfig {
            merge_registry: registry,
            ..UnitConfig::default()
        },
    )
    .unwrap();
    unit.put(object_put(ids([0, 1, 2], 0), &[("a", vec!["a", "b", "c"])]))
        .await
        .unwrap();
    let update = |rows: Vec<&str>| UnitUpdate {
        samples: ids([0, 1, 2], 0),
        fields: [(
            "a".to_string(),
            UnitRows::separate(rows.into_iter().map(obj).collect()),
        )]
        .into(),
    };
    let op = MergeOp::Named("append_unless_bad".into());
    let e = assert_kind(
        unit.update(update(vec!["x", "bad", "y"]), &op).await,
        ErrorKind::Invalid,
    );
    assert!(
        e.message().contains("`u`") && e.message().contains("1@g0"),
        "{e}"
    );
    for (i, want) in ["a", "b", "c"].into_iter().enumerate() {
        assert_eq!(
            get_obj(&unit, "a", SampleId::new(i as u32, 0))
                .await
                .unwrap(),
            want
        );
    }
    // Missing cell: NotFound, nothing merged.
    let mut absent = update(vec!["x", "y", "z"]);
    absent.samples[2] = SampleId::new(9, 0);
    assert_kind(unit.update(absent, &op).await, ErrorKind::NotFound);
    assert_eq!(get_obj(&unit, "a", SampleId::new(0, 0)).await.unwrap(), "a");
    // And the same update without the bad row commits every cell.
    let reply = unit.update(update(vec!["x", "y", "z"]), &op).await.unwrap();
    assert_eq!(reply.fields["a"].len(), 3);
    assert_eq!(
        get_obj(&unit, "a", SampleId::new(2, 0)).await.unwrap(),
        "cz"
    );
}

// ---------------------------------------------------------------------------------------------
// zero copy

#[tokio::test]
async fn dense_rows_are_stored_as_slices_of_the_put_allocation() {
    let unit = MemoryUnit::new("u");
    let t = dense_u8(4, 16, 7);
    unit.put(dense_put("x", ids(0..4, 0), &t)).await.unwrap();
    let got = unit.get(&names(&["x"]), &ids([3, 0, 2], 0)).await.unwrap();
    for (v, row) in got[0].iter().zip([3, 0, 2]) {
        let b = v.bytes();
        assert_eq!(
            b.as_ptr(),
            t.data()[row * 16..].as_ptr(),
            "row {row} is not a slice of the put buffer"
        );
        assert_eq!(v, &Value::Tensor(t.row(row)));
    }
    let s = stats(&unit).await;
    assert_eq!((s.shared_blocks, s.shared_retained_bytes), (1, 64));
}

#[tokio::test]
async fn manager_put_is_zero_copy_and_get_packs_one_dense_column() {
    let s = SimpleStorage::in_memory(2, SimpleConfig::default()).unwrap();
    let t = dense_u8(6, 8, 3);
    let batch = Batch::from_columns([("x", Column::Dense(t.clone()))]).unwrap();
    // Indexes 13-15 on unit 0 and 16-18 on unit 1 (runs of 16).
    let meta = meta_for(ids(13..19, 0), &batch);
    s.put(&meta, &batch).await.unwrap();
    for (pos, sample) in meta.samples().iter().enumerate() {
        let unit = &s.units()[s.unit_for(sample.index)];
        let v = unit.get(&names(&["x"]), &[*sample]).await.unwrap();
        assert_eq!(v[0][0].bytes().as_ptr(), t.data()[pos * 8..].as_ptr());
    }
    // Each unit tracks its rows of the dense column as one shared block (3 rows of 8 bytes).
    for u in s.stats().await.unwrap() {
        assert_eq!((u.shared_blocks, u.shared_retained_bytes), (1, 24), "{u:?}");
    }
    // Reversed order across both units comes back as one contiguous dense column (one copy,
    // independent of storage).
    let rev = meta.select_samples(&[5, 4, 3, 2, 1, 0]).unwrap();
    let got = s.get(&rev).await.unwrap();
    let Column::Dense(g) = got.column("x").unwrap() else {
        panic!("equal-shaped rows must come back dense")
    };
    assert_eq!(g.shape(), &[6, 8]);
    assert!(!within(g.data(), t.data()), "get must not alias storage");
    for i in 0..6 {
        assert_eq!(g.row(i), t.row(5 - i));
    }
}

// ---------------------------------------------------------------------------------------------
// compaction

const ROWS: usize = 1000;
const ROW_BYTES: usize = 1024;

async fn big_block() -> (MemoryUnit, Tensor) {
    let unit = MemoryUnit::new("u");
    let t = dense_u8(ROWS, ROW_BYTES, 1);
    unit.put(dense_put("x", ids(0..ROWS as u32, 0), &t))
        .await
        .unwrap();
    let s = stats(&unit).await;
    assert_eq!(s.live_bytes, (ROWS * ROW_BYTES) as u64);
    assert_eq!(s.retained_bytes(), (ROWS * ROW_BYTES) as u64);
    assert!(!t.data().is_unique(), "the unit shares the put buffer");
    (unit, t)
}

async fn check_rows(unit: &MemoryUnit, t: &Tensor, rows: std::ops::Range<usize>, aliased: bool) {
    let samples = ids(rows.start as u32..rows.end as u32, 0);
    let got = unit.get(&names(&["x"]), &samples).await.unwrap();
    for (v, r) in got[0].iter().zip(rows) {
        assert_eq!(v, &Value::Tensor(t.row(r)), "row {r} reads back");
        assert_eq!(within(v.bytes(), t.data()), aliased, "row {r} aliasing");
    }
}

#[tokio::test]
async fn clearing_most_of_a_block_compacts_it() {
    let (unit, t) = big_block().await;
    unit.clear(&ids(0..900, 0), &FieldFilter::All)
        .await
        .unwrap();
    let s = stats(&unit).await;
    let live = (100 * ROW_BYTES) as u64;
    assert_eq!(s.live_bytes, live);
    assert_eq!(s.retained_bytes(), live, "retained drops to the live bytes");
    assert_eq!((s.shared_blocks, s.shared_retained_bytes), (0, 0));
    assert_eq!((s.compactions, s.compacted_bytes), (1, live));
    assert_eq!((s.rows, s.cells), (100, 100));
    check_rows(&unit, &t, 900..ROWS, false).await;
    assert!(
        t.data().is_unique(),
        "after compaction the unit holds no reference to the put buffer"
    );
}

#[tokio::test]
async fn clearing_a_fifth_of_a_block_keeps_the_slices() {
    let (unit, t) = big_block().await;
    unit.clear(&ids(0..200, 0), &FieldFilter::All)
        .await
        .unwrap();
    let s = stats(&unit).await;
    assert_eq!(s.live_bytes, (800 * ROW_BYTES) as u64);
    assert_eq!(s.shared_retained_bytes, (ROWS * ROW_BYTES) as u64);
    assert_eq!(s.retained_bytes(), (ROWS * ROW_BYTES) as u64);
    assert_eq!(s.compactions, 0);
    check_rows(&unit, &t, 200..ROWS, true).await;
    // Clearing everything drops the block without copying.
    unit.clear(&ids(0..ROWS as u32, 0), &FieldFilter::All)
        .await
        .unwrap();
    let s = stats(&unit).await;
    assert_eq!((s.retained_bytes(), s.compactions, s.cells), (0, 0, 0));
    assert!(t.data().is_unique());
}

#[tokio::test]
async fn overwrites_and_generation_purges_release_rows_too() {
    let unit = MemoryUnit::new("u");
    let t = dense_u8(10, 32, 2);
    unit.put(dense_put("x", ids(0..10, 0), &t)).await.unwrap();
    // Overwrite 4 rows (same generation) and move 3 more to a newer generation: 3 of 10 left.
    let t2 = dense_u8(4, 32, 9);
    unit.put(dense_put("x", ids(0..4, 0), &t2)).await.unwrap();
    assert_eq!(stats(&unit).await.compactions, 0, "60% live: kept");
    unit.put(object_put(ids(4..7, 1), &[("y", vec!["a", "b", "c"])]))
        .await
        .unwrap();
    let s = stats(&unit).await;
    assert_eq!(s.compactions, 1, "30% live: compacted");
    assert_eq!(
        s.shared_retained_bytes,
        4 * 32,
        "only the second put's block"
    );
    check_rows(&unit, &t, 7..10, false).await;
    let got = unit.get(&names(&["x"]), &ids(0..4, 0)).await.unwrap();
    for (i, v) in got[0].iter().enumerate() {
        assert_eq!(v, &Value::Tensor(t2.row(i)));
    }
}

#[tokio::test]
async fn compaction_threshold_is_configurable_and_checked() {
    let never = MemoryUnit::with_config(
        "u",
        UnitConfig {
            compaction_threshold: 0.0,
            ..UnitConfig::default()
        },
    )
    .unwrap();
    let t = dense_u8(10, 8, 0);
    never.put(dense_put("x", ids(0..10, 0), &t)).await.unwrap();
    never.clear(&ids(0..9, 0), &FieldFilter::All).await.unwrap();
    let s = stats(&never).await;
    assert_eq!((s.compactions, s.shared_retained_bytes), (0, 80));
    for bad in [-0.1, 1.5, f64::NAN] {
        let e = MemoryUnit::with_config(
            "u",
            UnitConfig {
                compaction_threshold: bad,
                ..UnitConfig::default()
            },
        )
        .unwrap_err();
        assert_eq!(e.kind(), &ErrorKind::Invalid, "{bad}: {e}");
        let config = SimpleConfig {
            compaction_threshold: bad,
            ..SimpleConfig::default()
        };
        assert!(SimpleStorage::in_memory(2, config).is_err(), "{bad}");
    }
}

#[tokio::test]
async fn replace_update_results_are_tracked_like_a_put() {
    let unit = MemoryUnit::new("u");
    let t = dense_u8(4, 16, 1);
    unit.put(dense_put("x", ids(0..4, 0), &t)).await.unwrap();
    let t2 = dense_u8(4, 16, 5);
    let req = UnitUpdate {
        samples: ids(0..4, 0),
        fields: [(
            "x".to_string(),
            UnitRows::shared((0..4).map(|i| Value::Tensor(t2.row(i))).collect()),
        )]
        .into(),
    };
    unit.update(req, &MergeOp::Replace).await.unwrap();
    assert!(t.data().is_unique(), "the replaced block was dropped");
    let s = stats(&unit).await;
    assert_eq!((s.shared_blocks, s.shared_retained_bytes), (1, 64));
    unit.clear(&ids(0..3, 0), &FieldFilter::All).await.unwrap();
    assert_eq!(stats(&unit).await.compactions, 1);
    assert!(t2.data().is_unique(), "the update buffer was released");
    check_rows(&unit, &t2, 3..4, false).await;
}

// ---------------------------------------------------------------------------------------------
// routing

#[tokio::test]
async fn samples_land_on_the_unit_of_their_run() {
    let s = SimpleStorage::in_memory(3, SimpleConfig::default()).unwrap();
    let batch = Batch::from_columns([("x", Column::Dense(Tensor::from_vec((0..10i64).collect())))])
        .unwrap();
    // Shuffled, non-contiguous order must not matter. Runs of 16 indexes share a unit.
    let order = [40u32, 2, 35, 17, 20, 0, 47, 33, 18, 5];
    let meta = meta_for(ids(order, 0), &batch);
    s.put(&meta, &batch).await.unwrap();
    let rows: Vec<usize> = s.stats().await.unwrap().iter().map(|u| u.rows).collect();
    assert_eq!(
        rows,
        vec![3, 3, 4],
        "indexes 0,2,5 / 17,18,20 / 33,35,40,47"
    );
    for (pos, &i) in order.iter().enumerate() {
        assert_eq!(s.unit_for(i), (i as usize / 16) % 3);
        let home = &s.units()[s.unit_for(i)];
        let v = home
            .get(&names(&["x"]), &[SampleId::new(i, 0)])
            .await
            .unwrap();
        assert_eq!(v[0][0], batch.column("x").unwrap().value(pos));
        let other = &s.units()[(s.unit_for(i) + 1) % 3];
        assert_kind(
            other.get(&names(&["x"]), &[SampleId::new(i, 0)]).await,
            ErrorKind::NotFound,
        );
    }
    // Clear routes the same way.
    s.clear(&meta.select_samples(&[0, 1]).unwrap(), &FieldFilter::All)
        .await
        .unwrap();
    let rows: Vec<usize> = s.stats().await.unwrap().iter().map(|u| u.rows).collect();
    assert_eq!(rows, vec![2, 3, 3], "2 from unit 0 and 40 from unit 2");
}

// ---------------------------------------------------------------------------------------------
// update through the manager

#[tokio::test]
async fn named_merge_function_from_the_registry() {
    let mut registry = MergeRegistry::default();
    registry.register(
        "subtract",
        Arc::new(|old: &Value, new: &Value| {
            let (a, b) = (old.as_tensor().unwrap(), new.as_tensor().unwrap());
            let v: Vec<i64> = a
                .to_vec::<i64>()?
                .iter()
                .zip(b.to_vec::<i64>()?)
                .map(|(x, y)| x - y)
                .collect();
            Ok(Value::Tensor(Tensor::from_slice(a.shape().to_vec(), &v)?))
        }),
    );
    let config = SimpleConfig {
        merge_registry: registry,
        ..SimpleConfig::default()
    };
    let s = SimpleStorage::in_memory(2, config).unwrap();
    let col = |v: &[i64]| Column::Dense(Tensor::from_slice(vec![3, 2], v).unwrap());
    let base = Batch::from_columns([("x", col(&[10, 20, 30, 40, 50, 60]))]).unwrap();
    let meta = meta_for(ids([4, 5, 6], 0), &base);
    s.put(&meta, &base).await.unwrap();
    let delta = Batch::from_columns([("x", col(&[1, 2, 3, 4, 5, 6]))]).unwrap();
    let r = s
        .update(&meta, &delta, &MergeOp::Named("subtract".into()))
        .await
        .unwrap();
    assert_eq!(r.schemas["x"], FieldMeta::dense(DType::I64, vec![2]));
    let got = s.get(&meta).await.unwrap();
    let Column::Dense(t) = got.column("x").unwrap() else {
        panic!("dense")
    };
    assert_eq!(t.to_vec::<i64>().unwrap(), vec![9, 18, 27, 36, 45, 54]);
    // An unregistered name is refused and changes nothing.
    let e = s
        .update(&meta, &delta, &MergeOp::Named("nope".into()))
        .await
        .unwrap_err();
    assert!(e.message().contains("nope"), "{e}");
    assert_eq!(s.get(&meta).await.unwrap(), got);
}

#[tokio::test]
async fn concat_changes_shapes_and_the_receipt_reports_them() {
    let s = SimpleStorage::in_memory(3, SimpleConfig::default()).unwrap();
    let ragged = Column::Ragged(
        (1..=3)
            .map(|n| Tensor::from_slice(vec![n], &vec![n as i32; n]).unwrap())
            .collect(),
    );
    let base = Batch::from_columns([
        ("r", ragged),
        ("o", Column::Objects(vec![Bytes::from_static(b"ab"); 3])),
    ])
    .unwrap();
    let meta = meta_for(ids([0, 1, 2], 0), &base);
    s.put(&meta, &base).await.unwrap();
    let tail = Batch::from_columns([
        (
            "r",
            Column::Dense(Tensor::from_slice(vec![3, 2], &[7i32; 6]).unwrap()),
        ),
        ("o", Column::Objects(vec![Bytes::from_static(b"cd"); 3])),
    ])
    .unwrap();
    let receipt = s
        .update(&meta, &tail, &MergeOp::Concat { dim: 0 })
        .await
        .unwrap();
    let r = &receipt.schemas["r"];
    assert_eq!(r.kind(), FieldKind::Ragged);
    assert_eq!(
        r.per_sample_shapes().unwrap(),
        &vec![vec![3], vec![4], vec![5]]
    );
    assert_eq!(receipt.schemas["o"], FieldMeta::object());
    let got = s.get(&meta).await.unwrap();
    let Column::Ragged(rows) = got.column("r").unwrap() else {
        panic!("ragged")
    };
    assert_eq!(rows[1].to_vec::<i32>().unwrap(), vec![2, 2, 7, 7]);
    assert_eq!(
        got.column("o").unwrap().value(2),
        Value::Object(Bytes::from_static(b"abcd"))
    );
}

// ---------------------------------------------------------------------------------------------
// errors from units

/// A unit whose every request fails like an unreachable remote unit would.
struct DownUnit;

#[async_trait]
impl StorageUnit for DownUnit {
    fn id(&self) -> &str {
        "down"
    }
    async fn put(&self, _: UnitPut) -> Result<()> {
        Err(Error::unavailable("connection refused"))
    }
    async fn get(&self, _: &[FieldName], _: &[SampleId]) -> Result<Vec<Vec<Value>>> {
        Err(Error::unavailable("connection refused"))
    }
    async fn update(&self, _: UnitUpdate, _: &MergeOp) -> Result<UnitUpdateReply> {
        Err(Error::unavailable("connection refused"))
    }
    async fn clear(&self, _: &[SampleId], _: &FieldFilter) -> Result<()> {
        Err(Error::unavailable("connection refused"))
    }
    async fn stats(&self) -> Result<UnitStats> {
        Err(Error::unavailable("connection refused"))
    }
}

#[tokio::test]
async fn unit_failures_are_reported_with_the_unit_never_swallowed() {
    let s = SimpleStorage::new(vec![
        Arc::new(MemoryUnit::new("fine")) as Arc<dyn StorageUnit>,
        Arc::new(DownUnit),
    ])
    .unwrap();
    let batch =
        Batch::from_columns([("x", Column::Objects(vec![Bytes::from_static(b"v"); 2]))]).unwrap();
    // Index 0 on `fine`, 16 on `down` (runs of 16 indexes share a unit).
    let meta = meta_for(ids([0, 16], 0), &batch);
    let e = assert_kind(s.put(&meta, &batch).await, ErrorKind::Unavailable);
    assert!(e.message().contains("`down`"), "{e}");
    assert!(
        e.message().contains("fine"),
        "says which unit committed: {e}"
    );
    assert!(e.is_retryable());
    let e = assert_kind(s.get(&meta).await, ErrorKind::Unavailable);
    assert!(e.message().contains("`down`"), "{e}");
    assert_kind(
        s.update(&meta, &batch, &MergeOp::Replace).await,
        ErrorKind::Unavailable,
    );
    assert_kind(s.stats().await, ErrorKind::Unavailable);
    // Only samples on the healthy unit: fine.
    let healthy = meta.select_samples(&[0]).unwrap();
    assert_eq!(s.get(&healthy).await.unwrap().len(), 1);
    // A failed clear is an error (the caller must not release the indexes), even though the
    // healthy unit did clear its part.
    let e = assert_kind(
        s.clear(&meta, &FieldFilter::All).await,
        ErrorKind::Unavailable,
    );
    assert!(e.message().contains("`down`"), "{e}");
    assert_kind(s.get(&healthy).await, ErrorKind::NotFound);
}

#[tokio::test]
async fn routing_table_must_be_usable() {
    assert_kind(SimpleStorage::new(Vec::new()), ErrorKind::Invalid);
    let e = assert_kind(
        SimpleStorage::new(vec![
            Arc::new(MemoryUnit::new("a")) as Arc<dyn StorageUnit>,
            Arc::new(MemoryUnit::new("a")),
        ]),
        ErrorKind::Invalid,
    );
    assert!(e.message().contains("`a`"), "{e}");
    assert_kind(
        SimpleStorage::in_memory(0, SimpleConfig::default()),
        ErrorKind::Invalid,
    );
    let s = SimpleStorage::in_memory(2, SimpleConfig::default()).unwrap();
    assert_eq!(s.name(), "simple");
    let c = s.capabilities();
    assert!(c.update && !c.native_expire && c.links);
}

// ---------------------------------------------------------------------------------------------
// concurrency

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_updates_never_lose_a_merge() {
    // Merges run outside the unit's lock; a commit must notice a cell that changed meanwhile and
    // recompute, so every successful Add is reflected exactly once.
    let slow_add: tq_core::MergeFn = Arc::new(|old: &Value, new: &Value| {
        std::thread::yield_now();
        tq_core::apply_merge(&MergeOp::Add, &MergeRegistry::default(), old, new)
    });
    let unit = Arc::new(MemoryUnit::new("u"));
    let zeros = Tensor::from_slice(vec![4, 1], &[0i64; 4]).unwrap();
    unit.put(dense_put("n", ids(0..4, 0), &zeros))
        .await
        .unwrap();
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let (unit, op) = (unit.clone(), MergeOp::Custom(slow_add.clone()));
            tokio::spawn(async move {
                let mut applied = 0i64;
                for _ in 0..200 {
                    let one = Tensor::from_slice(vec![4, 1], &[1i64; 4]).unwrap();
                    match unit
                        .update(
                            UnitUpdate {
                                samples: ids(0..4, 0),
                                fields: [(
                                    "n".to_string(),
                                    UnitRows::shared(
                                        (0..4).map(|i| Value::Tensor(one.row(i))).collect(),
                                    ),
                                )]
                                .into(),
                            },
                            &op,
                        )
                        .await
                    {
                        Ok(_) => applied += 1,
                        Err(e) => assert_eq!(e.kind(), &ErrorKind::Conflict, "{e}"),
                    }
                }
                applied
            })
        })
        .collect();
    let mut applied = 0;
    for t in tasks {
        applied += t.await.unwrap();
    }
    assert!(applied > 0);
    let got = unit.get(&names(&["n"]), &ids(0..4, 0)).await.unwrap();
    for v in &got[0] {
        assert_eq!(
            v.as_tensor().unwrap().to_vec::<i64>().unwrap(),
            vec![applied]
        );
    }
}
