//! kv_update, field-level clear and kv_link: one test per rule of reference §11.2–§11.7 and
//! checklist §11.10 (embedded deployment).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and examples may panic
use std::sync::Arc;
use tq_client::*;
use tq_core::{Batch, Column, ErrorKind, MergeOp, MergeRegistry, TagValue, Tags, Tensor, Value};

fn client() -> Client {
    Client::embedded(Config::default()).unwrap()
}

/// A client and its controller, for tests that drive the clear protocol's steps by hand to
/// reach an interleaving (the client itself does not expose them).
fn client_and_control() -> (Client, Arc<dyn tq_controller::ControlPlane>) {
    let storage = tq_backend_simple::SimpleStorage::in_memory(2, Default::default()).unwrap();
    let control: Arc<dyn tq_controller::ControlPlane> = Arc::new(
        tq_controller::Controller::new(tq_controller::ControllerConfig::default()).unwrap(),
    );
    let tq = Client::from_parts(control.clone(), Arc::new(storage), Config::default());
    (tq, control)
}

fn i64s(rows: usize, cols: usize, base: i64) -> Batch {
    let v: Vec<i64> = (0..(rows * cols) as i64).map(|i| base + i).collect();
    Batch::from_columns([(
        "x",
        Column::Dense(Tensor::from_slice(vec![rows, cols], &v).unwrap()),
    )])
    .unwrap()
}

fn prompt(rows: usize, base: i64) -> Batch {
    let v: Vec<i64> = (0..rows as i64 * 4).map(|i| base + i).collect();
    Batch::from_columns([(
        "prompt",
        Column::Dense(Tensor::from_slice(vec![rows, 4], &v).unwrap()),
    )])
    .unwrap()
}

fn col_i64(b: &Batch, f: &str) -> Vec<i64> {
    b.column(f)
        .unwrap()
        .values()
        .iter()
        .flat_map(|v| v.as_tensor().unwrap().to_vec::<i64>().unwrap())
        .collect()
}

fn keys(listing: &KeyListing, p: &str) -> Vec<String> {
    assert_eq!(listing.partition, p);
    listing.entries.iter().map(|(k, _)| k.clone()).collect()
}

const PUB: &str = "__public__";

// ---------------------------------------------------------------------------------------------
// kv_update

#[tokio::test]
async fn update_merges_in_place_and_keeps_consumption_and_tags() {
    let tq = client();
    let tags: Vec<Tags> = (0..3)
        .map(|i| [("i".to_string(), TagValue::Int(i))].into())
        .collect();
    tq.partition("p")
        .kv_batch_put(&["a", "b", "c"], &i64s(3, 2, 0), Some(tags))
        .await
        .unwrap();
    assert_eq!(
        tq.partition("p")
            .fetch(&["x"], "train", 3)
            .await
            .unwrap()
            .len(),
        3
    );
    tq.partition("p")
        .kv_batch_update(&["a", "b", "c"], &i64s(3, 2, 100), &MergeOp::Add)
        .await
        .unwrap();
    let got = tq
        .partition("p")
        .kv_batch_get(&["a", "b", "c"], None)
        .await
        .unwrap();
    assert_eq!(col_i64(&got, "x"), vec![100, 102, 104, 106, 108, 110]);
    assert!(
        tq.partition("p")
            .consumption_status("train")
            .await
            .unwrap()
            .all_consumed(),
        "no redelivery"
    );
    assert_eq!(
        tq.partition("p").kv_tags(&["c"]).await.unwrap()[0]["i"],
        TagValue::Int(2)
    );
    // Concat appends a response to a prompt: the field becomes ragged when lengths differ.
    let tail = Batch::from_columns([(
        "x",
        Column::Ragged(vec![
            Tensor::from_vec(vec![7i64]),
            Tensor::from_vec(vec![8i64, 9]),
            Tensor::from_vec(vec![10i64]),
        ]),
    )])
    .unwrap();
    tq.partition("p")
        .kv_batch_update(&["a", "b", "c"], &tail, &MergeOp::Concat { dim: 0 })
        .await
        .unwrap();
    let got = tq
        .partition("p")
        .kv_batch_get(&["a", "b", "c"], None)
        .await
        .unwrap();
    match got.column("x").unwrap() {
        Column::Ragged(rows) => {
            assert_eq!(rows[1].to_vec::<i64>().unwrap(), vec![104, 106, 8, 9]);
            assert_eq!(rows[0].shape(), &[3]);
        }
        other => panic!("expected ragged after concat, got {other:?}"),
    }
}

#[tokio::test]
async fn update_preconditions_change_nothing() {
    let tq = client();
    tq.partition("p")
        .kv_batch_put(&["a", "b"], &i64s(2, 2, 0), None)
        .await
        .unwrap();
    let extra = Batch::from_columns([(
        "y",
        Column::Dense(Tensor::from_slice(vec![1, 1], &[5i64]).unwrap()),
    )])
    .unwrap();
    tq.partition("p").kv_put("a", &extra, None).await.unwrap();
    let before = tq
        .partition("p")
        .kv_batch_get(&["a", "b"], Some(&["x"]))
        .await
        .unwrap();
    let cases = vec![
        tq.partition("p")
            .kv_batch_update(&["a", "zz"], &i64s(2, 2, 1), &MergeOp::Add)
            .await
            .unwrap_err(),
        tq.partition("p")
            .kv_batch_update(&["a", "a"], &i64s(2, 2, 1), &MergeOp::Add)
            .await
            .unwrap_err(),
        tq.partition("p")
            .kv_batch_update(&["a", "b"], &i64s(1, 2, 1), &MergeOp::Add)
            .await
            .unwrap_err(),
        // `y` is produced for `a` only.
        tq.partition("p")
            .kv_batch_update(
                &["a", "b"],
                &Batch::from_columns([(
                    "y",
                    Column::Dense(Tensor::from_slice(vec![2, 1], &[1i64, 2]).unwrap()),
                )])
                .unwrap(),
                &MergeOp::Add,
            )
            .await
            .unwrap_err(),
    ];
    for e in cases {
        assert_eq!(e.kind(), &ErrorKind::Invalid, "{e}");
    }
    // A merge whose result changes the dtype fails on the unit and writes nothing.
    let f32s = Batch::from_columns([(
        "x",
        Column::Dense(Tensor::from_slice(vec![2, 2], &[1.0f32; 4]).unwrap()),
    )])
    .unwrap();
    assert!(tq
        .partition("p")
        .kv_batch_update(&["a", "b"], &f32s, &MergeOp::Replace)
        .await
        .is_err());
    assert_eq!(
        tq.partition("p")
            .kv_batch_get(&["a", "b"], Some(&["x"]))
            .await
            .unwrap(),
        before
    );
}

#[tokio::test]
async fn named_merge_functions_and_closures() {
    let mut reg = MergeRegistry::default();
    reg.register(
        "keep_old",
        Arc::new(|old: &Value, _: &Value| Ok(old.clone())),
    );
    let tq = Client::embedded_with_merges(Config::default(), reg).unwrap();
    tq.partition("p")
        .kv_put("a", &i64s(1, 2, 1), None)
        .await
        .unwrap();
    tq.partition("p")
        .kv_update("a", &i64s(1, 2, 50), &MergeOp::Named("keep_old".into()))
        .await
        .unwrap();
    assert_eq!(
        col_i64(
            &tq.partition("p").kv_batch_get(&["a"], None).await.unwrap(),
            "x"
        ),
        vec![1, 2]
    );
    let double: tq_core::MergeFn = Arc::new(|_: &Value, new: &Value| {
        let v: Vec<i64> = new
            .as_tensor()
            .unwrap()
            .to_vec::<i64>()
            .unwrap()
            .iter()
            .map(|x| x * 2)
            .collect();
        Ok(Value::Tensor(Tensor::from_slice(
            new.as_tensor().unwrap().shape().to_vec(),
            &v,
        )?))
    });
    tq.partition("p")
        .kv_update("a", &i64s(1, 2, 10), &MergeOp::Custom(double))
        .await
        .unwrap();
    assert_eq!(
        col_i64(
            &tq.partition("p").kv_batch_get(&["a"], None).await.unwrap(),
            "x"
        ),
        vec![20, 22]
    );
    let e = tq
        .partition("p")
        .kv_update("a", &i64s(1, 2, 1), &MergeOp::Named("nope".into()))
        .await
        .unwrap_err();
    assert!(e.message().contains("nope"), "{e}");
}

// ---------------------------------------------------------------------------------------------
// Field-level clear

#[tokio::test]
async fn a_put_racing_a_field_clear_fails_loudly_instead_of_vanishing() {
    let (tq, control) = client_and_control();
    tq.partition("p")
        .kv_batch_put(&["a"], &i64s(1, 2, 0), None)
        .await
        .unwrap();
    let kv = control
        .kv_retrieve_meta("p", &["a".to_string()], false)
        .await
        .unwrap();
    // The clear's controller step ran; its storage step has not yet.
    let fields = vec!["x".to_string()];
    control
        .begin_clear_fields("p", kv.meta.samples(), &fields)
        .await
        .unwrap();
    let e = tq
        .partition("p")
        .kv_put("a", &i64s(1, 2, 9), None)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Conflict, "{e}");
    tq.storage()
        .clear(&kv.meta, &tq_core::FieldFilter::Only(fields.clone()))
        .await
        .unwrap();
    control
        .finish_clear_fields("p", kv.meta.samples(), &fields)
        .await
        .unwrap();
    // Afterwards the write goes through and is readable: nothing points at freed storage.
    tq.partition("p")
        .kv_put("a", &i64s(1, 2, 9), None)
        .await
        .unwrap();
    assert_eq!(
        col_i64(
            &tq.partition("p").kv_batch_get(&["a"], None).await.unwrap(),
            "x"
        ),
        vec![9, 10]
    );
}

// ---------------------------------------------------------------------------------------------
// kv_link

async fn public_video(tq: &Client, key: &str, base: i64) {
    tq.partition(PUB)
        .kv_put(key, &prompt(1, base), None)
        .await
        .unwrap();
}

#[tokio::test]
async fn linked_keys_read_the_shared_payload() {
    let tq = client();
    public_video(&tq, "video_0", 1000).await;
    public_video(&tq, "video_1", 2000).await;
    let resp = ["r0", "r1", "r2", "r3"];
    let m = tq
        .partition("train")
        .kv_link(
            &resp,
            &["video_0", "video_0", "video_1", "video_0"],
            &["prompt"],
            &LinkOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(m.fields, vec!["prompt"]);
    // Responses are written privately next to the linked prompt.
    tq.partition("train")
        .kv_batch_put(&resp, &i64s(4, 1, 0), None)
        .await
        .unwrap();
    let got = tq
        .partition("train")
        .kv_batch_get(&resp, None)
        .await
        .unwrap();
    assert_eq!(got.field_names().collect::<Vec<_>>(), vec!["prompt", "x"]);
    let p = col_i64(&got, "prompt");
    assert_eq!(&p[0..4], &[1000, 1001, 1002, 1003]);
    assert_eq!(&p[8..12], &[2000, 2001, 2002, 2003]);
    assert_eq!(p[0..4], p[12..16]);
    // Linked fields are ordinary produced fields for consumers.
    let batch = tq
        .partition("train")
        .fetch(&["prompt", "x"], "trainer", 4)
        .await
        .unwrap();
    assert_eq!(tq.get_data(&batch).await.unwrap().len(), 4);
}

#[tokio::test]
async fn bad_link_requests_change_nothing() {
    let tq = client();
    public_video(&tq, "v", 0).await;
    let o = LinkOptions::default();
    let invalid = vec![
        tq.partition("d")
            .kv_link(&["a", "a"], &["v", "v"], &["prompt"], &o)
            .await
            .unwrap_err(),
        tq.partition("d")
            .kv_link::<&str, &str>(&[], &[], &["prompt"], &o)
            .await
            .unwrap_err(),
        tq.partition("d")
            .kv_link(&["a"], &["v"], &[], &o)
            .await
            .unwrap_err(),
        tq.partition("d")
            .kv_link(&["a", "b"], &["v"], &["prompt"], &o)
            .await
            .unwrap_err(),
        tq.partition("d")
            .kv_link(&["a"], &["v"], &["nope"], &o)
            .await
            .unwrap_err(),
        tq.partition(PUB)
            .kv_link(&["a"], &["v"], &["prompt"], &o)
            .await
            .unwrap_err(),
        tq.partition("d")
            .kv_link(
                &["a"],
                &["v"],
                &["prompt"],
                &LinkOptions {
                    public_partition: "train".into(),
                    ..o.clone()
                },
            )
            .await
            .unwrap_err(),
    ];
    for e in invalid {
        assert_eq!(e.kind(), &ErrorKind::Invalid, "{e}");
    }
    let e = tq
        .partition("d")
        .kv_link(&["a"], &["missing"], &["prompt"], &o)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::NotFound, "{e}");
    assert!(
        keys(&tq.partition("d").kv_list().await.unwrap(), "d").is_empty(),
        "no keys were created"
    );
}

#[tokio::test]
async fn types_are_checked_before_keys_are_created() {
    let tq = client();
    public_video(&tq, "v", 0).await;
    let f32_prompt = Batch::from_columns([(
        "prompt",
        Column::Dense(Tensor::from_slice(vec![1, 4], &[0.5f32; 4]).unwrap()),
    )])
    .unwrap();
    tq.partition("d")
        .kv_put("existing", &f32_prompt, None)
        .await
        .unwrap();
    let e = tq
        .partition("d")
        .kv_link(
            &["new1", "new2"],
            &["v", "v"],
            &["prompt"],
            &LinkOptions::default(),
        )
        .await
        .unwrap_err();
    assert!(e.message().contains("dtype mismatch"), "{e}");
    assert_eq!(
        keys(&tq.partition("d").kv_list().await.unwrap(), "d"),
        vec!["existing"]
    );
}

#[tokio::test]
async fn a_private_payload_is_refused_unless_replaced_explicitly() {
    let tq = client();
    public_video(&tq, "v", 500).await;
    tq.partition("d")
        .kv_put("a", &prompt(1, 0), None)
        .await
        .unwrap();
    let e = tq
        .partition("d")
        .kv_link(&["a"], &["v"], &["prompt"], &LinkOptions::default())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Conflict, "{e}");
    let replace = LinkOptions {
        replace_private: true,
        ..LinkOptions::default()
    };
    tq.partition("d")
        .kv_link(&["a"], &["v"], &["prompt"], &replace)
        .await
        .unwrap();
    assert_eq!(
        col_i64(
            &tq.partition("d").kv_batch_get(&["a"], None).await.unwrap(),
            "prompt"
        )[0],
        500
    );
    // Re-pointing an existing link needs no replace.
    public_video(&tq, "w", 900).await;
    tq.partition("d")
        .kv_link(&["a"], &["w"], &["prompt"], &LinkOptions::default())
        .await
        .unwrap();
    assert_eq!(
        col_i64(
            &tq.partition("d").kv_batch_get(&["a"], None).await.unwrap(),
            "prompt"
        )[0],
        900
    );
    // `v` has no link left: it may be cleared.
    tq.partition(PUB).kv_clear(&["v"]).await.unwrap();
}

#[tokio::test]
async fn writes_to_linked_rows_and_fields_are_refused() {
    let tq = client();
    public_video(&tq, "v", 0).await;
    tq.partition("d")
        .kv_link(&["a"], &["v"], &["prompt"], &LinkOptions::default())
        .await
        .unwrap();
    // The public row is still linked: rewriting it would change old trajectories.
    let e = tq
        .partition(PUB)
        .kv_put("v", &prompt(1, 77), None)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Conflict, "{e}");
    let e = tq
        .partition(PUB)
        .kv_update("v", &prompt(1, 1), &MergeOp::Add)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Conflict, "{e}");
    assert_eq!(
        col_i64(
            &tq.partition("d").kv_batch_get(&["a"], None).await.unwrap(),
            "prompt"
        )[0],
        0,
        "payload unchanged"
    );
    // The linked destination field needs an explicit unlink before a private write.
    let e = tq
        .partition("d")
        .kv_put("a", &prompt(1, 5), None)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Conflict, "{e}");
    let e = tq
        .partition("d")
        .kv_update("a", &prompt(1, 5), &MergeOp::Add)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Conflict, "{e}");
    assert_eq!(
        tq.partition("d")
            .kv_unlink(&["a"], &["prompt"])
            .await
            .unwrap(),
        1
    );
    tq.partition("d")
        .kv_put("a", &prompt(1, 5), None)
        .await
        .unwrap();
    assert_eq!(
        col_i64(
            &tq.partition("d").kv_batch_get(&["a"], None).await.unwrap(),
            "prompt"
        )[0],
        5
    );
    // With no link left, the public row can be rewritten.
    tq.partition(PUB)
        .kv_put("v", &prompt(1, 77), None)
        .await
        .unwrap();
}

#[tokio::test]
async fn clearing_linked_public_rows_is_refused_atomically() {
    let tq = client();
    public_video(&tq, "linked", 0).await;
    public_video(&tq, "free", 10).await;
    tq.partition("d")
        .kv_link(
            &["a", "b"],
            &["linked", "linked"],
            &["prompt"],
            &LinkOptions::default(),
        )
        .await
        .unwrap();
    for e in [
        tq.partition(PUB)
            .kv_clear(&["free", "linked"])
            .await
            .unwrap_err(),
        tq.partition(PUB)
            .kv_clear_fields(&["linked"], &["prompt"])
            .await
            .unwrap_err(),
        tq.partition(PUB).clear().await.unwrap_err(),
    ] {
        assert_eq!(e.kind(), &ErrorKind::Conflict, "{e}");
    }
    assert_eq!(
        keys(&tq.partition(PUB).kv_list().await.unwrap(), PUB),
        vec!["linked", "free"],
        "nothing cleared"
    );
    // Field-level clear of a linked destination field drops only that link.
    tq.partition("d")
        .kv_clear_fields(&["a"], &["prompt"])
        .await
        .unwrap();
    assert!(tq
        .partition("d")
        .kv_batch_get(&["a"], Some(&["prompt"]))
        .await
        .is_err());
    assert_eq!(
        col_i64(
            &tq.partition("d").kv_batch_get(&["b"], None).await.unwrap(),
            "prompt"
        )[0],
        0
    );
    // Clearing the last linking key drops its links; then the public row clears.
    tq.partition("d").kv_clear(&["b"]).await.unwrap();
    tq.partition(PUB)
        .kv_clear(&["linked", "free"])
        .await
        .unwrap();
    assert!(keys(&tq.partition(PUB).kv_list().await.unwrap(), PUB).is_empty());
}

#[tokio::test]
async fn links_to_or_from_samples_being_cleared_are_refused() {
    let (tq, control) = client_and_control();
    public_video(&tq, "v", 0).await;
    tq.partition("d")
        .kv_put("busy", &i64s(1, 1, 0), None)
        .await
        .unwrap();
    let v = control
        .kv_retrieve_meta(PUB, &["v".to_string()], false)
        .await
        .unwrap();
    let busy = control
        .kv_retrieve_meta("d", &["busy".to_string()], false)
        .await
        .unwrap();
    // Source being cleared: its production is gone, so the link is refused.
    control
        .mark_clearing(PUB, Some(v.meta.samples()))
        .await
        .unwrap();
    let e = tq
        .partition("d")
        .kv_link(&["a"], &["v"], &["prompt"], &LinkOptions::default())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Conflict, "{e}");
    control.release(PUB, v.meta.samples()).await.unwrap();
    // Destination being cleared.
    public_video(&tq, "w", 0).await;
    control
        .mark_clearing("d", Some(busy.meta.samples()))
        .await
        .unwrap();
    let e = tq
        .partition("d")
        .kv_link(&["busy"], &["w"], &["prompt"], &LinkOptions::default())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Conflict, "{e}");
}

#[tokio::test]
async fn sweeping_unlinked_public_keys_protects_fresh_payloads_and_namespaces() {
    let tq = client();
    let ns = "__public__/job1";
    tq.partition(ns)
        .kv_put("old", &prompt(1, 0), None)
        .await
        .unwrap();
    tq.partition(ns)
        .kv_put("kept", &prompt(1, 0), None)
        .await
        .unwrap();
    tq.partition(ns)
        .kv_put("fresh", &prompt(1, 0), None)
        .await
        .unwrap();
    tq.partition(PUB)
        .kv_put("other_job", &prompt(1, 0), None)
        .await
        .unwrap();
    let o = LinkOptions {
        public_partition: ns.into(),
        replace_private: false,
    };
    tq.partition("d")
        .kv_link(&["a", "b"], &["old", "kept"], &["prompt"], &o)
        .await
        .unwrap();
    let other = LinkOptions::default();
    tq.partition("e")
        .kv_link(&["z"], &["other_job"], &["prompt"], &other)
        .await
        .unwrap();
    tq.partition("d").kv_clear(&["a"]).await.unwrap();
    tq.partition("e").kv_clear(&["z"]).await.unwrap();
    let swept = tq.partition(ns).kv_clear_unlinked_public("").await.unwrap();
    assert_eq!(swept, vec!["old"], "linked-then-unlinked only");
    assert_eq!(
        keys(&tq.partition(ns).kv_list().await.unwrap(), ns),
        vec!["kept", "fresh"]
    );
    assert_eq!(
        keys(&tq.partition(PUB).kv_list().await.unwrap(), PUB),
        vec!["other_job"],
        "other namespace untouched"
    );
    assert_eq!(
        col_i64(
            &tq.partition("d").kv_batch_get(&["b"], None).await.unwrap(),
            "prompt"
        )[0],
        0
    );
    assert!(tq
        .partition("train")
        .kv_clear_unlinked_public("")
        .await
        .is_err());
}

#[tokio::test]
async fn backends_without_links_are_refused_by_the_controller() {
    use tq_controller::{ControlPlane, Controller, ControllerConfig, LinkRequest};
    let c = Controller::new(ControllerConfig {
        storage_backend: "redis".into(),
        links_supported: false,
        ..ControllerConfig::default()
    })
    .unwrap();
    let e = c
        .kv_link(LinkRequest {
            partition: "d".into(),
            keys: vec!["a".into()],
            public_partition: PUB.into(),
            public_keys: vec!["v".into()],
            fields: vec!["prompt".into()],
        })
        .await
        .unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::Unsupported { .. }), "{e}");
    assert!(c.list_partitions().await.unwrap().is_empty());
}
