//! A unit set to free behind answers a large clear once the cells are out of it; their buffers
//! are freed behind it. The cells are unreadable at once, the stats count the bytes (pending,
//! then freed behind), and the buffers really are let go. Small clears, and every clear of a
//! unit not set to, free inline.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use tq_core::{Bytes, FieldFilter, SampleId, Value};
use tq_unit::reclaim::{self, RECLAIMED_BEHIND, RECLAIMED_INLINE, RECLAIM_PENDING};
use tq_unit::{MemoryUnit, StorageUnit, UnitPut, UnitRows};

/// `n` samples of one object field, each cell `bytes` long, starting at index `first`; returns
/// the put and one probe handle per cell (to see when the unit lets go of the buffer).
fn put_of(first: u32, n: u32, bytes: usize) -> (UnitPut, Vec<Bytes>) {
    let samples: Vec<_> = (first..first + n).map(|i| SampleId::new(i, 1)).collect();
    let probes: Vec<Bytes> = samples
        .iter()
        .map(|s| Bytes::from(vec![s.index as u8; bytes]))
        .collect();
    let values = probes.iter().cloned().map(Value::Object).collect();
    let put = UnitPut {
        samples,
        fields: BTreeMap::from([("f".to_string(), UnitRows::separate(values))]),
    };
    (put, probes)
}

async fn counter(unit: &MemoryUnit, name: &str) -> u64 {
    unit.stats().await.unwrap().counters[name]
}

#[tokio::test]
async fn a_large_clear_frees_behind_its_answer_and_counts_the_bytes() {
    let unit = MemoryUnit::new("u").free_cleared_behind(true);
    // 32 MiB: at the inline threshold.
    let (put, probes) = put_of(0, 4, 8 << 20);
    let samples = put.samples.clone();
    unit.put(put).await.unwrap();
    assert!(
        probes.iter().all(|p| !p.is_unique()),
        "the unit holds the buffers"
    );

    unit.clear(&samples, &FieldFilter::All).await.unwrap();
    let err = unit.get(&["f".into()], &samples[..1]).await.unwrap_err();
    assert!(
        err.to_string().contains("f"),
        "cleared cells are gone at once: {err}"
    );
    let stats = unit.stats().await.unwrap();
    assert_eq!(stats.cells, 0);
    assert_eq!(stats.live_bytes, 0);
    // Pending until the reclaimer gets to it, then freed behind; never both, never lost.
    let pending = stats.counters[RECLAIM_PENDING];
    let behind = stats.counters[RECLAIMED_BEHIND];
    assert_eq!(pending + behind, 32 << 20, "{:?}", stats.counters);

    reclaim::wait_freed();
    assert_eq!(counter(&unit, RECLAIM_PENDING).await, 0);
    assert_eq!(counter(&unit, RECLAIMED_BEHIND).await, 32 << 20);
    assert_eq!(counter(&unit, RECLAIMED_INLINE).await, 0);
    assert!(
        probes.iter().all(Bytes::is_unique),
        "the unit let go of every buffer"
    );
}

#[tokio::test]
async fn a_unit_not_set_to_free_behind_frees_inline() {
    let unit = MemoryUnit::new("u");
    let (put, probes) = put_of(0, 4, 8 << 20);
    let samples = put.samples.clone();
    unit.put(put).await.unwrap();
    unit.clear(&samples, &FieldFilter::All).await.unwrap();
    assert!(
        probes.iter().all(Bytes::is_unique),
        "freed before the answer"
    );
    assert_eq!(counter(&unit, RECLAIMED_INLINE).await, 32 << 20);
    assert_eq!(counter(&unit, RECLAIMED_BEHIND).await, 0);
}

#[tokio::test]
async fn a_small_clear_frees_inline() {
    let unit = MemoryUnit::new("u").free_cleared_behind(true);
    let (put, probes) = put_of(0, 8, 1024);
    let samples = put.samples.clone();
    unit.put(put).await.unwrap();
    unit.clear(&samples[..4], &FieldFilter::All).await.unwrap();
    assert!(
        probes[..4].iter().all(Bytes::is_unique),
        "freed before the answer"
    );
    assert!(probes[4..].iter().all(|p| !p.is_unique()), "the rest stays");
    assert_eq!(counter(&unit, RECLAIMED_INLINE).await, 4 * 1024);
    assert_eq!(counter(&unit, RECLAIM_PENDING).await, 0);
    // A field-level clear counts the same way.
    unit.clear(&samples[4..], &FieldFilter::Only(vec!["f".into()]))
        .await
        .unwrap();
    assert_eq!(counter(&unit, RECLAIMED_INLINE).await, 8 * 1024);
    assert!(probes.iter().all(Bytes::is_unique));
}
