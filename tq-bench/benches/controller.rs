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
}

criterion_group!(benches, bench);
criterion_main!(benches);
