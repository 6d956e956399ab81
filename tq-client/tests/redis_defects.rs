//! Defects of the adversarial-testing issue that need a real Redis: keys stuck after a put
//! failed during an outage, stale writes leaking keys, and the TTL re-arm of a whole sample; and
//! the epoch in KV keys, which keeps a restarted process off the keys of its earlier life.
//! Each test starts its own `redis-server` on a free loopback port.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and examples may panic

#[path = "../../tq-backend-kv/tests/common/mod.rs"]
mod common;

use common::{redis_available, RedisServer};
use tq_client::*;
use tq_core::{Batch, Column, ErrorKind, Tensor};

fn ints(rows: usize, base: i64) -> Batch {
    let v: Vec<i64> = (0..rows as i64 * 2).map(|i| base + i).collect();
    Batch::from_columns([(
        "x",
        Column::Dense(Tensor::from_slice(vec![rows, 2], &v).unwrap()),
    )])
    .unwrap()
}

fn two_fields(base: i64) -> Batch {
    ints(1, base)
        .with(
            "y",
            Column::Dense(Tensor::from_slice(vec![1, 2], &[base, base]).unwrap()),
        )
        .unwrap()
}

fn client_on(redis: &RedisServer, extra: &str) -> Client {
    let config = Config::from_toml(&format!(
        "[storage]\nbackend = \"kv\"\n[storage.kv]\n{extra}\nstores = [{{ name = \"r\", url = \"{}\" }}]\n",
        redis.url()
    ))
    .unwrap();
    let mut config = config;
    config.net.request_timeout_ms = 2_000;
    Client::embedded(config).unwrap()
}

#[tokio::test]
async fn defect_2_keys_whose_put_failed_during_an_outage_are_not_stuck() {
    if !redis_available("defect_2_keys_whose_put_failed_during_an_outage_are_not_stuck") {
        return;
    }
    let mut redis = RedisServer::start();
    let tq = client_on(&redis, "");
    tq.partition("p")
        .kv_put("old", &ints(1, 0), None)
        .await
        .unwrap();
    redis.kill();
    // New keys: created, the write fails, their removal fails too (storage is down).
    for key in ["again", "cleared", "background"] {
        let e = tq
            .partition("p")
            .kv_put(key, &ints(1, 1), None)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), &ErrorKind::Unavailable, "{key}: {e}");
    }
    assert_eq!(tq.unfinished_clears(), 3);
    let redis = redis.restart();
    // 1. A put of the key finishes its clear first.
    tq.partition("p")
        .kv_put("again", &ints(1, 5), None)
        .await
        .unwrap();
    assert_eq!(
        tq.partition("p")
            .kv_batch_get(&["again"], None)
            .await
            .unwrap(),
        ints(1, 5)
    );
    // 2. A clear of the key finishes it (and the key can be written afterwards).
    tq.partition("p").kv_clear(&["cleared"]).await.unwrap();
    tq.partition("p")
        .kv_put("cleared", &ints(1, 6), None)
        .await
        .unwrap();
    // 3. The retry of unfinished clears (what the background task runs) frees the last one.
    assert_eq!(tq.retry_unfinished_clears().await.unwrap(), 0);
    assert_eq!(tq.unfinished_clears(), 0);
    tq.partition("p")
        .kv_put("background", &ints(1, 7), None)
        .await
        .unwrap();
    let listed = tq.partition("p").kv_list().await.unwrap();
    let keys: Vec<&str> = listed.entries.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys.len(), 4, "{keys:?}");
    // Nothing left behind once everything is cleared.
    tq.partition("p").clear().await.unwrap();
    assert_eq!(redis.live_keys(), 0);
}

#[tokio::test]
async fn defect_4_refused_stale_writes_leave_no_keys_in_redis() {
    if !redis_available("defect_4_refused_stale_writes_leave_no_keys_in_redis") {
        return;
    }
    let redis = RedisServer::start();
    let tq = client_on(&redis, "");
    tq.partition("keep")
        .kv_put("k", &ints(1, 0), None)
        .await
        .unwrap();
    let baseline = redis.live_keys();
    for round in 0..40 {
        let meta = tq.partition("p").put_new(&ints(2, round)).await.unwrap();
        tq.clear_samples(&meta).await.unwrap();
        // Reuse the index, then write with the stale metadata.
        let fresh = tq
            .partition("p")
            .put_new(&ints(2, 100 + round))
            .await
            .unwrap();
        let e = tq.put(&meta, &ints(2, 999)).await.unwrap_err();
        assert_eq!(e.kind(), &ErrorKind::Conflict, "{e}");
        assert_eq!(tq.get_data(&fresh).await.unwrap(), ints(2, 100 + round));
        tq.clear_samples(&fresh).await.unwrap();
    }
    assert_eq!(redis.live_keys(), baseline, "orphaned keys in Redis");
}

#[tokio::test]
async fn defect_5_rewriting_one_field_re_arms_the_ttl_of_the_whole_sample() {
    if !redis_available("defect_5_rewriting_one_field_re_arms_the_ttl_of_the_whole_sample") {
        return;
    }
    let redis = RedisServer::start();
    let tq = client_on(&redis, "data_ttl_ms = 600000");
    tq.partition("p")
        .kv_put("k", &two_fields(1), None)
        .await
        .unwrap();
    let keys = redis.cli(&["--raw", "KEYS", "*/y"]);
    let y_key = keys.lines().next().expect("the key of field y").to_string();
    // Pretend field y was written long ago: its deadline is near.
    redis.cli(&["PEXPIRE", &y_key, "5000"]);
    tq.partition("p")
        .kv_put("k", &ints(1, 2), None)
        .await
        .unwrap();
    let ttl: i64 = redis.cli(&["PTTL", &y_key]).trim().parse().unwrap();
    assert!(
        ttl > 500_000,
        "field y was not re-armed by a write of x: PTTL {ttl} ms"
    );
    // kv_update re-arms it too.
    redis.cli(&["PEXPIRE", &y_key, "5000"]);
    tq.partition("p")
        .kv_update("k", &ints(1, 1), &tq_core::MergeOp::Add)
        .await
        .unwrap();
    let ttl: i64 = redis.cli(&["PTTL", &y_key]).trim().parse().unwrap();
    assert!(
        ttl > 500_000,
        "field y was not re-armed by an update of x: PTTL {ttl} ms"
    );
}

/// Epochs: an embedded process that died without clearing left generation keys in Redis (index
/// 0 at generation 2 here). Its successor's controller starts again at index 0, generation 0:
/// its keys carry a new epoch, so it neither trips over the old generation key (a put refused
/// as stale) nor touches the keys of its earlier life.
#[tokio::test]
async fn a_restarted_embedded_process_starts_on_fresh_keys() {
    if !redis_available("a_restarted_embedded_process_starts_on_fresh_keys") {
        return;
    }
    let redis = RedisServer::start();
    let first = client_on(&redis, "");
    let p = first.partition("p");
    for round in 0..3 {
        p.kv_put("k", &ints(1, round), None).await.unwrap();
        if round < 2 {
            p.kv_clear(&["k"]).await.unwrap();
        }
    }
    let old = p.kv_meta(&["k"]).await.unwrap();
    assert_eq!(old.samples()[0], tq_core::SampleId::new(0, 2));
    let first_epoch = first.epoch();
    drop(first);
    let left = redis.live_keys();
    assert_eq!(
        left, 2,
        "one cell and one generation key of the earlier life"
    );

    let second = client_on(&redis, "");
    assert_ne!(second.epoch(), first_epoch);
    let q = second.partition("p");
    q.kv_put("k", &ints(1, 100), None).await.unwrap();
    let now = q.kv_meta(&["k"]).await.unwrap();
    assert_eq!(now.samples()[0], tq_core::SampleId::new(0, 0));
    assert_eq!(q.kv_batch_get(&["k"], None).await.unwrap(), ints(1, 100));
    assert_eq!(
        redis.live_keys(),
        left + 2,
        "the earlier keys are untouched"
    );
    q.kv_clear(&["k"]).await.unwrap();
    assert_eq!(redis.live_keys(), left);
}
