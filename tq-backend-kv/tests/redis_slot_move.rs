//! A slot moves between the masters of a Redis Cluster after the store cached the slot map:
//! multi-slot reads, writes and the generation clear (one script per node, see
//! `CLEAR_GENERATIONS_CROSS_SLOT_SCRIPT`) still do their work, through the per-slot path the
//! cluster connection redirects; the node script that met the moved key changes nothing it
//! should not.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic
#![cfg(feature = "redis")]

mod common;

use bytes::Bytes;
use std::time::{Duration, Instant};
use tq_backend_kv::{key_slot, KvStore, KvValue, RedisStore};

/// Moves `slot` (and its keys) from master `from` to master `to` the way `redis-cli --cluster
/// reshard` does, and waits until every master names `to` as its owner.
fn move_slot(cluster: &common::RedisCluster, slot: u16, from: usize, to: usize) {
    let (src, dst) = (&cluster.nodes[from], &cluster.nodes[to]);
    let id = |n: &common::RedisServer| n.cli(&["CLUSTER", "MYID"]).trim().to_string();
    let (src_id, dst_id) = (id(src), id(dst));
    let slot_arg = slot.to_string();
    assert_eq!(
        dst.cli(&["CLUSTER", "SETSLOT", &slot_arg, "IMPORTING", &src_id])
            .trim(),
        "OK"
    );
    assert_eq!(
        src.cli(&["CLUSTER", "SETSLOT", &slot_arg, "MIGRATING", &dst_id])
            .trim(),
        "OK"
    );
    let keys = src.cli(&["CLUSTER", "GETKEYSINSLOT", &slot_arg, "1000"]);
    let keys: Vec<&str> = keys.lines().filter(|k| !k.is_empty()).collect();
    assert!(!keys.is_empty(), "slot {slot} holds the test's keys");
    let port = dst.port.to_string();
    let mut migrate = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
    migrate.extend(&keys);
    assert_eq!(src.cli(&migrate).trim(), "OK");
    for m in cluster.masters() {
        cluster.nodes[m].cli(&["CLUSTER", "SETSLOT", &slot_arg, "NODE", &dst_id]);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let owner_port = |n: &common::RedisServer| {
        let slots = n.cli(&["CLUSTER", "SLOTS"]);
        // Each range prints start, end, then the primary's host and port on their own lines.
        let lines: Vec<&str> = slots.lines().map(str::trim).collect();
        lines.windows(4).find_map(|w| {
            let (a, b) = (w[0].parse::<u16>().ok()?, w[1].parse::<u16>().ok()?);
            (a <= slot && slot <= b && w[2] == "127.0.0.1").then(|| w[3].to_string())
        })
    };
    while !cluster
        .masters()
        .into_iter()
        .all(|m| owner_port(&cluster.nodes[m]).as_deref() == Some(port.as_str()))
    {
        assert!(Instant::now() < deadline, "slot {slot} never moved");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_moved_slot_sends_the_call_per_slot() {
    if !common::redis_available("a_moved_slot_sends_the_call_per_slot") {
        return;
    }
    let cluster = common::RedisCluster::start();
    let store = RedisStore::cluster(&cluster.urls(), Default::default()).unwrap();
    let p = common::unique("moved");
    // Generation keys of 48 samples, each in its own slot (as the adapter's keys are).
    let gens: Vec<String> = (0..48).map(|i| format!("{p}/{{s{i}}}/gen")).collect();
    let raised: Vec<(String, u32)> = gens.iter().map(|k| (k.clone(), 5)).collect();
    // This caches the slot map.
    store.raise_generations(raised, None).await.unwrap();
    // Move the first key's slot to another master, behind the store's back.
    let slot = key_slot(gens[0].as_bytes());
    let owner = cluster
        .masters()
        .into_iter()
        .find(|&m| {
            cluster.nodes[m]
                .cli(&["CLUSTER", "COUNTKEYSINSLOT", &slot.to_string()])
                .trim()
                != "0"
        })
        .expect("a master holds the key");
    let other = cluster.masters().into_iter().find(|&m| m != owner).unwrap();
    move_slot(&cluster, slot, owner, other);

    // Clear every other key at generation 5 (deleted) and the rest at 4 (kept: they hold 5).
    let clears: Vec<(String, u32)> = gens
        .iter()
        .enumerate()
        .map(|(i, k)| (k.clone(), if i % 2 == 0 { 5 } else { 4 }))
        .collect();
    store.clear_generations(clears).await.unwrap();
    let held = store.mget(&gens).await.unwrap();
    for (i, v) in held.iter().enumerate() {
        if i % 2 == 0 {
            assert_eq!(v, &None, "{} cleared at its generation", gens[i]);
        } else {
            assert_eq!(
                v.as_deref(),
                Some(&5u32.to_le_bytes()[..]),
                "{} holds a newer generation and stays",
                gens[i]
            );
        }
    }
    // Writes and reads over many slots also find the moved one.
    let cells: Vec<(String, KvValue)> = gens
        .iter()
        .map(|k| (format!("{k}/cell"), KvValue::from(Bytes::from(k.clone()))))
        .collect();
    let keys: Vec<String> = cells.iter().map(|(k, _)| k.clone()).collect();
    store.mset(cells, None).await.unwrap();
    let read = store.mget(&keys).await.unwrap();
    for (k, v) in keys.iter().zip(read) {
        assert_eq!(
            v.as_deref(),
            Some(k.strip_suffix("/cell").unwrap().as_bytes())
        );
    }
    store.delete(&keys).await.unwrap();
    store.delete(&gens).await.unwrap();
    for n in &cluster.nodes {
        assert_eq!(n.live_keys(), 0, "node {} holds no test keys", n.port);
    }
}
