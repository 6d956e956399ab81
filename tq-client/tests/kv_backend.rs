//! The embedded client on `storage.backend = "kv"` (the in-memory KV store; Redis and
//! object_store are tested in tq-backend-kv).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and examples may panic
use tq_client::*;
use tq_core::{Batch, Bytes, Column, ErrorKind, Tensor};

#[tokio::test]
async fn embedded_client_on_the_kv_backend() {
    let config = Config::from_toml(
        "[storage]\nbackend = \"kv\"\n[storage.kv]\ndata_ttl_ms = 60000\n\
         stores = [{ name = \"a\", url = \"memory://\" }, { name = \"b\", url = \"memory://\" }]\n\
         routing = { kind = \"by-field\", fields = { text = \"b\" }, default = \"a\" }\n",
    )
    .unwrap();
    let tq = Client::embedded(config).unwrap();
    let one = Batch::from_columns([
        (
            "ids",
            Column::Dense(Tensor::from_slice(vec![1, 3], &[1i64, 2, 3]).unwrap()),
        ),
        ("text", Column::Objects(vec![Bytes::from_static(b"hello")])),
    ])
    .unwrap();
    tq.partition("p").kv_put("k", &one, None).await.unwrap();
    let got = tq.partition("p").kv_batch_get(&["k"], None).await.unwrap();
    assert_eq!(got.column("ids"), one.column("ids"));
    assert_eq!(got.column("text"), one.column("text"));
    tq.partition("p").kv_clear(&["k"]).await.unwrap();
    let e = tq
        .partition("p")
        .kv_batch_get(&["k"], None)
        .await
        .unwrap_err();
    assert!(
        matches!(e.kind(), ErrorKind::NotFound | ErrorKind::Invalid),
        "{e}"
    );
    // The reused index gets a new generation and reads back its own data.
    tq.partition("p").kv_put("k2", &one, None).await.unwrap();
    let got = tq.partition("p").kv_batch_get(&["k2"], None).await.unwrap();
    assert_eq!(got.column("ids"), one.column("ids"));
}
