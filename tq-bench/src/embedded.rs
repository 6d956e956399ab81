//! Embedded put/get/clear throughput of a workload, next to a memcpy of the same bytes.

use crate::measure::{copy_batch, measure, rss_bytes, Stats};
use crate::workloads;
use std::time::Instant;
use tq_client::{Client, Config};
use tq_core::{Batch, Result};

/// One workload's figures.
#[derive(Debug, Clone)]
pub struct EmbeddedReport {
    pub workload: String,
    pub samples: usize,
    pub cells: usize,
    pub bytes: usize,
    pub memcpy: Stats,
    pub put: Stats,
    pub get: Stats,
    pub clear: Stats,
    /// RSS with the workload built but nothing stored, right after the last put, and after
    /// the last clear (bytes).
    pub rss_before: Option<u64>,
    pub rss_after_put: Option<u64>,
    pub rss_after_clear: Option<u64>,
}

/// Runs `reps` iterations of put → get → clear of `batch` under keys `key_{i}`, after one
/// untimed, verified iteration.
pub fn run(
    runtime: &tokio::runtime::Runtime,
    config: Config,
    name: &str,
    batch: &Batch,
    reps: usize,
) -> Result<EmbeddedReport> {
    let tq = Client::embedded(config)?;
    let keys = workloads::keys(batch.len());
    let partition = "bench";
    // Warm-up and the one verification, outside the timed region.
    runtime.block_on(async {
        tq.kv_batch_put(partition, &keys, Some(batch), None).await?;
        let back = tq.kv_batch_get(partition, &keys, None).await?;
        if &back != batch {
            return Err(tq_core::Error::internal(format!(
                "{name}: data read back differs from data written"
            )));
        }
        tq.kv_clear(partition, &keys, None).await
    })?;
    let rss_before = rss_bytes().0;
    let memcpy = measure(1, reps, || {
        std::hint::black_box(copy_batch(batch));
    });
    let (mut put, mut get, mut clear) = (Vec::new(), Vec::new(), Vec::new());
    let (mut rss_after_put, mut rss_after_clear) = (None, None);
    for _ in 0..reps.max(1) {
        runtime.block_on(async {
            let t = Instant::now();
            tq.kv_batch_put(partition, &keys, Some(batch), None).await?;
            put.push(t.elapsed());
            rss_after_put = rss_bytes().0;
            let t = Instant::now();
            let back = tq.kv_batch_get(partition, &keys, None).await?;
            get.push(t.elapsed());
            drop(std::hint::black_box(back));
            let t = Instant::now();
            tq.kv_clear(partition, &keys, None).await?;
            clear.push(t.elapsed());
            rss_after_clear = rss_bytes().0;
            Ok::<_, tq_core::Error>(())
        })?;
    }
    Ok(EmbeddedReport {
        workload: name.to_string(),
        samples: batch.len(),
        cells: workloads::cells(batch),
        bytes: batch.nbytes(),
        memcpy,
        put: Stats::from_samples(put),
        get: Stats::from_samples(get),
        clear: Stats::from_samples(clear),
        rss_before,
        rss_after_put,
        rss_after_clear,
    })
}

fn ms(s: &Stats) -> String {
    format!(
        "{:.2} ({:.2}–{:.2})",
        s.median.as_secs_f64() * 1e3,
        s.min.as_secs_f64() * 1e3,
        s.max.as_secs_f64() * 1e3
    )
}

fn mib(b: Option<u64>) -> String {
    b.map(|b| format!("{:.0}", b as f64 / 1048576.0))
        .unwrap_or_else(|| "n/a".into())
}

/// Markdown table header for [`EmbeddedReport::row`].
pub const TABLE_HEADER: &str = "| workload | op | ms median (min–max) | Gbit/s | Mcells/s | × memcpy |\n|---|---|---|---|---|---|";

impl EmbeddedReport {
    /// Markdown rows: memcpy, put, get, clear.
    pub fn rows(&self) -> String {
        let base = self.memcpy.gbit_per_s(self.bytes);
        let line = |op: &str, s: &Stats| {
            let g = s.gbit_per_s(self.bytes);
            format!(
                "| {} | {op} | {} | {:.2} | {:.2} | {:.2} |",
                self.workload,
                ms(s),
                g,
                s.per_s(self.cells) / 1e6,
                g / base
            )
        };
        [
            line("memcpy", &self.memcpy),
            line("put", &self.put),
            line("get", &self.get),
            line("clear", &self.clear),
        ]
        .join("\n")
    }

    /// One line on memory.
    pub fn memory_line(&self) -> String {
        format!(
            "{}: RSS with the workload built {} MiB, after put {} MiB, after clear {} MiB (payload {:.0} MiB)",
            self.workload,
            mib(self.rss_before),
            mib(self.rss_after_put),
            mib(self.rss_after_clear),
            self.bytes as f64 / 1048576.0
        )
    }
}
