//! Test support: `redis-server` processes started on free loopback ports and killed on drop.
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A unique name for namespaces and directories within this test process.
pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// A temporary directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new() -> Self {
        let p = std::env::temp_dir().join(unique("tq-kv-test-"));
        std::fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// True when `redis-server` and `redis-cli` can run. Otherwise prints why the calling test is
/// skipped — or panics when `TQ_REQUIRE_REDIS=1` (CI), so nothing is skipped silently there.
pub fn redis_available(test: &str) -> bool {
    let ok = |bin: &str| {
        Command::new(bin)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if ok("redis-server") && ok("redis-cli") {
        return true;
    }
    if std::env::var("TQ_REQUIRE_REDIS").is_ok_and(|v| v == "1") {
        panic!("{test}: redis-server/redis-cli not on PATH but TQ_REQUIRE_REDIS=1");
    }
    eprintln!(
        "SKIPPED {test}: redis-server/redis-cli not on PATH (install the redis-server package)"
    );
    false
}

/// A loopback port that is free now and that no other test in this process was given before.
///
/// The kernel hands a port freed by a killed server to the next `bind(0)`, so without the
/// record a test that killed its Redis to simulate an outage could find another test's fresh
/// Redis answering on that port (a CI run saw a put "succeed" during the outage that way).
/// A port's cluster-bus twin (`port + 10000`) is recorded with it.
pub fn free_port() -> u16 {
    static GIVEN: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("bind a free port")
            .port();
        let bus = port.checked_add(10_000);
        if let Some(bus) = bus.filter(|b| !given.contains(&port) && !given.contains(b)) {
            given.insert(port);
            given.insert(bus);
            return port;
        }
    }
}

/// One `redis-server` process on 127.0.0.1, killed when dropped (also on panic).
pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
    dir: TempDir,
    cluster: bool,
}

impl RedisServer {
    pub fn start() -> Self {
        Self::start_on(free_port(), false)
    }

    pub fn start_on(port: u16, cluster: bool) -> Self {
        let dir = TempDir::new();
        Self::spawn(port, cluster, dir)
    }

    fn spawn(port: u16, cluster: bool, dir: TempDir) -> Self {
        let mut cmd = Command::new("redis-server");
        cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(["--dir", dir.0.to_str().expect("utf-8 temp dir")]);
        if cluster {
            cmd.args([
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                &format!("nodes-{port}.conf"),
                "--cluster-node-timeout",
                "2000",
            ]);
        }
        let child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        let s = RedisServer {
            port,
            child: Some(child),
            dir,
            cluster,
        };
        s.wait_ready();
        s
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("run redis-cli");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// How many keys the server holds that have not expired. `DBSIZE` would also count keys
    /// whose deadline has passed but that Redis has not reclaimed yet (retired cells expire
    /// shortly after an overwrite, by design); `SCAN` skips them.
    /// Keys holding data (or generations): controllers' epoch claims (`…/__owner__`, which
    /// expire by themselves) are not counted.
    pub fn live_keys(&self) -> usize {
        self.cli(&["--scan"])
            .lines()
            .filter(|k| !k.ends_with("/__owner__"))
            .count()
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.cli(&["ping"]).trim() == "PONG" {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("redis-server on port {} did not start", self.port);
    }

    /// Kills the process (SIGKILL) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts a fresh server on the same port (after [`RedisServer::kill`]).
    pub fn restart(mut self) -> Self {
        self.kill();
        let dir = std::mem::replace(&mut self.dir, TempDir::new());
        Self::spawn(self.port, self.cluster, dir)
    }

    /// Kills the process (SIGKILL) and starts it again on the same port and directory: a
    /// cluster node keeps its identity (its nodes file) and rejoins — a master that was failed
    /// over comes back as a replica of the node that replaced it.
    pub fn restart_in_place(&mut self) {
        self.kill();
        let dir = std::mem::replace(&mut self.dir, TempDir::new());
        *self = Self::spawn(self.port, self.cluster, dir);
    }

    /// Sends a signal (`STOP`, `CONT`) to the server process.
    pub fn signal(&self, sig: &str) {
        Command::new("kill")
            .args([&format!("-{sig}"), &self.pid().to_string()])
            .status()
            .expect("run kill");
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(c) = &self.child {
            // A stopped process must be continued to die promptly on some systems.
            let _ = Command::new("kill")
                .args(["-CONT", &c.id().to_string()])
                .stderr(Stdio::null())
                .status();
        }
        self.kill();
    }
}

/// Three master nodes joined into a cluster, all killed on drop.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Three masters, no replicas.
    pub fn start() -> Self {
        Self::start_with(0)
    }

    /// Three masters with `replicas` replicas each (`redis-cli --cluster create` assigns them).
    pub fn start_with(replicas: usize) -> Self {
        let nodes: Vec<RedisServer> = (0..3 * (1 + replicas))
            .map(|_| RedisServer::start_on(free_port(), true))
            .collect();
        let mut args: Vec<String> = vec!["--cluster".into(), "create".into()];
        args.extend(nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)));
        args.extend([
            "--cluster-replicas".to_string(),
            replicas.to_string(),
            "--cluster-yes".into(),
        ]);
        let out = Command::new("redis-cli")
            .args(&args)
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ok = nodes
                .iter()
                .all(|n| n.cli(&["cluster", "info"]).contains("cluster_state:ok"));
            if ok {
                break;
            }
            assert!(Instant::now() < deadline, "cluster state never became ok");
            std::thread::sleep(Duration::from_millis(50));
        }
        RedisCluster { nodes }
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// Waits (at most 30 s) until three masters serve the slots and every replica's link to
    /// its master is up.
    pub fn wait_replicas_synced(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let synced = |n: &RedisServer| {
            let info = n.cli(&["info", "replication"]);
            !info.contains("role:slave") || info.contains("master_link_status:up")
        };
        while self.masters().len() != 3 || !self.nodes.iter().all(synced) {
            assert!(Instant::now() < deadline, "replicas never synced");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Positions in `nodes` of the current masters that serve slots (`CLUSTER NODES` as seen
    /// by the first node that answers).
    pub fn masters(&self) -> Vec<usize> {
        let view = self
            .nodes
            .iter()
            .find_map(|n| {
                let out = n.cli(&["cluster", "nodes"]);
                (!out.trim().is_empty()).then_some(out)
            })
            .expect("a node answers");
        view.lines()
            .filter(|l| l.contains("master") && !l.contains("fail") && l.split(' ').count() > 8)
            .filter_map(|l| {
                let port: u16 = l
                    .split(' ')
                    .nth(1)?
                    .split(['@', ':'])
                    .nth(1)?
                    .parse()
                    .ok()?;
                self.nodes.iter().position(|n| n.port == port)
            })
            .collect()
    }
}

/// `n` rows of a dense `i64` field `x` of 4 elements each, counting up from `base`.
pub fn i64_rows(n: usize, base: i64) -> tq_core::Batch {
    let v: Vec<i64> = (0..n as i64 * 4).map(|i| base + i).collect();
    tq_core::Batch::from_columns([(
        "x",
        tq_core::Column::Dense(tq_core::Tensor::from_slice(vec![n, 4], &v).unwrap()),
    )])
    .unwrap()
}

/// Metadata of samples `first..first + n` (generation 0) of partition `p` holding `b`'s fields.
pub fn meta_of(first: u32, n: usize, b: &tq_core::Batch) -> tq_core::BatchMeta {
    let samples = (first..first + n as u32)
        .map(|i| tq_core::SampleId::new(i, 0))
        .collect();
    tq_core::BatchMeta::new("p", samples)
        .with_fields(b.schemas())
        .unwrap()
}
