//! Round-trip latency of one small `kv_put` followed by `kv_batch_get` of the same key.

use std::time::{Duration, Instant};
use tq_client::Client;
use tq_core::{Batch, Column, DType, Result, Tensor};

/// Percentiles of a set of durations.
#[derive(Debug, Clone, Copy)]
pub struct Percentiles {
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
}

impl Percentiles {
    pub fn of(mut v: Vec<Duration>) -> Percentiles {
        v.sort_unstable();
        let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
        Percentiles {
            p50: at(0.5),
            p99: at(0.99),
            max: v[v.len() - 1],
        }
    }
}

/// One sample of one 4 KiB field `x`: the payload of the latency rounds.
pub fn sample_4k() -> Result<Batch> {
    let bytes = tq_core::Bytes::from(vec![7u8; 4096]);
    Batch::from_columns([(
        "x",
        Column::Dense(Tensor::new(DType::U8, vec![1, 4096], bytes)?),
    )])
}

/// `rounds` times: put one 4 KiB sample under one key, then read it back. Returns each pair's
/// duration (after 50 untimed warm-up rounds).
pub async fn put_get(tq: &Client, rounds: usize) -> Result<Vec<Duration>> {
    let one = sample_4k()?;
    let mut times = Vec::with_capacity(rounds);
    for i in 0..rounds + 50 {
        let t = Instant::now();
        tq.partition("latency").kv_put("k", &one, None).await?;
        let back = tq.partition("latency").kv_batch_get(&["k"], None).await?;
        let d = t.elapsed();
        debug_assert_eq!(back.len(), 1);
        if i >= 50 {
            times.push(d);
        }
    }
    tq.partition("latency").kv_clear(&["k"]).await?;
    Ok(times)
}

/// [`put_get`] through two clients, `rounds` each, in alternating blocks of up to 100 (first
/// `a`, then `b`), so that a noisy stretch of the machine does not land on one of them only.
pub async fn put_get_alternating(
    a: &Client,
    b: &Client,
    rounds: usize,
) -> Result<(Vec<Duration>, Vec<Duration>)> {
    let (mut over_a, mut over_b) = (Vec::new(), Vec::new());
    let block = rounds.clamp(1, 100);
    for _ in 0..rounds.div_ceil(block) {
        over_a.extend(put_get(a, block).await?);
        over_b.extend(put_get(b, block).await?);
    }
    Ok((over_a, over_b))
}
