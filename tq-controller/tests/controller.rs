//! Behaviour of the in-process controller (reference §10 cases 10–30 and the fixes of §11).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and examples may panic
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tq_controller::*;
use tq_core::{
    BackendMeta, Bytes, DType, ErrorKind, FieldKind, FieldMeta, SampleId, TagValue, Tags,
};

fn controller(units: u32) -> Controller {
    Controller::new(ControllerConfig {
        storage_units: units,
        ..Default::default()
    })
    .unwrap()
}

async fn insert(c: &Controller, p: &str, n: usize) -> Vec<SampleId> {
    let req = GetMetaRequest {
        partition: p.into(),
        fields: vec![],
        mode: GetMetaMode::Insert { count: n },
        sampler: None,
        dp_rank: None,
        batch_index: None,
        sampler_args: None,
    };
    let m = c.get_meta(req).await.unwrap();
    assert!(m.production().iter().all(|&p| !p));
    m.samples().to_vec()
}

fn notice(p: &str, ids: &[SampleId], fields: &[(&str, FieldMeta)]) -> ProductionNotice {
    ProductionNotice {
        partition: p.into(),
        samples: ids.to_vec(),
        schemas: fields
            .iter()
            .map(|(n, s)| (n.to_string(), s.clone()))
            .collect(),
        tags: None,
        backend_meta: None,
    }
}

fn f32s(shape: Vec<usize>) -> FieldMeta {
    FieldMeta::dense(DType::F32, shape)
}

async fn produce(c: &Controller, p: &str, ids: &[SampleId], fields: &[&str]) {
    let f: Vec<(&str, FieldMeta)> = fields.iter().map(|n| (*n, f32s(vec![2]))).collect();
    c.notify_production(notice(p, ids, &f)).await.unwrap();
}

async fn fetch(c: &Controller, p: &str, fields: &[&str], task: &str, n: usize) -> Vec<u32> {
    let m = c
        .get_meta(GetMetaRequest::fetch(p, fields, task, n, Wait::NoWait))
        .await
        .unwrap();
    m.samples().iter().map(|s| s.index).collect()
}

async fn clear(c: &Controller, p: &str, ids: Option<&[SampleId]>) -> usize {
    let m = c.mark_clearing(p, ids).await.unwrap();
    c.release(p, m.samples()).await.unwrap();
    m.len()
}

fn force(p: &str, fields: &[&str]) -> GetMetaRequest {
    GetMetaRequest {
        partition: p.into(),
        fields: fields.iter().map(|s| s.to_string()).collect(),
        mode: GetMetaMode::Force,
        sampler: None,
        dp_rank: None,
        batch_index: None,
        sampler_args: None,
    }
}

#[tokio::test]
async fn insert_produce_fetch_force_and_clear_partition() {
    let c = controller(1);
    let ids = insert(&c, "p", 32).await;
    assert_eq!(
        ids.iter().map(|i| i.index).collect::<Vec<_>>(),
        (0..32).collect::<Vec<_>>()
    );
    produce(&c, "p", &ids, &["a", "b"]).await;
    let ps = c
        .production_status("p", &["a".into(), "b".into()])
        .await
        .unwrap();
    assert_eq!(ps.samples.len(), 32);
    assert!(ps.all_produced());
    let cs = c.consumption_status("p", "T").await.unwrap();
    assert_eq!(cs.consumed, vec![false; 32]);

    let m = c
        .get_meta(GetMetaRequest::fetch("p", &["a"], "T", 32, Wait::NoWait))
        .await
        .unwrap();
    assert_eq!(m.len(), 32);
    assert!(m.is_ready());
    assert_eq!(m.field_names().collect::<Vec<_>>(), vec!["a"]);
    assert!(c.consumption_status("p", "T").await.unwrap().all_consumed());
    assert_eq!(c.get_meta(force("p", &["a"])).await.unwrap().len(), 32);

    assert_eq!(clear(&c, "p", None).await, 32);
    assert!(c.list_partitions().await.unwrap().is_empty());
    let e = c.get_meta(force("p", &["a"])).await.unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::NotFound);
    // Clearing a missing partition is a no-op.
    assert_eq!(clear(&c, "p", None).await, 0);
    assert_eq!(c.samples_in_use(), 0);
}

#[tokio::test]
async fn indexes_are_reused_with_a_new_generation() {
    let c = controller(1);
    let p1 = insert(&c, "p1", 32).await;
    let _p2 = insert(&c, "p2", 16).await;
    clear(&c, "p1", Some(&p1)).await;
    let p3 = insert(&c, "p3", 64).await;
    let idx: Vec<u32> = p3.iter().map(|s| s.index).collect();
    let mut want: Vec<u32> = (0..32).collect();
    want.extend(48..80);
    assert_eq!(idx, want);
    assert!(p3[..32].iter().all(|s| s.generation == 1));
    assert!(p3[32..].iter().all(|s| s.generation == 0));
}

#[tokio::test]
async fn tasks_consume_independently_and_reset() {
    let c = controller(1);
    let ids = insert(&c, "p", 6).await;
    produce(&c, "p", &ids, &["a"]).await;
    assert_eq!(fetch(&c, "p", &["a"], "A", 3).await, vec![0, 1, 2]);
    assert_eq!(fetch(&c, "p", &["a"], "A", 3).await, vec![3, 4, 5]);
    assert_eq!(fetch(&c, "p", &["a"], "B", 2).await, vec![0, 1]);
    assert!(fetch(&c, "p", &["a"], "A", 1).await.is_empty());
    c.reset_consumption("p", Some("A")).await.unwrap();
    assert_eq!(fetch(&c, "p", &["a"], "A", 6).await.len(), 6);
    assert_eq!(fetch(&c, "p", &["a"], "B", 6).await, Vec::<u32>::new());
    c.reset_consumption("p", None).await.unwrap();
    assert_eq!(fetch(&c, "p", &["a"], "B", 6).await.len(), 6);
    let e = c.reset_consumption("nope", None).await.unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::NotFound);
}

#[tokio::test]
async fn partial_production_and_clear_of_samples() {
    let c = controller(1);
    let ids = insert(&c, "p", 8).await;
    produce(&c, "p", &ids, &["a"]).await;
    assert!(c
        .production_status("p", &["a".into()])
        .await
        .unwrap()
        .all_produced());
    assert!(!c
        .production_status("p", &["a".into(), "b".into()])
        .await
        .unwrap()
        .all_produced());
    let gone: Vec<SampleId> = [0, 1, 2, 3, 6].iter().map(|&i| ids[i]).collect();
    assert_eq!(clear(&c, "p", Some(&gone)).await, 5);
    let left: Vec<u32> = c
        .get_meta(force("p", &[]))
        .await
        .unwrap()
        .samples()
        .iter()
        .map(|s| s.index)
        .collect();
    assert_eq!(left, vec![4, 5, 7]);
    // Repeating, or naming another partition, changes nothing.
    assert_eq!(clear(&c, "p", Some(&gone)).await, 0);
    assert_eq!(clear(&c, "other", Some(&gone)).await, 0);
    assert_eq!(c.get_meta(force("p", &[])).await.unwrap().len(), 3);
}

#[tokio::test]
async fn notify_is_rejected_for_clearing_or_released_samples() {
    let c = controller(1);
    let ids = insert(&c, "p", 2).await;
    let m = c.mark_clearing("p", Some(&ids[..1])).await.unwrap();
    let e = c
        .notify_production(notice("p", &ids, &[("a", f32s(vec![1]))]))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Conflict);
    assert!(e.message().contains("being cleared"), "{e}");
    // Nothing changed for the other sample either (all-or-nothing).
    assert!(
        !c.production_status("p", &["a".into()])
            .await
            .unwrap()
            .produced[0]
    );
    c.release("p", m.samples()).await.unwrap();
    let e = c
        .notify_production(notice("p", &ids[..1], &[("a", f32s(vec![1]))]))
        .await
        .unwrap_err();
    assert!(e.message().contains("not owned"), "{e}");
    // The index is reused with a new generation; the stale id still cannot notify.
    let again = insert(&c, "q", 1).await;
    assert_eq!(again[0].index, ids[0].index);
    assert!(c
        .notify_production(notice("q", &ids[..1], &[("a", f32s(vec![1]))]))
        .await
        .is_err());
    // Duplicate samples in one notice are invalid.
    let e = c
        .notify_production(notice("p", &[ids[1], ids[1]], &[("a", f32s(vec![1]))]))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Invalid);
}

#[tokio::test]
async fn cleared_partition_never_sees_another_partitions_reuse() {
    let c = controller(1);
    let a = insert(&c, "p1", 1).await;
    produce(&c, "p1", &a, &["x"]).await;
    clear(&c, "p1", Some(&a)).await;
    let b = insert(&c, "p2", 1).await;
    assert_eq!(b[0].index, a[0].index);
    produce(&c, "p2", &b, &["x"]).await;
    assert!(fetch(&c, "p1", &["x"], "t", 1).await.is_empty());
    assert_eq!(fetch(&c, "p2", &["x"], "t", 1).await, vec![a[0].index]);
}

#[tokio::test]
async fn schemas_follow_the_promotion_rules() {
    let c = controller(1);
    let ids = insert(&c, "p", 3).await;
    c.notify_production(notice("p", &ids, &[("f", f32s(vec![2]))]))
        .await
        .unwrap();
    // dtype conflict: Invalid, nothing changes.
    let e = c
        .notify_production(notice(
            "p",
            &ids[..1],
            &[("f", FieldMeta::dense(DType::I64, vec![2]))],
        ))
        .await
        .unwrap_err();
    assert!(e.message().contains("dtype mismatch"), "{e}");
    let e = c
        .notify_production(notice("p", &ids[..1], &[("f", FieldMeta::object())]))
        .await
        .unwrap_err();
    assert!(e.message().contains("kind mismatch"), "{e}");
    // A different shape promotes to ragged.
    c.notify_production(notice("p", &ids[2..], &[("f", f32s(vec![5]))]))
        .await
        .unwrap();
    let m = c.get_meta(force("p", &["f"])).await.unwrap();
    let s = &m.fields()["f"];
    assert_eq!(s.kind(), FieldKind::Ragged);
    assert_eq!(
        s.per_sample_shapes().unwrap(),
        &vec![vec![2], vec![2], vec![5]]
    );
    // Clearing the odd sample demotes back to dense.
    clear(&c, "p", Some(&ids[2..])).await;
    let m = c.get_meta(force("p", &["f"])).await.unwrap();
    assert_eq!(m.fields()["f"], f32s(vec![2]));
    // Clearing every sample forgets the schema: a new dtype is accepted.
    clear(&c, "p", Some(&ids[..2])).await;
    let more = insert(&c, "p", 1).await;
    c.notify_production(notice(
        "p",
        &more,
        &[("f", FieldMeta::dense(DType::I64, vec![1]))],
    ))
    .await
    .unwrap();
}

#[tokio::test]
async fn tags_and_backend_meta_arrive_with_readiness() {
    let c = controller(1);
    let ids = insert(&c, "p", 2).await;
    let mut n = notice("p", &ids, &[("a", f32s(vec![1])), ("b", f32s(vec![1]))]);
    n.tags = Some(vec![
        [("len".to_string(), TagValue::Int(10))].into(),
        [("len".to_string(), TagValue::Int(20))].into(),
    ]);
    let bm: Vec<BackendMeta> = (0..2)
        .map(|i| {
            BTreeMap::from([
                ("a".to_string(), Bytes::from(format!("a{i}"))),
                ("b".to_string(), Bytes::from(format!("b{i}"))),
            ])
        })
        .collect();
    n.backend_meta = Some(bm);
    let replaced = c.notify_production(n).await.unwrap();
    assert!(replaced.is_empty(), "a first write replaces nothing");
    // A rewrite of `a` for the second sample answers the entry it replaced, and only that.
    let mut again = notice("p", &ids, &[("a", f32s(vec![1]))]);
    again.backend_meta = Some(vec![
        BTreeMap::from([("a".to_string(), Bytes::from("a0"))]),
        BTreeMap::from([("a".to_string(), Bytes::from("a1-new"))]),
    ]);
    let replaced = c.notify_production(again).await.unwrap();
    assert_eq!(
        replaced,
        vec![
            BackendMeta::new(),
            BTreeMap::from([("a".to_string(), Bytes::from("a1"))])
        ]
    );
    let m = c.get_meta(force("p", &["a", "b"])).await.unwrap();
    assert_eq!(m.backend_meta()[1]["a"], Bytes::from("a1-new"));
    assert_eq!(m.backend_meta()[1]["b"], Bytes::from("b1"));
    let m = c
        .get_meta(GetMetaRequest::fetch("p", &["a"], "t", 2, Wait::NoWait))
        .await
        .unwrap();
    assert_eq!(m.tags()[1]["len"], TagValue::Int(20));
    assert_eq!(
        m.backend_meta()[0].len(),
        1,
        "backend meta filtered to the fetched field"
    );
    assert_eq!(m.backend_meta()[0]["a"], Bytes::from("a0"));
    c.set_tags(
        "p",
        &ids[..1],
        vec![[("x".to_string(), TagValue::from("y"))].into()],
    )
    .await
    .unwrap();
    let m = c.get_meta(force("p", &["a"])).await.unwrap();
    assert_eq!(m.tags()[0].len(), 2);
    assert_eq!(m.tags()[1].len(), 1);
    assert!(c.set_tags("p", &ids, vec![Tags::new()]).await.is_err());
}

#[tokio::test]
async fn kv_keys_resolve_create_and_list() {
    let c = controller(2);
    let keys: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
    let kv = c.kv_retrieve_meta("p", &keys, true).await.unwrap();
    assert_eq!(kv.keys, keys);
    assert_eq!(kv.meta.len(), 3);
    assert!(kv.meta.fields().is_empty());
    // Same keys resolve to the same samples.
    let again = c.kv_retrieve_meta("p", &keys, false).await.unwrap();
    assert_eq!(again.meta.samples(), kv.meta.samples());
    // Mixed existing and missing keys without create.
    let mixed: Vec<String> = ["a", "x", "c", "y"].iter().map(|s| s.to_string()).collect();
    let m = c.kv_retrieve_meta("p", &mixed, false).await.unwrap();
    assert_eq!(m.keys, vec!["a", "c"]);
    assert_eq!(m.missing, vec!["x", "y"]);
    let none = c.kv_retrieve_meta("nope", &mixed, false).await.unwrap();
    assert!(none.meta.is_empty());
    assert!(
        c.list_partitions().await.unwrap() == vec!["p"],
        "lookup without create creates nothing"
    );
    // Invalid key lists.
    let dup: Vec<String> = vec!["a".into(), "a".into()];
    assert_eq!(
        c.kv_retrieve_meta("p", &dup, true)
            .await
            .unwrap_err()
            .kind(),
        &ErrorKind::Invalid
    );
    assert_eq!(
        c.kv_retrieve_meta("p", &[], true).await.unwrap_err().kind(),
        &ErrorKind::Invalid
    );
    // A lookup, a lookup that creates and a put check their list while resolving it: the
    // first bad key in order is named, whether the partition holds it or not (and whether the
    // partition exists), and nothing changes.
    let listed = |listing: Vec<tq_controller::KeyListing>| -> Vec<(String, usize)> {
        listing
            .into_iter()
            .map(|l| (l.partition, l.entries.len()))
            .collect()
    };
    let before = listed(c.kv_list(None).await.unwrap());
    let put_fields: BTreeMap<_, _> = [("data".to_string(), f32s(vec![1]))].into();
    let strings = |ks: &[&str]| ks.iter().map(|s| s.to_string()).collect::<Vec<String>>();
    for (list, bad) in [
        (strings(&["a", "b", "a"]), "key `a` appears twice"),
        (strings(&["x", "b", "x", "a", "a"]), "key `x` appears twice"),
        (strings(&["a", "x", "a", "x"]), "key `a` appears twice"),
        (strings(&["x", "", "x"]), "empty key"),
        (strings(&["a", ""]), "empty key"),
        (Vec::new(), "empty key list"),
    ] {
        for partition in ["p", "nope"] {
            let errors = [
                ("lookup", c.kv_retrieve_meta(partition, &list, false).await),
                ("create", c.kv_retrieve_meta(partition, &list, true).await),
                ("put", c.kv_prepare_put(partition, &list, &put_fields).await),
            ];
            for (op, result) in errors {
                let err = result.unwrap_err();
                assert_eq!(
                    err.kind(),
                    &ErrorKind::Invalid,
                    "{op} {list:?} in {partition}"
                );
                assert!(
                    err.message().contains(bad),
                    "{op} {list:?} in {partition}: {err}"
                );
            }
        }
    }
    assert_eq!(c.list_partitions().await.unwrap(), vec!["p"]);
    assert_eq!(listed(c.kv_list(None).await.unwrap()), before);
    // After production the common field shows up; tags in key order.
    let mut n = notice("p", kv.meta.samples(), &[("data", f32s(vec![1]))]);
    n.tags = Some(
        (0..3)
            .map(|i| [("i".to_string(), TagValue::Int(i))].into())
            .collect(),
    );
    c.notify_production(n).await.unwrap();
    let m = c.kv_retrieve_meta("p", &keys, false).await.unwrap();
    assert_eq!(m.meta.field_names().collect::<Vec<_>>(), vec!["data"]);
    assert!(m.meta.is_ready());
    let listing = c.kv_list(Some("p")).await.unwrap();
    assert_eq!(listing.len(), 1);
    let listed: Vec<&str> = listing[0].entries.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(listed, vec!["a", "b", "c"]);
    assert_eq!(listing[0].entries[2].1["i"], TagValue::Int(2));
    assert!(c.kv_list(Some("nope")).await.unwrap().is_empty());
    // A cleared key disappears from listings and lookups.
    let a = c.kv_retrieve_meta("p", &keys[..1], false).await.unwrap();
    clear(&c, "p", Some(a.meta.samples())).await;
    let listing = c.kv_list(None).await.unwrap();
    assert_eq!(listing[0].entries.len(), 2);
    assert_eq!(
        c.kv_retrieve_meta("p", &keys[..1], false)
            .await
            .unwrap()
            .missing,
        vec!["a"]
    );
}

#[tokio::test]
async fn heterogeneous_keys_expose_only_common_fields() {
    let c = controller(1);
    let keys: Vec<String> = vec!["a".into(), "b".into()];
    let kv = c.kv_retrieve_meta("p", &keys, true).await.unwrap();
    let (a, b) = (kv.meta.samples()[0], kv.meta.samples()[1]);
    produce(&c, "p", &[a], &["f_a", "f_b"]).await;
    produce(&c, "p", &[b], &["f_a", "f_c"]).await;
    let m = c.kv_retrieve_meta("p", &keys, false).await.unwrap();
    assert_eq!(m.meta.field_names().collect::<Vec<_>>(), vec!["f_a"]);
}

// Paused time: the clock moves only when every task waits, so each sleep below lets the
// other tasks reach their waits and each lease expires exactly when due.
#[tokio::test(start_paused = true)]
async fn blocking_fetch_waits_without_blocking_others() {
    let c = Arc::new(controller(1));
    let ids = insert(&c, "p", 4).await;
    let waiter = {
        let c = c.clone();
        tokio::spawn(async move {
            c.get_meta(GetMetaRequest::fetch(
                "p",
                &["a"],
                "t",
                4,
                Wait::For(Duration::from_secs(10)),
            ))
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    // Other requests are served while the fetch waits.
    let started = tokio::time::Instant::now();
    assert_eq!(c.list_partitions().await.unwrap(), vec!["p"]);
    produce(&c, "p", &ids[..2], &["a"]).await;
    assert!(started.elapsed() < Duration::from_secs(1));
    assert!(!waiter.is_finished(), "two of four ready: still waiting");
    produce(&c, "p", &ids[2..], &["a"]).await;
    let m = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(m.len(), 4);
    // A deadline turns into Timeout with a message naming the partition.
    let e = c
        .get_meta(GetMetaRequest::fetch(
            "p",
            &["a"],
            "t",
            1,
            Wait::For(Duration::from_millis(50)),
        ))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Timeout);
    assert!(e.message().contains("`p`"), "{e}");
    // Waiting for a partition that does not exist yet works too.
    let w = {
        let c = c.clone();
        tokio::spawn(async move {
            c.get_meta(GetMetaRequest::fetch(
                "later",
                &["a"],
                "t",
                1,
                Wait::For(Duration::from_secs(10)),
            ))
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    let l = insert(&c, "later", 1).await;
    produce(&c, "later", &l, &["a"]).await;
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(5), w)
            .await
            .unwrap()
            .unwrap()
            .unwrap()
            .len(),
        1
    );
}

#[tokio::test]
async fn bad_fetches_are_errors() {
    let c = controller(1);
    let ids = insert(&c, "p", 2).await;
    produce(&c, "p", &ids, &["a"]).await;
    let e = c
        .get_meta(GetMetaRequest::fetch("p", &[], "t", 1, Wait::NoWait))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Invalid);
    let e = c
        .get_meta(GetMetaRequest::fetch("p", &["a"], "t", 0, Wait::NoWait))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Invalid);
    let e = c
        .get_meta(GetMetaRequest::fetch("p", &["a"], "t", 1, Wait::NoWait).with_sampler("nope"))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Invalid);
    // Unknown field: nothing ready.
    assert!(fetch(&c, "p", &["zzz"], "t", 1).await.is_empty());
    // Polling with too few ready: empty, and nothing consumed.
    assert!(fetch(&c, "p", &["a"], "t", 3).await.is_empty());
    assert_eq!(fetch(&c, "p", &["a"], "t", 2).await.len(), 2);
    let e = c
        .get_meta(GetMetaRequest {
            mode: GetMetaMode::Insert { count: 0 },
            ..force("p", &[])
        })
        .await
        .unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Invalid);
}

#[tokio::test]
async fn allocation_balances_partitions_across_units() {
    let c = controller(2);
    let mut a = vec![];
    let mut b = vec![];
    // Single rows, alternating: each partition fills a run of a unit, then the other's.
    for _ in 0..32 {
        a.extend(insert(&c, "a", 1).await);
        b.extend(insert(&c, "b", 1).await);
    }
    for ids in [a, b] {
        let on0 = ids
            .iter()
            .filter(|s| tq_core::routing::unit_of(s.index, 2) == 0)
            .count();
        assert_eq!(on0, 16, "{ids:?}");
    }
}

#[tokio::test]
async fn max_samples_bounds_the_samples_held_over_all_partitions() {
    let c = Controller::new(ControllerConfig {
        storage_units: 2,
        max_samples: Some(40),
        ..Default::default()
    })
    .unwrap();
    let a = insert(&c, "a", 32).await;
    // 8 left: an insert of 10 is refused whole, naming the partition and the limit.
    let req = GetMetaRequest {
        partition: "b".into(),
        fields: vec![],
        mode: GetMetaMode::Insert { count: 10 },
        sampler: None,
        dp_rank: None,
        batch_index: None,
        sampler_args: None,
    };
    let e = c.get_meta(req).await.unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::CapacityExceeded, "{e}");
    assert!(e.message().contains("partition `b`"), "{e}");
    assert!(e.message().contains("controller.max_samples = 40"), "{e}");
    // So are new keys; the keys the partition already holds are not new.
    let keys: Vec<String> = (0..10).map(|i| format!("k{i}")).collect();
    let e = c.kv_retrieve_meta("b", &keys, true).await.unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::CapacityExceeded, "{e}");
    assert!(e.message().contains("controller.max_samples = 40"), "{e}");
    assert_eq!(
        insert(&c, "b", 8).await.len(),
        8,
        "nothing was taken by the refusals"
    );
    // Released samples count no more.
    assert_eq!(clear(&c, "a", Some(&a[..16])).await, 16);
    assert_eq!(insert(&c, "b", 16).await.len(), 16);

    // The limit is the controller's, not the state's: a snapshot of this state restored into
    // a controller without one takes new samples, and this one, restored from a snapshot of an
    // unlimited controller holding 40 samples, takes none.
    let (full, _) = c.snapshot().unwrap();
    let unlimited = controller(2);
    unlimited.restore(&full).unwrap();
    assert_eq!(insert(&unlimited, "c", 100).await.len(), 100);
    let (hundred_forty, _) = unlimited.snapshot().unwrap();
    let limited = Controller::new(ControllerConfig {
        storage_units: 2,
        max_samples: Some(40),
        ..Default::default()
    })
    .unwrap();
    limited.restore(&hundred_forty).unwrap();
    let e = limited
        .kv_retrieve_meta("c", &["new".to_string()], true)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::CapacityExceeded, "{e}");
}

#[tokio::test]
async fn grpo_sampler_hands_out_whole_groups() {
    let c = controller(1);
    c.register_sampler("grpo", Arc::new(GrpoGroupNSampler::new(2).unwrap()));
    let ids = insert(&c, "p", 6).await;
    // Groups (0,1) (2,3) (4,5); produce 0,1,2 and 4,5.
    produce(&c, "p", &[ids[0], ids[1], ids[2], ids[4], ids[5]], &["r"]).await;
    let m = c
        .get_meta(GetMetaRequest::fetch("p", &["r"], "train", 4, Wait::NoWait).with_sampler("grpo"))
        .await
        .unwrap();
    let got: Vec<u32> = m.samples().iter().map(|s| s.index).collect();
    assert_eq!(got, vec![0, 1, 4, 5]);
    let m = c
        .get_meta(GetMetaRequest::fetch("p", &["r"], "train", 2, Wait::NoWait).with_sampler("grpo"))
        .await
        .unwrap();
    assert!(m.is_empty(), "sample 2's partner is not ready");
}

#[tokio::test]
async fn field_level_clear_blocks_writes_until_finished() {
    let c = controller(1);
    let ids = insert(&c, "p", 3).await;
    produce(&c, "p", &ids, &["a", "b"]).await;
    assert_eq!(fetch(&c, "p", &["a"], "t", 3).await.len(), 3);
    let fields = vec!["b".to_string()];
    let m = c.begin_clear_fields("p", &ids[..2], &fields).await.unwrap();
    assert_eq!(m.len(), 2);
    assert_eq!(m.field_names().collect::<Vec<_>>(), vec!["b"]);
    let ps = c
        .production_status("p", &["a".into(), "b".into()])
        .await
        .unwrap();
    assert_eq!(ps.produced, vec![true, false, true, false, true, true]);
    // Writing the cell while the storage clear runs is refused.
    let e = c
        .notify_production(notice("p", &ids[..1], &[("b", f32s(vec![2]))]))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Conflict);
    c.finish_clear_fields("p", &ids[..2], &fields)
        .await
        .unwrap();
    produce(&c, "p", &ids[..1], &["b"]).await;
    // Consumption and the sample itself stay.
    assert!(c.consumption_status("p", "t").await.unwrap().all_consumed());
    assert!(c.begin_clear_fields("p", &ids, &[]).await.is_err());
}

/// `tq soak --storage redis` left overwritten cells (`<field>%v<version>`) in Redis: a field
/// clear whose answer was lost in a controller kill was repeated, and the repeat named the
/// cells without their version, so storage deleted the wrong keys.
#[tokio::test]
async fn a_repeated_field_clear_names_the_cells_the_first_one_did() {
    let c = controller(1);
    let ids = insert(&c, "p", 2).await;
    let mut n = notice("p", &ids, &[("a", f32s(vec![1])), ("b", f32s(vec![1]))]);
    let at = |i: usize, f: &str| Bytes::from(format!("{f}{i}-v7"));
    n.backend_meta = Some(
        (0..2)
            .map(|i| BTreeMap::from([("a".into(), at(i, "a")), ("b".into(), at(i, "b"))]))
            .collect(),
    );
    c.notify_production(n).await.unwrap();
    let fields = vec!["b".to_string()];
    let first = c.begin_clear_fields("p", &ids, &fields).await.unwrap();
    let again = c.begin_clear_fields("p", &ids, &fields).await.unwrap();
    assert_eq!(first.backend_meta()[1]["b"], at(1, "b"));
    assert_eq!(again.samples(), first.samples());
    assert_eq!(again.backend_meta(), first.backend_meta());
    // A whole-sample clear meanwhile names them too (the field clear's storage step may
    // never have run).
    let marked = c.mark_clearing("p", Some(&ids[..1])).await.unwrap();
    assert_eq!(marked.backend_meta()[0]["b"], at(0, "b"));
    c.finish_clear_fields("p", &ids, &fields).await.unwrap();
    // Once finished, the cells of `b` are gone from the metadata: a repeat finds none, and
    // the sample names only the cells that stay.
    let late = c.begin_clear_fields("p", &ids[1..], &fields).await.unwrap();
    let marked = c.mark_clearing("p", Some(&ids[1..])).await.unwrap();
    assert_eq!(
        marked.backend_meta()[0],
        BTreeMap::from([("a".into(), at(1, "a"))])
    );
    assert!(late.is_empty(), "{late:?}");
}

#[tokio::test]
async fn growth_keeps_production_and_consumption() {
    let c = controller(2);
    let first = insert(&c, "p", 3).await;
    produce(&c, "p", &first, &["a"]).await;
    assert_eq!(fetch(&c, "p", &["a"], "t", 2).await.len(), 2);
    // Grow far past the first bitmap word and add many fields.
    let more = insert(&c, "p", 500).await;
    let fields: Vec<String> = (0..40).map(|i| format!("f{i}")).collect();
    let names: Vec<&str> = fields.iter().map(String::as_str).collect();
    produce(&c, "p", &more, &names).await;
    let cs = c.consumption_status("p", "t").await.unwrap();
    assert_eq!(cs.samples.len(), 503);
    assert_eq!(
        cs.consumed.iter().filter(|&&x| x).count(),
        2,
        "consumption survived growth"
    );
    assert!(c
        .production_status("p", &["a".into()])
        .await
        .unwrap()
        .produced[..3]
        .iter()
        .all(|&p| p));
    assert_eq!(fetch(&c, "p", &["f39"], "t", 500).await.len(), 500);
    assert_eq!(
        fetch(&c, "p", &["a"], "t", 5).await.len(),
        0,
        "only one unconsumed `a` left"
    );
}

/// A sampler that hands out something that is not ready must not get it through.
struct Rogue;
impl Sampler for Rogue {
    fn sample(
        &self,
        ready: &[Candidate<'_>],
        _: usize,
        _: &SamplerContext<'_>,
    ) -> tq_core::Result<Sampled> {
        let mut ids: Vec<SampleId> = ready.iter().map(|c| c.id).collect();
        ids.push(SampleId::new(ready[0].id.index + 1, 0));
        Ok(Sampled {
            sampled: ids.clone(),
            consumed: ids,
        })
    }
}

#[tokio::test]
async fn a_sampler_cannot_hand_out_unready_samples() {
    let c = controller(1);
    c.register_sampler("rogue", Arc::new(Rogue));
    let ids = insert(&c, "p", 2).await;
    produce(&c, "p", &ids[..1], &["a"]).await;
    let e = c
        .get_meta(GetMetaRequest::fetch("p", &["a"], "t", 1, Wait::NoWait).with_sampler("rogue"))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Internal);
    // Nothing was consumed.
    assert!(!c.consumption_status("p", "t").await.unwrap().consumed[0]);
}

#[tokio::test]
async fn overwriting_the_odd_shape_demotes_to_dense() {
    let c = controller(1);
    let ids = insert(&c, "p", 2).await;
    c.notify_production(notice("p", &ids, &[("f", f32s(vec![2]))]))
        .await
        .unwrap();
    c.notify_production(notice("p", &ids[..1], &[("f", f32s(vec![3]))]))
        .await
        .unwrap();
    assert_eq!(
        c.get_meta(force("p", &["f"])).await.unwrap().fields()["f"].kind(),
        FieldKind::Ragged
    );
    c.notify_production(notice("p", &ids[..1], &[("f", f32s(vec![2]))]))
        .await
        .unwrap();
    assert_eq!(
        c.get_meta(force("p", &["f"])).await.unwrap().fields()["f"],
        f32s(vec![2])
    );
}

fn leased(p: &str, fields: &[&str], task: &str, n: usize, lease_ms: u64) -> GetMetaRequest {
    GetMetaRequest::fetch(p, fields, task, n, Wait::NoWait)
        .with_lease(Duration::from_millis(lease_ms))
}

// Paused time, as above: the lease deadlines are exact.
#[tokio::test(start_paused = true)]
async fn a_renewed_lease_keeps_its_samples_past_the_first_deadline() {
    let c = controller(1);
    let ids = insert(&c, "p", 3).await;
    produce(&c, "p", &ids, &["a"]).await;
    let m = c.get_meta(leased("p", &["a"], "t", 2, 100)).await.unwrap();
    let lease = m.lease().unwrap();
    tokio::time::sleep(Duration::from_millis(60)).await;
    // Renewing for 200 ms at t=60 moves the deadline to t=260.
    let renewed = c
        .renew_lease("p", "t", lease, m.samples(), Duration::from_millis(200))
        .await
        .unwrap();
    assert_eq!(renewed, 2);
    tokio::time::sleep(Duration::from_millis(100)).await; // t=160: past the first deadline
    assert!(
        fetch(&c, "p", &["a"], "t", 2).await.is_empty(),
        "the renewed samples are still leased: one sample is ready, not two"
    );
    assert_eq!(fetch(&c, "p", &["a"], "t", 1).await, vec![ids[2].index]);
    // Another lease, an unknown task or sample, and a second naming count nothing.
    let twice = [m.samples()[0], m.samples()[0], SampleId::new(999, 0)];
    assert_eq!(
        c.renew_lease("p", "t", lease, &twice, Duration::from_secs(1))
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        c.renew_lease("p", "t", lease + 1000, m.samples(), Duration::from_secs(1))
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        c.renew_lease("p", "nobody", lease, m.samples(), Duration::from_secs(1))
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        c.renew_lease("missing", "t", lease, m.samples(), Duration::from_secs(1))
            .await
            .unwrap(),
        0
    );
    let e = c
        .renew_lease("p", "t", lease, m.samples(), Duration::ZERO)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Invalid, "{e}");
    // The second sample was renewed until t=260 only: once that passes it cannot be renewed
    // (its lease ran out) and it is ready again; the first (renewed at t=160 for 1 s) is not.
    tokio::time::sleep(Duration::from_millis(150)).await; // t=310
    assert_eq!(
        c.renew_lease("p", "t", lease, &m.samples()[1..], Duration::from_secs(1))
            .await
            .unwrap(),
        0,
        "a lease past its deadline is not renewed"
    );
    let back = fetch(&c, "p", &["a"], "t", 1).await;
    assert_eq!(back, vec![m.samples()[1].index]);
    // The renewed sample is acknowledged under its lease as usual.
    assert_eq!(c.ack("p", "t", lease, &m.samples()[..1]).await.unwrap(), 1);
}

// Paused time: the clock moves only when every task waits, so each sleep below lets the
// other tasks reach their waits and each lease expires exactly when due.
#[tokio::test(start_paused = true)]
async fn leases_expire_back_to_ready_and_acks_consume() {
    let c = controller(1);
    let ids = insert(&c, "p", 4).await;
    produce(&c, "p", &ids, &["a"]).await;
    let m = c.get_meta(leased("p", &["a"], "t", 2, 100)).await.unwrap();
    let lease = m.lease().expect("acknowledged mode sets a lease");
    // Leased samples are not ready for the task, and not consumed either.
    let cs = c.consumption_status("p", "t").await.unwrap();
    assert_eq!(cs.leased.iter().filter(|&&l| l).count(), 2);
    assert!(cs.consumed.iter().all(|&x| !x));
    assert_eq!(
        fetch(&c, "p", &["a"], "t", 4).await.len(),
        0,
        "only 2 ready"
    );
    // Another task is unaffected.
    assert_eq!(fetch(&c, "p", &["a"], "other", 4).await.len(), 4);
    // Ack one of them; let the lease on the other expire.
    assert_eq!(c.ack("p", "t", lease, &m.samples()[..1]).await.unwrap(), 1);
    tokio::time::sleep(Duration::from_millis(150)).await;
    let again = c
        .get_meta(leased("p", &["a"], "t", 3, 10_000))
        .await
        .unwrap();
    let got: Vec<SampleId> = again.samples().to_vec();
    assert!(
        got.contains(&m.samples()[1]),
        "expired lease returned to ready"
    );
    assert!(
        !got.contains(&m.samples()[0]),
        "acknowledged sample stays consumed"
    );
    // A late ack of the expired lease consumes nothing (the sample is with someone else now).
    assert_eq!(c.ack("p", "t", lease, &m.samples()[1..]).await.unwrap(), 0);
    assert_ne!(again.lease(), Some(lease));
    // A waiting fetch wakes up when a lease expires.
    let c = Arc::new(c);
    let short = c.get_meta(leased("p", &["a"], "u", 4, 100)).await.unwrap();
    assert_eq!(short.len(), 4);
    let started = tokio::time::Instant::now();
    let m = c
        .get_meta(
            GetMetaRequest::fetch("p", &["a"], "u", 4, Wait::For(Duration::from_secs(5)))
                .with_lease(Duration::from_secs(5)),
        )
        .await
        .unwrap();
    assert_eq!(m.len(), 4);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "woke at lease expiry, not the deadline"
    );
    // reset_consumption forgets leases too.
    c.reset_consumption("p", Some("u")).await.unwrap();
    assert_eq!(fetch(&c, "p", &["a"], "u", 4).await.len(), 4);
    assert!(
        c.get_meta(leased("p", &["a"], "t", 1, 0)).await.is_err(),
        "zero lease is invalid"
    );
}

// Paused time: the clock moves only when every task waits, so each sleep below lets the
// other tasks reach their waits and each lease expires exactly when due.
#[tokio::test(start_paused = true)]
async fn a_complete_partition_ends_fetches_of_tasks_that_consumed_it() {
    let c = Arc::new(controller(1));
    let ids = insert(&c, "p", 2).await;
    produce(&c, "p", &ids, &["a"]).await;
    c.mark_complete("p").await.unwrap();
    assert_eq!(fetch(&c, "p", &["a"], "t", 2).await.len(), 2);
    let wait = |task: &str| {
        GetMetaRequest::fetch("p", &["a"], task, 1, Wait::For(Duration::from_secs(10)))
    };
    let started = tokio::time::Instant::now();
    let e = c.get_meta(wait("t")).await.unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Closed, "{e}");
    assert!(started.elapsed() < Duration::from_secs(1));
    // A task that has not consumed everything still gets data.
    assert_eq!(c.get_meta(wait("fresh")).await.unwrap().len(), 1);
    // Leased but unacknowledged samples keep the stream open; the ack finishes it.
    let m = c
        .get_meta(leased("p", &["a"], "acker", 2, 10_000))
        .await
        .unwrap();
    let waiter = {
        let c = c.clone();
        tokio::spawn(async move { c.get_meta(wait("acker")).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!waiter.is_finished());
    c.ack("p", "acker", m.lease().unwrap(), m.samples())
        .await
        .unwrap();
    let e = tokio::time::timeout(Duration::from_secs(2), waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Closed);
    // The completion mark survives clearing every sample, until the partition is dropped.
    clear(&c, "p", None).await;
    assert_eq!(c.list_partitions().await.unwrap(), vec!["p"]);
    assert_eq!(
        c.get_meta(wait("t")).await.unwrap_err().kind(),
        &ErrorKind::Closed
    );
    c.drop_partition("p").await.unwrap();
    assert!(c.list_partitions().await.unwrap().is_empty());
    // Dropping a partition that still holds samples is refused.
    insert(&c, "q", 1).await;
    assert_eq!(
        c.drop_partition("q").await.unwrap_err().kind(),
        &ErrorKind::Conflict
    );
    c.drop_partition("missing").await.unwrap();
}

#[tokio::test]
async fn a_complete_partition_hands_out_its_last_smaller_batch() {
    let c = controller(1);
    let ids = insert(&c, "p", 5).await;
    produce(&c, "p", &ids, &["a"]).await;
    assert_eq!(fetch(&c, "p", &["a"], "t", 2).await.len(), 2);
    // Not complete: 3 ready are not enough for a batch of 4.
    assert!(fetch(&c, "p", &["a"], "t", 4).await.is_empty());
    c.mark_complete("p").await.unwrap();
    assert_eq!(fetch(&c, "p", &["a"], "t", 4).await.len(), 3);
    // But not while some remaining sample can still become ready.
    let more = insert(&c, "q", 3).await;
    produce(&c, "q", &more[..2], &["a"]).await;
    c.mark_complete("q").await.unwrap();
    assert!(fetch(&c, "q", &["a"], "t", 4).await.is_empty());
}

#[tokio::test]
async fn an_oversized_insert_is_refused_before_anything_is_allocated() {
    let c = controller(2);
    for count in [MAX_INSERT_COUNT + 1, usize::MAX] {
        let e = c
            .get_meta(GetMetaRequest {
                partition: "p".into(),
                fields: vec![],
                mode: GetMetaMode::Insert { count },
                sampler: None,
                dp_rank: None,
                batch_index: None,
                sampler_args: None,
            })
            .await
            .unwrap_err();
        assert_eq!(e.kind(), &ErrorKind::Invalid, "{e}");
        assert!(e.message().contains("at most"), "{e}");
    }
    assert!(
        c.list_partitions().await.unwrap().is_empty(),
        "nothing was created"
    );
    assert_eq!(
        insert(&c, "p", 3).await.len(),
        3,
        "a sane insert still works"
    );
}

/// An acknowledgement whose answer was lost is retried: the lease that acknowledged a sample
/// gets it counted again (also after a snapshot and restore, as a controller restarted on its
/// state dir does), while an expired lease whose sample another lease acknowledged still
/// counts nothing.
#[tokio::test(start_paused = true)]
async fn a_retried_ack_answers_as_acknowledged() {
    let c = controller(1);
    let ids = insert(&c, "p", 4).await;
    produce(&c, "p", &ids, &["a"]).await;
    let m = c.get_meta(leased("p", &["a"], "t", 3, 100)).await.unwrap();
    let lease = m.lease().unwrap();
    let (first, late) = m.samples().split_at(2);
    assert_eq!(c.ack("p", "t", lease, first).await.unwrap(), 2);
    assert_eq!(c.ack("p", "t", lease, first).await.unwrap(), 2, "a retry");
    let twice = [first[0], first[0]];
    assert_eq!(c.ack("p", "t", lease, &twice).await.unwrap(), 1);

    // The third sample's lease expires; another lease takes and acknowledges it.
    tokio::time::sleep(Duration::from_millis(150)).await;
    let again = c
        .get_meta(leased("p", &["a"], "t", 1, 10_000))
        .await
        .unwrap();
    assert_eq!(again.samples(), late);
    let other = again.lease().unwrap();
    assert_eq!(c.ack("p", "t", other, late).await.unwrap(), 1);
    assert_eq!(
        c.ack("p", "t", lease, late).await.unwrap(),
        0,
        "not this lease's"
    );

    let (bytes, _) = c.snapshot().unwrap();
    let restored = controller(1);
    restored.restore(&bytes).unwrap();
    assert_eq!(restored.ack("p", "t", lease, m.samples()).await.unwrap(), 2);
    assert_eq!(restored.ack("p", "t", other, late).await.unwrap(), 1);
    // Undone consumption forgets who acknowledged.
    restored.reset_consumption("p", Some("t")).await.unwrap();
    assert_eq!(restored.ack("p", "t", lease, first).await.unwrap(), 0);
}
