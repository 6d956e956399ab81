//! A remote controller whose storage is a KV store every process reaches directly: real
//! `tq` processes, a real `redis-server`, configuration files shared by servers and clients.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic
mod common;
#[path = "../../tq-backend-kv/tests/common/mod.rs"]
mod redis_common;

use common::{acked_ids, Tq};
use redis_common::{redis_available, RedisCluster, RedisServer, TempDir};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tq_client::{Client, Config, StreamConfig};
use tq_core::{Batch, Column, ErrorKind, StorageManager, Tensor};

fn rows(n: usize, base: i64) -> Batch {
    let v: Vec<i64> = (0..n * 4).map(|i| base + i as i64).collect();
    Batch::from_columns([(
        "x",
        Column::Dense(Tensor::from_slice(vec![n, 4], &v).unwrap()),
    )])
    .unwrap()
}

/// A configuration file with KV storage on `store_url`, and the `grpo` sampler the demo needs.
fn config_file(dir: &TempDir, store_url: &str) -> PathBuf {
    let path = dir.0.join("tq.toml");
    std::fs::write(
        &path,
        format!(
            "[controller.samplers]\ngrpo = \"grpo:4\"\n\n[storage]\nbackend = \"kv\"\n\n\
             [storage.kv]\nstores = [{{ url = \"{store_url}\" }}]\n"
        ),
    )
    .unwrap();
    path
}

fn start_controller(config: &std::path::Path) -> (Tq, String) {
    let mut c = Tq::spawn(&[
        "controller",
        "--listen",
        "tcp://127.0.0.1:0",
        "--config",
        config.to_str().unwrap(),
    ]);
    let url = Tq::controller_endpoint(&c.listening(1));
    (c, url)
}

/// A redis-server of its own, a configuration file with KV storage on it, and a fixed
/// controller address (for tests that restart the controller where clients know it).
struct KvJob {
    redis: RedisServer,
    dir: TempDir,
    config: PathBuf,
    listen: String,
}

fn kv_job() -> KvJob {
    let redis = RedisServer::start();
    let dir = TempDir::new();
    let config = config_file(&dir, &redis.url());
    let listen = format!("tcp://127.0.0.1:{}", redis_common::free_port());
    KvJob {
        redis,
        dir,
        config,
        listen,
    }
}

/// `tq controller` on `listen` with the configuration file `config` and `extra` arguments (for
/// tests that restart it on the same address).
fn controller_at(listen: &str, config: &std::path::Path, extra: &[&str]) -> Tq {
    let mut args = vec![
        "controller",
        "--listen",
        listen,
        "--config",
        config.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    Tq::spawn(&args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_of_a_kv_controller_share_the_redis_store() {
    if !redis_available("clients_of_a_kv_controller_share_the_redis_store") {
        return;
    }
    let redis = RedisServer::start();
    let dir = TempDir::new();
    let config = config_file(&dir, &redis.url());
    let (_controller, url) = start_controller(&config);

    // Two clients, neither told where the data lives: the controller hands out its storage.
    let a = Client::connect_with(&url, Config::default()).await.unwrap();
    let b = Client::connect_with(&url, Config::default()).await.unwrap();
    assert_eq!(a.storage().name(), "kv(redis)");
    let before = redis.live_keys();
    a.partition("p")
        .kv_batch_put(&["k0", "k1", "k2"], &rows(3, 10), None)
        .await
        .unwrap();
    assert!(redis.live_keys() > before, "the payloads are in Redis");
    let got = b
        .partition("p")
        .kv_batch_get(&["k2", "k0"], Some(&["x"]))
        .await
        .unwrap();
    assert_eq!(
        got.column("x"),
        rows(3, 10).select_rows(&[2, 0]).unwrap().column("x")
    );
    // Metadata API across clients: a fetch by one, a read and clear by the other.
    let meta = b.partition("m").put_new(&rows(4, 0)).await.unwrap();
    let fetched = a.partition("m").fetch(&["x"], "train", 4).await.unwrap();
    assert_eq!(fetched.samples(), meta.samples());
    assert_eq!(
        a.get_data(&fetched).await.unwrap().column("x"),
        rows(4, 0).column("x")
    );
    a.clear_samples(&fetched).await.unwrap();
    b.partition("p")
        .kv_clear(&["k0", "k1", "k2"])
        .await
        .unwrap();
    assert_eq!(
        redis.live_keys(),
        before,
        "clears from any process delete the keys"
    );

    // The conformance kit against the storage a connected client built from the description;
    // each case starts from an empty Redis.
    let storage: Arc<dyn StorageManager> = a.storage().clone();
    let redis = &redis;
    tq_core::testkit::run_all_with(
        tq_core::testkit::KitOptions {
            expire_settles_within: Duration::from_secs(1),
            skip: &[],
        },
        || {
            redis.cli(&["flushall"]);
            let s = storage.clone();
            async move { s }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_runs_against_a_kv_controller_in_another_process() {
    if !redis_available("the_demo_runs_against_a_kv_controller_in_another_process") {
        return;
    }
    let redis = RedisServer::start();
    let dir = TempDir::new();
    let config = config_file(&dir, &redis.url());
    let (_controller, url) = start_controller(&config);
    let demo = Tq::spawn(&[
        "demo",
        "--connect",
        &url,
        "--prompts",
        "32",
        "--responses",
        "4",
        "--prompt-len",
        "64",
        "--response-len",
        "64",
        "--quiet",
    ]);
    let (status, stderr) = demo.wait_exit(Duration::from_secs(120));
    assert!(status.success(), "demo failed: {stderr}");
    assert_eq!(redis.live_keys(), 0, "the demo cleared everything it wrote");
}

/// Runs the demo in its own process against a controller whose storage is `store_url`.
fn demo_against(store_url: &str) {
    let dir = TempDir::new();
    let config = config_file(&dir, store_url);
    let (_controller, url) = start_controller(&config);
    let demo = Tq::spawn(&[
        "demo",
        "--connect",
        &url,
        "--prompts",
        "24",
        "--responses",
        "4",
        "--prompt-len",
        "32",
        "--response-len",
        "32",
        "--quiet",
    ]);
    let (status, stderr) = demo.wait_exit(Duration::from_secs(120));
    assert!(status.success(), "demo on {store_url} failed: {stderr}");
}

#[test]
fn the_demo_runs_on_a_redis_cluster_behind_a_controller() {
    if !redis_available("the_demo_runs_on_a_redis_cluster_behind_a_controller") {
        return;
    }
    let cluster = RedisCluster::start();
    demo_against(&cluster_url(&cluster));
    let keys: usize = cluster.nodes.iter().map(RedisServer::live_keys).sum();
    assert_eq!(
        keys, 0,
        "the demo cleared everything it wrote on every node"
    );
}

#[test]
fn the_demo_runs_on_object_storage_shared_by_the_processes() {
    let dir = TempDir::new();
    let store = dir.0.join("objects");
    std::fs::create_dir_all(&store).unwrap();
    demo_against(&format!("file://{}", store.display()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_contradicting_client_configuration_is_refused_at_connect() {
    let dir = TempDir::new();
    // Shared storage on a directory: no Redis needed for this one.
    let store = dir.0.join("objects");
    std::fs::create_dir_all(&store).unwrap();
    let config = config_file(&dir, &format!("file://{}", store.display()));
    let (_controller, url) = start_controller(&config);
    let mut mine = Config::default();
    mine.storage.backend = tq_client::Backend::Kv;
    let e = Client::connect_with(&url, mine).await.unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Invalid, "{e}");
    assert!(e.message().contains("contradicts"), "{e}");
    // The same storage as the controller's is fine, and so is none.
    let same = Config::load(Some(&config)).unwrap();
    let same_storage = Config {
        storage: same.storage,
        ..Config::default()
    };
    Client::connect_with(&url, same_storage).await.unwrap();
    let tq = Client::connect_with(&url, Config::default()).await.unwrap();
    let p = tq.partition("p");
    p.kv_put("k", &rows(1, 7), None).await.unwrap();
    assert_eq!(p.kv_batch_get(&["k"], None).await.unwrap().len(), 1);
    // A stream ends with a Timeout item when nothing arrives, also remotely.
    let mut s = p
        .stream(StreamConfig::new("t", &["missing"], 1).idle_timeout(Duration::from_millis(200)))
        .unwrap();
    use futures::StreamExt;
    assert_eq!(
        s.next().await.unwrap().unwrap_err().kind(),
        &ErrorKind::Timeout
    );
}

#[test]
fn storage_units_cannot_join_a_controller_with_shared_storage() {
    let dir = TempDir::new();
    let store = dir.0.join("objects");
    std::fs::create_dir_all(&store).unwrap();
    let config = config_file(&dir, &format!("file://{}", store.display()));
    let (_controller, url) = start_controller(&config);
    let unit = Tq::spawn(&["storage-unit", "--controller", &url, "--id", "unit-0"]);
    let (status, stderr) = unit.wait_exit(Duration::from_secs(30));
    assert!(!status.success());
    assert!(stderr.contains("shared"), "{stderr}");
    // And `--units` next to shared storage is a clear error.
    let c = Tq::spawn(&[
        "controller",
        "--listen",
        "tcp://127.0.0.1:0",
        "--units",
        "2",
        "--config",
        config.to_str().unwrap(),
    ]);
    let (status, stderr) = c.wait_exit(Duration::from_secs(30));
    assert!(!status.success());
    assert!(stderr.contains("no storage units"), "{stderr}");
}

#[test]
fn secrets_in_store_urls_never_reach_the_servers_output() {
    let dir = TempDir::new();
    // An unreachable Redis with a password: the controller validates, serves and logs without
    // ever printing the password.
    let config = config_file(&dir, "redis://:pw-s3cret@127.0.0.1:9");
    let mut c = Tq::spawn_env(
        &[
            "controller",
            "--listen",
            "tcp://127.0.0.1:0",
            "--config",
            config.to_str().unwrap(),
        ],
        &[("RUST_LOG", "debug")],
    );
    c.listening(1);
    c.terminate(Duration::from_secs(10));
    let (_, stderr) = c.wait_exit(Duration::from_secs(10));
    assert!(!stderr.contains("pw-s3cret"), "{stderr}");
}

/// Two producer and two consumer processes (acknowledged streams) against a controller whose
/// storage `config` describes. The slow consumer is killed (SIGKILL) while it holds leases,
/// right after its first acknowledgement; `meanwhile` then runs (a fault of the store, or
/// nothing) while the others go on. Every sample is consumed exactly once, none is lost, no
/// lease is left. Producers put every `pace_ms`, so a fault lands mid-production. Returns
/// the surviving processes' stderr.
async fn pipeline_loses_nothing(
    config: &std::path::Path,
    pace_ms: u64,
    meanwhile: impl FnOnce(),
) -> String {
    let (_controller, url) = start_controller(config);
    const PER_PRODUCER: i64 = 300;
    let produce = |first: i64| {
        Tq::spawn(&[
            "produce",
            "--connect",
            &url,
            "--first",
            &first.to_string(),
            "--count",
            &PER_PRODUCER.to_string(),
            "--batch",
            "10",
            "--retry-ms",
            "60000",
            "--pace-ms",
            &pace_ms.to_string(),
        ])
    };
    let consume = |work_ms: &str| {
        Tq::spawn(&[
            "consume",
            "--connect",
            &url,
            "--batch",
            "6",
            "--lease-ms",
            "1000",
            "--work-ms",
            work_ms,
            "--idle-ms",
            "60000",
            "--retry-ms",
            "60000",
        ])
    };
    // The slow consumer is killed while it holds leases; the fast one finishes the job.
    let mut slow = consume("150");
    let mut fast = consume("5");
    let producers = [produce(0), produce(PER_PRODUCER)];
    let first = slow.wait_line("acked ", Duration::from_secs(60));
    slow.kill();
    let mut slow_acked = vec![first];
    slow_acked.extend(slow.rest_of_output(Duration::from_secs(10)));
    meanwhile();
    let mut logs = String::new();
    for p in producers {
        let (status, stderr) = p.wait_exit(Duration::from_secs(180));
        assert!(status.success(), "producer: {stderr}");
        logs.push_str(&stderr);
    }
    // Nothing more will come: consumers end once everything is consumed.
    let done = Tq::spawn(&["produce", "--connect", &url, "--count", "0", "--complete"]);
    let (status, stderr) = done.wait_exit(Duration::from_secs(30));
    assert!(status.success(), "{stderr}");
    let fast_out = fast.rest_of_output(Duration::from_secs(180));
    let (status, stderr) = fast.wait_exit(Duration::from_secs(10));
    assert!(status.success(), "consumer: {stderr}");
    logs.push_str(&stderr);

    // Every sample acknowledged, none twice; the killed consumer's leases went to the other.
    let mut ids = acked_ids(&slow_acked);
    let from_slow = ids.len();
    ids.extend(acked_ids(&fast_out));
    let printed = ids.len();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), printed, "a sample was acknowledged twice");
    assert!(from_slow > 0);
    let tq = Client::connect_with(&url, Config::default()).await.unwrap();
    let status = tq
        .partition("work")
        .consumption_status("consume")
        .await
        .unwrap();
    assert_eq!(status.samples.len(), 2 * PER_PRODUCER as usize);
    assert!(status.all_consumed(), "every sample consumed");
    assert!(status.leased.iter().all(|l| !l), "no lease left");
    // A sample missing from the output was acknowledged by the killed consumer just before
    // the kill, between its acknowledgement and its print: at most one batch.
    assert!(
        2 * PER_PRODUCER as usize - printed <= 6,
        "{printed} of {} printed",
        2 * PER_PRODUCER
    );
    logs
}

/// `redis+cluster://` with every node of `cluster` as a seed.
fn cluster_url(cluster: &RedisCluster) -> String {
    let seeds: Vec<String> = cluster
        .urls()
        .iter()
        .map(|u| u.trim_start_matches("redis://").to_string())
        .collect();
    format!("redis+cluster://{}", seeds.join(","))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producers_and_consumers_in_their_own_processes_lose_nothing_when_one_is_killed() {
    if !redis_available("producers_and_consumers_in_their_own_processes") {
        return;
    }
    let redis = RedisServer::start();
    let dir = TempDir::new();
    pipeline_loses_nothing(&config_file(&dir, &redis.url()), 0, || {}).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pipeline_loses_nothing_on_a_redis_cluster() {
    if !redis_available("the_pipeline_loses_nothing_on_a_redis_cluster") {
        return;
    }
    let cluster = RedisCluster::start();
    let dir = TempDir::new();
    pipeline_loses_nothing(&config_file(&dir, &cluster_url(&cluster)), 0, || {}).await;
}

/// 3 masters with 2 replicas each, puts confirmed by one replica (`WAIT`): a master is killed
/// (SIGKILL) while producers and consumers run; a replica takes over and the other follows it,
/// so confirmed writes go on; the processes retry through the failover. Nothing acknowledged is
/// lost. (The killed node stays down: a master without persistence started again comes back
/// empty and, until it learns it was replaced, answers for its old slots from nothing — reads
/// of a client whose slot map still points there then find no data. An earlier version of this
/// test restarted it in place and read `DataLost` that way, once.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pipeline_loses_nothing_when_a_cluster_master_is_killed() {
    if !redis_available("the_pipeline_loses_nothing_when_a_cluster_master_is_killed") {
        return;
    }
    let cluster = RedisCluster::start_with(2);
    cluster.wait_replicas_synced();
    let dir = TempDir::new();
    let config = config_file(&dir, &cluster_url(&cluster));
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str("\n[storage.kv.redis]\nwait_replicas = 1\nwait_timeout_ms = 2000\n");
    std::fs::write(&config, text).unwrap();
    // 30 puts per producer, 300 ms apart: the failover (about 4 s) lands mid-production.
    let logs = pipeline_loses_nothing(&config, 300, || {
        let victim = cluster.masters()[0];
        // SIGKILL through the process id: the node stays down.
        cluster.nodes[victim].signal("KILL");
        // The replica is promoted after the node timeout (2 s here).
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while cluster.masters().len() != 3 || cluster.masters().contains(&victim) {
            assert!(
                std::time::Instant::now() < deadline,
                "no replica was promoted"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        cluster.wait_replicas_synced();
    })
    .await;
    assert!(
        logs.contains("retrying"),
        "the processes never saw the failover: {logs}"
    );
    eprintln!(
        "retried operations through the failover: {}",
        logs.matches("retrying").count()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pipeline_loses_nothing_on_object_storage_shared_by_the_processes() {
    let dir = TempDir::new();
    let store = dir.0.join("objects");
    std::fs::create_dir_all(&store).unwrap();
    let config = config_file(&dir, &format!("file://{}", store.display()));
    pipeline_loses_nothing(&config, 0, || {}).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_field_clears_and_expire_on_clear_work_from_any_process() {
    if !redis_available("ttl_field_clears_and_expire_on_clear_work_from_any_process") {
        return;
    }
    let redis = RedisServer::start();
    let dir = TempDir::new();
    let path = dir.0.join("tq.toml");
    std::fs::write(
        &path,
        format!(
            "[storage]\nbackend = \"kv\"\n[storage.kv]\ndata_ttl_ms = 600000\n\
             clear_expire_after_ms = 200\nstores = [{{ url = \"{}\" }}]\n",
            redis.url()
        ),
    )
    .unwrap();
    let (_controller, url) = start_controller(&path);
    let writer = Client::connect_with(&url, Config::default()).await.unwrap();
    let clearer = Client::connect_with(&url, Config::default()).await.unwrap();
    let two = Batch::from_columns([
        (
            "x",
            Column::Dense(Tensor::from_slice(vec![2, 2], &[1i64, 2, 3, 4]).unwrap()),
        ),
        (
            "y",
            Column::Dense(Tensor::from_slice(vec![2, 1], &[5i64, 6]).unwrap()),
        ),
    ])
    .unwrap();
    writer
        .partition("p")
        .kv_batch_put(&["a", "b"], &two, None)
        .await
        .unwrap();
    // Every key the writer made carries the configured TTL (the controller's, not a default).
    let keys: Vec<String> = redis
        .cli(&["--raw", "keys", "*"])
        .lines()
        .map(str::to_string)
        // (The controller's claim on its epoch expires on a lease of its own.)
        .filter(|k| !k.is_empty() && !k.ends_with("/__owner__"))
        .collect();
    assert!(keys.len() >= 6, "4 cells and 2 generation keys: {keys:?}");
    for k in &keys {
        let ttl: i64 = redis.cli(&["pttl", k]).trim().parse().unwrap();
        assert!(ttl > 500_000, "key {k} has TTL {ttl} ms");
    }
    // A field clear from another process: `y` is gone for everyone, `x` stays.
    clearer
        .partition("p")
        .kv_clear_fields(&["a", "b"], &["y"])
        .await
        .unwrap();
    let e = writer
        .partition("p")
        .kv_batch_get(&["a"], Some(&["y"]))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::NotFound, "{e}");
    let x = writer
        .partition("p")
        .kv_batch_get(&["a", "b"], Some(&["x"]))
        .await
        .unwrap();
    assert_eq!(x.len(), 2);
    // A whole-key clear from the other process expires the keys shortly (expire-on-clear).
    clearer.partition("p").kv_clear(&["a", "b"]).await.unwrap();
    for k in &keys {
        let ttl: i64 = redis.cli(&["pttl", k]).trim().parse().unwrap();
        // -2: gone already (generation keys are deleted at once); else a deadline of at most
        // `clear_expire_after_ms` (-1 would be a key left without any deadline).
        assert!(
            ttl == -2 || (0..=200).contains(&ttl),
            "after the clear, key {k}: PTTL {ttl}"
        );
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while redis.live_keys() != 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "cleared keys never expired"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A controller with Redis storage, killed and started again without its state on the same
/// address: a new epoch. The client from before is refused whatever it asks (its metadata names
/// indexes the new epoch reuses); a new client starts on fresh keys next to the earlier ones,
/// which nothing touches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kv_controller_restarted_without_its_state_refuses_earlier_metadata() {
    if !redis_available("a_kv_controller_restarted_without_its_state") {
        return;
    }
    // (`dir` holds the configuration file: it must live as long as the test.)
    let KvJob {
        redis,
        dir: _dir,
        config,
        listen,
    } = kv_job();
    let start = || controller_at(&listen, &config, &[]);
    let mut controller = start();
    controller.listening(1);
    let old = Client::connect_with(&listen, Config::default())
        .await
        .unwrap();
    for round in 0..2 {
        old.partition("p")
            .kv_put("k", &rows(1, round), None)
            .await
            .unwrap();
        old.partition("p").kv_clear(&["k"]).await.unwrap();
    }
    old.partition("p")
        .kv_put("k", &rows(1, 7), None)
        .await
        .unwrap();
    let old_meta = old.partition("p").kv_meta(&["k"]).await.unwrap();
    let left = redis.live_keys();

    controller.kill();
    let mut controller = start();
    controller.listening(1);
    let new = Client::connect_with(&listen, Config::default())
        .await
        .unwrap();
    assert_ne!(new.epoch(), old.epoch());
    new.partition("p")
        .kv_put("k", &rows(1, 100), None)
        .await
        .expect("index 0 again, on the new epoch's keys");
    assert_eq!(
        new.partition("p").kv_batch_get(&["k"], None).await.unwrap(),
        rows(1, 100)
    );
    let e = old
        .partition("p")
        .kv_batch_get(&["k"], None)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Conflict, "{e}");
    assert!(e.message().contains("restarted without its state"), "{e}");
    // Read straight from the store with the old metadata: the old epoch's keys, its own data —
    // never the new sample at the same index.
    assert_eq!(old.get_data(&old_meta).await.unwrap(), rows(1, 7));
    assert_eq!(
        redis.live_keys(),
        left + 2,
        "the earlier keys are untouched"
    );
    let _ = controller.terminate(Duration::from_secs(5));
}

/// The first half of a checkpointed job: a controller on `job`'s Redis, 200 samples produced,
/// 50 consumed (acknowledged), then `tq checkpoint save` (with `extra` arguments) and kill -9 of
/// the controller. Returns the ids consumed and where the checkpoint is.
async fn checkpoint_mid_job(job: &KvJob, extra: &[&str]) -> (Vec<i64>, std::path::PathBuf) {
    let checkpoint = job.dir.0.join("checkpoint");
    let mut controller = controller_at(&job.listen, &job.config, &[]);
    controller.listening(1);
    common::produce(&job.listen, 200);
    let tq = Client::connect_with(&job.listen, Config::default())
        .await
        .unwrap();
    let first = common::consume_acked(&tq, 50).await;
    let url = format!("file://{}", checkpoint.display());
    common::checkpoint_with("save", &url, &job.listen, extra);
    controller.kill();
    (first, checkpoint)
}

/// `tq checkpoint save`, kill -9 of the controller, a new controller on the same address and
/// `tq checkpoint load`: the job goes on — every sample produced before the checkpoint is
/// consumed exactly once across the two controllers, the ones consumed before are not handed
/// out again, and the payloads are read where they stayed (Redis).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_carries_a_job_across_a_controller_kill() {
    if !redis_available("a_checkpoint_carries_a_job_across_a_controller_kill") {
        return;
    }
    let job = kv_job();
    let (first, checkpoint) = checkpoint_mid_job(&job, &[]).await;
    let mut controller = controller_at(&job.listen, &job.config, &[]);
    controller.listening(1);
    common::checkpoint("load", checkpoint.to_str().unwrap(), &job.listen);
    common::finish_job(&job.listen, &first, 200);
    let _ = controller.terminate(Duration::from_secs(5));
}

/// `tq checkpoint save --copy-payloads`, then the controller and its redis-server both die;
/// a new controller on a fresh, empty redis-server loads the checkpoint (the payloads are
/// written into the new server) and the job finishes: every sample consumed exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_with_copied_payloads_moves_a_job_to_a_new_redis_server() {
    if !redis_available("a_checkpoint_with_copied_payloads_moves_a_job_to_a_new_redis_server") {
        return;
    }
    let job = kv_job();
    let (first, checkpoint) = checkpoint_mid_job(&job, &["--copy-payloads"]).await;
    let KvJob { redis, listen, .. } = job;
    drop(redis);

    let fresh = RedisServer::start();
    let fresh_dir = TempDir::new();
    let fresh_config = config_file(&fresh_dir, &fresh.url());
    let mut controller = controller_at(&listen, &fresh_config, &[]);
    controller.listening(1);
    assert_eq!(fresh.live_keys(), 0);
    common::checkpoint("load", checkpoint.to_str().unwrap(), &listen);
    assert!(
        fresh.live_keys() >= 150,
        "the unconsumed samples' payloads were written back"
    );
    common::finish_job(&listen, &first, 200);
    let _ = controller.terminate(Duration::from_secs(5));
}

/// `tq controller --state-dir` with Redis storage, killed with SIGKILL under a producer and an
/// acknowledged consumer and started again on the same directory and address: the workers
/// carry on (same epoch, same keys) and every sample is consumed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kv_controller_with_a_state_dir_survives_kill_9() {
    if !redis_available("a_kv_controller_with_a_state_dir_survives_kill_9") {
        return;
    }
    let KvJob {
        redis: _redis,
        dir,
        config,
        listen,
    } = kv_job();
    let state = dir.0.join("state");
    let start = || controller_at(&listen, &config, &["--state-dir", state.to_str().unwrap()]);
    let mut controller = start();
    controller.listening(1);
    let mut controller =
        common::a_job_across_a_controller_kill(&listen, controller, start, 1, 200).await;
    let _ = controller.terminate(Duration::from_secs(5));
}

/// `tq bench` on a KV store, with the controller in its own process and in the bench's: every
/// operation reported next to the store's raw pipelined commands of the same run.
#[cfg(feature = "bench")]
#[test]
fn bench_measures_a_kv_store_next_to_its_raw_commands() {
    if !redis_available("bench_measures_a_kv_store_next_to_its_raw_commands") {
        return;
    }
    let redis = RedisServer::start();
    for deployment in ["remote-kv", "embedded-kv"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_tq"))
            .args([
                "bench",
                "--deployment",
                deployment,
                "--kv-url",
                &redis.url(),
                "--workloads",
                "simple-small",
                "--samples",
                "64",
                "--reps",
                "1",
            ])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{deployment}: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let heading = if deployment == "embedded-kv" {
            "## Embedded controller"
        } else {
            "## Remote controller"
        };
        assert!(stdout.contains(heading), "{stdout}");
        for op in [
            "raw pipelined write",
            "raw pipelined read",
            "raw pipelined delete",
            "put",
            "get",
            "clear",
        ] {
            assert!(
                stdout.contains(&format!("| simple-small | {op} |")),
                "{deployment}: {stdout}"
            );
        }
        // A remote controller's part of a clear, step by step, each with a figure.
        let steps = [
            "| raw TCP round trip, 64 B, to a sleeping thread | ",
            "| empty request (`list_partitions`) | ",
            "| `kv_mark_clearing` | ",
            "| `release` | ",
        ];
        for step in steps {
            let line = stdout.lines().find(|l| l.starts_with(step));
            match deployment {
                "remote-kv" => {
                    let line = line.unwrap_or_else(|| panic!("no `{step}` line: {stdout}"));
                    let median: f64 = line[step.len()..]
                        .split_whitespace()
                        .next()
                        .and_then(|v| v.parse().ok())
                        .unwrap_or_else(|| panic!("no median in `{line}`"));
                    assert!(median > 0.0, "{line}");
                }
                _ => assert!(line.is_none(), "an embedded controller has no round trips"),
            }
        }
    }
    // Without a store to measure, a clear error.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tq"))
        .args(["bench", "--deployment", "embedded-kv"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--deployment embedded-kv needs --kv-url")
    );
}

/// Health of a deployment whose payloads are in Redis: `tq health` and the controller's
/// `/healthz` answer ok while Redis serves, and fail naming the store once it is down (every
/// put would fail then).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_fails_while_the_kv_store_is_down() {
    if !redis_available("health_fails_while_the_kv_store_is_down") {
        return;
    }
    let mut job = kv_job();
    let mut controller = controller_at(
        &job.listen,
        &job.config,
        &["--metrics-listen", "127.0.0.1:0"],
    );
    let lines = controller.listening(2);
    let metrics = lines.iter().find(|l| l.role == "metrics").unwrap();
    let metrics = metrics.endpoint.trim_start_matches("http://").to_string();
    let healthz = |addr: &str| {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        write!(s, "GET /healthz HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
        let mut reply = String::new();
        s.read_to_string(&mut reply).unwrap();
        reply
    };
    let health = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_tq"))
            .args(["health", &job.listen])
            .output()
            .unwrap()
    };
    assert!(health().status.success());
    assert!(healthz(&metrics).starts_with("HTTP/1.1 200"));

    job.redis.kill();
    let down = health();
    assert!(!down.status.success(), "{down:?}");
    let why = String::from_utf8_lossy(&down.stderr);
    assert!(why.contains("kv store `redis` is down"), "{why}");
    let reply = healthz(&metrics);
    assert!(reply.starts_with("HTTP/1.1 503"), "{reply}");
    assert!(reply.contains("kv store `redis`"), "{reply}");
    let _ = controller.terminate(Duration::from_secs(5));
}

/// A checkpoint of Redis-backed state (payloads left in Redis) loaded next to the live
/// controller it came from would make two controllers own one epoch — the same indexes, the
/// same generations, each overwriting the other's cells. The load is refused while that
/// controller lives (naming the claim), changing nothing; once it is dead, its claim lapses and
/// the same load goes through and the job finishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_is_not_loaded_next_to_its_live_controller() {
    if !redis_available("a_checkpoint_is_not_loaded_next_to_its_live_controller") {
        return;
    }
    let job = kv_job();
    let checkpoint = job.dir.0.join("checkpoint");
    let mut live = controller_at(&job.listen, &job.config, &[]);
    live.listening(1);
    common::produce(&job.listen, 40);
    let url = format!("file://{}", checkpoint.display());
    common::checkpoint("save", &url, &job.listen);

    let second_listen = common::free_listen();
    let mut second = controller_at(&second_listen, &job.config, &[]);
    second.listening(1);
    let load = Tq::spawn(&[
        "checkpoint",
        "load",
        checkpoint.to_str().unwrap(),
        "--controller",
        &second_listen,
    ]);
    let (status, stderr) = load.wait_exit(Duration::from_secs(60));
    assert!(!status.success(), "loaded next to its live controller");
    assert!(stderr.contains(tq_core::EPOCH_CLAIMED), "{stderr}");
    let fresh = Client::connect_with(&second_listen, Config::default())
        .await
        .unwrap();
    assert!(
        fresh
            .partition("work")
            .kv_list()
            .await
            .unwrap()
            .entries
            .is_empty()
            && fresh
                .controller_status()
                .await
                .unwrap()
                .partitions
                .is_empty(),
        "the refused load changed nothing"
    );
    // The live controller's job is whole: finish it there.
    common::finish_job(&job.listen, &[], 40);

    // Its controller dies: the load is accepted once the claim lapses, and the checkpointed
    // job (40 samples, none consumed at save time) can be run again from it.
    live.kill();
    common::checkpoint("load", checkpoint.to_str().unwrap(), &second_listen);
    common::finish_job(&second_listen, &[], 40);
    let _ = second.terminate(Duration::from_secs(5));
}

/// A client pointed at Redis's port instead of the controller's is told so at once (Redis
/// answers the hello's first line), not after its handshake timeout: from the library and
/// from `tq stats`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_pointed_at_redis_is_told_at_once() {
    if !redis_available("a_client_pointed_at_redis_is_told_at_once") {
        return;
    }
    let redis = RedisServer::start();
    let url = format!("tcp://127.0.0.1:{}", redis.port);
    let started = std::time::Instant::now();
    let e = tq_client::Client::connect(&url)
        .await
        .expect_err("Redis is not a controller");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert!(e.message().contains("Redis"), "{e}");
    assert!(e.message().contains(&url), "{e}");
    let started = std::time::Instant::now();
    let (status, stderr) =
        Tq::spawn(&["stats", "--controller", &url]).wait_exit(Duration::from_secs(10));
    assert!(!status.success());
    assert!(stderr.contains("as a Redis server does"), "{stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}
