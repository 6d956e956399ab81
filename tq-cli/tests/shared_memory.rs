//! Same-host shared memory across processes: a real `tq serve` with two storage units and a
//! client in this process that turns `net.shared_memory` on. Large payloads travel as sealed
//! memfd segments over the units' Unix sockets (the client ends up holding views of the
//! units' segments), small ones and clients without the setting over TCP, and the data is the
//! same either way.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic
#![cfg(target_os = "linux")]

mod common;

use common::serve;
use tq_client::{Client, Config};
use tq_core::{Batch, Bytes, Column, Tensor};

/// Whether `bytes` lie in a memfd mapping of this process.
fn in_memfd(bytes: &[u8]) -> bool {
    let at = bytes.as_ptr() as usize;
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines().any(|line| {
        let mut parts = line.splitn(2, ' ');
        let (Some(range), Some(rest)) = (parts.next(), parts.next()) else {
            return false;
        };
        let Some((lo, hi)) = range.split_once('-') else {
            return false;
        };
        let lo = usize::from_str_radix(lo, 16).unwrap();
        let hi = usize::from_str_radix(hi, 16).unwrap();
        rest.contains("/memfd:tq-cells") && lo <= at && at + bytes.len() <= hi
    })
}

fn large_batch(n: usize) -> Batch {
    let dense: Vec<f32> = (0..n * (80 << 10)).map(|i| i as f32 * 0.5).collect();
    Batch::from_columns([
        (
            "weights",
            Column::Dense(Tensor::from_slice(vec![n, 80 << 10], &dense).unwrap()),
        ),
        (
            "blob",
            Column::Objects(
                (0..n)
                    .map(|r| Bytes::from(vec![r as u8 ^ 0x5a; (384 << 10) + r]))
                    .collect(),
            ),
        ),
    ])
    .unwrap()
}

async fn client(url: &str, shared_memory: bool) -> Client {
    let mut config = Config::default();
    config.net.shared_memory = shared_memory;
    Client::connect_with(url, config).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_payloads_cross_processes_through_shared_memory() {
    let (_tq, url) = serve(2, &[]);
    let keys: Vec<String> = (0..6).map(|i| format!("k{i}")).collect();
    let batch = large_batch(keys.len());

    let tq = client(&url, true).await;
    tq.partition("p")
        .kv_batch_put(&keys, &batch, None)
        .await
        .unwrap();
    let got = tq.partition("p").kv_batch_get(&keys, None).await.unwrap();
    assert_eq!(got, batch);
    // The objects are views of the units' segments, mapped into this process.
    let Some(Column::Objects(blobs)) = got.column("blob") else {
        panic!("blob: {:?}", got.column("blob"));
    };
    for (r, b) in blobs.iter().enumerate() {
        assert!(in_memfd(b), "blob {r} did not come through shared memory");
    }

    // A client without the setting reads the same data over TCP.
    let plain = client(&url, false).await;
    let over_tcp = plain
        .partition("p")
        .kv_batch_get(&keys, None)
        .await
        .unwrap();
    assert_eq!(over_tcp, batch);
    let Some(Column::Objects(blobs)) = over_tcp.column("blob") else {
        panic!("blob: {:?}", over_tcp.column("blob"));
    };
    assert!(
        blobs.iter().all(|b| !in_memfd(b)),
        "TCP reads are not mapped"
    );

    // What it writes over TCP, the shared-memory client reads back, and the clear reaches
    // both kinds of cell.
    let more: Vec<String> = (0..3).map(|i| format!("m{i}")).collect();
    plain
        .partition("p")
        .kv_batch_put(&more, &large_batch(3), None)
        .await
        .unwrap();
    assert_eq!(
        tq.partition("p").kv_batch_get(&more, None).await.unwrap(),
        large_batch(3)
    );
    tq.partition("p").kv_clear(&keys).await.unwrap();
    assert!(tq.partition("p").kv_batch_get(&keys, None).await.is_err());
    // What this process still holds stays intact after the clear.
    assert_eq!(got, batch);
}
