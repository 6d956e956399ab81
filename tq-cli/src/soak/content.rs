//! What a soak sample holds, and how a reader tells its own data from any other bytes.
//!
//! A row has four fields: `id` and `ver` (which sample, which write of it), `x` (a
//! pseudo-random payload derived from both) and `crc` (a checksum of `id`, `ver` and the bytes
//! of `x`). A row read back is the sample's own data exactly when its checksum matches; a mix of
//! two writes' fields, another sample's row or torn bytes all fail it.

use tq_core::{Batch, Column, Result, Tensor};

/// The fields a soak row has, in the order reads ask for them.
pub const FIELDS: [&str; 4] = ["id", "ver", "x", "crc"];

/// SplitMix64: a well-spread 64-bit value from a counter (no dependency for a test payload).
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The payload of sample `id` at version `ver`.
pub fn payload(id: i64, ver: i64, width: usize) -> impl Iterator<Item = i64> {
    let seed = mix(id as u64 ^ mix(ver as u64));
    (0..width as u64).map(move |i| mix(seed.wrapping_add(i)) as i64)
}

/// FNV-1a (64-bit) over `id`, `ver` and the little-endian bytes of `x`.
pub fn checksum(id: i64, ver: i64, x: &[i64]) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for v in [id, ver].iter().chain(x) {
        for b in v.to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h as i64
}

/// Rows for `samples` (`(id, ver)` each), `width` payload elements per row.
pub fn rows(samples: &[(i64, i64)], width: usize) -> Result<Batch> {
    let n = samples.len();
    let mut x = Vec::with_capacity(n * width);
    let mut crc = Vec::with_capacity(n);
    for &(id, ver) in samples {
        let start = x.len();
        x.extend(payload(id, ver, width));
        crc.push(checksum(id, ver, &x[start..]));
    }
    let ids: Vec<i64> = samples.iter().map(|s| s.0).collect();
    let vers: Vec<i64> = samples.iter().map(|s| s.1).collect();
    Batch::from_columns([
        ("id", Column::Dense(Tensor::from_slice(vec![n], &ids)?)),
        ("ver", Column::Dense(Tensor::from_slice(vec![n], &vers)?)),
        ("x", Column::Dense(Tensor::from_slice(vec![n, width], &x)?)),
        ("crc", Column::Dense(Tensor::from_slice(vec![n], &crc)?)),
    ])
}

/// One row read back: which sample and write it claims to be, and whether its checksum holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadRow {
    pub id: i64,
    pub ver: i64,
    pub intact: bool,
}

fn dense(batch: &Batch, field: &str) -> std::result::Result<Vec<i64>, String> {
    match batch.column(field) {
        Some(Column::Dense(t)) => t
            .to_vec::<i64>()
            .map_err(|e| format!("field `{field}`: {e}")),
        Some(_) => Err(format!("field `{field}` is not a dense tensor")),
        None => Err(format!("field `{field}` is missing from a successful read")),
    }
}

/// The rows of a read; `Err` when the batch lacks a field or has the wrong shape (a read that
/// succeeded without its data).
pub fn check(batch: &Batch) -> std::result::Result<Vec<ReadRow>, String> {
    let ids = dense(batch, "id")?;
    let vers = dense(batch, "ver")?;
    let x = dense(batch, "x")?;
    let crcs = dense(batch, "crc")?;
    let n = ids.len();
    if vers.len() != n || crcs.len() != n || (n > 0 && x.len() % n != 0) {
        return Err(format!(
            "fields of different lengths: {n} ids, {} versions, {} checksums, {} payload elements",
            vers.len(),
            crcs.len(),
            x.len()
        ));
    }
    let width = x.len().checked_div(n).unwrap_or(0);
    Ok((0..n)
        .map(|r| ReadRow {
            id: ids[r],
            ver: vers[r],
            intact: checksum(ids[r], vers[r], &x[r * width..(r + 1) * width]) == crcs[r],
        })
        .collect())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn rows_read_back_intact_and_a_mix_of_two_writes_does_not() {
        let a = rows(&[(7, 1), (8, 1)], 5).unwrap();
        let rows_a = check(&a).unwrap();
        assert!(rows_a.iter().all(|r| r.intact));
        assert_eq!((rows_a[1].id, rows_a[1].ver), (8, 1));
        // `x` of version 2 with the checksum of version 1: not intact.
        let b = rows(&[(7, 2), (8, 2)], 5).unwrap();
        let mixed = Batch::from_columns([
            ("id", a.column("id").unwrap().clone()),
            ("ver", a.column("ver").unwrap().clone()),
            ("x", b.column("x").unwrap().clone()),
            ("crc", a.column("crc").unwrap().clone()),
        ])
        .unwrap();
        assert!(check(&mixed).unwrap().iter().all(|r| !r.intact));
        // A read without a field is not a read of the data.
        let partial = Batch::from_columns([("id", a.column("id").unwrap().clone())]).unwrap();
        assert!(check(&partial).unwrap_err().contains("`ver` is missing"));
    }
}
