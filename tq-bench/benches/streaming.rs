//! Criterion: streaming on the embedded deployment: a producer writes 1024 samples in 8 puts
//! of 128 while a consumer stream (batches of 128, acknowledged delivery) reads and
//! acknowledges them; one iteration is the time until the consumer has all 1024. The stream is
//! opened and the partition cleared outside the timed part. Next to it, a memcpy of the same
//! bytes: the cost of moving them once.
//! Run: `cargo bench -p tq-bench --bench streaming`

mod common;

use common::{criterion, memcpy, runtime, Workload, ROWS};
use futures::StreamExt;
use std::time::{Duration, Instant};

/// Puts per iteration; each writes `ROWS / PUTS` samples.
const PUTS: usize = 8;

fn main() {
    let mut c = criterion(3);
    let rt = runtime();
    let tq = tq::Client::embedded(tq::Config::default()).expect("embedded client");
    let w = Workload::new("simple-small");
    let chunk = tq_bench::workloads::by_name(w.name, ROWS / PUTS).expect("a workload");
    let fields: Vec<String> = w.batch.columns().keys().cloned().collect();
    let fields: Vec<&str> = fields.iter().map(String::as_str).collect();
    let mut g = w.group(&mut c, "streaming");
    memcpy(&mut g, &w);
    let mut round = 0u64;
    g.bench_function("produce+consume", |b| {
        b.iter_custom(|iters| {
            let mut timed = Duration::ZERO;
            for _ in 0..iters {
                // A consumer of its own per iteration, as a fresh trainer would be.
                round += 1;
                let task = format!("trainer-{round}");
                let p = tq.partition("stream");
                timed += rt.block_on(async {
                    let config = tq::StreamConfig::new(&task, &fields, ROWS / PUTS)
                        .acknowledged(Duration::from_secs(60))
                        .idle_timeout(Duration::from_secs(5));
                    let mut stream = p.stream(config).expect("a stream");
                    let t = Instant::now();
                    let producer = async {
                        for _ in 0..PUTS {
                            p.put_new(&chunk).await.expect("put");
                        }
                    };
                    let consumer = async {
                        let mut got = 0;
                        while got < ROWS {
                            let item = stream
                                .next()
                                .await
                                .expect("an item")
                                .unwrap_or_else(|e| panic!("after {got} samples: {e}"));
                            stream.ack(&item).await.expect("ack");
                            got += item.meta.len();
                        }
                    };
                    tokio::join!(producer, consumer);
                    let elapsed = t.elapsed();
                    drop(stream);
                    p.clear().await.expect("clear");
                    elapsed
                });
            }
            timed
        })
    });
    g.finish();
    c.final_summary();
}
