//! `Client::builder()`: custom storage, custom backends chosen by name in configuration, merge
//! functions and samplers; settings that cannot apply are errors, never dropped.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and examples may panic
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tq_client::*;
use tq_core::{Batch, Column, ErrorKind, StorageManager, Tensor};

fn ints(rows: usize, base: i64) -> Batch {
    let v: Vec<i64> = (0..rows as i64).map(|i| base + i).collect();
    Batch::from_columns([(
        "x",
        Column::Dense(Tensor::from_slice(vec![rows], &v).unwrap()),
    )])
    .unwrap()
}

fn in_memory() -> Arc<dyn StorageManager> {
    Arc::new(tq_backend_simple::SimpleStorage::in_memory(2, Default::default()).unwrap())
}

#[tokio::test]
async fn a_custom_backend_is_chosen_by_name_in_configuration() {
    let made = Arc::new(AtomicUsize::new(0));
    let counter = made.clone();
    let config = Config::from_toml("[storage]\nbackend = \"mine\"\n").unwrap();
    let tq = Client::builder()
        .config(config.clone())
        .backend(
            "mine",
            move |config: &Config, _merges: &tq_core::MergeRegistry| {
                assert_eq!(config.storage.backend, Backend::Custom("mine".into()));
                counter.fetch_add(1, Ordering::SeqCst);
                Ok(in_memory())
            },
        )
        .build()
        .unwrap();
    assert_eq!(made.load(Ordering::SeqCst), 1);
    let p = tq.partition("p");
    p.kv_put("k", &ints(1, 5), None).await.unwrap();
    let got = p.kv_batch_get(&["k"], None).await.unwrap();
    assert_eq!(got.column("x"), ints(1, 5).column("x"));

    // A name nobody registered is refused, naming what is registered.
    let e = Client::builder()
        .config(config)
        .backend("other", |_: &Config, _: &tq_core::MergeRegistry| {
            Ok(in_memory())
        })
        .build()
        .unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Invalid, "{e}");
    assert!(
        e.message().contains("`mine`") && e.message().contains("other"),
        "{e}"
    );
}

#[tokio::test]
async fn custom_storage_and_samplers_are_wired_in() {
    let storage = in_memory();
    let tq = Client::builder()
        .config(Config::default())
        .storage(storage.clone())
        .sampler("mine", Arc::new(tq_controller::SequentialSampler))
        .build()
        .unwrap();
    assert!(Arc::ptr_eq(tq.storage(), &storage));
    let p = tq.partition("p");
    p.put_new(&ints(3, 0)).await.unwrap();
    let meta = tq
        .get_meta(GetMetaRequest::fetch("p", &["x"], "t", 3, Wait::NoWait).with_sampler("mine"))
        .await
        .unwrap();
    assert_eq!(meta.len(), 3);
    let e = tq
        .get_meta(GetMetaRequest::fetch("p", &["x"], "u", 3, Wait::NoWait).with_sampler("nope"))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Invalid, "{e}");
}

#[test]
fn merge_functions_for_a_custom_storage_are_refused_not_dropped() {
    let e = Client::builder()
        .config(Config::default())
        .storage(in_memory())
        .merge(
            "sum",
            Arc::new(|_old: &tq_core::Value, new: &tq_core::Value| Ok(new.clone())),
        )
        .build()
        .unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Invalid, "{e}");
}

#[tokio::test]
async fn a_connected_client_refuses_settings_only_an_embedded_one_can_carry() {
    // Refused before any connection is tried (nothing listens on this port).
    let url = "tcp://127.0.0.1:9";
    let cases = [
        Client::builder().sampler("s", Arc::new(tq_controller::SequentialSampler)),
        Client::builder().storage(in_memory()),
    ];
    for builder in cases {
        let e = builder
            .config(Config::default())
            .connect(url)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), &ErrorKind::Invalid, "{e}");
        assert!(e.message().contains("embedded"), "{e}");
    }
}

#[cfg(feature = "kv")]
#[tokio::test]
async fn merge_functions_reach_the_kv_backend() {
    // `embedded_with_merges` used to drop the registry when storage.backend = "kv".
    let config = Config::from_toml("[storage]\nbackend = \"kv\"\n").unwrap();
    let mut merges = tq_core::MergeRegistry::default();
    merges.register(
        "double_new",
        Arc::new(|_old: &tq_core::Value, new: &tq_core::Value| {
            let t = new.as_tensor().unwrap();
            let v: Vec<i64> = t.to_vec::<i64>().unwrap().iter().map(|x| x * 2).collect();
            Ok(tq_core::Value::Tensor(
                Tensor::from_slice(t.shape().to_vec(), &v).unwrap(),
            ))
        }),
    );
    let tq = Client::embedded_with_merges(config, merges).unwrap();
    let p = tq.partition("p");
    p.kv_put("k", &ints(1, 1), None).await.unwrap();
    p.kv_update(
        "k",
        &ints(1, 21),
        &tq_core::MergeOp::Named("double_new".into()),
    )
    .await
    .unwrap();
    let got = p.kv_batch_get(&["k"], Some(&["x"])).await.unwrap();
    assert_eq!(got.column("x"), ints(1, 42).column("x"));
}
