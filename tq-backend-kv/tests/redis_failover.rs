//! A master of a Redis Cluster with replicas is killed (SIGKILL): requests during the failover
//! fail with an error that is safe to retry, within the store's deadline; once a replica is
//! promoted, the same client reads the data it wrote before (never other bytes) and writes
//! again — nothing restarted. Real `redis-server` processes, 3 masters and 3 replicas.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};
use tq_backend_kv::{KvOptions, KvStorageManager, RedisOptions, RedisStore};
use tq_core::{ErrorKind, FieldFilter, StorageManager};

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_master_is_replaced_and_the_client_goes_on() {
    if !common::redis_available("a_killed_master_is_replaced_and_the_client_goes_on") {
        return;
    }
    let mut cluster = common::RedisCluster::start_with(1);
    cluster.wait_replicas_synced();
    let options = RedisOptions {
        op_timeout: Duration::from_secs(3),
        ..RedisOptions::default()
    };
    let store = RedisStore::cluster(&cluster.urls(), options).unwrap();
    let kv = Arc::new(KvStorageManager::new(Arc::new(store), KvOptions::default()).unwrap());
    let before = common::i64_rows(64, 0);
    let before_meta = common::meta_of(0, 64, &before);
    kv.put(&before_meta, &before).await.unwrap();
    assert_eq!(
        kv.get(&before_meta).await.unwrap().column("x"),
        before.column("x")
    );
    // Let replication catch up with the writes before the kill: Redis replicates
    // asynchronously, so a master killed before its replica has the writes loses them (that
    // is Redis, not tq). `WAIT` from another connection proves nothing (it waits for that
    // connection's writes only), so compare the replication offsets.
    for m in cluster.masters() {
        replicated(&cluster.nodes[m]);
    }

    let victim = cluster.masters()[0];
    cluster.nodes[victim].kill();
    let killed_at = Instant::now();
    let mut failures = 0;
    let recovered = loop {
        match kv.get(&before_meta).await {
            Ok(got) => break got,
            Err(e) => {
                failures += 1;
                assert!(
                    e.is_retryable()
                        || matches!(e.kind(), ErrorKind::NotFound | ErrorKind::DataLost),
                    "a failover error must be retryable or say what is missing: {e}"
                );
                assert!(
                    killed_at.elapsed() < Duration::from_secs(60),
                    "no recovery within 60 s; last error: {e}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    // The data written before the kill comes back whole and unchanged, never other bytes.
    assert_eq!(recovered.column("x"), before.column("x"));
    // The same client writes and reads again.
    let after = common::i64_rows(64, 1000);
    let after_meta = common::meta_of(100, 64, &after);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match kv.put(&after_meta, &after).await {
            Ok(_) => break,
            Err(e) => {
                assert!(e.is_retryable(), "{e}");
                assert!(Instant::now() < deadline, "writes never resumed: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    assert_eq!(
        kv.get(&after_meta).await.unwrap().column("x"),
        after.column("x")
    );
    kv.clear(&after_meta, &FieldFilter::All).await.unwrap();
    eprintln!(
        "failover: {failures} failed reads, recovered after {:?}",
        killed_at.elapsed()
    );
}

/// Waits until the replica of master `node` has everything the master has written so far
/// (its acknowledged offset in `INFO replication` reaches the master's offset).
#[cfg(feature = "redis")]
fn replicated(node: &common::RedisServer) {
    let field = |info: &str, key: &str| -> Option<u64> {
        info.lines()
            .find_map(|l| l.trim().strip_prefix(key))
            .and_then(|v| v.trim().parse().ok())
    };
    let replica_offset = |info: &str| -> Option<u64> {
        let line = info.lines().find(|l| l.starts_with("slave0:"))?;
        line.split(',')
            .find_map(|kv| kv.strip_prefix("offset="))
            .and_then(|v| v.trim().parse().ok())
    };
    let target = field(&node.cli(&["info", "replication"]), "master_repl_offset:")
        .expect("a master reports its replication offset");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let info = node.cli(&["info", "replication"]);
        if replica_offset(&info).is_some_and(|o| o >= target) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the replica never caught up with its master (offset {target}): {info}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
