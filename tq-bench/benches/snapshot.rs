//! Criterion: a controller snapshot (checkpoint) and its restore, for the metadata of 1 million
//! keyed samples, next to writing (with fsync) and reading the same bytes with std::fs.
//! Run: `cargo bench -p tq-bench --bench snapshot`

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;
use tq_bench::controller;
use tq_controller::{Controller, ControllerConfig, StateDir};

const SAMPLES: usize = 1_000_000;

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let source = controller::populated(&rt, SAMPLES, 4).unwrap();
    let (bytes, counts) = source.snapshot().unwrap();
    assert_eq!(counts.samples as usize, SAMPLES);
    eprintln!(
        "snapshot of {SAMPLES} samples x 4 fields: {:.1} MiB",
        bytes.len() as f64 / (1 << 20) as f64
    );
    let dir = std::env::temp_dir().join(format!("tq-bench-snapshot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("controller.state");

    let mut g = c.benchmark_group("snapshot 1M samples");
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(10));
    g.throughput(Throughput::Bytes(bytes.len() as u64));
    g.bench_function("snapshot (encode + CRC)", |b| {
        b.iter(|| source.snapshot().unwrap().0.len())
    });
    g.bench_function("restore (CRC + decode) into an empty controller", |b| {
        b.iter_batched(
            || Controller::new(ControllerConfig::default()).unwrap(),
            |fresh| {
                fresh.restore(&bytes).unwrap();
                // Dropped after the timing: freeing 1 million samples is not part of a restore.
                fresh
            },
            BatchSize::PerIteration,
        )
    });
    // What a restart after kill -9 waits for: `tq controller --state-dir` opening a directory
    // whose snapshot holds the 1 million samples (read + restore + an empty log).
    let state_dir = dir.join("state-dir");
    std::fs::create_dir_all(&state_dir).unwrap();
    std::fs::write(state_dir.join("controller.state"), &bytes).unwrap();
    g.bench_function("state dir: open after a kill (read + restore)", |b| {
        b.iter_batched(
            || Arc::new(Controller::new(ControllerConfig::default()).unwrap()),
            |fresh| {
                let state = StateDir::open(&state_dir, fresh.clone()).unwrap();
                (state, fresh)
            },
            BatchSize::PerIteration,
        )
    });
    g.bench_function("baseline: std::fs write + fsync of the same bytes", |b| {
        b.iter(|| {
            let mut f = std::fs::File::create(&path).unwrap();
            f.write_all(&bytes).unwrap();
            f.sync_all().unwrap();
        })
    });
    g.bench_function("baseline: std::fs read of the same bytes", |b| {
        b.iter(|| std::fs::read(&path).unwrap().len())
    });
    g.finish();
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, bench);
criterion_main!(benches);
