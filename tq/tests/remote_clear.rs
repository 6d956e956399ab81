//! A large clear through units served over TCP: the cells are gone when the clear answers, the
//! units free the buffers behind it (counted as freed behind, none left pending once the
//! reclaimer is done), and a small clear of the same deployment frees inline. A remote clear's
//! release goes behind its answer, and the client's next request waits for it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use tq::server::{Deployment, ServeOptions};
use tq::storage::reclaim::{self, RECLAIMED_BEHIND, RECLAIMED_INLINE, RECLAIM_PENDING};
use tq::{Batch, Bytes, Client, Column, Config, DType, ErrorKind, Tensor};

/// `n` samples of one `u8[bytes]` field.
fn batch(n: usize, bytes: usize) -> Batch {
    let data: Vec<u8> = (0..n * bytes).map(|i| (i % 251) as u8).collect();
    let t = Tensor::new(DType::U8, vec![n, bytes], Bytes::from(data)).unwrap();
    Batch::from_columns([("x", Column::Dense(t))]).unwrap()
}

fn keys(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

/// A controller and 2 units served over loopback TCP in this process, and a client of them.
async fn served() -> (Deployment, Client) {
    let options = ServeOptions {
        listen: "tcp://127.0.0.1:0".into(),
        units: Some(2),
        ..ServeOptions::default()
    };
    let deployment = Deployment::start(Config::default(), options).await.unwrap();
    let tq = Client::connect(deployment.url()).await.unwrap();
    (deployment, tq)
}

async fn counters(tq: &Client, name: &str) -> u64 {
    let status = tq.status().await.unwrap();
    assert_eq!(status.units.len(), 2);
    status.units.iter().map(|u| u.counters[name]).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn served_units_free_a_large_clear_behind_its_answer() {
    let (deployment, tq) = served().await;
    let p = tq.partition("p");

    // 128 MiB over two units: each unit's share is over the 32 MiB a clear must free to be
    // freed behind.
    let big = keys("big-", 128);
    let payload = batch(128, 1 << 20);
    p.kv_batch_put(&big, &payload, None).await.unwrap();
    drop(payload);
    assert_eq!(p.kv_batch_get(&big[..1], None).await.unwrap().len(), 1);
    p.kv_clear(&big).await.unwrap();
    let err = p.kv_batch_get(&big[..1], None).await.unwrap_err();
    assert_eq!(err.kind(), &ErrorKind::NotFound, "{err}");
    let status = tq.status().await.unwrap();
    assert!(status.units.iter().all(|u| u.cells == 0 && u.bytes == 0));

    // The units are in this process, so their reclaimer is this process's.
    reclaim::wait_freed();
    assert_eq!(counters(&tq, RECLAIM_PENDING).await, 0);
    assert_eq!(counters(&tq, RECLAIMED_BEHIND).await, 128 << 20);
    assert_eq!(counters(&tq, RECLAIMED_INLINE).await, 0);

    // A small clear frees inline.
    let small = keys("small-", 16);
    p.kv_batch_put(&small, &batch(16, 4096), None)
        .await
        .unwrap();
    p.kv_clear(&small).await.unwrap();
    assert_eq!(counters(&tq, RECLAIMED_INLINE).await, 16 * 4096);
    assert_eq!(counters(&tq, RECLAIMED_BEHIND).await, 128 << 20);
    drop(tq);
    deployment.shutdown().await;
}

/// A remote clear answers once the cells are deleted and sends the release behind its answer
/// (decision 0044); the client's next request waits for that release. So the client always
/// sees its own clear finished: right after clearing the last keys of a partition, the
/// partition is gone (it goes with the release of its last sample), and putting the keys again
/// needs no second clear. Repeated, since without the wait the listing races the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_clear_is_released_before_the_clients_next_request() {
    let (deployment, tq) = served().await;
    let controller = deployment.controller_service().controller().clone();
    let p = tq.partition("p");
    let ks = keys("k", 8);
    for round in 0..40 {
        p.kv_batch_put(&ks, &batch(8, 64), None).await.unwrap();
        p.kv_clear(&ks).await.unwrap();
        let partitions = tq.list_partitions().await.unwrap();
        assert!(
            !partitions.iter().any(|name| name == "p"),
            "round {round}: the client's next request saw its clear unreleased: {partitions:?}"
        );
        assert_eq!(controller.samples_in_use(), 0, "round {round}");
    }
    // The last clear, waited for with `settle` instead of another request.
    p.kv_batch_put(&ks, &batch(8, 64), None).await.unwrap();
    p.kv_clear(&ks).await.unwrap();
    tq.settle().await;
    assert_eq!(controller.samples_in_use(), 0);
    let status = tq.status().await.unwrap();
    assert!(status.units.iter().all(|u| u.cells == 0));
    drop(tq);
    deployment.shutdown().await;
}
