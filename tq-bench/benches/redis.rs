//! Criterion: the KV backend on Redis and on a 3-master Redis Cluster, each started by this
//! benchmark on free loopback ports and stopped at the end of its group: put, get and clear
//! next to the same cells written with pipelined `MSET`, read with `MGET` and removed with
//! `DEL` through the store directly (`raw-mset`, `raw-mget`, `raw-del`).
//! Run: `cargo bench -p tq-bench --bench redis [-- redis-cluster]` (needs `redis-server` and
//! `redis-cli` on the PATH)

mod common;
#[path = "../../tq-backend-kv/tests/common/mod.rs"]
mod redis_servers;

use common::{criterion, put_get_clear, runtime, Workload};
use criterion::measurement::WallTime;
use criterion::BenchmarkGroup;
use redis_servers::{RedisCluster, RedisServer};
use std::time::{Duration, Instant};
use tq_bench::kv_raw::RawKv;

fn raw_baseline(
    g: &mut BenchmarkGroup<'_, WallTime>,
    rt: &tokio::runtime::Runtime,
    url: &str,
    w: &Workload,
) {
    let raw = RawKv::open(url).expect("the raw store");
    let cells = raw.cells(&w.batch);
    g.bench_function("raw-mset", |b| {
        b.iter_custom(|iters| {
            let mut timed = Duration::ZERO;
            for _ in 0..iters {
                let t = Instant::now();
                rt.block_on(raw.put(&cells)).expect("mset");
                timed += t.elapsed();
                rt.block_on(raw.delete(&cells)).expect("del");
            }
            timed
        })
    });
    rt.block_on(raw.put(&cells)).expect("mset");
    g.bench_function("raw-mget", |b| {
        b.iter(|| rt.block_on(raw.get(&cells)).expect("mget"))
    });
    g.bench_function("raw-del", |b| {
        b.iter_custom(|iters| {
            let mut timed = Duration::ZERO;
            for _ in 0..iters {
                rt.block_on(raw.put(&cells)).expect("mset");
                let t = Instant::now();
                rt.block_on(raw.delete(&cells)).expect("del");
                timed += t.elapsed();
            }
            timed
        })
    });
    rt.block_on(raw.delete(&cells)).expect("del");
}

fn kv_client(url: &str) -> tq::Client {
    let config = tq::Config::from_toml(&format!(
        "[storage]\nbackend = \"kv\"\n[storage.kv]\nstores = [{{ url = \"{url}\" }}]\n"
    ))
    .expect("configuration");
    tq::Client::embedded(config).expect("embedded client on Redis")
}

fn main() {
    let mut c = criterion(3);
    let rt = runtime();
    let w = Workload::new("simple-small");
    {
        let server = RedisServer::start();
        let url = server.url();
        let tq = kv_client(&url);
        let mut g = w.group(&mut c, "redis");
        raw_baseline(&mut g, &rt, &url, &w);
        put_get_clear(&mut g, &rt, &tq, &w);
        g.finish();
    }
    {
        let cluster = RedisCluster::start();
        let hosts: Vec<String> = cluster
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let url = format!("redis+cluster://{}", hosts.join(","));
        let tq = kv_client(&url);
        let mut g = w.group(&mut c, "redis-cluster");
        raw_baseline(&mut g, &rt, &url, &w);
        put_get_clear(&mut g, &rt, &tq, &w);
        g.finish();
    }
    c.final_summary();
}
