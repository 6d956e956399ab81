//! Repetitions with a warm-up, reported as median, min and max.

use std::time::{Duration, Instant};

/// Timing of repeated runs.
#[derive(Debug, Clone, Copy)]
pub struct Stats {
    pub median: Duration,
    pub min: Duration,
    pub max: Duration,
}

impl Stats {
    pub fn from_samples(mut v: Vec<Duration>) -> Stats {
        assert!(!v.is_empty(), "at least one repetition");
        v.sort_unstable();
        Stats {
            median: v[v.len() / 2],
            min: v[0],
            max: v[v.len() - 1],
        }
    }

    /// Payload Gbit/s (decimal) at the median.
    pub fn gbit_per_s(&self, bytes: usize) -> f64 {
        bytes as f64 * 8.0 / 1e9 / self.median.as_secs_f64()
    }

    /// Items per second at the median.
    pub fn per_s(&self, items: usize) -> f64 {
        items as f64 / self.median.as_secs_f64()
    }
}

/// Runs `f` `warmup` times untimed, then `reps` times timed.
pub fn measure(warmup: usize, reps: usize, mut f: impl FnMut()) -> Stats {
    for _ in 0..warmup {
        f();
    }
    let v = (0..reps.max(1))
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect();
    Stats::from_samples(v)
}

/// Runs `round` `warmup` times, then `reps` times, keeping the times the timed rounds report
/// (a round that times only part of itself: an untimed clear after it, say); stops at the
/// first error.
pub fn measure_rounds(
    warmup: usize,
    reps: usize,
    mut round: impl FnMut() -> tq_core::Result<Duration>,
) -> tq_core::Result<Stats> {
    for _ in 0..warmup {
        round()?;
    }
    let v = (0..reps.max(1))
        .map(|_| round())
        .collect::<tq_core::Result<Vec<Duration>>>()?;
    Ok(Stats::from_samples(v))
}

/// Current and peak resident set size of this process, from `/proc/self/status`.
pub fn rss_bytes() -> (Option<u64>, Option<u64>) {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return (None, None);
    };
    let read = |key: &str| {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .map(|kib| kib * 1024)
    };
    (read("VmRSS:"), read("VmHWM:"))
}

/// The memcpy baseline: copy every payload buffer of `batch` into new buffers, holding all
/// copies until the whole batch is copied (as a reader holds a batch it got), then free them.
/// Returns the bytes copied.
pub fn copy_batch(batch: &tq_core::Batch) -> usize {
    // Each copy goes into the same kind of buffer tq packs a read into (`tq_core::buffer`:
    // recycled by its pool from 64 KiB, huge pages when large), so the baseline pays no page
    // faults that tq avoids: it is the floor of moving the bytes once in memory.
    let copy = |b: &[u8]| tq_core::buffer::concatenated(std::iter::once(b));
    let mut copies: Vec<tq_core::Bytes> = Vec::new();
    for col in batch.columns().values() {
        match col {
            tq_core::Column::Dense(t) => copies.push(copy(t.data())),
            tq_core::Column::Ragged(v) => copies.extend(v.iter().map(|t| copy(t.data()))),
            tq_core::Column::Objects(v) => copies.extend(v.iter().map(|b| copy(b))),
        }
    }
    std::hint::black_box(&copies);
    copies.iter().map(|b| b.len()).sum()
}
