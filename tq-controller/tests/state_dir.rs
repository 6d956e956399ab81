//! `--state-dir` at the controller level: what was made durable comes back in a controller
//! started on the directory (epoch included); a damaged state file is refused by name and
//! nothing is restored; many concurrent changes all become durable.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and examples may panic
use std::sync::Arc;
use tq_controller::*;
use tq_core::{DType, ErrorKind, FieldMeta};

fn controller() -> Arc<Controller> {
    Arc::new(Controller::new(ControllerConfig::default()).unwrap())
}

fn tempdir() -> std::path::PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let dir = std::env::temp_dir().join(format!("tq-state-dir-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn put_keys(c: &Controller, state: &StateDir, names: &[String]) {
    let kv = c.kv_retrieve_meta("p", names, true).await.unwrap();
    state.changed().await.unwrap();
    c.notify_production(ProductionNotice {
        partition: "p".into(),
        samples: kv.meta.samples().to_vec(),
        schemas: [("x".to_string(), FieldMeta::dense(DType::I64, vec![2]))].into(),
        tags: None,
        backend_meta: None,
    })
    .await
    .unwrap();
    state.changed().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_changes_come_back_and_damage_is_refused() {
    let dir = tempdir();
    let first = controller();
    let state = StateDir::open(&dir, first.clone()).unwrap();
    // Concurrent writers: every change becomes durable (group commit shares the writes).
    let tasks: Vec<_> = (0..32)
        .map(|t| {
            let (c, s) = (first.clone(), state.clone());
            tokio::spawn(async move {
                let names: Vec<String> = (0..4).map(|i| format!("k{t}-{i}")).collect();
                put_keys(&c, &s, &names).await;
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let listing = first.kv_list(Some("p")).await.unwrap();
    assert_eq!(listing[0].entries.len(), 128);
    let epoch = first.epoch();
    drop(state);

    // A controller started on the directory has it all, in the same epoch.
    let second = controller();
    let _state = StateDir::open(&dir, second.clone()).unwrap();
    assert_eq!(second.epoch(), epoch);
    assert_eq!(second.kv_list(Some("p")).await.unwrap(), listing);
    let status = second
        .production_status("p", &["x".to_string()])
        .await
        .unwrap();
    assert_eq!(
        format!("{status:?}"),
        format!(
            "{:?}",
            first
                .production_status("p", &["x".to_string()])
                .await
                .unwrap()
        )
    );

    // One flipped byte: refused, naming the file; the new controller stays empty.
    let file = dir.join("controller.state");
    let mut bytes = std::fs::read(&file).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x10;
    std::fs::write(&file, &bytes).unwrap();
    let third = controller();
    let e = StateDir::open(&dir, third.clone())
        .err()
        .expect("a damaged state");
    assert_eq!(e.kind(), &ErrorKind::Corrupted, "{e}");
    assert!(e.message().contains("controller.state"), "{e}");
    assert!(third.list_partitions().await.unwrap().is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}
