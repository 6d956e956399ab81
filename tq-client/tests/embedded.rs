//! End-to-end behaviour of the embedded deployment (reference §10 cases 35–39 and the fixes).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and examples may panic
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;
use tq_client::*;
use tq_core::{Batch, Bytes, Column, ErrorKind, FieldKind, TagValue, Tags, Tensor};

fn client() -> Client {
    Client::embedded(Config::default()).unwrap()
}

fn dense_i64(rows: usize, cols: usize, base: i64) -> Column {
    let v: Vec<i64> = (0..rows * cols).map(|i| base + i as i64).collect();
    Column::Dense(Tensor::from_slice(vec![rows, cols], &v).unwrap())
}

fn batch(rows: usize, base: i64) -> Batch {
    Batch::from_columns([
        ("ids", dense_i64(rows, 4, base)),
        (
            "text",
            Column::Objects(
                (0..rows)
                    .map(|i| Bytes::from(format!("row {}", base + i as i64)))
                    .collect(),
            ),
        ),
    ])
    .unwrap()
}

fn tag(k: &str, v: i64) -> Tags {
    [(k.to_string(), TagValue::Int(v))].into()
}

fn keys_of(listing: &KeyListing, partition: &str) -> Vec<String> {
    assert_eq!(listing.partition, partition);
    listing.entries.iter().map(|(k, _)| k.clone()).collect()
}

#[tokio::test]
async fn kv_put_get_tags_and_cumulative_fields() {
    let tq = client();
    let one = batch(1, 0);
    let m = tq
        .partition("p")
        .kv_put("k", &one, Some(tag("step", 1)))
        .await
        .unwrap();
    assert_eq!(m.fields, vec!["ids", "text"]);
    assert_eq!(m.tags[0]["step"], TagValue::Int(1));
    // Tag-only update merges.
    let m = tq
        .partition("p")
        .kv_set_tags(&["k"], vec![tag("score", 7)])
        .await
        .unwrap();
    assert_eq!(m.tags[0].len(), 2);
    // Adding a field keeps the old ones; the returned field list is cumulative.
    let extra = Batch::from_columns([("reward", dense_i64(1, 1, 42))]).unwrap();
    let m = tq.partition("p").kv_put("k", &extra, None).await.unwrap();
    assert_eq!(m.fields, vec!["ids", "reward", "text"]);
    let got = tq.partition("p").kv_batch_get(&["k"], None).await.unwrap();
    assert_eq!(
        got.field_names().collect::<Vec<_>>(),
        vec!["ids", "reward", "text"]
    );
    assert_eq!(got.column("ids"), one.column("ids"));
    let got = tq
        .partition("p")
        .kv_batch_get(&["k"], Some(&["reward"]))
        .await
        .unwrap();
    assert_eq!(got.field_names().collect::<Vec<_>>(), vec!["reward"]);
    let listing = tq.partition("p").kv_list().await.unwrap();
    assert_eq!(listing.entries[0].1["score"], TagValue::Int(7));
    // A multi-row batch is refused for kv_put.
    let e = tq
        .partition("p")
        .kv_put("k2", &batch(2, 0), None)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Invalid);
}

#[tokio::test]
async fn differing_shapes_come_back_ragged() {
    let tq = client();
    let short = Batch::from_columns([("resp", dense_i64(1, 2, 0))]).unwrap();
    let long = Batch::from_columns([("resp", dense_i64(1, 5, 0))]).unwrap();
    tq.partition("p").kv_put("a", &short, None).await.unwrap();
    tq.partition("p").kv_put("b", &long, None).await.unwrap();
    let got = tq
        .partition("p")
        .kv_batch_get(&["a", "b"], None)
        .await
        .unwrap();
    match got.column("resp").unwrap() {
        Column::Ragged(rows) => {
            assert_eq!(rows[0].shape(), &[2]);
            assert_eq!(rows[1].shape(), &[5]);
        }
        other => panic!("expected ragged, got {other:?}"),
    }
    let meta = tq
        .get_meta(GetMetaRequest {
            partition: "p".into(),
            fields: vec!["resp".into()],
            mode: GetMetaMode::Force,
            sampler: None,
            dp_rank: None,
            batch_index: None,
            sampler_args: None,
        })
        .await
        .unwrap();
    assert_eq!(meta.fields()["resp"].kind(), FieldKind::Ragged);
}

#[tokio::test]
async fn heterogeneous_keys_return_common_fields() {
    let tq = client();
    let a =
        Batch::from_columns([("f_a", dense_i64(1, 1, 1)), ("f_b", dense_i64(1, 1, 2))]).unwrap();
    let b =
        Batch::from_columns([("f_a", dense_i64(1, 1, 3)), ("f_c", dense_i64(1, 1, 4))]).unwrap();
    tq.partition("p").kv_put("a", &a, None).await.unwrap();
    tq.partition("p").kv_put("b", &b, None).await.unwrap();
    let got = tq
        .partition("p")
        .kv_batch_get(&["a", "b"], None)
        .await
        .unwrap();
    assert_eq!(got.field_names().collect::<Vec<_>>(), vec!["f_a"]);
    let e = tq
        .partition("p")
        .kv_batch_get(&["a", "b"], Some(&["f_b"]))
        .await
        .unwrap_err();
    // Not produced for every key (yet): not ready, not a caller's mistake.
    assert_eq!(e.kind(), &ErrorKind::NotFound);
    assert!(e.message().contains("f_b"), "{e}");
}

#[tokio::test]
async fn invalid_kv_input_changes_nothing() {
    let tq = client();
    let b2 = batch(2, 0);
    let cases: Vec<tq_core::Error> = vec![
        tq.partition("p")
            .kv_batch_put(&["a", "a"], &b2, None)
            .await
            .unwrap_err(),
        tq.partition("p")
            .kv_batch_put::<&str>(&[], &b2, None)
            .await
            .unwrap_err(),
        tq.partition("p")
            .kv_batch_put(&["a", "b", "c"], &b2, None)
            .await
            .unwrap_err(),
        tq.partition("p")
            .kv_batch_put(&["a", "b"], &b2, Some(vec![Tags::new()]))
            .await
            .unwrap_err(),
        tq.partition("p")
            .kv_set_tags(&["a", "b"], vec![Tags::new()])
            .await
            .unwrap_err(),
        tq.partition("p")
            .kv_batch_put(&["a", ""], &b2, None)
            .await
            .unwrap_err(),
        tq.partition("p")
            .kv_batch_get(&["a", "a"], None)
            .await
            .unwrap_err(),
        tq.partition("p")
            .kv_clear_fields(&["a"], &[])
            .await
            .unwrap_err(),
    ];
    for e in cases {
        assert_eq!(e.kind(), &ErrorKind::Invalid, "{e}");
    }
    assert!(
        tq.list_partitions().await.unwrap().is_empty(),
        "nothing was created"
    );
    // A missing key is NotFound naming the key, never a shorter result.
    tq.partition("p")
        .kv_batch_put(&["a", "b"], &b2, None)
        .await
        .unwrap();
    let e = tq
        .partition("p")
        .kv_batch_get(&["a", "zz"], None)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::NotFound);
    assert!(e.message().contains("zz"), "{e}");
    // A field no key holds is not ready either (a reader may ask before any writer wrote
    // it); the error names it.
    let e = tq
        .partition("p")
        .kv_batch_get(&["a"], Some(&["nope"]))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::NotFound);
    assert!(e.message().contains("`nope`"), "{e}");
}

#[tokio::test]
async fn kv_clear_is_idempotent_and_isolated_between_partitions() {
    let tq = client();
    tq.partition("p1")
        .kv_put("a", &batch(1, 0), None)
        .await
        .unwrap();
    tq.partition("p1").kv_clear(&["a"]).await.unwrap();
    assert!(keys_of(&tq.partition("p1").kv_list().await.unwrap(), "p1").is_empty());
    tq.partition("p1").kv_clear(&["a"]).await.unwrap();
    tq.partition("nope").kv_clear(&["a"]).await.unwrap();
    // p2 reuses the index of p1's cleared key; p1 sees nothing.
    tq.partition("p2")
        .kv_put("b", &batch(1, 100), None)
        .await
        .unwrap();
    let m = tq
        .get_meta(GetMetaRequest::fetch("p1", &["ids"], "t", 1, Wait::NoWait))
        .await
        .unwrap();
    assert!(m.is_empty());
    assert!(tq.partition("p1").kv_list().await.unwrap().is_empty());
    assert_eq!(
        tq.partition("p2").kv_batch_get(&["b"], None).await.unwrap(),
        batch(1, 100)
    );
}

#[tokio::test]
async fn field_level_clear_keeps_keys_tags_and_consumption() {
    let tq = client();
    tq.partition("p")
        .kv_batch_put(
            &["a", "b"],
            &batch(2, 0),
            Some(vec![tag("t", 1), tag("t", 2)]),
        )
        .await
        .unwrap();
    // Consume both for task "train".
    assert_eq!(
        tq.partition("p")
            .fetch(&["ids"], "train", 2)
            .await
            .unwrap()
            .len(),
        2
    );
    tq.partition("p")
        .kv_clear_fields(&["a"], &["text"])
        .await
        .unwrap();
    // a's text is gone, b's is not; a's ids stay; tags stay.
    let e = tq
        .partition("p")
        .kv_batch_get(&["a"], Some(&["text"]))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::NotFound);
    let got = tq
        .partition("p")
        .kv_batch_get(&["a", "b"], None)
        .await
        .unwrap();
    assert_eq!(got.field_names().collect::<Vec<_>>(), vec!["ids"]);
    assert_eq!(
        tq.partition("p")
            .kv_batch_get(&["b"], Some(&["text"]))
            .await
            .unwrap()
            .len(),
        1
    );
    let listing = tq.partition("p").kv_list().await.unwrap();
    assert_eq!(keys_of(&listing, "p"), vec!["a", "b"]);
    assert_eq!(listing.entries[0].1["t"], TagValue::Int(1));
    assert!(tq
        .partition("p")
        .consumption_status("train")
        .await
        .unwrap()
        .all_consumed());
    // Clearing again, or a field some keys lack, is fine; writing it again works.
    tq.partition("p")
        .kv_clear_fields(&["a", "b"], &["text"])
        .await
        .unwrap();
    tq.partition("p")
        .kv_put("a", &batch(1, 9).select_fields(&["text"]).unwrap(), None)
        .await
        .unwrap();
    assert_eq!(
        tq.partition("p")
            .kv_batch_get(&["a"], Some(&["text"]))
            .await
            .unwrap()
            .len(),
        1
    );
    // Clearing every field leaves the key listed.
    tq.partition("p")
        .kv_clear_fields(&["b"], &["ids"])
        .await
        .unwrap();
    assert_eq!(
        keys_of(&tq.partition("p").kv_list().await.unwrap(), "p"),
        vec!["a", "b"]
    );
}

#[tokio::test]
async fn metadata_api_round_trip() {
    let tq = client();
    let data = batch(8, 0);
    let put = tq.partition("train").put_new(&data).await.unwrap();
    assert!(put.is_ready());
    assert_eq!(put.len(), 8);
    // Partial production: ids+text produced, reward not.
    assert!(tq
        .partition("train")
        .production_status(&["ids", "text"])
        .await
        .unwrap()
        .all_produced());
    assert!(!tq
        .partition("train")
        .production_status(&["ids", "reward"])
        .await
        .unwrap()
        .all_produced());
    // Consumption is marked at fetch time, before any data is read.
    let m = tq
        .partition("train")
        .fetch(&["ids", "text"], "learner", 5)
        .await
        .unwrap();
    let status = tq
        .partition("train")
        .consumption_status("learner")
        .await
        .unwrap();
    assert_eq!(status.consumed.iter().filter(|&&c| c).count(), 5);
    let got = tq.get_data(&m).await.unwrap();
    assert_eq!(got, data.select_rows(&[0, 1, 2, 3, 4]).unwrap());
    // Write a new field for the fetched samples, through their meta.
    let reward = Batch::from_columns([("reward", dense_i64(5, 1, 0))]).unwrap();
    let m2 = tq.put(&m, &reward).await.unwrap();
    assert!(m2.fields().contains_key("reward"));
    let m3 = tq
        .partition("train")
        .fetch(&["reward"], "critic", 5)
        .await
        .unwrap();
    assert_eq!(m3.samples(), m.samples());
    // Clearing an empty meta is a no-op; clearing the fetched samples leaves the others.
    tq.clear_samples(&tq_core::BatchMeta::empty("train"))
        .await
        .unwrap();
    tq.clear_samples(&m).await.unwrap();
    assert_eq!(
        tq.partition("train")
            .consumption_status("learner")
            .await
            .unwrap()
            .samples
            .len(),
        3
    );
    tq.partition("train").clear().await.unwrap();
    assert!(tq.list_partitions().await.unwrap().is_empty());
    // Bad puts.
    let e = tq
        .put(&tq_core::BatchMeta::empty("train"), &data)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Invalid);
    let e = tq.put(&put, &batch(3, 0)).await.unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Invalid);
}

#[tokio::test]
async fn stale_metadata_cannot_touch_a_reused_index() {
    let tq = client();
    let old = tq.partition("p1").put_new(&batch(2, 0)).await.unwrap();
    tq.clear_samples(&old).await.unwrap();
    let new = tq.partition("p2").put_new(&batch(2, 50)).await.unwrap();
    let old_idx: HashSet<u32> = old.samples().iter().map(|s| s.index).collect();
    let new_idx: HashSet<u32> = new.samples().iter().map(|s| s.index).collect();
    assert_eq!(old_idx, new_idx, "indexes are reused");
    let e = tq.get_data(&old).await.unwrap_err();
    assert!(
        matches!(e.kind(), ErrorKind::NotFound | ErrorKind::DataLost),
        "{e}"
    );
    let e = tq.put(&old, &batch(2, 999)).await.unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Conflict, "{e}");
    tq.clear_samples(&old).await.unwrap();
    assert_eq!(tq.get_data(&new).await.unwrap(), batch(2, 50));
}

#[tokio::test]
async fn capacity_exceeded_leaves_nothing_behind() {
    let mut cfg = Config::default();
    cfg.storage.num_units = 1;
    cfg.storage.capacity_per_unit = Some(4);
    let tq = Client::embedded(cfg).unwrap();
    tq.partition("p")
        .kv_batch_put(&["a", "b", "c"], &batch(3, 0), None)
        .await
        .unwrap();
    let e = tq
        .partition("p")
        .kv_batch_put(&["d", "e"], &batch(2, 0), None)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::CapacityExceeded, "{e}");
    assert_eq!(
        keys_of(&tq.partition("p").kv_list().await.unwrap(), "p"),
        vec!["a", "b", "c"]
    );
    let e = tq.partition("q").put_new(&batch(2, 0)).await.unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::CapacityExceeded);
    assert_eq!(tq.list_partitions().await.unwrap(), vec!["p"]);
    // Overwriting existing keys still works, and freeing room lets new keys in.
    tq.partition("p")
        .kv_batch_put(&["a", "b"], &batch(2, 7), None)
        .await
        .unwrap();
    tq.partition("p").kv_clear(&["c"]).await.unwrap();
    tq.partition("p")
        .kv_batch_put(&["d", "e"], &batch(2, 0), None)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_producers_and_consumers_lose_and_duplicate_nothing() {
    let tq = client();
    let producers = 4;
    let per_producer = 50;
    let mut handles = Vec::new();
    for p in 0..producers {
        let tq = tq.clone();
        handles.push(tokio::spawn(async move {
            for i in 0..per_producer {
                let id = (p * per_producer + i) as i64;
                let b = Batch::from_columns([("id", dense_i64(1, 1, id))]).unwrap();
                tq.partition("stream").put_new(&b).await.unwrap();
            }
        }));
    }
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut consumers = Vec::new();
    for _ in 0..3 {
        let (tq, seen) = (tq.clone(), seen.clone());
        consumers.push(tokio::spawn(async move {
            loop {
                let m = tq
                    .get_meta(GetMetaRequest::fetch(
                        "stream",
                        &["id"],
                        "consumer",
                        7,
                        Wait::For(Duration::from_millis(300)),
                    ))
                    .await;
                let m = match m {
                    Ok(m) => m,
                    Err(e) if e.kind() == &ErrorKind::Timeout => break,
                    Err(e) => panic!("{e}"),
                };
                let data = tq.get_data(&m).await.unwrap();
                let Column::Dense(t) = data.column("id").unwrap() else {
                    panic!()
                };
                seen.lock().unwrap().extend(t.to_vec::<i64>().unwrap());
                tq.clear_samples(&m).await.unwrap();
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    // Whatever is left (fewer than a batch) is drained by one last small fetch.
    for c in consumers {
        c.await.unwrap();
    }
    let rest = tq
        .get_meta(GetMetaRequest::fetch(
            "stream",
            &["id"],
            "consumer",
            1,
            Wait::NoWait,
        ))
        .await
        .unwrap();
    let mut rest_meta = rest;
    while !rest_meta.is_empty() {
        let d = tq.get_data(&rest_meta).await.unwrap();
        let Column::Dense(t) = d.column("id").unwrap() else {
            panic!()
        };
        seen.lock().unwrap().extend(t.to_vec::<i64>().unwrap());
        tq.clear_samples(&rest_meta).await.unwrap();
        rest_meta = tq
            .get_meta(GetMetaRequest::fetch(
                "stream",
                &["id"],
                "consumer",
                1,
                Wait::NoWait,
            ))
            .await
            .unwrap();
    }
    let mut seen = seen.lock().unwrap().clone();
    seen.sort_unstable();
    let want: Vec<i64> = (0..(producers * per_producer) as i64).collect();
    assert_eq!(seen, want, "every sample consumed exactly once");
}

#[test]
fn blocking_client_round_trip() {
    let tq = BlockingClient::embedded(Config::default()).unwrap();
    tq.partition("p")
        .kv_batch_put(&["x", "y"], &batch(2, 3), None)
        .unwrap();
    assert_eq!(
        tq.partition("p").kv_batch_get(&["x", "y"], None).unwrap(),
        batch(2, 3)
    );
    tq.partition("p").kv_clear(&["x", "y"]).unwrap();
    assert!(tq.list_partitions().unwrap().is_empty());
}

#[test]
fn a_blocking_call_from_inside_a_runtime_is_refused_not_left_to_block_its_worker() {
    let tq = BlockingClient::embedded(Config::default()).unwrap();
    let other = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let inside = other.block_on(async {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| tq.list_partitions()))
    });
    let message = inside.expect_err("a blocking call inside a runtime must not run");
    let text = message
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| message.downcast_ref::<&str>().copied())
        .unwrap_or_default();
    assert!(text.contains("runtime"), "{text}");
    // Outside it, the same client works.
    assert!(tq.list_partitions().unwrap().is_empty());
}

#[cfg(feature = "ssd")]
#[tokio::test]
async fn ssd_offload_from_the_config() {
    let dir = std::env::temp_dir().join(format!("tq-ssd-client-{}", std::process::id()));
    let mut cfg = Config::default();
    cfg.storage.ssd.enabled = true;
    cfg.storage.ssd.path = Some(dir.clone());
    cfg.storage.ssd.threshold_bytes = 64;
    {
        let tq = Client::embedded(cfg).unwrap();
        let big = batch(4, 0); // ids rows are 32 bytes, text rows smaller: all in memory
        let large = Batch::from_columns([("big", dense_i64(4, 64, 0))]).unwrap(); // 512 B rows
        tq.partition("p")
            .kv_batch_put(&["a", "b", "c", "d"], &big, None)
            .await
            .unwrap();
        tq.partition("p")
            .kv_batch_put(&["a", "b", "c", "d"], &large, None)
            .await
            .unwrap();
        let files = walk(&dir);
        assert_eq!(files, 4, "one file per large cell");
        let got = tq
            .partition("p")
            .kv_batch_get(&["a", "b", "c", "d"], Some(&["big"]))
            .await
            .unwrap();
        assert_eq!(got, large);
        tq.partition("p").kv_clear(&["a", "b"]).await.unwrap();
        assert_eq!(walk(&dir), 2, "clear deletes the files at once");
    }
    // Dropping the client shuts the units down: the run's files go, the user's directory stays.
    assert_eq!(walk(&dir), 0);
    assert!(dir.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[cfg(feature = "ssd")]
fn walk(dir: &std::path::Path) -> usize {
    let mut n = 0;
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                n += walk(&p);
            } else if p.extension().is_some_and(|x| x == "cell") {
                n += 1;
            }
        }
    }
    n
}
