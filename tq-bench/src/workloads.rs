//! The standard workloads (docs/benchmarks.md, "Standard workloads").

use tq_core::{Batch, Bytes, Column, DType, Tensor};

/// Workload names `tq bench` accepts.
pub const NAMES: &[&str] = &[
    "simple-small",
    "simple-medium",
    "simple-large",
    "complex-small",
    "complex-medium",
    "complex-large",
    "perftest-small",
];

/// Deterministic, non-constant bytes (so a wrong row would be noticed by the check).
fn filled(len: usize, seed: u64) -> Bytes {
    let mut out = Vec::with_capacity(len);
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    while out.len() + 8 <= len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.resize(len, 0xA5);
    Bytes::from(out)
}

/// A dense `dtype[rows, row_elems]` column of [`filled`] bytes.
pub(crate) fn dense(dtype: DType, rows: usize, row_elems: usize, seed: u64) -> Column {
    let bytes = filled(rows * row_elems * dtype.size(), seed);
    Column::Dense(Tensor::new(dtype, vec![rows, row_elems], bytes).expect("sized"))
}

/// `simple-*`: four dense fields `f32[4k]`, `i64[2k]`, `f32[4k]`, `i64[2k]` per sample.
pub fn simple(rows: usize, k: usize) -> Batch {
    Batch::from_columns([
        ("f0", dense(DType::F32, rows, 4 * k, 1)),
        ("f1", dense(DType::I64, rows, 2 * k, 2)),
        ("f2", dense(DType::F32, rows, 4 * k, 3)),
        ("f3", dense(DType::I64, rows, 2 * k, 4)),
    ])
    .expect("equal rows")
}

/// `complex-*`: one dense `f32[S]`, one ragged f32 with lengths 1..S, one object of 4·S bytes.
pub fn complex(rows: usize, s: usize) -> Batch {
    let ragged = (0..rows)
        .map(|i| {
            let len = 1 + (i * (s - 1)) / rows.max(1);
            Tensor::new(DType::F32, vec![len], filled(len * 4, 100 + i as u64)).expect("sized")
        })
        .collect();
    let objects = (0..rows)
        .map(|i| filled(4 * s, 10_000 + i as u64))
        .collect();
    Batch::from_columns([
        ("dense", dense(DType::F32, rows, s, 5)),
        ("ragged", Column::Ragged(ragged)),
        ("object", Column::Objects(objects)),
    ])
    .expect("equal rows")
}

/// `perftest-small`: nine dense `f32[8192]` fields.
pub fn perftest(rows: usize) -> Batch {
    let cols: Vec<(String, Column)> = (0..9)
        .map(|i| (format!("f{i}"), dense(DType::F32, rows, 8192, 20 + i)))
        .collect();
    Batch::from_columns(cols).expect("equal rows")
}

/// Builds a named workload of `rows` samples.
pub fn by_name(name: &str, rows: usize) -> Option<Batch> {
    Some(match name {
        "simple-small" => simple(rows, 64),
        "simple-medium" => simple(rows, 1024),
        "simple-large" => simple(rows, 16384),
        "complex-small" => complex(rows, 410),
        "complex-medium" => complex(rows, 6554),
        "complex-large" => complex(rows, 104858),
        "perftest-small" => perftest(rows),
        _ => return None,
    })
}

/// `key_0 .. key_{n-1}`.
pub fn keys(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("key_{i}")).collect()
}

/// Number of cells (samples × fields).
pub fn cells(batch: &Batch) -> usize {
    batch.len() * batch.columns().len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_match_the_table() {
        let per_sample = |b: Batch| b.nbytes() / b.len();
        assert_eq!(per_sample(simple(4, 64)), 4096);
        assert_eq!(per_sample(simple(2, 1024)), 65536);
        assert_eq!(per_sample(perftest(2)), 9 * 8192 * 4);
        let c = per_sample(complex(64, 410));
        assert!((3000..5000).contains(&c), "{c}");
    }
}
