//! The checkpoint gate: a hold makes puts and clears wait (reads and merges go on) until the
//! capture, which sees every cell stored before the hold and lifts it; a hold nobody captures
//! lifts itself after its time to live; a capture after that is refused. Time is paused, so
//! "waits" means "has not finished after a minute of (virtual) time".
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tq_core::{Bytes, ErrorKind, FieldFilter, SampleId, Value};
use tq_unit::{GatedUnit, MemoryUnit, StorageUnit, UnitPut, UnitRows};

fn put(index: u32, text: &str) -> UnitPut {
    UnitPut {
        samples: vec![SampleId::new(index, 1)],
        fields: BTreeMap::from([(
            "f".to_string(),
            UnitRows::separate(vec![Value::Object(Bytes::from(text.to_string()))]),
        )]),
    }
}

fn gated() -> Arc<GatedUnit> {
    Arc::new(GatedUnit::new(Arc::new(MemoryUnit::new("u"))))
}

#[tokio::test(start_paused = true)]
async fn a_hold_keeps_clears_and_puts_waiting_until_the_capture() {
    let unit = gated();
    unit.put(put(0, "kept")).await.unwrap();
    unit.hold_writes(Duration::from_secs(3600)).await.unwrap();

    let clear = {
        let unit = unit.clone();
        tokio::spawn(async move { unit.clear(&[SampleId::new(0, 1)], &FieldFilter::All).await })
    };
    let late_put = {
        let unit = unit.clone();
        tokio::spawn(async move { unit.put(put(1, "late")).await })
    };
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(!clear.is_finished(), "a clear waits for the capture");
    assert!(!late_put.is_finished(), "a put waits for the capture");
    // Reads go on during the hold.
    let read = unit
        .get(&["f".to_string()], &[SampleId::new(0, 1)])
        .await
        .unwrap();
    assert_eq!(read[0][0], Value::Object(Bytes::from("kept")));

    let info = unit.capture_cells().await.unwrap();
    assert_eq!(
        (info.cells, info.bytes),
        (1, 4),
        "the capture predates the held writes"
    );
    clear.await.unwrap().unwrap();
    late_put.await.unwrap().unwrap();
    // The capture still holds the cleared cell; the unit does not.
    let page = unit.capture_page(info.id, 0, u64::MAX).await.unwrap();
    assert_eq!(
        page.fields[0].values,
        vec![Value::Object(Bytes::from("kept"))]
    );
    assert_eq!(page.next, None);
    assert_eq!(unit.stats().await.unwrap().cells, 1, "only the late put");

    unit.release_capture(Some(info.id)).await.unwrap();
    let e = unit.capture_page(info.id, 0, 1).await.unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::NotFound, "{e}");
}

#[tokio::test(start_paused = true)]
async fn a_hold_nobody_captures_lifts_itself_and_its_capture_is_refused() {
    let unit = gated();
    unit.hold_writes(Duration::from_secs(5)).await.unwrap();
    let e = unit.hold_writes(Duration::from_secs(5)).await.unwrap_err();
    assert_eq!(
        e.kind(),
        &ErrorKind::Unavailable,
        "one checkpoint at a time: {e}"
    );
    let started = tokio::time::Instant::now();
    unit.put(put(0, "x")).await.unwrap();
    assert!(
        started.elapsed() >= Duration::from_secs(5),
        "the put waited for the ttl"
    );
    let e = unit.capture_cells().await.unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Unavailable, "{e}");
    assert!(e.message().contains("expired"), "{e}");
    // A hold lifted without a capture (the checkpoint gave up) lets writes go at once.
    unit.hold_writes(Duration::from_secs(3600)).await.unwrap();
    unit.release_capture(None).await.unwrap();
    unit.clear(&[SampleId::new(0, 1)], &FieldFilter::All)
        .await
        .unwrap();
}
