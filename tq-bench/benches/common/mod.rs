//! What every criterion target shares: the runtime, the workloads, the standard put / get /
//! clear functions of one deployment, the raw baselines, and the server processes of the
//! remote targets (this very bench binary, started again with `TQ_BENCH_SERVER` set).
//!
//! Methodology, the same for every target: each timed iteration does exactly the operation it
//! names, within the standard put → get → clear cycle of `tq bench` (see [`put_get_clear`]):
//! a put writes keys that do not exist, a get reads data just written, a clear removes it; the
//! other two steps of the cycle run outside the timed part. Criterion warms each function up before measuring; sample counts and
//! times are small enough for a 2-core machine; servers are stopped when their target's groups
//! end (dropped), so nothing runs on between benchmarks.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tq::{Batch, Client};

/// Samples per batch of every workload (as in docs/benchmarks.md).
pub const ROWS: usize = 1024;

/// A two-worker runtime, like the machines the figures come from.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// Criterion settings that fit a 2-core machine: 10 samples, 1 s warm-up, `secs` of
/// measurement per function.
pub fn criterion(secs: u64) -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(secs))
        .configure_from_args()
}

/// One standard workload: its batch, keys and sizes.
pub struct Workload {
    pub name: &'static str,
    pub batch: Batch,
    pub keys: Vec<String>,
}

impl Workload {
    pub fn new(name: &'static str) -> Workload {
        Workload::with_rows(name, ROWS)
    }

    /// The workload with `rows` samples per batch instead of [`ROWS`].
    pub fn with_rows(name: &'static str, rows: usize) -> Workload {
        let batch = tq_bench::workloads::by_name(name, rows).expect("a standard workload");
        let keys = tq_bench::workloads::keys(batch.len());
        Workload { name, batch, keys }
    }

    pub fn bytes(&self) -> u64 {
        self.batch.nbytes() as u64
    }

    pub fn cells(&self) -> u64 {
        tq_bench::workloads::cells(&self.batch) as u64
    }

    /// A benchmark group `<deployment>/<workload>` reporting cells and bytes per second.
    pub fn group<'a>(
        &self,
        c: &'a mut Criterion,
        deployment: &str,
    ) -> BenchmarkGroup<'a, WallTime> {
        let mut g = c.benchmark_group(format!("{deployment}/{}", self.name));
        g.throughput(Throughput::ElementsAndBytes {
            elements: self.cells(),
            bytes: self.bytes(),
        });
        g
    }
}

/// `put`, `get` and `clear` of `w` through `client`, in partition `bench`.
///
/// Every iteration of each of the three runs the standard cycle of `tq bench` — put the batch
/// under keys that do not exist, get it back, clear it — and times only the step it names. So a
/// put writes new keys, a get reads data just written (as a trainer does), a clear removes it,
/// and each starts from the state the same step of `tq bench` starts from.
pub fn put_get_clear(
    g: &mut BenchmarkGroup<'_, WallTime>,
    rt: &tokio::runtime::Runtime,
    client: &Client,
    w: &Workload,
) {
    let p = client.partition("bench");
    let cycle = |iters: u64, step: usize| -> Duration {
        let mut timed = Duration::ZERO;
        for _ in 0..iters {
            timed += rt.block_on(async {
                let t0 = Instant::now();
                p.kv_batch_put(&w.keys, &w.batch, None).await.expect("put");
                let t1 = Instant::now();
                let got = p.kv_batch_get(&w.keys, None).await.expect("get");
                let t2 = Instant::now();
                assert_eq!(got.len(), w.keys.len());
                drop(got);
                let t3 = Instant::now();
                p.kv_clear(&w.keys).await.expect("clear");
                let t4 = Instant::now();
                match step {
                    0 => t1 - t0,
                    1 => t2 - t1,
                    _ => t4 - t3,
                }
            });
        }
        timed
    };
    for (step, name) in ["put", "get", "clear"].into_iter().enumerate() {
        g.bench_function(name, |b| b.iter_custom(|iters| cycle(iters, step)));
    }
}

/// The baseline of moving the bytes in memory: one copy of every payload into fresh buffers.
pub fn memcpy(g: &mut BenchmarkGroup<'_, WallTime>, w: &Workload) {
    g.bench_function("memcpy", |b| {
        b.iter(|| tq_bench::measure::copy_batch(&w.batch))
    });
}

/// The payload of every cell of `w`, in row-major order: what a raw baseline writes.
pub fn cell_payloads(w: &Workload) -> Vec<tq::Bytes> {
    let mut out = Vec::new();
    for r in 0..w.batch.len() {
        for column in w.batch.columns().values() {
            match column.value(r) {
                tq::Value::Tensor(t) => out.push(t.into_data()),
                tq::Value::Object(b) => out.push(b),
            }
        }
    }
    out
}

/// The raw-disk baseline: every cell of `w` as a file of its own in `dir` (`fs-write` creates
/// and writes them, `fs-read` reads them, `fs-delete` removes them), with std::fs.
pub fn fs_baseline(g: &mut BenchmarkGroup<'_, WallTime>, w: &Workload, dir: &std::path::Path) {
    let cells = cell_payloads(w);
    let paths: Vec<_> = (0..cells.len())
        .map(|i| dir.join(format!("cell-{i}")))
        .collect();
    let write = || {
        for (path, data) in paths.iter().zip(&cells) {
            std::fs::write(path, data).expect("write a cell file");
        }
    };
    let delete = || {
        for path in &paths {
            std::fs::remove_file(path).expect("remove a cell file");
        }
    };
    g.bench_function("fs-write", |b| {
        b.iter_custom(|iters| {
            let mut timed = Duration::ZERO;
            for _ in 0..iters {
                let t = Instant::now();
                write();
                timed += t.elapsed();
                delete();
            }
            timed
        })
    });
    write();
    g.bench_function("fs-read", |b| {
        b.iter(|| {
            let mut total = 0;
            for path in &paths {
                total += std::fs::read(path).expect("read a cell file").len();
            }
            total
        })
    });
    g.bench_function("fs-delete", |b| {
        b.iter_custom(|iters| {
            let mut timed = Duration::ZERO;
            for _ in 0..iters {
                write();
                let t = Instant::now();
                delete();
                timed += t.elapsed();
            }
            timed
        })
    });
}

/// The raw loopback TCP baseline: `bytes` sent to an echo-less sink thread that answers one
/// byte once it has them all; one iteration is one such exchange on a connection kept open.
pub fn tcp_baseline(g: &mut BenchmarkGroup<'_, WallTime>, bytes: usize) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("address");
    let sink = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("accept");
        s.set_nodelay(true).expect("nodelay");
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let mut left = bytes;
            while left > 0 {
                match s.read(&mut buf[..left.min(1 << 20)]) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => left -= n,
                }
            }
            if s.write_all(&[1]).is_err() {
                return;
            }
        }
    });
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_nodelay(true).expect("nodelay");
    let payload = vec![7u8; bytes];
    g.bench_function("raw-tcp", |b| {
        b.iter(|| {
            s.write_all(&payload).expect("send");
            let mut ack = [0u8; 1];
            s.read_exact(&mut ack).expect("ack");
        })
    });
    drop(s);
    sink.join().expect("sink thread");
}

/// The environment variable that turns this bench binary into a server process.
const SERVER_ROLE: &str = "TQ_BENCH_SERVER";

/// In a child started by [`Deployment::start`]: serve the role it was given until stdin
/// closes (the parent exited or dropped the deployment), then exit. Otherwise returns at once.
/// Call first in `main`.
pub fn serve_if_child() {
    let Ok(role) = std::env::var(SERVER_ROLE) else {
        return;
    };
    let rt = runtime();
    let result: tq::Result<()> = rt.block_on(async {
        let server = match role.as_str() {
            "controller" => tq_bench::servers::controller(2).await,
            unit => {
                let controller = std::env::var("TQ_BENCH_CONTROLLER").expect("controller URL");
                tq_bench::servers::unit(unit, &controller).await
            }
        }?;
        println!("listening {}", server.local_endpoint());
        // Stdin closes when the parent goes away: serve until then.
        tokio::task::spawn_blocking(|| {
            let mut sink = Vec::new();
            let _ = std::io::stdin().read_to_end(&mut sink);
        })
        .await
        .ok();
        server.shutdown().await;
        Ok(())
    });
    std::process::exit(match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("bench server {role}: {e}");
            1
        }
    });
}

/// A controller and two storage-unit processes on loopback, stopped when dropped.
pub struct Deployment {
    children: Vec<Child>,
    pub url: String,
}

impl Deployment {
    pub fn start() -> Deployment {
        let (controller, url) = spawn_server("controller", None);
        let mut children = vec![controller];
        for i in 0..2 {
            children.push(spawn_server(&format!("unit-{i}"), Some(&url)).0);
        }
        Deployment { children, url }
    }
}

impl Drop for Deployment {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn spawn_server(role: &str, controller: Option<&str>) -> (Child, String) {
    let mut cmd = Command::new(std::env::current_exe().expect("this bench binary"));
    cmd.env(SERVER_ROLE, role)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if let Some(url) = controller {
        cmd.env("TQ_BENCH_CONTROLLER", url);
    }
    let mut child = cmd.spawn().expect("start a bench server");
    let stdout = child.stdout.take().expect("piped stdout");
    let mut lines = BufReader::new(stdout).lines();
    let line = lines
        .next()
        .expect("the server announces its endpoint")
        .expect("a line");
    let endpoint = line
        .strip_prefix("listening ")
        .unwrap_or_else(|| panic!("unexpected server output: {line}"))
        .to_string();
    (child, endpoint)
}

/// The clear-28 workload (`tq_bench::clears`): a group `<deployment>/clear-28` with one
/// function per size, each iteration a put and a get (untimed) and the timed `kv_clear` of
/// `n` keys × 28 fields of 1 KiB; throughput in cells.
pub fn clear_28(
    c: &mut Criterion,
    deployment: &str,
    rt: &tokio::runtime::Runtime,
    client: &Client,
) {
    let mut g = c.benchmark_group(format!("{deployment}/clear-28"));
    let p = client.partition("bench-clear-28");
    for n in tq_bench::clears::SIZES {
        let batch = tq_bench::clears::batch(n);
        let keys = tq_bench::workloads::keys(n);
        g.throughput(Throughput::Elements((n * tq_bench::clears::FIELDS) as u64));
        g.bench_function(format!("{n}"), |b| {
            b.iter_custom(|iters| {
                let mut timed = Duration::ZERO;
                for _ in 0..iters {
                    timed += rt.block_on(async {
                        p.kv_batch_put(&keys, &batch, None).await.expect("put");
                        let got = p.kv_batch_get(&keys, None).await.expect("get");
                        assert_eq!(got.len(), n);
                        drop(got);
                        let t = Instant::now();
                        p.kv_clear(&keys).await.expect("clear");
                        t.elapsed()
                    });
                }
                timed
            })
        });
    }
    g.finish();
}
