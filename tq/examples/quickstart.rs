//! The README example. Run: `cargo run -p tq-client --example quickstart`

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and examples may panic
use tq_client::{Client, Config};
use tq_core::{Batch, Column, Tensor};

#[tokio::main]
async fn main() -> tq_core::Result<()> {
    let tq = Client::embedded(Config::default())?; // controller + 2 storage units, in process
    let prompts = Batch::from_columns([(
        "input_ids",
        Column::Dense(Tensor::from_slice(vec![2, 3], &[1i64, 2, 3, 4, 5, 6])?),
    )])?;
    tq.partition("train")
        .kv_batch_put(&["a", "b"], &prompts, None)
        .await?; // KV API
    let back = tq
        .partition("train")
        .kv_batch_get(&["b", "a"], Some(&["input_ids"]))
        .await?;
    assert_eq!(back.len(), 2);

    // Metadata API: a consumer task takes samples once they are produced.
    let meta = tq
        .partition("train")
        .fetch(&["input_ids"], "rollout", 2)
        .await?; // waits, marks consumed
    let data = tq.get_data(&meta).await?;
    assert_eq!(data.len(), 2);
    tq.clear_samples(&meta).await?; // hide → delete → release
    println!("quickstart: ok");
    Ok(())
}
