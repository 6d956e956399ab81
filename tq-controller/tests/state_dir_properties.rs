//! `--state-dir` under random work: whatever sequence of puts, fetches and clears a controller
//! went through, a controller opened on a copy of its directory (what a crash at that moment
//! leaves, every change acknowledged) shows the same partitions, keys, tags, production and
//! consumption. This catches a change the log does not record.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic
use proptest::prelude::*;
use std::sync::Arc;
mod common;
use common::{picture, tempdir};
use tq_controller::*;
use tq_core::{DType, FieldMeta, TagValue, Tags};

#[derive(Debug, Clone)]
enum Op {
    /// Keys (by number) put into a partition: allocated, then produced with a tag.
    Put(u8, Vec<u8>),
    /// A fetch of up to `n` samples by task `t`.
    Fetch(u8, usize),
    /// Keys cleared: marked, then released.
    Clear(u8, Vec<u8>),
    /// A crash now: a copy of the directory must recover the state as it is.
    Crash,
}

fn op() -> impl Strategy<Value = Op> {
    let keys = || proptest::collection::vec(0u8..12, 1..5);
    prop_oneof![
        3 => (0u8..3, keys()).prop_map(|(p, k)| Op::Put(p, k)),
        2 => (0u8..3, 1usize..4).prop_map(|(p, n)| Op::Fetch(p, n)),
        2 => (0u8..3, keys()).prop_map(|(p, k)| Op::Clear(p, k)),
        1 => Just(Op::Crash),
    ]
}

fn names(keys: &[u8]) -> Vec<String> {
    let mut v: Vec<String> = keys.iter().map(|k| format!("k{k}")).collect();
    v.sort();
    v.dedup();
    v
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

async fn apply(c: &Controller, state: &StateDir, op: &Op) {
    // Failed requests (a clear of keys that do not exist, a fetch of a missing partition) are
    // part of the work too: they must leave nothing half-recorded.
    match op {
        Op::Put(p, keys) => {
            let partition = format!("p{p}");
            let keys = names(keys);
            if let Ok(kv) = c.kv_retrieve_meta(&partition, &keys, true).await {
                state.changed().await.unwrap();
                let tags: Vec<Tags> = keys
                    .iter()
                    .map(|k| [("key".to_string(), TagValue::from(k.clone()))].into())
                    .collect();
                let _ = c
                    .notify_production(ProductionNotice {
                        partition,
                        samples: kv.meta.samples().to_vec(),
                        schemas: [("x".to_string(), FieldMeta::dense(DType::F32, vec![2]))].into(),
                        tags: Some(tags),
                        backend_meta: None,
                    })
                    .await;
            }
        }
        Op::Fetch(p, n) => {
            let req = GetMetaRequest::fetch(format!("p{p}"), &["x"], "t", *n, Wait::NoWait);
            let _ = c.get_meta(req).await;
        }
        Op::Clear(p, keys) => {
            let partition = format!("p{p}");
            if let Ok(meta) = c.kv_mark_clearing(&partition, &names(keys)).await {
                state.changed().await.unwrap();
                let _ = c.release(&partition, meta.samples()).await;
            }
        }
        Op::Crash => return,
    }
    state.changed().await.unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn a_copy_of_the_directory_recovers_what_was_acknowledged(
        ops in proptest::collection::vec(op(), 1..30),
        compact in any::<bool>(),
    ) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let dir = tempdir("state-dir-prop");
            let live = Arc::new(Controller::new(ControllerConfig::default()).unwrap());
            // Compacting at every chance exercises the snapshot rewrite as much as the log.
            let options = StateDirOptions {
                compact_min_bytes: if compact { 1 } else { COMPACT_MIN_BYTES },
            };
            let state = StateDir::open_with(&dir, live.clone(), options).unwrap();
            let mut crashes = 0;
            for op in ops.iter().chain(std::iter::once(&Op::Crash)) {
                apply(&live, &state, op).await;
                if let Op::Crash = op {
                    let copy = dir.with_extension(format!("crash{crashes}"));
                    copy_dir(&dir, &copy);
                    crashes += 1;
                    let recovered = Arc::new(Controller::new(ControllerConfig::default()).unwrap());
                    let reopened = StateDir::open(&copy, recovered.clone()).unwrap();
                    assert_eq!(recovered.epoch(), live.epoch());
                    assert_eq!(picture(&recovered).await, picture(&live).await, "after {ops:?}");
                    drop(reopened);
                    let _ = std::fs::remove_dir_all(&copy);
                }
            }
            drop(state);
            let _ = std::fs::remove_dir_all(&dir);
        });
    }
}
