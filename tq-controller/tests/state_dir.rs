//! `--state-dir` at the controller level: what was made durable comes back in a controller
//! started on the directory (epoch included); a damaged state file is refused by name and
//! nothing is restored; many concurrent changes all become durable.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and examples may panic
use std::sync::Arc;
mod common;
use common::picture;
use tq_controller::*;
use tq_core::{DType, ErrorKind, FieldMeta};

fn controller() -> Arc<Controller> {
    Arc::new(Controller::new(ControllerConfig::default()).unwrap())
}

fn tempdir() -> std::path::PathBuf {
    common::tempdir("state-dir")
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
    let second_state = StateDir::open(&dir, second.clone()).unwrap();
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

    drop(second_state);

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

/// Allocates key `key` in partition `partition` (one change, one record).
async fn allocate(c: &Controller, state: &StateDir, partition: &str, key: &str) {
    let kv = c
        .kv_retrieve_meta(partition, &[key.to_string()], true)
        .await
        .unwrap();
    assert_eq!(kv.meta.len(), 1);
    state.changed().await.unwrap();
}

fn log_len(dir: &std::path::Path) -> u64 {
    std::fs::metadata(dir.join("controller.log")).unwrap().len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_go_to_the_log_and_a_record_cut_short_is_dropped() {
    let dir = tempdir();
    let first = controller();
    let state = StateDir::open(&dir, first.clone()).unwrap();
    let snapshot_len = std::fs::metadata(dir.join("controller.state"))
        .unwrap()
        .len();
    put_keys(&first, &state, &["a".into(), "b".into()]).await;
    // The commits appended records; the snapshot was not rewritten.
    let after_two = log_len(&dir);
    assert!(after_two > 0);
    assert_eq!(
        std::fs::metadata(dir.join("controller.state"))
            .unwrap()
            .len(),
        snapshot_len
    );
    // One more change, one more record: a key allocated.
    allocate(&first, &state, "p", "c").await;
    let whole = std::fs::read(dir.join("controller.log")).unwrap();
    let expected = picture(&first).await;
    drop(state);

    // A crash while the last record was written: half of it on disk. The state of the records
    // before it comes back; the cut-off one (never acknowledged) is dropped.
    let cut = after_two as usize + (whole.len() - after_two as usize) / 2;
    std::fs::write(dir.join("controller.log"), &whole[..cut]).unwrap();
    let second = controller();
    let state = StateDir::open(&dir, second.clone()).unwrap();
    let listing = second.kv_list(Some("p")).await.unwrap();
    let keys: Vec<&str> = listing[0].entries.iter().map(|e| e.0.as_str()).collect();
    assert_eq!(keys.len(), 2, "{keys:?}");
    assert!(!keys.contains(&"c"), "{keys:?}");
    // Opening cut the log back to its whole records, and left the snapshot as it was.
    assert_eq!(log_len(&dir), after_two);
    assert_eq!(
        std::fs::metadata(dir.join("controller.state"))
            .unwrap()
            .len(),
        snapshot_len
    );
    drop(state);

    // With the whole log, everything comes back.
    std::fs::write(dir.join("controller.log"), &whole).unwrap();
    let third = controller();
    let _state = StateDir::open(&dir, third.clone()).unwrap();
    assert_eq!(picture(&third).await, expected);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_record_with_more_after_it_is_refused_by_name() {
    let dir = tempdir();
    let first = controller();
    let state = StateDir::open(&dir, first.clone()).unwrap();
    allocate(&first, &state, "p", "a").await;
    let first_record = log_len(&dir) as usize;
    assert!(first_record > 40, "{first_record}");
    put_keys(&first, &state, &["b".into()]).await;
    drop(state);
    let mut bytes = std::fs::read(dir.join("controller.log")).unwrap();
    // Inside the first record's body (past its 20-byte header).
    bytes[first_record / 2] ^= 0x01;
    std::fs::write(dir.join("controller.log"), &bytes).unwrap();
    let second = controller();
    let e = StateDir::open(&dir, second.clone())
        .err()
        .expect("a damaged log");
    assert_eq!(e.kind(), &ErrorKind::Corrupted, "{e}");
    assert!(e.message().contains("controller.log"), "{e}");
    assert!(e.message().contains("record 1 at byte 0"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_dropped_and_a_restored_state_survive_through_the_log() {
    // A controller with two partitions, to restore from.
    let source = controller();
    let scratch = tempdir();
    let source_state = StateDir::open(&scratch, source.clone()).unwrap();
    put_keys(&source, &source_state, &["s1".into(), "s2".into()]).await;
    let (snapshot, _) = source.snapshot().unwrap();

    let dir = tempdir();
    let first = controller();
    let state = StateDir::open(&dir, first.clone()).unwrap();
    // A restore replaces the whole state: the next record carries all of it.
    first.restore(&snapshot).unwrap();
    state.changed().await.unwrap();
    allocate(&first, &state, "gone", "g").await;
    // Clearing its only sample removes the partition.
    let meta = first.mark_clearing("gone", None).await.unwrap();
    state.changed().await.unwrap();
    first.release("gone", meta.samples()).await.unwrap();
    state.changed().await.unwrap();
    let expected = picture(&first).await;
    assert!(!expected.contains("gone"), "{expected}");
    assert!(expected.contains("s1"), "{expected}");
    let epoch = first.epoch();
    drop(state);

    let second = controller();
    let _state = StateDir::open(&dir, second.clone()).unwrap();
    assert_eq!(second.epoch(), epoch);
    assert_eq!(picture(&second).await, expected);
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&scratch);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_log_is_compacted_into_a_snapshot_and_nothing_is_lost() {
    let dir = tempdir();
    let first = controller();
    let options = StateDirOptions {
        compact_min_bytes: 1,
    };
    let state = StateDir::open_with(&dir, first.clone(), options).unwrap();
    // A compaction rewrites the snapshot (the partition grows with every put).
    let snapshot = || std::fs::read(dir.join("controller.state")).unwrap();
    let mut compactions = 0;
    let mut last = snapshot();
    for i in 0..40 {
        put_keys(&first, &state, &[format!("k{i}")]).await;
        let now = snapshot();
        if now != last {
            compactions += 1;
        }
        last = now;
    }
    assert!(compactions > 0, "the log was never compacted");
    let expected = picture(&first).await;
    drop(state);
    let second = controller();
    let _state = StateDir::open(&dir, second.clone()).unwrap();
    assert_eq!(picture(&second).await, expected);
    assert_eq!(
        second.kv_list(Some("p")).await.unwrap()[0].entries.len(),
        40
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Two controllers on one state dir would append to one log and lose each other's changes:
/// the second is refused, naming the holder's pid, and gets the directory once the first is
/// gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_dir_has_one_controller_at_a_time() {
    let dir = tempdir();
    let first = controller();
    let state = StateDir::open(&dir, first.clone()).unwrap();
    put_keys(&first, &state, &["a".to_string()]).await;

    let second = controller();
    let e = StateDir::open(&dir, second.clone())
        .err()
        .expect("a state dir in use");
    assert_eq!(e.kind(), &ErrorKind::Conflict, "{e}");
    assert!(
        e.message().contains(&format!("pid {}", std::process::id())),
        "{e}"
    );
    assert!(
        second.list_partitions().await.unwrap().is_empty(),
        "nothing restored"
    );

    drop(state);
    let third = controller();
    let _state = StateDir::open(&dir, third.clone()).unwrap();
    assert_eq!(third.kv_list(Some("p")).await.unwrap().len(), 1);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A request tagged with a [`RequestId`] is applied once: an insert and an at-most-once fetch
/// that come again — in the same life, and after a restart on the state dir (also from a
/// compacted snapshot) — get their first answer, and the partition is as one application left
/// it. A request below what its client said is finished is refused as of unknown outcome, and
/// the answers below it are dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tagged_request_is_applied_once_across_restarts() {
    let dir = tempdir();
    let id = |seq, done_below| RequestId {
        client: 0xc1,
        seq,
        done_below,
    };
    let insert = || GetMetaRequest {
        partition: "p".into(),
        fields: vec!["x".into()],
        mode: GetMetaMode::Insert { count: 4 },
        sampler: None,
        dp_rank: None,
        batch_index: None,
        sampler_args: None,
    };
    let fetch = || GetMetaRequest::fetch("p", &["x"], "train", 2, Wait::NoWait);
    let first = controller();
    let state = StateDir::open(&dir, first.clone()).unwrap();
    let inserted = first.get_meta_once(insert(), id(1, 1)).await.unwrap();
    state.changed().await.unwrap();
    assert_eq!(
        first.get_meta_once(insert(), id(1, 1)).await.unwrap(),
        inserted
    );
    assert_eq!(first.samples_in_use(), 4, "one insert, not two");
    first
        .notify_production(ProductionNotice {
            partition: "p".into(),
            samples: inserted.samples().to_vec(),
            schemas: [("x".to_string(), FieldMeta::dense(DType::I64, vec![2]))].into(),
            tags: None,
            backend_meta: None,
        })
        .await
        .unwrap();
    let fetched = first.get_meta_once(fetch(), id(2, 1)).await.unwrap();
    state.changed().await.unwrap();
    assert_eq!(fetched.len(), 2);
    assert_eq!(first.remembered_answers(), 2);
    drop(state);

    // A restart replays the log: the same ids get the same answers; nothing is applied again.
    let second = controller();
    let state = StateDir::open(&dir, second.clone()).unwrap();
    assert_eq!(
        second.get_meta_once(insert(), id(1, 1)).await.unwrap(),
        inserted
    );
    assert_eq!(
        second.get_meta_once(fetch(), id(2, 1)).await.unwrap(),
        fetched
    );
    assert_eq!(second.samples_in_use(), 4);
    let status = second.consumption_status("p", "train").await.unwrap();
    let consumed = status.consumed.iter().filter(|c| **c).count();
    assert_eq!(consumed, 2, "{status:?}");
    // The next fetch (a new id) takes the other two.
    let rest = second.get_meta_once(fetch(), id(3, 1)).await.unwrap();
    state.changed().await.unwrap();
    let mut all: Vec<_> = fetched.samples().iter().chain(rest.samples()).collect();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 4);
    drop(state);

    // From a compacted snapshot (format 4 carries the answers), with the client saying that
    // everything below 3 is finished: 3 is answered, 1 and 2 are forgotten and refused.
    let third = controller();
    let state = StateDir::open_with(
        &dir,
        third.clone(),
        StateDirOptions {
            compact_min_bytes: 0,
        },
    )
    .unwrap();
    assert_eq!(third.get_meta_once(fetch(), id(3, 1)).await.unwrap(), rest);
    let again = third.get_meta_once(fetch(), id(4, 3)).await;
    assert_eq!(again.unwrap().len(), 0, "nothing left to fetch");
    state.changed().await.unwrap();
    let e = third
        .get_meta_once(insert(), id(1, 3))
        .await
        .expect_err("below done_below");
    assert_eq!(e.retry(), tq_core::Retry::OutcomeUnknown, "{e}");
    assert!(
        e.message().contains("whether it was applied is unknown"),
        "{e}"
    );
    assert_eq!(third.samples_in_use(), 4);
    assert_eq!(third.remembered_answers(), 1, "the answer to 3 is kept");
    drop(state);
    let fourth = controller();
    let _state = StateDir::open(&dir, fourth.clone()).unwrap();
    assert_eq!(fourth.remembered_answers(), 1);
    assert_eq!(fourth.get_meta_once(fetch(), id(3, 3)).await.unwrap(), rest);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A tagged production notice that comes again after its samples were consumed and cleared
/// (its first answer lost) gets its first answer, also after a restart on the state dir,
/// instead of a refusal as a stale write; an untagged one is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tagged_notice_that_comes_again_after_a_clear_gets_its_first_answer() {
    let dir = tempdir();
    let id = |seq| RequestId {
        client: 0xc2,
        seq,
        done_below: 1,
    };
    let first = controller();
    let state = StateDir::open(&dir, first.clone()).unwrap();
    let kv = first
        .kv_retrieve_meta("p", &["a".to_string()], true)
        .await
        .unwrap();
    let notice = || ProductionNotice {
        partition: "p".into(),
        samples: kv.meta.samples().to_vec(),
        schemas: [("x".to_string(), FieldMeta::dense(DType::I64, vec![2]))].into(),
        tags: None,
        backend_meta: None,
    };
    let answer = first.notify_once(notice(), id(1)).await.unwrap();
    let marked = first.mark_clearing("p", None).await.unwrap();
    first.release("p", marked.samples()).await.unwrap();
    state.changed().await.unwrap();
    assert!(
        first.list_partitions().await.unwrap().is_empty(),
        "cleared and removed"
    );
    let e = first.notify_production(notice()).await.unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Conflict, "{e}");
    assert_eq!(first.notify_once(notice(), id(1)).await.unwrap(), answer);
    assert!(
        first.list_partitions().await.unwrap().is_empty(),
        "nothing applied again"
    );
    drop(state);
    let second = controller();
    let _state = StateDir::open(&dir, second.clone()).unwrap();
    assert_eq!(second.notify_once(notice(), id(1)).await.unwrap(), answer);
    assert!(second.list_partitions().await.unwrap().is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}
