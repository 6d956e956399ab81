//! Starting the real `tq` binary as server processes for end-to-end tests.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A running `tq` process; killed when dropped.
pub struct Tq {
    pub child: Child,
    lines: mpsc::Receiver<String>,
}

/// One `listening <role> [<id>] <endpoint>` line.
#[derive(Debug, Clone)]
pub struct Listening {
    pub role: String,
    pub id: Option<String>,
    pub endpoint: String,
}

impl Tq {
    pub fn spawn(args: &[&str]) -> Tq {
        Tq::spawn_env(args, &[])
    }

    pub fn spawn_env(args: &[&str], env: &[(&str, &str)]) -> Tq {
        Tq::start(args, env, Stdio::piped())
    }

    /// [`Tq::spawn_env`] with stderr (the logs) going to the file `log` instead of a pipe, so
    /// a chatty log level cannot fill a pipe nobody reads and stall the process.
    pub fn spawn_logged(args: &[&str], env: &[(&str, &str)], log: &std::path::Path) -> Tq {
        let file = std::fs::File::create(log).expect("create the log file");
        Tq::start(args, env, Stdio::from(file))
    }

    fn start(args: &[&str], env: &[(&str, &str)], stderr: Stdio) -> Tq {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_tq"));
        cmd.args(args)
            .env_remove("TQ_NET_TOKEN")
            .stdout(Stdio::piped())
            .stderr(stderr);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("start tq");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Tq { child, lines: rx }
    }

    /// Waits for `n` listening lines (at most 30 s).
    pub fn listening(&mut self, n: usize) -> Vec<Listening> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut out = Vec::new();
        while out.len() < n {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = match self.lines.recv_timeout(left) {
                Ok(l) => l,
                Err(_) => {
                    let status = self.child.try_wait().ok().flatten();
                    panic!(
                        "tq did not report {n} listening endpoints (got {out:?}, exit {status:?})"
                    );
                }
            };
            let parts: Vec<&str> = line.split_whitespace().collect();
            if parts.first() != Some(&"listening") {
                continue;
            }
            out.push(Listening {
                role: parts[1].to_string(),
                id: (parts.len() == 4).then(|| parts[2].to_string()),
                endpoint: parts[parts.len() - 1].to_string(),
            });
        }
        out
    }

    /// Waits (at most `within`) for a stdout line starting with `prefix` and returns it; lines
    /// before it are dropped.
    pub fn wait_line(&mut self, prefix: &str, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.starts_with(prefix) => return line,
                Ok(_) => {}
                Err(_) => panic!("no line starting with `{prefix}` within {within:?}"),
            }
        }
    }

    /// Every stdout line not read yet, waiting for the output to end (the process exited or was
    /// killed) for at most `within`.
    pub fn rest_of_output(&mut self, within: Duration) -> Vec<String> {
        let deadline = Instant::now() + within;
        let mut out = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => out.push(line),
                Err(mpsc::RecvTimeoutError::Disconnected) => return out,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    panic!("output did not end within {within:?}")
                }
            }
        }
    }

    /// The controller endpoint among `listening` lines.
    pub fn controller_endpoint(lines: &[Listening]) -> String {
        lines
            .iter()
            .find(|l| l.role == "controller")
            .expect("a controller line")
            .endpoint
            .clone()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM and waits up to `within` for the process to exit.
    pub fn terminate(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()
            .expect("run kill");
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Ok(Some(s)) = self.child.try_wait() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// Kills the process at once (SIGKILL), like a crash.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits for the process to exit on its own (at most `within`); returns status and stderr.
    pub fn wait_exit(mut self, within: Duration) -> (std::process::ExitStatus, String) {
        let deadline = Instant::now() + within;
        loop {
            if let Ok(Some(s)) = self.child.try_wait() {
                let mut err = String::new();
                if let Some(mut e) = self.child.stderr.take() {
                    use std::io::Read;
                    let _ = e.read_to_string(&mut err);
                }
                return (s, err);
            }
            assert!(Instant::now() < deadline, "tq did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Tq {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `tq controller` on a free loopback port for `units` storage units (started separately);
/// returns the process and its URL.
pub fn controller(units: u32) -> (Tq, String) {
    let units = units.to_string();
    let mut tq = Tq::spawn(&[
        "controller",
        "--listen",
        "tcp://127.0.0.1:0",
        "--units",
        &units,
    ]);
    let url = Tq::controller_endpoint(&tq.listening(1));
    (tq, url)
}

/// `tq serve` with `units` storage units on free loopback ports; returns the process and the
/// controller URL.
pub fn serve(units: u32, extra: &[&str]) -> (Tq, String) {
    let units_s = units.to_string();
    let mut args = vec![
        "serve",
        "--listen",
        "tcp://127.0.0.1:0",
        "--units",
        &units_s,
    ];
    args.extend_from_slice(extra);
    let mut tq = Tq::spawn(&args);
    let lines = tq.listening(units as usize + 1);
    let url = Tq::controller_endpoint(&lines);
    (tq, url)
}

/// The sample ids of a consumer's `acked <id>` lines.
pub fn acked_ids(lines: &[String]) -> Vec<i64> {
    lines
        .iter()
        .filter_map(|l| l.strip_prefix("acked "))
        .map(|id| id.parse().expect("an id"))
        .collect()
}

/// A job across a controller kill: `producers` `tq produce` processes (`per_producer` samples
/// each, a put every 100 ms, so production lasts about 2 s) and an acknowledged `tq consume`
/// work against the controller at `listen`; right after the consumer's first acknowledgement the
/// controller is killed (SIGKILL) and `restart` starts it again. Then: every sample consumed,
/// none acknowledged twice, no lease left, and the kill landed mid-production. Returns the
/// restarted controller.
pub async fn a_job_across_a_controller_kill(
    listen: &str,
    mut controller: Tq,
    restart: impl Fn() -> Tq,
    producers: i64,
    per_producer: i64,
) -> Tq {
    let produce = |first: i64| {
        Tq::spawn(&[
            "produce",
            "--connect",
            listen,
            "--first",
            &first.to_string(),
            "--count",
            &per_producer.to_string(),
            "--batch",
            "10",
            "--pace-ms",
            "100",
            "--retry-ms",
            "60000",
        ])
    };
    let mut consumer = Tq::spawn(&[
        "consume",
        "--connect",
        listen,
        "--batch",
        "6",
        "--lease-ms",
        "2000",
        "--idle-ms",
        "60000",
        "--retry-ms",
        "60000",
    ]);
    let started = Instant::now();
    let running: Vec<Tq> = (0..producers).map(|p| produce(p * per_producer)).collect();
    let first = consumer.wait_line("acked ", Duration::from_secs(60));
    controller.kill();
    let killed_after = started.elapsed();
    let mut controller = restart();
    controller.listening(1);
    for p in running {
        let (status, stderr) = p.wait_exit(Duration::from_secs(120));
        assert!(status.success(), "producer: {stderr}");
    }
    // (The workers may not even notice the outage: the connection pool repeats an idempotent
    // request once on a fresh connection, and the controller can be back by then.)
    assert!(
        killed_after < Duration::from_millis(1500),
        "the kill must land mid-production: {killed_after:?}"
    );
    let done = Tq::spawn(&["produce", "--connect", listen, "--count", "0", "--complete"]);
    let (status, stderr) = done.wait_exit(Duration::from_secs(60));
    assert!(status.success(), "{stderr}");
    let mut lines = vec![first];
    lines.extend(consumer.rest_of_output(Duration::from_secs(120)));
    let (status, stderr) = consumer.wait_exit(Duration::from_secs(10));
    assert!(status.success(), "consumer: {stderr}");

    let mut ids = acked_ids(&lines);
    let printed = ids.len();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), printed, "a sample was acknowledged twice");
    let tq = tq_client::Client::connect_with(listen, tq_client::Config::default())
        .await
        .expect("connect");
    let status = tq
        .partition("work")
        .consumption_status("consume")
        .await
        .expect("status");
    let total = (producers * per_producer) as usize;
    assert_eq!(status.samples.len(), total, "nothing lost, nothing extra");
    assert!(status.all_consumed(), "every sample consumed");
    assert!(status.leased.iter().all(|l| !l), "no lease left");
    // An acknowledgement whose answer was lost in the kill is repeated and answers as
    // acknowledged (by its lease), so every consumed sample is printed.
    assert_eq!(printed, total, "every acknowledged sample is printed");
    controller
}

/// Fetches, reads and acknowledges batches of 10 of partition `work` for task `consume`
/// (the partition and task of `tq produce` / `tq consume`) until at least `n` samples are
/// consumed; returns their `id` tags.
pub async fn consume_acked(tq: &tq_client::Client, n: usize) -> Vec<i64> {
    let mut ids: Vec<i64> = Vec::new();
    while ids.len() < n {
        let meta = tq
            .get_meta(
                tq_client::GetMetaRequest::fetch(
                    "work",
                    &["x"],
                    "consume",
                    10,
                    tq_client::Wait::NoWait,
                )
                .with_lease(Duration::from_secs(60)),
            )
            .await
            .unwrap();
        tq.get_data(&meta).await.unwrap();
        tq.ack("consume", &meta).await.unwrap();
        ids.extend(meta.tags().iter().map(|t| match t["id"] {
            tq_core::TagValue::Int(id) => id,
            _ => panic!("id tag"),
        }));
    }
    ids
}

/// `tq checkpoint <action> <dir> --controller <listen>`, which must succeed.
pub fn checkpoint(action: &str, dir: &str, listen: &str) {
    checkpoint_with(action, dir, listen, &[]);
}

/// [`checkpoint`] with more arguments (`--copy-payloads`).
pub fn checkpoint_with(action: &str, dir: &str, listen: &str, extra: &[&str]) {
    let mut args = vec!["checkpoint", action, dir, "--controller", listen];
    args.extend_from_slice(extra);
    let run = Tq::spawn(&args);
    let (status, stderr) = run.wait_exit(Duration::from_secs(30));
    assert!(status.success(), "checkpoint {action}: {stderr}");
}

/// Finishes a `tq produce` job of `total` samples (ids `0..total`) at `listen` of which
/// `first` were consumed already: marks production complete, consumes the rest with `tq
/// consume`, and checks that every sample was consumed exactly once.
pub fn finish_job(listen: &str, first: &[i64], total: i64) {
    let mut consumer = Tq::spawn(&["consume", "--connect", listen, "--batch", "7"]);
    let done = Tq::spawn(&["produce", "--connect", listen, "--count", "0", "--complete"]);
    let (status, stderr) = done.wait_exit(Duration::from_secs(30));
    assert!(status.success(), "{stderr}");
    let rest = acked_ids(&consumer.rest_of_output(Duration::from_secs(60)));
    let (status, stderr) = consumer.wait_exit(Duration::from_secs(10));
    assert!(status.success(), "consumer: {stderr}");
    let mut all: Vec<i64> = first.iter().chain(&rest).copied().collect();
    all.sort_unstable();
    assert_eq!(
        all,
        (0..total).collect::<Vec<i64>>(),
        "each sample exactly once"
    );
}

/// A `tcp://` address on a loopback port that was free a moment ago (for a server that must
/// listen on the same address again after a restart).
pub fn free_listen() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind a free port")
        .local_addr()
        .expect("its address")
        .port();
    format!("tcp://127.0.0.1:{port}")
}

/// `tq produce --count <count> --batch 20` against `listen`, which must succeed (ids
/// `0..count`, partition `work`).
pub fn produce(listen: &str, count: i64) {
    let count = count.to_string();
    let run = Tq::spawn(&[
        "produce",
        "--connect",
        listen,
        "--count",
        &count,
        "--batch",
        "20",
    ]);
    let (status, stderr) = run.wait_exit(Duration::from_secs(60));
    assert!(status.success(), "produce: {stderr}");
}

/// A new empty directory under the system's temp dir, named after `name` and this process.
pub fn tempdir(name: &str) -> std::path::PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("a clock after 1970")
        .as_nanos();
    let dir = std::env::temp_dir().join(format!("tq-{name}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create a temp dir");
    dir
}

/// `n` `tq storage-unit` processes `unit-0`… registered with the controller at `listen`.
pub fn storage_units(listen: &str, n: usize) -> Vec<Tq> {
    (0..n)
        .map(|i| {
            let id = format!("unit-{i}");
            let mut u = Tq::spawn(&["storage-unit", "--controller", listen, "--id", &id]);
            u.listening(1);
            u
        })
        .collect()
}

/// A TCP proxy in front of `upstream` (`tcp://host:port`) that can lose answers: after
/// [`AnswerEater::eat_next`], the next bytes coming back from upstream are dropped and that
/// connection is cut on both sides, as when a controller's answer is lost on the way (the
/// request was applied; the client never hears). Serves until dropped.
pub struct AnswerEater {
    pub url: String,
    armed: std::sync::Arc<std::sync::atomic::AtomicBool>,
    eaten: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl AnswerEater {
    pub async fn start(upstream: &str) -> AnswerEater {
        use std::sync::atomic::{AtomicBool, AtomicUsize};
        use std::sync::Arc;
        let upstream = upstream.trim_start_matches("tcp://").to_string();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("tcp://{}", listener.local_addr().unwrap());
        let armed = Arc::new(AtomicBool::new(false));
        let eaten = Arc::new(AtomicUsize::new(0));
        let (a, e) = (armed.clone(), eaten.clone());
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(&upstream).await else {
                    continue;
                };
                tokio::spawn(Self::pipe(client, server, a.clone(), e.clone()));
            }
        });
        AnswerEater {
            url,
            armed,
            eaten,
            task,
        }
    }

    async fn pipe(
        client: tokio::net::TcpStream,
        server: tokio::net::TcpStream,
        armed: std::sync::Arc<std::sync::atomic::AtomicBool>,
        eaten: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    ) {
        use std::sync::atomic::Ordering;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut client_rx, mut client_tx) = client.into_split();
        let (mut server_rx, mut server_tx) = server.into_split();
        let up = async {
            let _ = tokio::io::copy(&mut client_rx, &mut server_tx).await;
        };
        let down = async {
            let mut buf = vec![0u8; 64 << 10];
            loop {
                let n = match server_rx.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                if armed.swap(false, Ordering::SeqCst) {
                    eaten.fetch_add(1, Ordering::SeqCst);
                    return;
                }
                if client_tx.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        };
        // Whichever side ends first ends the connection (both halves are dropped).
        tokio::select! {
            () = up => {}
            () = down => {}
        }
    }

    /// Drops the next answer that comes back, and cuts its connection.
    pub fn eat_next(&self) {
        self.armed.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// How many answers were dropped so far.
    pub fn eaten(&self) -> usize {
        self.eaten.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for AnswerEater {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Runs `tq args` to its end and returns its exit status, stdout and stderr (for commands
/// that end by themselves: clients, `tq partition`, `tq config check`).
pub fn run(args: &[&str]) -> (std::process::ExitStatus, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tq"))
        .args(args)
        .env_remove("TQ_NET_TOKEN")
        .output()
        .expect("run tq");
    (
        out.status,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `tq controller --listen <listen> --units 2 --state-dir <state>` (plus `extra`), once it
/// listens: the controller a restart test kills and starts again on the same directory.
pub fn state_dir_controller(listen: &str, state: &std::path::Path, extra: &[&str]) -> Tq {
    let mut args = vec![
        "controller",
        "--listen",
        listen,
        "--units",
        "2",
        "--state-dir",
        state.to_str().expect("a UTF-8 path"),
    ];
    args.extend_from_slice(extra);
    let mut c = Tq::spawn(&args);
    c.listening(1);
    c
}

/// Stops a test deployment: the controller (SIGTERM), its units (SIGKILL), and its directory.
pub fn stop_deployment(mut controller: Tq, units: &mut [Tq], dir: &std::path::Path) {
    let _ = controller.terminate(Duration::from_secs(5));
    for u in units {
        u.kill();
    }
    let _ = std::fs::remove_dir_all(dir);
}
