//! KV backend benchmark: clear cost per key (delete vs unlink vs expire, raw and through the
//! adapter) and put/get throughput through the adapter next to raw pipelined MSET/MGET of the
//! same bytes with the same crate, on a Redis single node and a 3-node Redis Cluster that this
//! program starts on free loopback ports (and kills on exit).
//!
//! ```text
//! cargo run --release -p tq-backend-kv --features redis --example kv-bench -- [reps]
//! ```

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tq_backend_kv::codec::{encode_header, KeyScheme};
use tq_backend_kv::{
    DeleteCommand, KvOptions, KvStorageManager, KvStoreExt, KvValue, RedisOptions, RedisStore,
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

fn store(topo: Topo, urls: &[String], delete: DeleteCommand) -> Arc<RedisStore> {
    let o = RedisOptions {
        delete,
        op_timeout: Duration::from_secs(60),
        response_timeout: Duration::from_secs(30),
        ..Default::default()
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

/// Clear cost: µs/key for 512 and 1024 samples × 28 fields.
async fn clear_bench(topo: Topo, urls: &[String], reps: usize) {
    let label = match topo {
        Topo::Single => "single",
        Topo::Cluster => "cluster",
    };
    let mut per_key = std::collections::BTreeMap::new();
    for samples in [512usize, 1024] {
        let (meta, batch) = meta_and_batch(samples, 28, 16);
        let keys = samples * 28;
        for method in [
            "del",
            "unlink",
            "expire",
            "adapter-delete",
            "adapter-expire",
        ] {
            let mut t = Vec::new();
            for rep in 0..reps + 1 {
                let ns = format!("c{rep}{method}{samples}");
                let ttl = method == "adapter-expire" || method == "expire";
                let del = if method == "del" {
                    DeleteCommand::Del
                } else {
                    DeleteCommand::Unlink
                };
                let s = store(topo, urls, del);
                let m = KvStorageManager::new(
                    s.clone(),
                    KvOptions {
                        namespace: ns.clone(),
                        data_ttl: ttl.then_some(Duration::from_secs(3600)),
                        ..Default::default()
                    },
                )
                .unwrap();
                m.put(&meta, &batch).await.unwrap();
                let ks = KeyScheme::new(&ns, "bench");
                let cell_keys: Vec<String> = batch
                    .field_names()
                    .flat_map(|f| meta.samples().iter().map(move |s| (f, *s)))
                    .map(|(f, s)| ks.cell(s, f))
                    .collect();
                let t0 = Instant::now();
                match method {
                    "del" | "unlink" => s.delete_all(&cell_keys).await.unwrap(),
                    "expire" => s
                        .expire_all(&cell_keys, Duration::from_secs(1))
                        .await
                        .unwrap(),
                    _ => m.clear(&meta, &FieldFilter::All).await.unwrap(),
                }
                let dt = t0.elapsed();
                if rep > 0 {
                    t.push(dt.as_secs_f64() * 1e6 / keys as f64);
                }
                // Clean up outside the timed region.
                s.delete_all(&cell_keys).await.unwrap();
            }
            let (med, min, max) = stats(t);
            per_key.insert((method, samples), med);
            println!(
                "clear {label:7} {method:15} {samples:5} samples x 28 = {keys:6} keys: \
                 {med:6.3} us/key (min {min:.3}, max {max:.3})"
            );
        }
    }
    for method in [
        "del",
        "unlink",
        "expire",
        "adapter-delete",
        "adapter-expire",
    ] {
        let r = per_key[&(method, 1024)] * 1024.0 * 28.0 / (per_key[&(method, 512)] * 512.0 * 28.0);
        println!("clear {label:7} {method:15} 1024/512 wall-clock ratio: {r:.2}x");
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
    let s = store(topo, urls, DeleteCommand::Unlink);
    let m = KvStorageManager::new(s.clone(), KvOptions::default()).unwrap();
    // Raw: the same keys and the same encoded bytes (header + payload), built untimed.
    let ks = KeyScheme::new("raw", "bench");
    let mut raw_items = Vec::new();
    for (f, col) in batch.columns() {
        for (r, sid) in meta.samples().iter().enumerate() {
            let v = col.value(r);
            let mut buf = encode_header(&v).to_vec();
            buf.extend_from_slice(v.bytes());
            raw_items.push((ks.cell(*sid, f), bytes::Bytes::from(buf)));
        }
    }
    let raw_keys: Vec<String> = raw_items.iter().map(|(k, _)| k.clone()).collect();
    let raw_store = store(topo, urls, DeleteCommand::Unlink);
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
    clear_bench(Topo::Single, &urls, reps).await;
    throughput_bench(Topo::Single, &urls, reps).await;
    drop(single);
    let (servers, urls) = start_cluster();
    clear_bench(Topo::Cluster, &urls, reps).await;
    throughput_bench(Topo::Cluster, &urls, reps).await;
    drop(servers);
}
