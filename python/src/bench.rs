//! The Rust side of `python/bench.py`: the same KV workload through the same client with no
//! Python in the loop, so the Python API's cost is measured against it in the same run.

use crate::NativeClient;
use pyo3::prelude::*;
use std::time::Instant;
use tq::{Batch, Bytes, Column, DType, Error, Tensor};

/// Times `reps` rounds of `kv_batch_put` of `keys` (one `u8` field `x` of `row_bytes` per
/// key, copied from a `Vec` into tq's buffer as part of the put), `kv_batch_get` of them,
/// and `kv_clear`, in `partition`, from Rust. Returns the put
/// and get times in seconds, one per round; every get is checked against what was put.
#[pyfunction]
pub fn bench_kv(
    py: Python<'_>,
    client: &NativeClient,
    partition: String,
    keys: Vec<String>,
    row_bytes: usize,
    reps: usize,
) -> PyResult<(Vec<f64>, Vec<f64>)> {
    let rows = keys.len();
    let data: Vec<u8> = (0..rows * row_bytes).map(|i| (i % 251) as u8).collect();
    client.run(py, move |client| async move {
        let p = client.partition(partition);
        let (mut puts, mut gets) = (Vec::with_capacity(reps), Vec::with_capacity(reps));
        for _ in 0..reps {
            let t = Instant::now();
            // As a Rust caller writing from its own memory does (and as the Python path does
            // from the numpy array): the bytes are copied into tq's buffer once.
            let tensor = Tensor::new(
                DType::U8,
                vec![rows, row_bytes],
                Bytes::copy_from_slice(&data),
            )?;
            let batch = Batch::from_columns([("x", Column::Dense(tensor))])?;
            p.kv_batch_put(&keys, &batch, None).await?;
            puts.push(t.elapsed().as_secs_f64());
            let t = Instant::now();
            let back = p.kv_batch_get(&keys, Some(&["x"])).await?;
            gets.push(t.elapsed().as_secs_f64());
            if back.column("x") != batch.column("x") {
                return Err(Error::internal(
                    "bench_kv: the get did not return what was put",
                ));
            }
            p.kv_clear(&keys).await?;
        }
        Ok((puts, gets))
    })
}
