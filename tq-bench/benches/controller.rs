//! Criterion: controller metadata cost for one batch (no payload).
//! Run: `cargo bench -p tq-bench --bench controller`

use criterion::{criterion_group, criterion_main, Criterion};
use std::time::Duration;
use tq_bench::controller;

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut g = c.benchmark_group("controller");
    g.measurement_time(Duration::from_secs(3));
    g.bench_function("allocate+notify+fetch 1024x28", |b| {
        b.iter_custom(|iters| {
            let s = controller::allocate_notify_fetch(&rt, 1024, 28, iters as usize).unwrap();
            // iter_custom wants the total; the harness measured each round individually.
            s.median * iters as u32
        })
    });
    g.bench_function("kv_retrieve_meta 1024 keys", |b| {
        b.iter_custom(|iters| {
            let s = controller::kv_retrieve_meta(&rt, 1024, 4, iters as usize).unwrap();
            s.median * iters as u32
        })
    });
    g.finish();

    // The same round through a controller server on loopback, state in memory vs on disk
    // (`--state-dir`: every change durable before it is answered).
    let dir = std::env::temp_dir().join(format!("tq-bench-state-{}", std::process::id()));
    let mut g = c.benchmark_group("controller over loopback");
    g.measurement_time(Duration::from_secs(5));
    g.sample_size(20);
    g.bench_function("allocate+notify+fetch 1024x28, in memory", |b| {
        b.iter_custom(|iters| {
            let s = controller::remote_allocate_notify_fetch(&rt, 1024, 28, iters as usize, None)
                .unwrap();
            s.median * iters as u32
        })
    });
    g.bench_function("allocate+notify+fetch 1024x28, state dir", |b| {
        b.iter_custom(|iters| {
            let _ = std::fs::remove_dir_all(&dir);
            let s =
                controller::remote_allocate_notify_fetch(&rt, 1024, 28, iters as usize, Some(&dir))
                    .unwrap();
            s.median * iters as u32
        })
    });
    g.finish();
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, bench);
criterion_main!(benches);
