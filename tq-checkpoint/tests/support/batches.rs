//! Batches the checkpoint and dump tests share.
#![allow(dead_code, clippy::unwrap_used)]

use tq_core::{Batch, Bytes, Column, Tensor};

/// `rows` rows of every column kind: dense `x` (i64 × 2), ragged `r` (row `r` holds `r + 1`
/// f32) and objects `o`, all derived from `base`.
pub fn every_kind(rows: usize, base: i64) -> Batch {
    let dense: Vec<i64> = (0..rows as i64 * 2).map(|i| base + i).collect();
    let ragged = (0..rows)
        .map(|r| {
            let v: Vec<f32> = (0..=r).map(|i| (base as f32) + i as f32 / 2.0).collect();
            Tensor::from_slice(vec![r + 1], &v).unwrap()
        })
        .collect();
    let objects = (0..rows)
        .map(|r| Bytes::from(format!("object {base}-{r}").into_bytes()))
        .collect();
    Batch::from_columns([
        (
            "x",
            Column::Dense(Tensor::from_slice(vec![rows, 2], &dense).unwrap()),
        ),
        ("r", Column::Ragged(ragged)),
        ("o", Column::Objects(objects)),
    ])
    .unwrap()
}
