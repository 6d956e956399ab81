//! Criterion: embedded kv_batch_put / kv_batch_get of the simple workloads, next to a memcpy of
//! the same bytes (criterion prints each one's throughput; compare within one run).
//! Run: `cargo bench -p tq-bench --bench embedded`

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use std::time::Duration;
use tq_bench::{measure::copy_batch, workloads};
use tq_client::{Client, Config};

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    for name in ["simple-small", "simple-medium", "simple-large"] {
        let batch = workloads::by_name(name, 1024).unwrap();
        let keys = workloads::keys(batch.len());
        let tq = Client::embedded(Config::default()).unwrap();
        let mut g = c.benchmark_group(format!("embedded/{name}"));
        g.throughput(Throughput::Bytes(batch.nbytes() as u64));
        g.sample_size(10);
        g.measurement_time(Duration::from_secs(5));
        g.bench_function("memcpy", |b| b.iter(|| copy_batch(&batch)));
        g.bench_function("put", |b| {
            b.iter_batched(
                || (),
                |_| {
                    rt.block_on(async {
                        tq.partition("bench")
                            .kv_batch_put(&keys, &batch, None)
                            .await
                            .unwrap();
                    })
                },
                BatchSize::PerIteration,
            )
        });
        rt.block_on(tq.partition("bench").kv_batch_put(&keys, &batch, None))
            .unwrap();
        g.bench_function("get", |b| {
            b.iter(|| {
                rt.block_on(tq.partition("bench").kv_batch_get(&keys, None))
                    .unwrap()
            })
        });
        g.finish();
        rt.block_on(tq.partition("bench").kv_clear(&keys)).unwrap();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
