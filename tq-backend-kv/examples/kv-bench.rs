//! KV backend benchmark: clear cost per key (delete vs unlink vs expire, raw and through the
//! adapter) and put/get throughput through the adapter next to raw pipelined MSET/MGET of the
//! same bytes with the same crate, on a Redis single node and a 3-node Redis Cluster that this
//! program starts on free loopback ports (and kills on exit).
//!
//! ```text
//! cargo run --release -p tq-backend-kv --features redis --example kv-bench -- [reps] [clear]
//! ```
//!
//! The clear benchmark runs `4 × reps` repetitions (one clear takes 5-50 ms, so a median of 5 is
//! mostly scheduler noise on a shared machine); put/get run `reps`. `clear` as the second
//! argument runs only the clear benchmark (`throughput`: only put/get). `TQ_KV_BENCH_KEYS_PER_CALL` and
//! `TQ_KV_BENCH_CALLS_IN_FLIGHT` override the store's `max_keys_per_call` (1024) and
//! `max_concurrent_calls` (16); `TQ_KV_BENCH_METHODS=unlink,adapter-expire-pipeline` picks clear
//! methods.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and examples may panic

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tq_backend_kv::codec::{encode_header, KeyScheme};
use tq_backend_kv::{
    DeleteCommand, ExpireCommand, KvOptions, KvStorageManager, KvStoreExt, KvValue, RedisOptions,
    RedisStore,
};
use tq_core::{Batch, BatchMeta, Column, FieldFilter, SampleId, StorageManager, Tensor};

struct Server(Child, std::path::PathBuf);
impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        let _ = std::fs::remove_dir_all(&self.1);
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn cli(port: u16, args: &[&str]) -> String {
    let o = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn start(port: u16, cluster: bool) -> Server {
    let dir = std::env::temp_dir().join(format!("tq-kv-bench-{}-{port}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut c = Command::new("redis-server");
    c.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args([
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            dir.to_str().unwrap(),
        ]);
    if cluster {
        c.args([
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
        ]);
    }
    let child = c
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server on PATH");
    let s = Server(child, dir);
    while cli(port, &["ping"]).trim() != "PONG" {
        std::thread::sleep(Duration::from_millis(20));
    }
    s
}

fn start_cluster() -> (Vec<Server>, Vec<String>) {
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let servers: Vec<Server> = ports.iter().map(|&p| start(p, true)).collect();
    let mut args = vec!["--cluster".to_string(), "create".into()];
    args.extend(ports.iter().map(|p| format!("127.0.0.1:{p}")));
    args.extend(["--cluster-replicas", "0", "--cluster-yes"].map(String::from));
    let o = Command::new("redis-cli").args(&args).output().unwrap();
    assert!(o.status.success());
    while !ports
        .iter()
        .all(|&p| cli(p, &["cluster", "info"]).contains("cluster_state:ok"))
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    let urls = ports
        .iter()
        .map(|p| format!("redis://127.0.0.1:{p}"))
        .collect();
    (servers, urls)
}

#[derive(Clone, Copy)]
enum Topo {
    Single,
    Cluster,
}

fn store(
    topo: Topo,
    urls: &[String],
    delete: DeleteCommand,
    expire: ExpireCommand,
) -> Arc<RedisStore> {
    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse().ok());
    let d = RedisOptions::default();
    let o = RedisOptions {
        delete,
        expire,
        op_timeout: Duration::from_secs(60),
        response_timeout: Duration::from_secs(30),
        max_keys_per_call: env("TQ_KV_BENCH_KEYS_PER_CALL").unwrap_or(d.max_keys_per_call),
        max_concurrent_calls: env("TQ_KV_BENCH_CALLS_IN_FLIGHT").unwrap_or(d.max_concurrent_calls),
        ..d
    };
    Arc::new(match topo {
        Topo::Single => RedisStore::single(&urls[0], o).unwrap(),
        Topo::Cluster => RedisStore::cluster(urls, o).unwrap(),
    })
}

fn stats(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn meta_and_batch(samples: usize, fields: usize, row_bytes: usize) -> (BatchMeta, Batch) {
    let ids = (0..samples as u32).map(|i| SampleId::new(i, 0)).collect();
    let cols = (0..fields).map(|f| {
        let n = row_bytes / 4;
        let v: Vec<f32> = (0..samples * n).map(|i| (i + f) as f32).collect();
        (
            format!("field_{f:02}"),
            Column::Dense(Tensor::from_slice(vec![samples, n], &v).unwrap()),
        )
    });
    let batch = Batch::from_columns(cols).unwrap();
    let meta = BatchMeta::new("bench", ids)
        .with_fields(batch.schemas())
        .unwrap();
    (meta, batch)
}

/// CPU time (user + system) the servers on `ports` have used, in µs (`INFO cpu`).
fn server_cpu_us(ports: &[u16]) -> f64 {
    ports
        .iter()
        .map(|&p| {
            cli(p, &["info", "cpu"])
                .lines()
                .filter_map(|l| {
                    let (k, v) = l.trim().split_once(':')?;
                    matches!(k, "used_cpu_sys" | "used_cpu_user")
                        .then(|| v.parse::<f64>().ok())
                        .flatten()
                })
                .sum::<f64>()
                * 1e6
        })
        .sum()
}

/// CPU time this process has used, all threads, in µs (`/proc/self/task/*/schedstat`).
fn client_cpu_us() -> f64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return f64::NAN;
    };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<f64>().ok())
        .sum::<f64>()
        / 1e3
}

/// Raw store calls on the cell keys (`del`, `unlink`, `expire-*`) and the adapter's clear
/// without (`adapter-delete`) and with a TTL (`adapter-expire-*`); `-pipeline` / `-script` is
/// the store's `ExpireCommand`.
const CLEAR_METHODS: [&str; 7] = [
    "del",
    "unlink",
    "expire-pipeline",
    "expire-script",
    "adapter-delete",
    "adapter-expire-pipeline",
    "adapter-expire-script",
];
const CLEAR_SIZES: [usize; 2] = [512, 1024];

/// One timed clear, per key: wall clock, CPU time of the server(s) and of this process, in µs.
struct Cost {
    wall: f64,
    server: f64,
    client: f64,
}

/// Clear cost: µs/key for 512 and 1024 samples × 28 fields, with the server and client CPU
/// time spent per key. Repetitions interleave the methods and both sizes (alternating which
/// size goes first, rotating the method order) so slow phases of a shared machine and the state
/// the server is left in hit every line alike; each repetition clears a fresh namespace and the
/// untimed cleanup removes every key it wrote (cells and generation keys), so the database is
/// the same size at every timed clear.
async fn clear_bench(topo: Topo, urls: &[String], reps: usize) {
    let label = match topo {
        Topo::Single => "single",
        Topo::Cluster => "cluster",
    };
    let ports: Vec<u16> = urls
        .iter()
        .map(|u| u.rsplit(':').next().unwrap().parse().unwrap())
        .collect();
    let ports = &ports[..];
    let only = std::env::var("TQ_KV_BENCH_METHODS").ok();
    let methods: Vec<&str> = CLEAR_METHODS
        .into_iter()
        .filter(|m| {
            only.as_deref()
                .is_none_or(|o| o.split(',').any(|x| x == *m))
        })
        .collect();
    let fields = 28;
    let data: Vec<(BatchMeta, Batch)> = CLEAR_SIZES
        .iter()
        .map(|&n| meta_and_batch(n, fields, 16))
        .collect();
    let stores: Vec<Arc<RedisStore>> = methods
        .iter()
        .map(|&m| {
            let del = if m == "del" {
                DeleteCommand::Del
            } else {
                DeleteCommand::Unlink
            };
            let exp = if m.ends_with("-script") {
                ExpireCommand::Script
            } else {
                ExpireCommand::Pipeline
            };
            store(topo, urls, del, exp)
        })
        .collect();
    // (method, size) -> one cost per timed repetition.
    let mut runs: BTreeMap<(usize, usize), Vec<Cost>> = BTreeMap::new();
    for rep in 0..reps + 1 {
        for k in 0..methods.len() {
            let mi = (k + rep) % methods.len();
            let method = methods[mi];
            let s = &stores[mi];
            for j in 0..CLEAR_SIZES.len() {
                let si = if rep % 2 == 0 {
                    j
                } else {
                    CLEAR_SIZES.len() - 1 - j
                };
                let (meta, batch) = &data[si];
                let ns = format!("c{rep}-{method}-{}", CLEAR_SIZES[si]);
                let ttl = method.contains("expire");
                let m = KvStorageManager::new(
                    s.clone(),
                    KvOptions {
                        namespace: ns.clone(),
                        data_ttl: ttl.then_some(Duration::from_secs(3600)),
                        ..Default::default()
                    },
                )
                .unwrap();
                m.put(meta, batch).await.unwrap();
                let ks = KeyScheme::new(&ns, "bench");
                // Sample-major, like the adapter: a sample's keys share a cluster hash slot.
                let cell_keys: Vec<String> = meta
                    .samples()
                    .iter()
                    .flat_map(|s| batch.field_names().map(|f| ks.cell(*s, f)))
                    .collect();
                let gen_keys: Vec<String> = meta
                    .samples()
                    .iter()
                    .map(|s| ks.generation(s.index))
                    .collect();
                let (srv0, cli0) = (server_cpu_us(ports), client_cpu_us());
                let t0 = Instant::now();
                match method {
                    "del" | "unlink" => s.delete_all(&cell_keys).await.unwrap(),
                    "expire-pipeline" | "expire-script" => s
                        .expire_all(&cell_keys, Duration::from_secs(1))
                        .await
                        .unwrap(),
                    _ => m.clear(meta, &FieldFilter::All).await.unwrap(),
                }
                let dt = t0.elapsed();
                let (srv1, cli1) = (server_cpu_us(ports), client_cpu_us());
                let keys = cell_keys.len() as f64;
                if rep > 0 {
                    runs.entry((mi, si)).or_default().push(Cost {
                        wall: dt.as_secs_f64() * 1e6 / keys,
                        server: (srv1 - srv0) / keys,
                        client: (cli1 - cli0) / keys,
                    });
                }
                // Clean up outside the timed region: every key this repetition wrote.
                s.delete_all(&cell_keys).await.unwrap();
                s.delete_all(&gen_keys).await.unwrap();
            }
        }
    }
    println!(
        "clear {label}: medians of {reps} repetitions after a warm-up (min, max); server / client \
         cpu = median CPU time of the redis-server process(es) / of this process"
    );
    for (mi, method) in methods.iter().enumerate() {
        for (si, samples) in CLEAR_SIZES.iter().enumerate() {
            let r = &runs[&(mi, si)];
            let (med, min, max) = stats(r.iter().map(|c| c.wall).collect());
            let (srv, _, _) = stats(r.iter().map(|c| c.server).collect());
            let (cpu, _, _) = stats(r.iter().map(|c| c.client).collect());
            println!(
                "clear {label:7} {method:23} {samples:5} samples x {fields} = {:6} keys: \
                 {med:6.3} us/key (min {min:.3}, max {max:.3}) | server cpu {srv:.3} | \
                 client cpu {cpu:.3} us/key",
                samples * fields
            );
        }
    }
    for (mi, method) in methods.iter().enumerate() {
        // Wall-clock ratio of the medians and of the minima, and of the server CPU medians.
        let med = |si: usize, f: fn(&Cost) -> f64| {
            stats(runs[&(mi, si)].iter().map(f).collect()).0 * CLEAR_SIZES[si] as f64
        };
        let min = |si: usize| {
            stats(runs[&(mi, si)].iter().map(|c| c.wall).collect()).1 * CLEAR_SIZES[si] as f64
        };
        println!(
            "clear {label:7} {method:23} 1024/512 wall-clock ratio: {:.2}x (of minima {:.2}x; \
             server cpu {:.2}x)",
            med(1, |c| c.wall) / med(0, |c| c.wall),
            min(1) / min(0),
            med(1, |c| c.server) / med(0, |c| c.server),
        );
    }
}

/// Put/get through the adapter vs raw pipelined MSET/MGET of the same bytes.
async fn throughput_bench(topo: Topo, urls: &[String], reps: usize) {
    let label = match topo {
        Topo::Single => "single",
        Topo::Cluster => "cluster",
    };
    // 1024 samples x 4 fields x 16 KiB = 64 KiB per sample, 64 MiB per batch.
    let (meta, batch) = meta_and_batch(1024, 4, 16 * 1024);
    let bytes = batch.nbytes();
    let s = store(topo, urls, DeleteCommand::Unlink, ExpireCommand::default());
    let m = KvStorageManager::new(s.clone(), KvOptions::default()).unwrap();
    // Raw: the same keys and the same encoded bytes (header + payload), built untimed, in
    // sample order (a sample's keys share a cluster hash slot), as the adapter writes them.
    let ks = KeyScheme::new("raw", "bench");
    let mut raw_items = Vec::new();
    for (r, sid) in meta.samples().iter().enumerate() {
        for (f, col) in batch.columns() {
            let v = col.value(r);
            let mut buf = encode_header(&v).to_vec();
            buf.extend_from_slice(v.bytes());
            raw_items.push((ks.cell(*sid, f), bytes::Bytes::from(buf)));
        }
    }
    let raw_keys: Vec<String> = raw_items.iter().map(|(k, _)| k.clone()).collect();
    let raw_store = store(topo, urls, DeleteCommand::Unlink, ExpireCommand::default());
    let (mut tp, mut tg, mut rp, mut rg) = (vec![], vec![], vec![], vec![]);
    for rep in 0..reps + 1 {
        // Adapter.
        let t0 = Instant::now();
        m.put(&meta, &batch).await.unwrap();
        let put = t0.elapsed();
        let t0 = Instant::now();
        let got = m.get(&meta).await.unwrap();
        let get = t0.elapsed();
        if rep == 0 {
            assert_eq!(got.column("field_00"), batch.column("field_00"), "verify");
        }
        // Raw pipelined (the store's own MSET/MGET chunks, same crate, same concurrency).
        let items: Vec<(String, KvValue)> = raw_items
            .iter()
            .map(|(k, v)| (k.clone(), KvValue::from(v.clone())))
            .collect();
        let t0 = Instant::now();
        raw_store.mset_all(items, None).await.unwrap();
        let rput = t0.elapsed();
        let t0 = Instant::now();
        let vals = raw_store.mget_all(&raw_keys).await.unwrap();
        let rget = t0.elapsed();
        if rep == 0 {
            assert!(vals.iter().all(Option::is_some), "verify raw");
        }
        if rep > 0 {
            tp.push(bytes as f64 * 8.0 / 1e9 / put.as_secs_f64());
            tg.push(bytes as f64 * 8.0 / 1e9 / get.as_secs_f64());
            rp.push(bytes as f64 * 8.0 / 1e9 / rput.as_secs_f64());
            rg.push(bytes as f64 * 8.0 / 1e9 / rget.as_secs_f64());
        }
        m.clear(&meta, &FieldFilter::All).await.unwrap();
        raw_store.delete_all(&raw_keys).await.unwrap();
    }
    for (what, a, r) in [("put", tp, rp), ("get", tg, rg)] {
        let (am, amin, amax) = stats(a);
        let (rm, rmin, rmax) = stats(r);
        println!(
            "{what} {label:7} 1024 x 4 x 16 KiB: adapter {am:.2} Gbit/s (min {amin:.2}, max {amax:.2}) \
             | raw pipelined {rm:.2} Gbit/s (min {rmin:.2}, max {rmax:.2}) | ratio {:.0}%",
            100.0 * am / rm
        );
    }
}

#[tokio::main]
async fn main() {
    let reps: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(5);
    let port = free_port();
    let single = start(port, false);
    let urls = vec![format!("redis://127.0.0.1:{port}")];
    let part = std::env::args().nth(2);
    let (clear, throughput) = match part.as_deref() {
        Some("clear") => (true, false),
        Some("throughput") => (false, true),
        _ => (true, true),
    };
    if clear {
        clear_bench(Topo::Single, &urls, 4 * reps).await;
    }
    if throughput {
        throughput_bench(Topo::Single, &urls, reps).await;
    }
    drop(single);
    let (servers, urls) = start_cluster();
    if clear {
        clear_bench(Topo::Cluster, &urls, 4 * reps).await;
    }
    if throughput {
        throughput_bench(Topo::Cluster, &urls, reps).await;
    }
    drop(servers);
}
