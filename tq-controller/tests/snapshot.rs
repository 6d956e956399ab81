//! Controller snapshots (checkpoints): the whole state goes out and comes back — every column
//! kind, tags, keys, links, backend meta, consumption, leases, generations and the epoch — and
//! damaged, newer or mismatched snapshots are refused before anything changes.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and examples may panic
use std::collections::BTreeMap;
use std::time::Duration;
use tq_controller::*;
use tq_core::{Bytes, DType, ErrorKind, FieldMeta, SampleId, TagValue, Tags};

fn controller() -> Controller {
    Controller::new(ControllerConfig {
        storage_units: 2,
        links_supported: true,
        ..Default::default()
    })
    .unwrap()
}

fn keys(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| s.to_string()).collect()
}

fn force(p: &str, fields: &[&str]) -> GetMetaRequest {
    GetMetaRequest {
        partition: p.into(),
        fields: fields.iter().map(|s| s.to_string()).collect(),
        mode: GetMetaMode::Force,
        sampler: None,
        dp_rank: None,
        batch_index: None,
    }
}

/// A controller with something of everything.
async fn busy() -> (Controller, u64) {
    let c = controller();
    // Keys with a dense, a ragged and an object field, tags and backend meta.
    let kv = c
        .kv_retrieve_meta("p", &keys(&["a", "b", "c", "d"]), true)
        .await
        .unwrap();
    let ids = kv.meta.samples().to_vec();
    let tags: Vec<Tags> = (0..4)
        .map(|i| Tags::from([("len".to_string(), TagValue::Int(i))]))
        .collect();
    c.notify_production(ProductionNotice {
        partition: "p".into(),
        samples: ids.clone(),
        schemas: BTreeMap::from([
            ("dense".to_string(), FieldMeta::dense(DType::F32, vec![3])),
            (
                "ragged".to_string(),
                FieldMeta::from_shapes(DType::I64, (1..=4).map(|n| vec![n]).collect()),
            ),
            ("obj".to_string(), FieldMeta::object()),
        ]),
        tags: Some(tags),
        backend_meta: Some(
            (0..4)
                .map(|i| BTreeMap::from([("dense".to_string(), Bytes::from(format!("loc{i}")))]))
                .collect(),
        ),
    })
    .await
    .unwrap();
    // A public row and a link to it.
    let public = c
        .kv_retrieve_meta(PUBLIC_PARTITION, &keys(&["prompt"]), true)
        .await
        .unwrap();
    c.notify_production(ProductionNotice {
        partition: PUBLIC_PARTITION.into(),
        samples: public.meta.samples().to_vec(),
        schemas: BTreeMap::from([("prompt".to_string(), FieldMeta::dense(DType::I32, vec![8]))]),
        tags: None,
        backend_meta: None,
    })
    .await
    .unwrap();
    c.kv_retrieve_meta("g", &keys(&["r0", "r1"]), true)
        .await
        .unwrap();
    c.kv_link(LinkRequest {
        partition: "g".into(),
        keys: keys(&["r0", "r1"]),
        public_partition: PUBLIC_PARTITION.into(),
        public_keys: keys(&["prompt", "prompt"]),
        fields: vec!["prompt".into()],
    })
    .await
    .unwrap();
    // Consumption: one task consumed two samples; another holds a lease on two.
    let taken = c
        .get_meta(GetMetaRequest::fetch(
            "p",
            &["dense"],
            "train",
            2,
            Wait::NoWait,
        ))
        .await
        .unwrap();
    assert_eq!(taken.len(), 2);
    let leased = c
        .get_meta(
            GetMetaRequest::fetch("p", &["dense"], "score", 2, Wait::NoWait)
                .with_lease(Duration::from_secs(600)),
        )
        .await
        .unwrap();
    let lease = leased.lease().unwrap();
    // A cleared key whose index is reused: generation 1.
    let cleared = c.kv_mark_clearing("p", &keys(&["d"])).await.unwrap();
    c.release("p", cleared.samples()).await.unwrap();
    c.kv_retrieve_meta("q", &keys(&["z"]), true).await.unwrap();
    (c, lease)
}

/// The sample a new key gets.
async fn next_index(c: &Controller) -> Vec<SampleId> {
    c.kv_retrieve_meta("new", &keys(&["n"]), true)
        .await
        .unwrap()
        .meta
        .samples()
        .to_vec()
}

async fn view(c: &Controller) -> Vec<String> {
    let mut out = vec![format!("{:?}", c.list_partitions().await.unwrap())];
    out.push(format!("{:?}", c.kv_list(None).await.unwrap()));
    for (p, fields) in [
        ("p", vec!["dense", "ragged", "obj"]),
        (PUBLIC_PARTITION, vec!["prompt"]),
        ("g", vec!["prompt"]),
        ("q", vec![]),
    ] {
        // Answers and errors alike (a partition that does not exist must not exist after a
        // restore either).
        out.push(format!("{:?}", c.get_meta(force(p, &fields)).await));
        let names: Vec<String> = fields.iter().map(|s| s.to_string()).collect();
        out.push(format!("{:?}", c.production_status(p, &names).await));
        for task in ["train", "score"] {
            out.push(format!("{:?}", c.consumption_status(p, task).await));
        }
    }
    out
}

#[tokio::test]
async fn a_snapshot_restores_everything() {
    let (c, lease) = busy().await;
    let (bytes, counts) = c.snapshot().unwrap();
    assert_eq!(counts.partitions, 4);
    assert_eq!(counts.leases, 2);
    assert!(counts.keys >= 7 && counts.samples >= 7, "{counts:?}");
    let restored = controller();
    assert_ne!(restored.epoch(), c.epoch());
    assert_eq!(restored.restore(&bytes).unwrap(), counts);
    assert_eq!(
        restored.epoch(),
        c.epoch(),
        "the epoch comes back: KV keys reattach"
    );
    assert_eq!(view(&restored).await, view(&c).await);
    // The lease is still held and can be acknowledged; allocation goes on where it was.
    let score = restored.consumption_status("p", "score").await.unwrap();
    let held: Vec<SampleId> = score
        .samples
        .iter()
        .zip(&score.leased)
        .filter(|(_, l)| **l)
        .map(|(s, _)| *s)
        .collect();
    assert_eq!(held.len(), 2);
    assert_eq!(restored.ack("p", "score", lease, &held).await.unwrap(), 2);
    assert_eq!(next_index(&restored).await, next_index(&c).await);
}

#[tokio::test]
async fn damaged_newer_or_mismatched_snapshots_change_nothing() {
    let (c, _) = busy().await;
    let (bytes, _) = c.snapshot().unwrap();
    let target = controller();
    let before = view(&target).await;
    // One flipped byte anywhere: header, length, checksum or body.
    for at in [0, 9, 17, 20, bytes.len() / 2, bytes.len() - 1] {
        let mut bad = bytes.clone();
        bad[at] ^= 0x40;
        let e = target.restore(&bad).unwrap_err();
        assert!(
            matches!(e.kind(), ErrorKind::Corrupted | ErrorKind::Invalid),
            "byte {at}: {e}"
        );
    }
    // A truncated snapshot.
    let e = target.restore(&bytes[..bytes.len() - 3]).unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Corrupted, "{e}");
    // A newer format.
    let mut newer = bytes.clone();
    newer[4..8].copy_from_slice(&(SNAPSHOT_FORMAT + 1).to_le_bytes());
    let e = target.restore(&newer).unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Invalid, "{e}");
    assert!(e.message().contains("newer"), "{e}");
    // Another deployment: three units.
    let three = Controller::new(ControllerConfig {
        storage_units: 3,
        ..Default::default()
    })
    .unwrap();
    let e = three.restore(&bytes).unwrap_err();
    assert!(e.message().contains("2 storage units"), "{e}");
    // A controller that holds something already.
    target
        .kv_retrieve_meta("mine", &keys(&["k"]), true)
        .await
        .unwrap();
    let held = view(&target).await;
    let e = target.restore(&bytes).unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Conflict, "{e}");
    assert_eq!(
        view(&target).await,
        held,
        "a refused restore changes nothing"
    );
    assert_ne!(held, before);
}
