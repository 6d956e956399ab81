//! SSD offload benchmarks (`cargo run --release -p tq-bench --bin ssd-bench`).
//!
//! - Throughput: put and get of cells of 1, 2 and 4 MiB through an [`SsdUnit`] with offload
//!   enabled (every cell goes to disk), next to writing and reading the same bytes as one plain
//!   file per cell with `std::fs`, in the same run and directory.
//! - Memory: a unit holding a few GiB of which 80% is offloaded, next to the same workload in
//!   memory, each in a fresh child process: RSS peak, before clear and after clear.

use crate::measure::{rss_bytes, Stats};
use bytes::Bytes;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tq_backend_simple::{SimpleStorage, StorageUnit, UnitConfig, UnitPut, UnitRows};
use tq_backend_ssd::{EngineKind, SsdConfig, SsdUnit};
use tq_core::{Batch, BatchMeta, Column, FieldFilter, SampleId, StorageManager, Tensor, Value};

const MIB: usize = 1 << 20;

/// One throughput row.
#[derive(Debug, Clone)]
pub struct ThroughputRow {
    pub cell_mib: usize,
    pub what: String,
    pub put: Stats,
    pub get: Stats,
    pub bytes: usize,
}

fn cells(n: usize, size: usize, seed: u64) -> Vec<Bytes> {
    (0..n)
        .map(|i| {
            let mut v = vec![0u8; size];
            let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ i as u64;
            for chunk in v.chunks_mut(8) {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let b = x.to_le_bytes();
                chunk.copy_from_slice(&b[..chunk.len()]);
            }
            Bytes::from(v)
        })
        .collect()
}

/// Requests of `batch` cells each.
const BATCH: usize = 32;

/// Put/get through an SSD unit with `engine`; returns (put, get) timings.
async fn ssd_round(
    dir: &Path,
    engine: EngineKind,
    data: &[Bytes],
    warmup: usize,
    reps: usize,
) -> (Stats, Stats) {
    let cfg = SsdConfig::enabled_at(dir)
        .with_threshold(MIB)
        .with_engine(engine);
    let unit = SsdUnit::new("bench", UnitConfig::default(), cfg).expect("unit");
    let field = vec!["x".to_string()];
    let mut puts = Vec::new();
    let mut gets = Vec::new();
    let mut verified = false;
    for rep in 0..warmup + reps {
        let generation = rep as u32;
        let t = Instant::now();
        for (b, chunk) in data.chunks(BATCH).enumerate() {
            let samples: Vec<SampleId> = (0..chunk.len())
                .map(|i| SampleId::new((b * BATCH + i) as u32, generation))
                .collect();
            let values = chunk.iter().map(|c| Value::Object(c.clone())).collect();
            let req = UnitPut {
                samples,
                fields: [("x".to_string(), UnitRows::separate(values))].into(),
            };
            unit.put(req).await.expect("put");
        }
        let put = t.elapsed();
        let t = Instant::now();
        let mut total = 0usize;
        for (b, chunk) in data.chunks(BATCH).enumerate() {
            let samples: Vec<SampleId> = (0..chunk.len())
                .map(|i| SampleId::new((b * BATCH + i) as u32, generation))
                .collect();
            let got = unit.get(&field, &samples).await.expect("get");
            if !verified {
                for (g, want) in got[0].iter().zip(chunk) {
                    assert_eq!(g.bytes(), want, "data read back differs");
                }
            }
            total += got[0].iter().map(Value::nbytes).sum::<usize>();
        }
        verified = true;
        let get = t.elapsed();
        assert_eq!(total, data.iter().map(Bytes::len).sum::<usize>());
        let all: Vec<SampleId> = (0..data.len())
            .map(|i| SampleId::new(i as u32, generation))
            .collect();
        unit.clear(&all, &FieldFilter::All).await.expect("clear");
        if rep >= warmup {
            puts.push(put);
            gets.push(get);
        }
    }
    unit.shutdown().await.expect("shutdown");
    (Stats::from_samples(puts), Stats::from_samples(gets))
}

/// The baseline: one file per cell written with `std::fs::write` and read with `std::fs::read`,
/// one after the other on one thread; reads keep the buffers of a request (`BATCH` cells) until
/// the request is complete, as the unit's reply does.
fn fs_round(dir: &Path, data: &[Bytes], warmup: usize, reps: usize) -> (Stats, Stats) {
    let dir = dir.join("plain-files");
    std::fs::create_dir_all(&dir).expect("baseline dir");
    let mut puts = Vec::new();
    let mut gets = Vec::new();
    for rep in 0..warmup + reps {
        let paths: Vec<PathBuf> = (0..data.len())
            .map(|i| dir.join(format!("{rep}-{i}.bin")))
            .collect();
        let t = Instant::now();
        for (p, d) in paths.iter().zip(data) {
            std::fs::write(p, d).expect("write");
        }
        let put = t.elapsed();
        let t = Instant::now();
        let mut total = 0;
        for chunk in paths.chunks(BATCH) {
            // Held per request of BATCH cells, as a unit's get holds its reply.
            let got: Vec<Vec<u8>> = chunk
                .iter()
                .map(|p| std::fs::read(p).expect("read"))
                .collect();
            total += got.iter().map(Vec::len).sum::<usize>();
        }
        let get = t.elapsed();
        assert_eq!(total, data.iter().map(Bytes::len).sum::<usize>());
        for p in &paths {
            let _ = std::fs::remove_file(p);
        }
        if rep >= warmup {
            puts.push(put);
            gets.push(get);
        }
    }
    let _ = std::fs::remove_dir(&dir);
    (Stats::from_samples(puts), Stats::from_samples(gets))
}

/// Throughput rows for cells of 1, 2 and 4 MiB, `total_mib` per repetition.
pub async fn throughput(dir: &Path, total_mib: usize, reps: usize) -> Vec<ThroughputRow> {
    let mut rows = Vec::new();
    let mut engines = vec![EngineKind::Psync];
    if tq_backend_ssd::uring_available() {
        engines.insert(0, EngineKind::Uring);
    }
    for cell_mib in [1usize, 2, 4] {
        let n = total_mib / cell_mib;
        let data = cells(n, cell_mib * MIB, cell_mib as u64);
        let bytes = n * cell_mib * MIB;
        let (p, g) = fs_round(dir, &data, 1, reps);
        rows.push(ThroughputRow {
            cell_mib,
            what: "std::fs files (baseline)".into(),
            put: p,
            get: g,
            bytes,
        });
        for &engine in &engines {
            let (p, g) = ssd_round(dir, engine, &data, 1, reps).await;
            rows.push(ThroughputRow {
                cell_mib,
                what: format!("SsdUnit {engine:?}"),
                put: p,
                get: g,
                bytes,
            });
        }
    }
    rows
}

/// What one memory run measured.
#[derive(Debug, Clone, Copy, Default)]
pub struct RssReport {
    pub peak: u64,
    pub before_clear: u64,
    pub after_clear: u64,
    pub disk_bytes: u64,
    pub live_bytes: u64,
}

/// The memory workload in this process: `samples` samples of one 4 MiB field (offloaded) and
/// four 256 KiB fields (in memory), i.e. 80% offloaded; put in batches of 32 through
/// [`SimpleStorage`], read back, cleared; `iterations` times. Reports the last iteration.
pub async fn rss_workload(
    dir: Option<&Path>,
    samples: usize,
    iterations: usize,
    trim: bool,
) -> RssReport {
    let mut cfg = match dir {
        Some(d) => SsdConfig::enabled_at(d).with_threshold(MIB),
        None => SsdConfig::default(),
    };
    cfg.trim_after_clear = trim;
    let unit = Arc::new(SsdUnit::new("rss", UnitConfig::default(), cfg).expect("unit"));
    let storage = SimpleStorage::new(vec![unit.clone() as Arc<dyn StorageUnit>]).expect("storage");
    let mut report = RssReport::default();
    const B: usize = 32;
    for it in 0..iterations {
        let ids: Vec<SampleId> = (0..samples)
            .map(|i| SampleId::new(i as u32, it as u32))
            .collect();
        let mut metas = Vec::new();
        for (b, chunk) in ids.chunks(B).enumerate() {
            let n = chunk.len();
            let col = |floats_per_row: usize, seed: usize| {
                let v: Vec<f32> = (0..n * floats_per_row)
                    .map(|i| (i + seed + b) as f32)
                    .collect();
                Column::Dense(Tensor::from_slice(vec![n, floats_per_row], &v).expect("tensor"))
            };
            let batch = Batch::from_columns([
                ("large", col(MIB, 1)), // 4 MiB per row
                ("s0", col(MIB / 16, 2)),
                ("s1", col(MIB / 16, 3)),
                ("s2", col(MIB / 16, 4)),
                ("s3", col(MIB / 16, 5)),
            ])
            .expect("batch");
            let meta = BatchMeta::new("rss", chunk.to_vec())
                .with_fields(batch.schemas())
                .expect("meta");
            storage.put(&meta, &batch).await.expect("put");
            metas.push(meta);
        }
        for meta in &metas {
            let got = storage.get(meta).await.expect("get");
            assert_eq!(got.len(), meta.samples().len());
        }
        let st = unit.stats().await.expect("stats");
        report.disk_bytes = st.offloaded_bytes;
        report.live_bytes = st.live_bytes;
        report.before_clear = rss_bytes().0.unwrap_or(0);
        for meta in &metas {
            storage.clear(meta, &FieldFilter::All).await.expect("clear");
        }
        // Let the blocking pool's deletions and trims finish before reading RSS.
        tokio::time::sleep(Duration::from_millis(200)).await;
        report.after_clear = rss_bytes().0.unwrap_or(0);
    }
    report.peak = rss_bytes().1.unwrap_or(0);
    if dir.is_some() {
        unit.shutdown().await.expect("shutdown");
    }
    report
}
