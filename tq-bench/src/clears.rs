//! The clear-28 workload: `kv_clear` of many small cells (512 and 1024 keys × 28 fields of
//! 1 KiB), each after a put and a get of the same keys, in one partition.
//!
//! A clear's cost is per cell (the controller hides and releases every sample with every field
//! the partition knows, the units drop every cell), so this workload is where a clear that
//! stopped being linear, or got a per-cell constant it should not have, shows first. The two
//! sizes are interleaved repetition by repetition, so a noisy stretch of the machine lands on
//! both; the report gives µs per cell and the 1024/512 ratio (2.0 when linear).

use crate::measure::Stats;
use std::time::{Duration, Instant};
use tq_client::Client;
use tq_core::{Batch, Column, DType, Result};

/// Fields per sample.
pub const FIELDS: usize = 28;
/// Bytes per cell.
pub const CELL_BYTES: usize = 1024;
/// The two batch sizes.
pub const SIZES: [usize; 2] = [512, 1024];

/// `rows` samples × [`FIELDS`] dense `u8[1024]` fields (`c0` .. `c27`), each field's bytes
/// distinct.
pub fn batch(rows: usize) -> Batch {
    let columns: Vec<(String, Column)> = (0..FIELDS)
        .map(|f| {
            let column = crate::workloads::dense(DType::U8, rows, CELL_BYTES, 1000 + f as u64);
            (format!("c{f}"), column)
        })
        .collect();
    Batch::from_columns(columns).expect("equal rows")
}

/// The clear times of one size.
#[derive(Debug, Clone, Copy)]
pub struct SizeReport {
    pub samples: usize,
    pub clear: Stats,
}

impl SizeReport {
    pub fn cells(&self) -> usize {
        self.samples * FIELDS
    }

    /// µs per cell at the median.
    pub fn us_per_cell(&self) -> f64 {
        self.clear.median.as_secs_f64() * 1e6 / self.cells() as f64
    }
}

/// Both sizes' figures.
#[derive(Debug, Clone, Copy)]
pub struct ClearReport {
    pub small: SizeReport,
    pub large: SizeReport,
}

impl ClearReport {
    /// Median clear of 1024 over median clear of 512 (2.0 when linear).
    pub fn ratio(&self) -> f64 {
        self.large.clear.median.as_secs_f64() / self.small.clear.median.as_secs_f64()
    }

    /// Markdown rows for [`TABLE_HEADER`], `deployment` naming the column's deployment.
    pub fn rows(&self, deployment: &str) -> String {
        [self.small, self.large]
            .iter()
            .map(|s| {
                format!(
                    "| {deployment} | {} × {FIELDS} | {:.3} ({:.3}–{:.3}) | {:.3} |",
                    s.samples,
                    s.clear.median.as_secs_f64() * 1e3,
                    s.clear.min.as_secs_f64() * 1e3,
                    s.clear.max.as_secs_f64() * 1e3,
                    s.us_per_cell()
                )
            })
            .chain(std::iter::once(format!(
                "| {deployment} | 1024 / 512 | {:.2} × | |",
                self.ratio()
            )))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Markdown header of [`ClearReport::rows`].
pub const TABLE_HEADER: &str =
    "| deployment | keys × fields | kv_clear ms median (min–max) | µs per cell |\n|---|---|---|---|";

/// One put → get → clear of `keys`, timing the clear; checks the get returned every key.
async fn round(tq: &Client, keys: &[String], batch: &Batch) -> Result<Duration> {
    let p = tq.partition("bench-clear-28");
    p.kv_batch_put(keys, batch, None).await?;
    let back = p.kv_batch_get(keys, None).await?;
    if back.len() != keys.len() || back.columns().len() != FIELDS {
        return Err(tq_core::Error::internal(format!(
            "clear-28: read back {} rows × {} fields, wrote {} × {FIELDS}",
            back.len(),
            back.columns().len(),
            keys.len()
        )));
    }
    drop(back);
    let t = Instant::now();
    p.kv_clear(keys).await?;
    Ok(t.elapsed())
}

/// `reps` clears of each size (after one untimed round of each), the sizes interleaved.
pub fn run(runtime: &tokio::runtime::Runtime, tq: &Client, reps: usize) -> Result<ClearReport> {
    let inputs: Vec<(Vec<String>, Batch)> = SIZES
        .iter()
        .map(|&n| (crate::workloads::keys(n), batch(n)))
        .collect();
    let mut times: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
    runtime.block_on(async {
        for (keys, batch) in &inputs {
            round(tq, keys, batch).await?;
        }
        for _ in 0..reps.max(1) {
            for ((keys, batch), t) in inputs.iter().zip(times.iter_mut()) {
                t.push(round(tq, keys, batch).await?);
            }
        }
        Ok::<_, tq_core::Error>(())
    })?;
    let [small, large] = [0, 1].map(|i| SizeReport {
        samples: SIZES[i],
        clear: Stats::from_samples(std::mem::take(&mut times[i])),
    });
    Ok(ClearReport { small, large })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_batch_has_28_fields_of_1_kib_per_sample() {
        let b = batch(3);
        assert_eq!(b.len(), 3);
        assert_eq!(b.columns().len(), FIELDS);
        assert_eq!(b.nbytes(), 3 * FIELDS * CELL_BYTES);
    }
}
