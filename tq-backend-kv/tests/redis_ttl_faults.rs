//! TTL semantics (upstream PR #156's scenario) and fault handling against real Redis servers
//! started by the tests, plus the same TTL scenario on the in-memory store under paused time.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and examples may panic
#![cfg(feature = "redis")]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};
use tq_backend_kv::codec::KeyScheme;
use tq_backend_kv::{
    ExpireCommand, KvOptions, KvStorageManager, KvStore, MemoryKvStore, RedisOptions, RedisStore,
};
use tq_core::testkit::{assert_same_rows, sample_batch};
use tq_core::{Batch, BatchMeta, ErrorKind, FieldFilter, SampleId, StorageManager};

const PARTITION: &str = "train";

fn meta(samples: Vec<SampleId>, batch: &Batch) -> BatchMeta {
    BatchMeta::new(PARTITION, samples)
        .with_fields(batch.schemas())
        .unwrap()
}

/// An adapter over `store` under `namespace`, with `data_ttl`.
fn manager(
    store: Arc<impl KvStore>,
    namespace: impl Into<String>,
    data_ttl: Option<Duration>,
) -> KvStorageManager {
    KvStorageManager::new(
        store,
        KvOptions {
            namespace: namespace.into(),
            data_ttl,
            ..Default::default()
        },
    )
    .unwrap()
}

/// The PR #156 scenario, driven through any store: `sleep` advances time.
async fn reused_sample_survives_old_deadline<S, F>(
    store: Arc<dyn KvStore>,
    sleep: S,
) -> (KeyScheme, Vec<SampleId>)
where
    S: Fn(Duration) -> F,
    F: std::future::Future<Output = ()>,
{
    let ns = common::unique("ttl");
    let m = KvStorageManager::new(
        store.clone(),
        KvOptions {
            namespace: ns.clone(),
            data_ttl: Some(Duration::from_secs(30)),
            clear_expire_after: Duration::from_millis(400),
            ..Default::default()
        },
    )
    .unwrap();
    let old_ids = vec![SampleId::new(5, 0), SampleId::new(6, 0)];
    let new_ids = vec![SampleId::new(5, 1), SampleId::new(6, 1)];
    let old = sample_batch(2, 1).select_fields(&["f32", "obj"]).unwrap();
    m.put(&meta(old_ids.clone(), &old), &old).await.unwrap();
    // Clear marks the keys to expire in 400 ms; the index is reused at once (generation 1).
    m.clear(&meta(old_ids.clone(), &old), &FieldFilter::All)
        .await
        .unwrap();
    assert!(
        m.get(&meta(old_ids.clone(), &old)).await.is_err(),
        "cleared sample is unreadable at once"
    );
    let new = sample_batch(2, 2).select_fields(&["f32", "obj"]).unwrap();
    m.put(&meta(new_ids.clone(), &new), &new).await.unwrap();
    // The very same cell key is rebuilt too: expire a field, then rewrite it before the deadline.
    let f32_only = new.select_fields(&["f32"]).unwrap();
    m.expire(
        &meta(new_ids.clone(), &f32_only),
        &FieldFilter::Only(vec!["f32".into()]),
    )
    .await
    .unwrap();
    let rewritten = sample_batch(2, 3).select_fields(&["f32"]).unwrap();
    m.put(&meta(new_ids.clone(), &rewritten), &rewritten)
        .await
        .unwrap();
    sleep(Duration::from_millis(900)).await;
    // Past the old deadline: the rewrites are all there.
    let want = Batch::from_columns([
        ("f32", rewritten.column("f32").unwrap().clone()),
        ("obj", new.column("obj").unwrap().clone()),
    ])
    .unwrap();
    let got = m
        .get(&meta(new_ids.clone(), &want))
        .await
        .expect("rewritten sample survives");
    assert_same_rows("reused sample after the old deadline", &want, &got);
    // The cleared generation's keys are gone.
    let ks = KeyScheme::new(&ns, PARTITION);
    let old_keys: Vec<String> = old_ids
        .iter()
        .flat_map(|s| ["f32", "obj"].map(|f| ks.cell(*s, f)))
        .collect();
    let raw = store.mget(&old_keys).await.unwrap();
    assert!(
        raw.iter().all(Option::is_none),
        "cleared keys expired: {raw:?}"
    );
    (ks, new_ids)
}

#[tokio::test(start_paused = true)]
async fn memory_reused_sample_survives_old_deadline() {
    let store = Arc::new(MemoryKvStore::new());
    reused_sample_survives_old_deadline(store.clone(), tokio::time::sleep).await;
    // The sweeper reclaimed the expired keys' memory.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        store.resident_keys(),
        2 * 2 + 2,
        "two samples x two fields + two generation keys"
    );
}

#[tokio::test]
async fn redis_reused_sample_survives_old_deadline() {
    if !common::redis_available("redis_reused_sample_survives_old_deadline") {
        return;
    }
    let server = common::RedisServer::start();
    let store = Arc::new(RedisStore::single(&server.url(), RedisOptions::default()).unwrap());
    let (ks, ids) = reused_sample_survives_old_deadline(store, tokio::time::sleep).await;
    // The TTL was re-armed by the rewrite (30 s, not the 400 ms of the expire).
    for key in [ks.cell(ids[0], "f32"), ks.generation(ids[0].index)] {
        let pttl: i64 = server.cli(&["pttl", &key]).trim().parse().unwrap();
        assert!(pttl > 20_000, "{key}: pttl {pttl}");
    }
}

#[tokio::test]
async fn redis_without_ttl_clear_deletes_at_once() {
    if !common::redis_available("redis_without_ttl_clear_deletes_at_once") {
        return;
    }
    let server = common::RedisServer::start();
    let store = Arc::new(RedisStore::single(&server.url(), RedisOptions::default()).unwrap());
    let ns = common::unique("nottl");
    let m = manager(store.clone(), ns.clone(), None);
    let ids = vec![SampleId::new(1, 0), SampleId::new(2, 0)];
    let b = sample_batch(2, 4);
    m.put(&meta(ids.clone(), &b), &b).await.unwrap();
    let ks = KeyScheme::new(&ns, PARTITION);
    let key = ks.cell(ids[0], "f32");
    assert_eq!(server.cli(&["pttl", &key]).trim(), "-1", "no TTL on writes");
    m.clear(&meta(ids.clone(), &b), &FieldFilter::All)
        .await
        .unwrap();
    let keys: Vec<String> = ids
        .iter()
        .flat_map(|s| b.field_names().map(|f| ks.cell(*s, f)).collect::<Vec<_>>())
        .chain(ids.iter().map(|s| ks.generation(s.index)))
        .collect();
    assert!(store.mget(&keys).await.unwrap().iter().all(Option::is_none));
    assert_eq!(server.live_keys(), 0);
}

#[tokio::test]
async fn redis_missing_cell_is_data_lost_naming_the_key() {
    if !common::redis_available("redis_missing_cell_is_data_lost_naming_the_key") {
        return;
    }
    let server = common::RedisServer::start();
    let store = Arc::new(RedisStore::single(&server.url(), RedisOptions::default()).unwrap());
    let ns = common::unique("lost");
    let m = manager(store.clone(), ns.clone(), None);
    let ids = vec![SampleId::new(1, 0), SampleId::new(2, 0)];
    let b = sample_batch(2, 5);
    let receipt = m.put(&meta(ids.clone(), &b), &b).await.unwrap();
    let bm = receipt.backend_meta.expect("per-cell routing tags");
    assert_eq!(bm[0]["f32"].as_ref(), b"redis");
    let key = KeyScheme::new(&ns, PARTITION).cell(ids[1], "obj");
    server.cli(&["del", &key]);
    let e = m.get(&meta(ids, &b)).await.unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::DataLost, "{e}");
    assert!(e.message().contains(&key), "{e}");
}

fn fault_options() -> RedisOptions {
    RedisOptions {
        connect_timeout: Duration::from_millis(300),
        response_timeout: Duration::from_millis(500),
        op_timeout: Duration::from_millis(1500),
        ..Default::default()
    }
}

fn assert_unavailable_in_time<T: std::fmt::Debug>(what: &str, r: tq_core::Result<T>, t0: Instant) {
    let e = r.expect_err(what);
    assert_eq!(e.kind(), &ErrorKind::Unavailable, "{what}: {e}");
    assert!(
        t0.elapsed() < Duration::from_secs(3),
        "{what}: took {:?}",
        t0.elapsed()
    );
}

#[tokio::test]
async fn redis_killed_then_restarted() {
    if !common::redis_available("redis_killed_then_restarted") {
        return;
    }
    let mut server = common::RedisServer::start();
    let store = Arc::new(RedisStore::single(&server.url(), fault_options()).unwrap());
    let m = manager(store, common::unique("fault"), None);
    let ids = vec![SampleId::new(1, 0)];
    let b = sample_batch(1, 6);
    m.put(&meta(ids.clone(), &b), &b).await.unwrap();
    server.kill();
    for round in 0..2 {
        let t0 = Instant::now();
        assert_unavailable_in_time(
            &format!("put after kill #{round}"),
            m.put(&meta(ids.clone(), &b), &b).await,
            t0,
        );
        let t0 = Instant::now();
        assert_unavailable_in_time(
            &format!("get after kill #{round}"),
            m.get(&meta(ids.clone(), &b)).await,
            t0,
        );
        let t0 = Instant::now();
        assert_unavailable_in_time(
            &format!("clear after kill #{round}"),
            m.clear(&meta(ids.clone(), &b), &FieldFilter::All).await,
            t0,
        );
    }
    let server = server.restart();
    // The restarted server is empty (no persistence): the next operations succeed.
    m.put(&meta(ids.clone(), &b), &b)
        .await
        .expect("put after restart");
    let got = m
        .get(&meta(ids.clone(), &b))
        .await
        .expect("get after restart");
    assert_same_rows("after restart", &b, &got);
    // A server that stops answering (SIGSTOP) fails calls within the deadline, no hang.
    server.signal("STOP");
    let t0 = Instant::now();
    assert_unavailable_in_time("get while stopped", m.get(&meta(ids.clone(), &b)).await, t0);
    server.signal("CONT");
    let mut ok = false;
    for _ in 0..3 {
        if m.get(&meta(ids.clone(), &b)).await.is_ok() {
            ok = true;
            break;
        }
    }
    assert!(ok, "get after SIGCONT");
}

#[tokio::test]
async fn redis_cluster_unreachable_is_unavailable() {
    if !common::redis_available("redis_cluster_unreachable_is_unavailable") {
        return;
    }
    let mut cluster = common::RedisCluster::start();
    let store = Arc::new(RedisStore::cluster(&cluster.urls(), fault_options()).unwrap());
    let m = manager(store, common::unique("cfault"), None);
    let ids: Vec<SampleId> = (0..16).map(|i| SampleId::new(i, 0)).collect();
    let b = sample_batch(16, 7);
    m.put(&meta(ids.clone(), &b), &b).await.unwrap();
    for n in &mut cluster.nodes {
        n.kill();
    }
    let t0 = Instant::now();
    let r = m.get(&meta(ids.clone(), &b)).await;
    let e = r.expect_err("get from a dead cluster");
    assert!(e.is_retryable(), "{e}");
    assert!(
        t0.elapsed() < Duration::from_secs(4),
        "took {:?}",
        t0.elapsed()
    );
}

/// `PTTL` of `key` on the server at `port` (`-c`: follows cluster redirects).
fn pttl(port: u16, key: &str) -> i64 {
    let out = std::process::Command::new("redis-cli")
        .args(["-c", "-p", &port.to_string(), "pttl", key])
        .output()
        .expect("run redis-cli");
    let text = String::from_utf8_lossy(&out.stdout);
    text.trim()
        .parse()
        .unwrap_or_else(|_| panic!("pttl {key}: {text:?}"))
}

/// A TTL clear gives every cell it clears the short deadline (`clear_expire_after`), whichever
/// way the store expires, on a single node or a cluster; cells not cleared keep the long TTL; a
/// cell that is already gone does not fail the clear. `port` is any node's.
async fn ttl_clear_sets_a_deadline_on_every_cell(store: Arc<dyn KvStore>, port: u16) {
    let ns = common::unique("deadline");
    let m = KvStorageManager::new(
        store,
        KvOptions {
            namespace: ns.clone(),
            data_ttl: Some(Duration::from_secs(600)),
            clear_expire_after: Duration::from_secs(60),
            ..Default::default()
        },
    )
    .unwrap();
    let fields = ["f32", "i64", "obj"];
    let ids: Vec<SampleId> = (0..16).map(|i| SampleId::new(i, 0)).collect();
    let b = sample_batch(16, 9).select_fields(&fields).unwrap();
    m.put(&meta(ids.clone(), &b), &b).await.unwrap();
    let ks = KeyScheme::new(&ns, PARTITION);
    let gone = ks.cell(ids[3], "i64");
    let out = std::process::Command::new("redis-cli")
        .args(["-c", "-p", &port.to_string(), "del", &gone])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "1");
    let long = |key: &str| {
        let t = pttl(port, key);
        assert!(t > 500_000, "{key}: pttl {t}, want the data TTL");
    };
    let short = |key: &str| {
        let t = pttl(port, key);
        assert!(
            t > 0 && t <= 60_000,
            "{key}: pttl {t}, want the clear deadline"
        );
    };
    // Whole samples 0..12: every cell expires, the generation keys are gone at once.
    let (cleared, kept) = ids.split_at(12);
    m.clear(&meta(cleared.to_vec(), &b), &FieldFilter::All)
        .await
        .unwrap();
    for s in cleared {
        for f in fields {
            let key = ks.cell(*s, f);
            if key == gone {
                assert_eq!(pttl(port, &key), -2, "{key} stays absent");
            } else {
                short(&key);
            }
        }
        assert_eq!(pttl(port, &ks.generation(s.index)), -2);
    }
    // Chosen fields of samples 12..16: only those cells expire.
    let only_obj = b.select_fields(&["obj"]).unwrap();
    m.expire(
        &meta(kept.to_vec(), &only_obj),
        &FieldFilter::Only(vec!["obj".into()]),
    )
    .await
    .unwrap();
    for s in kept {
        short(&ks.cell(*s, "obj"));
        long(&ks.cell(*s, "f32"));
        long(&ks.cell(*s, "i64"));
        long(&ks.generation(s.index));
    }
}

fn expire_options(expire: ExpireCommand) -> RedisOptions {
    RedisOptions {
        expire,
        // Small calls: samples are split across calls and a call spans several hash slots.
        max_keys_per_call: 5,
        ..Default::default()
    }
}

#[tokio::test]
async fn redis_ttl_clear_sets_a_deadline_on_every_cell() {
    if !common::redis_available("redis_ttl_clear_sets_a_deadline_on_every_cell") {
        return;
    }
    let server = common::RedisServer::start();
    for expire in [ExpireCommand::Pipeline, ExpireCommand::Script] {
        let store = RedisStore::single(&server.url(), expire_options(expire)).unwrap();
        ttl_clear_sets_a_deadline_on_every_cell(Arc::new(store), server.port).await;
    }
}

#[tokio::test]
async fn redis_cluster_ttl_clear_sets_a_deadline_on_every_cell() {
    if !common::redis_available("redis_cluster_ttl_clear_sets_a_deadline_on_every_cell") {
        return;
    }
    let cluster = common::RedisCluster::start();
    for expire in [ExpireCommand::Pipeline, ExpireCommand::Script] {
        let store = RedisStore::cluster(&cluster.urls(), expire_options(expire)).unwrap();
        ttl_clear_sets_a_deadline_on_every_cell(Arc::new(store), cluster.nodes[0].port).await;
    }
}

/// The expire path (pipelined or scripted) fails like every other call when the server is
/// gone, and works again on the restarted (empty, script cache and all) server.
#[tokio::test]
async fn redis_ttl_clear_killed_then_restarted() {
    if !common::redis_available("redis_ttl_clear_killed_then_restarted") {
        return;
    }
    for expire in [ExpireCommand::Pipeline, ExpireCommand::Script] {
        let mut server = common::RedisServer::start();
        let store = RedisStore::single(
            &server.url(),
            RedisOptions {
                expire,
                ..fault_options()
            },
        )
        .unwrap();
        let m = manager(
            Arc::new(store),
            common::unique("ttlfault"),
            Some(Duration::from_secs(60)),
        );
        let ids = vec![SampleId::new(1, 0), SampleId::new(2, 0)];
        let b = sample_batch(2, 8);
        m.put(&meta(ids.clone(), &b), &b).await.unwrap();
        server.kill();
        let t0 = Instant::now();
        assert_unavailable_in_time(
            &format!("{expire:?} clear after kill"),
            m.clear(&meta(ids.clone(), &b), &FieldFilter::All).await,
            t0,
        );
        let t0 = Instant::now();
        assert_unavailable_in_time(
            &format!("{expire:?} expire after kill"),
            m.expire(
                &meta(ids.clone(), &b),
                &FieldFilter::Only(vec!["f32".into()]),
            )
            .await,
            t0,
        );
        let server = server.restart();
        m.put(&meta(ids.clone(), &b), &b)
            .await
            .expect("put after restart");
        m.clear(&meta(ids.clone(), &b), &FieldFilter::All)
            .await
            .expect("clear after restart");
        let key = KeyScheme::new(&m.options().namespace, PARTITION).cell(ids[0], "f32");
        let t: i64 = server.cli(&["pttl", &key]).trim().parse().unwrap();
        assert!(t > 0 && t <= 1_000, "{expire:?}: {key}: pttl {t}");
    }
}

#[tokio::test]
async fn redis_cluster_ttl_clear_unreachable_is_unavailable() {
    if !common::redis_available("redis_cluster_ttl_clear_unreachable_is_unavailable") {
        return;
    }
    let mut cluster = common::RedisCluster::start();
    let ids: Vec<SampleId> = (0..16).map(|i| SampleId::new(i, 0)).collect();
    let b = sample_batch(16, 10);
    let mut managers = Vec::new();
    for expire in [ExpireCommand::Pipeline, ExpireCommand::Script] {
        let store = RedisStore::cluster(
            &cluster.urls(),
            RedisOptions {
                expire,
                ..fault_options()
            },
        )
        .unwrap();
        let m = manager(
            Arc::new(store),
            common::unique("cttlfault"),
            Some(Duration::from_secs(60)),
        );
        m.put(&meta(ids.clone(), &b), &b).await.unwrap();
        managers.push((expire, m));
    }
    for n in &mut cluster.nodes {
        n.kill();
    }
    for (expire, m) in managers {
        let t0 = Instant::now();
        let e = m
            .expire(
                &meta(ids.clone(), &b),
                &FieldFilter::Only(vec!["f32".into()]),
            )
            .await
            .expect_err("expire on a dead cluster");
        assert!(e.is_retryable(), "{expire:?}: {e}");
        assert!(
            t0.elapsed() < Duration::from_secs(4),
            "{expire:?}: took {:?}",
            t0.elapsed()
        );
    }
}

/// A command that fails inside a cluster node's pipeline fails the call (here: writes refused
/// for lack of memory), as it does on a single node, instead of being dropped with its reply.
#[tokio::test]
async fn redis_cluster_refused_write_is_an_error() {
    if !common::redis_available("redis_cluster_refused_write_is_an_error") {
        return;
    }
    let cluster = common::RedisCluster::start();
    for n in &cluster.nodes {
        n.cli(&["config", "set", "maxmemory-policy", "noeviction"]);
        n.cli(&["config", "set", "maxmemory", "1"]);
    }
    let store = RedisStore::cluster(&cluster.urls(), RedisOptions::default()).unwrap();
    let m = manager(Arc::new(store), common::unique("oom"), None);
    let ids: Vec<SampleId> = (0..16).map(|i| SampleId::new(i, 0)).collect();
    let b = sample_batch(16, 11);
    let e = m
        .put(&meta(ids, &b), &b)
        .await
        .expect_err("put over maxmemory");
    assert_eq!(e.kind(), &ErrorKind::CapacityExceeded, "{e}");
}

/// Calls of `command` the server at `port` has run (`INFO commandstats`).
fn command_calls(port: u16, command: &str) -> u64 {
    let out = std::process::Command::new("redis-cli")
        .args(["-p", &port.to_string(), "info", "commandstats"])
        .output()
        .expect("run redis-cli");
    let text = String::from_utf8_lossy(&out.stdout);
    let prefix = format!("cmdstat_{command}:calls=");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().expect("calls"))
}

/// `[storage.kv.redis]` reaches the store: the commands a TTL clear and a plain clear send are
/// the ones the configuration names.
#[tokio::test]
async fn redis_commands_follow_the_configuration() {
    if !common::redis_available("redis_commands_follow_the_configuration") {
        return;
    }
    let server = common::RedisServer::start();
    let batch = sample_batch(4, 1);
    let samples: Vec<SampleId> = (0..4).map(|i| SampleId::new(i, 1)).collect();
    for (delete, expire, ttl) in [
        ("unlink", "pipeline", None),
        ("del", "script", None),
        ("unlink", "script", Some(60_000)),
        ("del", "pipeline", Some(60_000)),
    ] {
        let config: tq_backend_kv::KvConfig = toml::from_str(&format!(
            "namespace = \"{}\"\nstores = [{{ url = \"{}\" }}]\n{}\n[redis]\ndelete = \"{delete}\"\nexpire = \"{expire}\"\n",
            common::unique("cfg"),
            server.url(),
            ttl.map_or(String::new(), |t| format!("data_ttl_ms = {t}")),
        ))
        .expect("config");
        let m = config.build().expect("build");
        let before: Vec<u64> = ["unlink", "del", "eval", "pexpire"]
            .iter()
            .map(|c| command_calls(server.port, c))
            .collect();
        let meta = meta(samples.clone(), &batch);
        m.put(&meta, &batch).await.expect("put");
        m.clear(&meta, &FieldFilter::All).await.expect("clear");
        let ran: Vec<&str> = ["unlink", "del", "eval", "pexpire"]
            .iter()
            .zip(&before)
            .filter(|(c, b)| command_calls(server.port, c) > **b)
            .map(|(c, _)| *c)
            .collect();
        // The put raises the generation keys with a script (`EVAL`). A whole-sample clear
        // deletes the generation keys with a check-and-delete script (its `DEL`s count);
        // with a TTL the cells expire by the configured means (the expire script's own
        // `PEXPIRE`s count too), without one they are deleted with the configured command.
        let want: Vec<&str> = match ttl {
            None if delete == "del" => vec!["del", "eval"],
            None => vec![delete, "del", "eval"],
            Some(_) => vec!["del", "eval", "pexpire"],
        };
        let mut want = want;
        want.sort_by_key(|c| {
            ["unlink", "del", "eval", "pexpire"]
                .iter()
                .position(|x| x == c)
        });
        assert_eq!(
            ran, want,
            "delete = {delete}, expire = {expire}, ttl = {ttl:?}"
        );
    }
}
