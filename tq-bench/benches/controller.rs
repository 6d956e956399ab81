//! Criterion: the controller's metadata cost for one batch (no payload), in process and over
//! loopback, next to the bookkeeping floor of the same batch (one hash-map insert per cell); and
//! one fetch of 8 by partition size, next to taking 8 entries off an ordered set of that size.
//! Run: `cargo bench -p tq-bench --bench controller`

mod common;

use common::criterion;
use criterion::Throughput;
use std::collections::HashMap;
use std::io::Write;
use std::time::Duration;
use tq_bench::controller;

const SAMPLES: usize = 1024;
const FIELDS: usize = 28;

fn main() {
    let mut c = criterion(3);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut g = c.benchmark_group("controller");
    g.throughput(Throughput::Elements((SAMPLES * FIELDS) as u64));
    g.bench_function("hashmap-insert 1024x28", |b| {
        b.iter(|| {
            let mut m = HashMap::with_capacity(SAMPLES * FIELDS);
            for s in 0..SAMPLES as u32 {
                for f in 0..FIELDS as u32 {
                    m.insert((s, f), true);
                }
            }
            m
        })
    });
    g.bench_function("allocate+notify+fetch 1024x28", |b| {
        b.iter_custom(|iters| {
            let s = controller::allocate_notify_fetch(&rt, SAMPLES, FIELDS, iters as usize)
                .expect("rounds");
            // The harness timed each round alone (the untimed clear between them excluded).
            s.median * iters as u32
        })
    });
    g.bench_function("allocate+notify+fetch 1024x28, tagged", |b| {
        b.iter_custom(|iters| {
            let s = controller::allocate_notify_fetch_tagged(&rt, SAMPLES, FIELDS, iters as usize)
                .expect("rounds");
            s.median * iters as u32
        })
    });
    g.bench_function("kv_retrieve_meta 1024 keys", |b| {
        b.iter_custom(|iters| {
            let s = controller::kv_retrieve_meta(&rt, SAMPLES, 4, iters as usize).expect("rounds");
            s.median * iters as u32
        })
    });
    g.finish();

    // The same round through a controller server on loopback, state in memory vs on disk
    // (`--state-dir`: every change durable before it is answered).
    let dir = tempfile::tempdir().expect("a temp dir");
    let state = dir.path().join("state");
    let mut g = c.benchmark_group("controller over loopback");
    g.throughput(Throughput::Elements((SAMPLES * FIELDS) as u64));
    g.measurement_time(Duration::from_secs(5));
    g.bench_function("allocate+notify+fetch 1024x28, in memory", |b| {
        b.iter_custom(|iters| {
            let s = controller::remote_allocate_notify_fetch(
                &rt,
                SAMPLES,
                FIELDS,
                iters as usize,
                None,
            )
            .expect("rounds");
            s.median * iters as u32
        })
    });
    g.bench_function("allocate+notify+fetch 1024x28, state dir", |b| {
        b.iter_custom(|iters| {
            let _ = std::fs::remove_dir_all(&state);
            let s = controller::remote_allocate_notify_fetch(
                &rt,
                SAMPLES,
                FIELDS,
                iters as usize,
                Some(&state),
            )
            .expect("rounds");
            s.median * iters as u32
        })
    });
    // The disk's floor for that round: its three commits as three appends of a record's size
    // (the log grows 25–30 KB per commit of this round) each made durable with `fdatasync`.
    let log = dir.path().join("baseline.log");
    g.bench_function("baseline: 3 x (append 28 KiB + fdatasync)", |b| {
        let record = vec![7u8; 28 << 10];
        let mut f = std::fs::File::create(&log).expect("a log file");
        b.iter(|| {
            for _ in 0..3 {
                f.write_all(&record).expect("append");
                f.sync_data().expect("fdatasync");
            }
        })
    });
    g.finish();

    // One fetch of 8 by partition size: it should cost the batch, not the partition. The
    // floor: taking 8 entries off the front of a BTreeSet of the same size and putting them back.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let mut g = c.benchmark_group("controller fetch(8) by partition size");
    for n in [4096usize, 16_384, 65_536] {
        g.bench_function(format!("fetch(8) from {n}"), |b| {
            b.iter_custom(|iters| {
                let s =
                    tq_bench::scale::fetch_cost(&runtime, n, 8, iters as usize).expect("fetches");
                s.median * iters as u32
            })
        });
        let mut set: std::collections::BTreeSet<u64> = (0..n as u64).collect();
        g.bench_function(format!("baseline: 8 off a BTreeSet of {n} and back"), |b| {
            b.iter(|| {
                let taken: Vec<u64> = (0..8).filter_map(|_| set.pop_first()).collect();
                set.extend(taken.iter().copied());
                taken
            })
        });
    }
    g.finish();
    c.final_summary();
}
