//! Criterion: the embedded deployment (controller and in-memory storage units in this
//! process): put, get and clear of the simple workloads next to a memcpy of the same bytes,
//! the clear-28 workload (`embedded/clear-28`), the read-buffer pool that packed columns
//! come from, on and off, and packing page-aligned rows (as mapped from shared memory) into a
//! buffer at a page boundary and 16 bytes past one.
//! Run: `cargo bench -p tq-bench --bench embedded [-- simple-small]`

mod common;

use common::{clear_28, criterion, memcpy, put_get_clear, runtime, Workload};
use criterion::{BenchmarkGroup, Throughput};
use std::hint::black_box;
use tq_core::buffer::BufferPool;

/// Rows of one packed column in the read-buffer group: 1024 rows of 1 KiB, as simple-small.
const ROWS: usize = 1024;
const ROW_BYTES: usize = 1024;
/// Columns packed per iteration (simple-small reads four 1 MiB columns).
const COLUMNS: usize = 4;

fn main() {
    let mut c = criterion(3);
    let rt = runtime();
    let tq = tq::Client::embedded(tq::Config::default()).expect("embedded client");
    for name in ["simple-small", "simple-medium"] {
        let w = Workload::new(name);
        let mut g = w.group(&mut c, "embedded");
        memcpy(&mut g, &w);
        put_get_clear(&mut g, &rt, &tq, &w);
        g.finish();
    }
    clear_28(&mut c, "embedded", &rt, &tq);
    let mut g = c.benchmark_group("read-buffers");
    g.throughput(Throughput::Bytes((COLUMNS * ROWS * ROW_BYTES) as u64));
    read_buffers(&mut g);
    g.finish();
    let mut g = c.benchmark_group("read-buffers-aligned");
    g.throughput(Throughput::Bytes((ROWS * PAGE) as u64));
    aligned_rows(&mut g);
    g.finish();
    c.final_summary();
}

/// Packs four columns of 1024 separate 1 KiB rows (what a get of simple-small does with its
/// payload) into buffers from a pool that keeps freed buffers, and from one that keeps none
/// (plain malloc, whose cost depends on the process's history); the baseline copies the same
/// bytes from one contiguous buffer into one reused buffer.
fn read_buffers(g: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>) {
    let rows: Vec<Vec<u8>> = (0..ROWS).map(|i| vec![i as u8; ROW_BYTES]).collect();
    let source: Vec<u8> = rows.concat();
    let mut target = vec![0u8; source.len()];
    g.bench_function("memcpy into a reused buffer", |b| {
        b.iter(|| {
            for _ in 0..COLUMNS {
                target.copy_from_slice(black_box(&source));
            }
            black_box(&target);
        })
    });
    for (name, pool) in [
        ("pack rows, pooled buffers", BufferPool::new(256 << 20)),
        ("pack rows, malloc (pool off)", BufferPool::new(0)),
    ] {
        g.bench_function(name, |b| {
            b.iter(|| {
                let columns: Vec<tq_core::Bytes> = (0..COLUMNS)
                    .map(|_| pool.concatenated(rows.iter().map(Vec::as_slice)))
                    .collect();
                black_box(columns)
            })
        });
    }
}

/// A page, and the row length of the aligned group (rows of whole pages, as 4 KiB samples).
const PAGE: usize = 4096;

/// Packs 1024 rows of 4 KiB that start at page boundaries, taken alternately from two halves
/// of one region (as rows of two units' segments come), into a pooled buffer (which starts at
/// a page boundary) and into a reused buffer 16 bytes past a page boundary (where malloc puts
/// a large allocation, and where pooled buffers used to start). glibc copies rows of this size
/// with `rep movsb`, whose speed on some CPUs depends on where the destination lies relative
/// to the source. Baseline: a memcpy of the same bytes between two contiguous buffers.
fn aligned_rows(g: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>) {
    let mut region = vec![0u8; ROWS * PAGE + PAGE];
    let start = region.as_ptr().align_offset(PAGE);
    for (i, b) in region.iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    let region = &region[start..start + ROWS * PAGE];
    let half = ROWS / 2;
    let rows: Vec<&[u8]> = (0..ROWS)
        .map(|i| {
            let at = (i % 2) * half + i / 2;
            &region[at * PAGE..(at + 1) * PAGE]
        })
        .collect();
    let source: Vec<u8> = region.to_vec();
    let mut target = vec![0u8; source.len()];
    g.bench_function("memcpy into a reused buffer", |b| {
        b.iter(|| {
            target.copy_from_slice(black_box(&source));
            black_box(&target);
        })
    });
    let pool = BufferPool::new(256 << 20);
    g.bench_function("pack into a pooled buffer (page boundary)", |b| {
        b.iter(|| black_box(pool.concatenated(rows.iter().copied())))
    });
    let mut padded = vec![0u8; ROWS * PAGE + PAGE + 16];
    let at = padded.as_ptr().align_offset(PAGE) + 16;
    g.bench_function("pack into a reused buffer 16 bytes past a page", |b| {
        b.iter(|| {
            let dst = &mut padded[at..at + ROWS * PAGE];
            let mut off = 0;
            for row in &rows {
                dst[off..off + row.len()].copy_from_slice(row);
                off += row.len();
            }
            black_box(&dst[..]);
        })
    });
}
