//! KV put/get/clear throughput of a workload through a [`Client`] (embedded or remote), next to
//! baselines measured in the same run on the same bytes.

use crate::measure::{rss_bytes, Stats};
use crate::workloads;
use std::time::Instant;
use tq_client::Client;
use tq_core::{Batch, Bytes, Column, Result, Tensor};

/// A baseline: what moving the workload's bytes costs without tq.
#[derive(Debug, Clone)]
pub struct Baseline {
    pub name: String,
    pub stats: Stats,
}

/// One workload's figures.
#[derive(Debug, Clone)]
pub struct KvReport {
    pub workload: String,
    pub samples: usize,
    pub cells: usize,
    pub bytes: usize,
    /// What put is compared with (memcpy embedded, raw TCP send remote).
    pub put_baseline: Baseline,
    /// What get is compared with (memcpy embedded, raw TCP receive remote).
    pub get_baseline: Baseline,
    /// What clear is compared with, when there is a raw equivalent (a store's own delete);
    /// otherwise clear is shown against the put baseline.
    pub clear_baseline: Option<Baseline>,
    pub put: Stats,
    pub get: Stats,
    pub clear: Stats,
    /// Memory step (embedded only): RSS before storing a private copy of the workload (so
    /// storage holds the only reference), while storing it, and after the clear (bytes).
    pub memory: Option<(Option<u64>, Option<u64>, Option<u64>)>,
}

/// Runs `reps` iterations of put → get → clear of `batch` under keys `key_{i}`, after one
/// untimed, verified iteration. With `measure_memory`, also the RSS step (meaningful only when
/// storage lives in this process).
#[allow(clippy::too_many_arguments)]
pub fn run(
    runtime: &tokio::runtime::Runtime,
    tq: &Client,
    name: &str,
    batch: &Batch,
    reps: usize,
    put_baseline: Baseline,
    get_baseline: Baseline,
    measure_memory: bool,
) -> Result<KvReport> {
    let keys = workloads::keys(batch.len());
    let partition = "bench";
    // Warm-up and the one verification, outside the timed region.
    runtime.block_on(async {
        tq.partition(partition)
            .kv_batch_put(&keys, batch, None)
            .await?;
        let back = tq.partition(partition).kv_batch_get(&keys, None).await?;
        if &back != batch {
            return Err(tq_core::Error::internal(format!(
                "{name}: data read back differs from data written"
            )));
        }
        tq.partition(partition).kv_clear(&keys).await
    })?;
    let (mut put, mut get, mut clear) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..reps.max(1) {
        runtime.block_on(async {
            let t = Instant::now();
            tq.partition(partition)
                .kv_batch_put(&keys, batch, None)
                .await?;
            put.push(t.elapsed());
            let t = Instant::now();
            let back = tq.partition(partition).kv_batch_get(&keys, None).await?;
            get.push(t.elapsed());
            drop(std::hint::black_box(back));
            let t = Instant::now();
            tq.partition(partition).kv_clear(&keys).await?;
            clear.push(t.elapsed());
            Ok::<_, tq_core::Error>(())
        })?;
    }
    let memory = if measure_memory {
        let before = rss_bytes().0;
        let (during, after) = runtime.block_on(async {
            let owned = deep_copy(batch)?;
            tq.partition(partition)
                .kv_batch_put(&keys, &owned, None)
                .await?;
            drop(owned);
            let during = rss_bytes().0;
            tq.partition(partition).kv_clear(&keys).await?;
            Ok::<_, tq_core::Error>((during, rss_bytes().0))
        })?;
        Some((before, during, after))
    } else {
        None
    };
    Ok(KvReport {
        workload: name.to_string(),
        samples: batch.len(),
        cells: workloads::cells(batch),
        bytes: batch.nbytes(),
        put_baseline,
        get_baseline,
        clear_baseline: None,
        put: Stats::from_samples(put),
        get: Stats::from_samples(get),
        clear: Stats::from_samples(clear),
        memory,
    })
}

/// A copy of `batch` that shares no buffer with it.
pub fn deep_copy(batch: &Batch) -> Result<Batch> {
    let mut out = Batch::empty(batch.len());
    for (name, col) in batch.columns() {
        let copy = match col {
            Column::Dense(t) => Column::Dense(Tensor::new(
                t.dtype(),
                t.shape().to_vec(),
                Bytes::copy_from_slice(t.data()),
            )?),
            Column::Ragged(v) => Column::Ragged(
                v.iter()
                    .map(|t| {
                        Tensor::new(
                            t.dtype(),
                            t.shape().to_vec(),
                            Bytes::copy_from_slice(t.data()),
                        )
                    })
                    .collect::<Result<_>>()?,
            ),
            Column::Objects(v) => {
                Column::Objects(v.iter().map(|b| Bytes::copy_from_slice(b)).collect())
            }
        };
        out.insert(name.clone(), copy)?;
    }
    Ok(out)
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

/// Markdown table header for [`KvReport::rows`].
pub const TABLE_HEADER: &str = "| workload | op | ms median (min–max) | Gbit/s | Mcells/s | × baseline |\n|---|---|---|---|---|---|";

impl KvReport {
    /// Markdown rows: the baselines, then put, get and clear (put against the put baseline,
    /// get against the get baseline, clear against the clear baseline if there is one, else
    /// the put baseline).
    pub fn rows(&self) -> String {
        let line = |op: &str, s: &Stats, base: &Stats| {
            let g = s.gbit_per_s(self.bytes);
            format!(
                "| {} | {op} | {} | {:.2} | {:.2} | {:.2} |",
                self.workload,
                ms(s),
                g,
                s.per_s(self.cells) / 1e6,
                g / base.gbit_per_s(self.bytes)
            )
        };
        let (pb, gb) = (&self.put_baseline, &self.get_baseline);
        let mut out = vec![line(&pb.name, &pb.stats, &pb.stats)];
        if gb.name != pb.name {
            out.push(line(&gb.name, &gb.stats, &gb.stats));
        }
        if let Some(cb) = &self.clear_baseline {
            out.push(line(&cb.name, &cb.stats, &cb.stats));
        }
        out.push(line("put", &self.put, &pb.stats));
        out.push(line("get", &self.get, &gb.stats));
        let cb = self.clear_baseline.as_ref().map_or(&pb.stats, |c| &c.stats);
        out.push(line("clear", &self.clear, cb));
        out.join("\n")
    }

    /// One line on memory, when measured.
    pub fn memory_line(&self) -> Option<String> {
        let (before, during, after) = self.memory?;
        Some(format!(
            "{}: RSS before {} MiB, holding a private copy {} MiB, after clear {} MiB (payload {:.0} MiB)",
            self.workload,
            mib(before),
            mib(during),
            mib(after),
            self.bytes as f64 / 1048576.0
        ))
    }
}
