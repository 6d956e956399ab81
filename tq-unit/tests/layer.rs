//! [`Layered`] forwards every operation of the unit below under its entry of the operation
//! table: a layer that records what it is shown sees each call once, as the right operation
//! with the right number of samples, and the unit below answers it. A gate stacked under a
//! meter still holds writes, so layers compose.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tq_core::{Bytes, FieldFilter, MergeOp, SampleId, Value};
use tq_unit::{
    GatedUnit, Layered, MemoryUnit, MeteredUnit, StorageUnit, UnitCall, UnitLayer, UnitOp, UnitPut,
    UnitRows, UnitUpdate,
};

#[derive(Default)]
struct Recorder {
    seen: Mutex<Vec<(UnitOp, u64)>>,
}

impl UnitLayer for Recorder {
    fn around<'a, T: Send + 'a>(
        &'a self,
        unit: &'a str,
        op: UnitOp,
        rows: u64,
        call: UnitCall<'a, T>,
    ) -> impl std::future::Future<Output = tq_core::Result<T>> + Send + 'a {
        assert_eq!(unit, "u");
        self.seen.lock().unwrap().push((op, rows));
        call
    }
}

fn rows(index: u32, n: u32, text: &str) -> (Vec<SampleId>, BTreeMap<String, UnitRows>) {
    let samples: Vec<_> = (index..index + n).map(|i| SampleId::new(i, 1)).collect();
    let values = samples
        .iter()
        .map(|_| Value::Object(Bytes::from(text.to_string())))
        .collect();
    (
        samples,
        BTreeMap::from([("f".to_string(), UnitRows::separate(values))]),
    )
}

#[tokio::test]
async fn every_call_reaches_the_unit_below_under_its_operation() {
    // The gate answers the checkpoint steps, so the recorder sits above a gated unit.
    let gated: Arc<dyn StorageUnit> = GatedUnit::wrap(Arc::new(MemoryUnit::new("u")));
    let unit = Layered::with_layer(gated, Recorder::default());

    let (samples, fields) = rows(0, 3, "a");
    unit.put(UnitPut {
        samples: samples.clone(),
        fields,
    })
    .await
    .unwrap();
    let got = unit.get(&["f".into()], &samples[..2]).await.unwrap();
    assert_eq!(got[0].len(), 2);
    let (_, fields) = rows(0, 1, "b");
    let err = unit
        .update(
            UnitUpdate {
                samples: samples[..1].to_vec(),
                fields,
            },
            &MergeOp::Add,
        )
        .await
        .expect_err("adding to an object cell is refused by the unit below");
    assert!(err.to_string().contains("f"), "{err}");
    unit.stats().await.unwrap();
    unit.hold_writes(Duration::from_secs(60)).await.unwrap();
    let capture = unit.capture_cells().await.unwrap();
    assert_eq!(capture.cells, 3, "the unit below holds the three cells");
    unit.capture_page(capture.id, 0, u64::MAX).await.unwrap();
    unit.release_capture(Some(capture.id)).await.unwrap();
    unit.clear(&samples[2..], &FieldFilter::All).await.unwrap();
    unit.enter_epoch(7).await.unwrap();
    let cells = unit.all_cells().await.unwrap();
    assert_eq!(cells[0].values.len(), 2, "the cleared cell is gone below");

    let seen = unit.layer().seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        [
            (UnitOp::Put, 3),
            (UnitOp::Get, 2),
            (UnitOp::Update, 1),
            (UnitOp::Stats, 0),
            (UnitOp::Hold, 0),
            (UnitOp::Capture, 0),
            (UnitOp::Page, 0),
            (UnitOp::Release, 0),
            (UnitOp::Clear, 1),
            (UnitOp::EnterEpoch, 0),
            (UnitOp::AllCells, 0),
        ]
    );
    let left = unit.get(&["f".into()], &samples[..2]).await.unwrap();
    assert_eq!(left[0][1], Value::Object(Bytes::from("a")));
}

#[tokio::test(start_paused = true)]
async fn a_gate_under_a_meter_still_holds_writes() {
    let unit = MeteredUnit::wrap(GatedUnit::wrap(Arc::new(MemoryUnit::new("u"))));
    unit.hold_writes(Duration::from_secs(3600)).await.unwrap();
    let (samples, fields) = rows(0, 1, "a");
    let put = {
        let unit = unit.clone();
        tokio::spawn(async move { unit.put(UnitPut { samples, fields }).await })
    };
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(!put.is_finished(), "the put waits for the capture");
    unit.capture_cells().await.unwrap();
    put.await.unwrap().unwrap();
    assert_eq!(unit.stats().await.unwrap().cells, 1);
}
