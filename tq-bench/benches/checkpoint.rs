//! Criterion: a checkpoint of a 1 GiB batch (simple-large, 1024 samples x 4 fields of 256 KiB)
//! held by in-memory storage units — save (hold, controller state, capture, `.cells` files
//! written and fsynced) and load (read, CRC, decode, cells into empty units, restore) — next to
//! writing (with fsync) and reading the same bytes as files of the same size with std::fs.
//!
//! With feature `redis` (on by default), a second group: a checkpoint that copies KV payloads
//! (`copy_payloads`) of 256 MiB (simple-large x 256) from a redis-server this benchmark starts
//! on a free loopback port — save (snapshot with the hold, every cell read with pipelined
//! `MGET`s, `.pages` files written and fsynced) next to raw `MGET`s of the same cells plus the
//! std::fs write of the values; load (read, checks, restore, every cell written back) next to
//! the std::fs read plus raw `MSET`s of the same cells.
//! Run: `cargo bench -p tq-bench --bench checkpoint [-- copied]` (the second group needs
//! `redis-server` on the PATH)

mod common;
#[cfg(feature = "redis")]
#[path = "../../tq-backend-kv/tests/common/mod.rs"]
mod redis_servers;

use common::runtime;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use std::io::Write;
use std::time::Duration;
use tq::checkpoint::Checkpoints;
use tq::{Client, Config};
use tq_bench::workloads;

const ROWS: usize = 1024;
/// The size of a `.cells` file (the checkpoint's page), for the baseline's files.
const FILE_BYTES: usize = 64 << 20;

fn embedded() -> Client {
    let mut config = Config::default();
    config.storage.num_units = 2;
    Client::embedded(config).unwrap()
}

/// The baseline's write: the bytes as files of `FILE_BYTES`, each written, fsynced and
/// renamed into place, then the previous round's files removed (as a save does).
fn write_files(dir: &std::path::Path, round: usize, parts: &[tq::Bytes]) {
    let mut file_no = 0;
    let mut i = 0;
    while i < parts.len() {
        let path = dir.join(format!("raw-{round}-{file_no}.bin"));
        let tmp = path.with_extension("tmp");
        let mut f = std::fs::File::create(&tmp).unwrap();
        let mut written = 0;
        while i < parts.len() && (written == 0 || written + parts[i].len() <= FILE_BYTES) {
            f.write_all(&parts[i]).unwrap();
            written += parts[i].len();
            i += 1;
        }
        f.sync_all().unwrap();
        drop(f);
        std::fs::rename(&tmp, &path).unwrap();
        file_no += 1;
    }
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_str().unwrap().to_string();
        if name.starts_with("raw-") && !name.starts_with(&format!("raw-{round}-")) {
            std::fs::remove_file(p).unwrap();
        }
    }
}

fn read_files(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| std::fs::read(e.unwrap().path()).unwrap().len())
        .sum()
}

fn bench(c: &mut Criterion) {
    let rt = runtime();
    let batch = workloads::by_name("simple-large", ROWS).unwrap();
    let keys = workloads::keys(ROWS);
    let source = embedded();
    rt.block_on(source.partition("p").kv_batch_put(&keys, &batch, None))
        .unwrap();
    // The baseline writes the same bytes, cell by cell, as the save does.
    let parts: Vec<tq::Bytes> = batch
        .columns()
        .values()
        .flat_map(|c| match c {
            tq::Column::Dense(t) => (0..t.rows())
                .map(|r| t.row(r).data().clone())
                .collect::<Vec<_>>(),
            _ => unreachable!("simple-large is dense"),
        })
        .collect();
    let total: u64 = parts.iter().map(|p| p.len() as u64).sum();
    eprintln!(
        "checkpoint of {ROWS} samples: {:.1} MiB of cells",
        total as f64 / (1 << 20) as f64
    );

    let root = std::env::temp_dir().join(format!("tq-bench-checkpoint-{}", std::process::id()));
    let ckpt = root.join("checkpoint");
    let raw = root.join("raw");
    std::fs::create_dir_all(&raw).unwrap();

    let mut g = c.benchmark_group("checkpoint 1 GiB (simple-large x 1024)");
    g.sample_size(10);
    g.warm_up_time(Duration::from_secs(1));
    g.measurement_time(Duration::from_secs(20));
    g.throughput(Throughput::Bytes(total));
    g.bench_function(
        "save (hold + state + capture + .cells written, fsynced)",
        |b| b.iter(|| rt.block_on(source.save_checkpoint(&ckpt)).unwrap()),
    );
    let mut round = 0;
    g.bench_function("baseline: std::fs write + fsync, 64 MiB files", |b| {
        b.iter(|| {
            round += 1;
            write_files(&raw, round, &parts)
        })
    });
    g.bench_function(
        "load (read + CRC + decode + cells into units + restore)",
        |b| {
            b.iter_batched(
                embedded,
                |fresh| {
                    rt.block_on(fresh.load_checkpoint(&ckpt)).unwrap();
                    // Dropped after the timing: freeing 1 GiB is not part of a load.
                    fresh
                },
                BatchSize::PerIteration,
            )
        },
    );
    g.bench_function("baseline: std::fs read, 64 MiB files", |b| {
        b.iter(|| assert_eq!(read_files(&raw) as u64, total))
    });
    g.finish();
    let _ = std::fs::remove_dir_all(&root);
}

/// Checkpoints that copy KV payloads out of Redis and back (see the module docs).
#[cfg(feature = "redis")]
fn bench_copied(c: &mut Criterion) {
    const COPIED_ROWS: usize = 256;
    let rt = runtime();
    let redis = redis_servers::RedisServer::start();
    let on_redis = || {
        let config = Config::from_toml(&format!(
            "[storage]\nbackend = \"kv\"\n[storage.kv]\nstores = [{{ url = \"{}\" }}]\n",
            redis.url()
        ))
        .unwrap();
        Client::embedded(config).unwrap()
    };
    let batch = workloads::by_name("simple-large", COPIED_ROWS).unwrap();
    let keys = workloads::keys(COPIED_ROWS);
    let source = on_redis();
    rt.block_on(source.partition("p").kv_batch_put(&keys, &batch, None))
        .unwrap();
    let raw = tq_bench::kv_raw::RawKv::open(&redis.url()).unwrap();
    let cells = raw.cells(&batch);
    rt.block_on(raw.put(&cells)).unwrap();
    let values = rt.block_on(raw.get_values(&cells)).unwrap();
    let total: u64 = values.iter().map(|v| v.len() as u64).sum();
    eprintln!(
        "checkpoint with copied KV payloads, {COPIED_ROWS} samples: {:.1} MiB of cells ({})",
        total as f64 / (1 << 20) as f64,
        raw.describe()
    );
    let root = std::env::temp_dir().join(format!("tq-bench-copied-{}", std::process::id()));
    let ckpt = root.join("checkpoint");
    let ckpt_url = ckpt.to_str().unwrap().to_string();
    let raw_dir = root.join("raw");
    std::fs::create_dir_all(&raw_dir).unwrap();
    let copy = tq::checkpoint::CheckpointOptions {
        copy_payloads: true,
    };

    let mut g =
        c.benchmark_group("checkpoint copied KV payloads 256 MiB (redis, simple-large x 256)");
    g.sample_size(10);
    g.warm_up_time(Duration::from_secs(1));
    g.measurement_time(Duration::from_secs(15));
    g.throughput(Throughput::Bytes(total));
    g.bench_function(
        "save --copy-payloads (hold + state + MGET + .pages fsynced)",
        |b| {
            b.iter(|| {
                rt.block_on(source.save_checkpoint_with(&ckpt_url, copy))
                    .unwrap()
            })
        },
    );
    let mut round = 0;
    g.bench_function("baseline: raw MGET + std::fs write + fsync", |b| {
        b.iter(|| {
            round += 1;
            let got = rt.block_on(raw.get_values(&cells)).unwrap();
            write_files(&raw_dir, round, &got)
        })
    });
    g.bench_function("load (read + checks + restore + cells written back)", |b| {
        b.iter_batched(
            on_redis,
            |fresh| {
                rt.block_on(fresh.load_checkpoint(&ckpt)).unwrap();
                fresh
            },
            BatchSize::PerIteration,
        )
    });
    g.bench_function("baseline: std::fs read + raw MSET", |b| {
        b.iter(|| {
            assert_eq!(read_files(&raw_dir) as u64, total);
            rt.block_on(raw.put(&cells)).unwrap()
        })
    });
    g.finish();
    let _ = std::fs::remove_dir_all(&root);
}

#[cfg(not(feature = "redis"))]
fn bench_copied(_: &mut Criterion) {}

criterion_group!(benches, bench, bench_copied);
criterion_main!(benches);
