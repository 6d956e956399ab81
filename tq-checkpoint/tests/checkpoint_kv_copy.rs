//! Checkpoints that copy KV payloads (`CheckpointOptions::copy_payloads`): the cells the
//! controller state names are read from the store into the checkpoint and written back when it
//! is loaded, so a checkpoint loads into another (empty) store: from one redis-server into
//! another, and for the in-memory KV store, which cannot be checkpointed otherwise. Every
//! column kind, overwritten cells, tags and leases come back; damage in a copy file is named
//! before anything changes; a checkpoint taken while writers put, overwrite and clear restores
//! every key it lists whole.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and examples may panic

#[path = "../../tq-backend-kv/tests/common/mod.rs"]
mod common;

#[path = "support/batches.rs"]
mod batches;

use batches::every_kind;

#[path = "support/writers.rs"]
mod writers;

use common::{redis_available, RedisServer, TempDir};
use futures::StreamExt;
use std::time::Duration;
use tq_checkpoint::*;
use tq_client::*;
use tq_core::{Batch, ErrorKind, TagValue, Tags};
use writers::{assert_listed_keys_whole, Writers};

const COPY: CheckpointOptions = CheckpointOptions {
    copy_payloads: true,
};
const KEYS: [&str; 6] = ["k0", "k1", "k2", "k3", "k4", "k5"];

fn kv_on(url: &str) -> Client {
    let config = Config::from_toml(&format!(
        "[storage]\nbackend = \"kv\"\n[storage.kv]\nstores = [{{ url = \"{url}\" }}]\n"
    ))
    .unwrap();
    Client::embedded(config).unwrap()
}

fn dir_url(dir: &TempDir) -> String {
    dir.0.to_str().unwrap().to_string()
}

/// Keys with every column kind, one of them overwritten (its cells under a write version),
/// tags, and two samples leased to an acknowledged fetch.
async fn fill(tq: &Client) {
    let p = tq.partition("train");
    p.kv_batch_put(&KEYS, &every_kind(KEYS.len(), 0), None)
        .await
        .unwrap();
    p.kv_put("k2", &every_kind(1, 100), None).await.unwrap();
    let mut tags = Tags::new();
    tags.insert("score".into(), TagValue::Float(0.5));
    p.kv_set_tags(&["k1"], vec![tags]).await.unwrap();
    let leased = tq
        .get_meta(
            GetMetaRequest::fetch("train", &["x"], "train", 2, Wait::NoWait)
                .with_lease(Duration::from_secs(600)),
        )
        .await
        .unwrap();
    assert_eq!(leased.len(), 2);
}

/// Row `r` of `got` is row `r` of `every_kind(6, 0)` where `bases[r] == r`, else the row of
/// `every_kind(1, bases[r])` (an overwrite). Compared value by value: a one-row read of a
/// ragged field may come back dense.
fn assert_rows(got: &Batch, bases: &[i64]) {
    let original = every_kind(KEYS.len(), 0);
    for (r, &base) in bases.iter().enumerate() {
        let (want, row) = if base == r as i64 {
            (original.clone(), r)
        } else {
            (every_kind(1, base), 0)
        };
        for field in ["x", "r", "o"] {
            assert_eq!(
                got.column(field).unwrap().value(r),
                want.column(field).unwrap().value(row),
                "row {r}, field `{field}`"
            );
        }
    }
}

async fn assert_filled(tq: &Client) {
    let p = tq.partition("train");
    assert_rows(
        &p.kv_batch_get(&KEYS, Some(&["x", "r", "o"])).await.unwrap(),
        &[0, 1, 100, 3, 4, 5],
    );
    assert_eq!(
        p.kv_tags(&["k1"]).await.unwrap()[0].get("score"),
        Some(&TagValue::Float(0.5))
    );
    // The lease is still held: the task's next batch is the other four samples.
    let mut rest = p
        .stream(StreamConfig::new("train", &["x"], 4).acknowledged(Duration::from_secs(600)))
        .unwrap();
    let item = rest.next().await.unwrap().unwrap();
    assert_eq!(
        item.meta.len(),
        4,
        "6 samples, 2 leased before the checkpoint"
    );
    let left = tq
        .get_meta(GetMetaRequest::fetch(
            "train",
            &["x"],
            "train",
            1,
            Wait::NoWait,
        ))
        .await
        .unwrap();
    assert_eq!(
        left.len(),
        0,
        "the two leased samples are not handed out again"
    );
}

#[tokio::test]
async fn copied_payloads_bring_an_in_memory_kv_store_back() {
    let dir = TempDir::new();
    let first = kv_on("memory://");
    fill(&first).await;
    let e = first.save_checkpoint(&dir.0).await.unwrap_err();
    assert!(
        matches!(e.kind(), ErrorKind::Unsupported { .. }) && e.message().contains("copy"),
        "without the copy an in-memory store is refused, pointing at the option: {e}"
    );
    let saved = first
        .save_checkpoint_with(&dir_url(&dir), COPY)
        .await
        .unwrap();
    let copied = saved.kv_copy.as_ref().expect("the payloads were copied");
    assert_eq!(copied.cells, 18, "6 keys × 3 fields");
    assert_eq!(saved.counts.leases, 2);
    assert_eq!(saved.format, CHECKPOINT_FORMAT);

    // A fresh process with an empty in-memory store gets everything back.
    let second = kv_on("memory://");
    second.load_checkpoint(&dir.0).await.unwrap();
    assert_filled(&second).await;
    // The first one goes on: the save lifted its hold on clears.
    first.partition("train").kv_clear(&["k0"]).await.unwrap();
}

#[tokio::test]
async fn damaged_copies_and_storage_that_cannot_take_them_change_nothing() {
    let dir = TempDir::new();
    let first = kv_on("memory://");
    fill(&first).await;
    first
        .save_checkpoint_with(&dir_url(&dir), COPY)
        .await
        .unwrap();
    let pages = std::fs::read_dir(&dir.0)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "pages"))
        .expect("a pages file");
    let good = std::fs::read(&pages).unwrap();

    // Storage units cannot take KV payloads.
    let units = Client::embedded(Config::default()).unwrap();
    let e = units.load_checkpoint(&dir.0).await.unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Invalid, "{e}");
    assert!(e.message().contains("copied KV payloads"), "{e}");
    assert!(units.list_partitions().await.unwrap().is_empty());

    // A flipped byte anywhere in the copy is named; the controller stays empty.
    let second = kv_on("memory://");
    for at in [3, good.len() / 2, good.len() - 1] {
        let mut bad = good.clone();
        bad[at] ^= 0x40;
        std::fs::write(&pages, &bad).unwrap();
        let e = second.load_checkpoint(&dir.0).await.unwrap_err();
        assert_eq!(e.kind(), &ErrorKind::Corrupted, "{e}");
        assert!(
            e.message()
                .contains(pages.file_name().unwrap().to_str().unwrap()),
            "names the file: {e}"
        );
        assert!(second.list_partitions().await.unwrap().is_empty());
    }
    std::fs::write(&pages, &good).unwrap();
    second.load_checkpoint(&dir.0).await.unwrap();
    assert_filled(&second).await;
}

/// From one redis-server into another, empty one: the checkpoint does not depend on the
/// store it came from.
#[tokio::test]
async fn copied_payloads_move_a_job_to_another_redis_server() {
    if !redis_available("copied_payloads_move_a_job_to_another_redis_server") {
        return;
    }
    let (from, to) = (RedisServer::start(), RedisServer::start());
    let dir = TempDir::new();
    let first = kv_on(&from.url());
    fill(&first).await;
    let saved = first
        .save_checkpoint_with(&dir_url(&dir), COPY)
        .await
        .unwrap();
    assert_eq!(saved.kv_copy.unwrap().cells, 18);
    assert_eq!(to.cli(&["DBSIZE"]).trim(), "0");
    drop(first);
    drop(from);
    let second = kv_on(&to.url());
    second.load_checkpoint(&dir.0).await.unwrap();
    assert_filled(&second).await;
}

/// A copy loads back into the very store it came from after that store moved on in the
/// checkpoint's epoch (its keys cleared, their indexes reused at higher generations, new keys
/// written): the load starts a fresh epoch, so the checkpoint's samples read as saved and new
/// writes never meet the generation keys written after the checkpoint.
#[tokio::test]
async fn a_copy_loads_into_the_store_it_came_from_after_that_store_moved_on() {
    if !redis_available("a_copy_loads_into_the_store_it_came_from_after_that_store_moved_on") {
        return;
    }
    let redis = RedisServer::start();
    let dir = TempDir::new();
    let first = kv_on(&redis.url());
    fill(&first).await;
    first
        .save_checkpoint_with(&dir_url(&dir), COPY)
        .await
        .unwrap();
    let names = |prefix: &str| -> Vec<String> { (0..24).map(|i| format!("{prefix}{i}")).collect() };
    let later = names("later");
    let later: Vec<&str> = later.iter().map(String::as_str).collect();
    let p = first.partition("train");
    p.kv_clear(&KEYS).await.unwrap();
    for round in 0..3 {
        p.kv_batch_put(&later, &every_kind(later.len(), 1000 * round), None)
            .await
            .unwrap();
        p.kv_clear(&later).await.unwrap();
    }
    p.kv_batch_put(&later, &every_kind(later.len(), 5000), None)
        .await
        .unwrap();
    let saved_epoch = first.epoch();
    drop(first);

    let second = kv_on(&redis.url());
    second.load_checkpoint(&dir.0).await.unwrap();
    assert_ne!(
        second.epoch(),
        saved_epoch,
        "a load with copied payloads starts a fresh epoch"
    );
    assert_filled(&second).await;
    // New keys take the indexes the earlier life wrote after the checkpoint.
    let fresh = names("new");
    let fresh: Vec<&str> = fresh.iter().map(String::as_str).collect();
    let p = second.partition("train");
    p.kv_batch_put(&fresh, &every_kind(fresh.len(), 7000), None)
        .await
        .expect("new keys write where the earlier life wrote after the checkpoint");
    let got = p.kv_batch_get(&fresh, Some(&["x"])).await.unwrap();
    assert_eq!(got.column("x"), every_kind(fresh.len(), 7000).column("x"));
}

/// Writers put, overwrite and clear all the time while checkpoints copy their payloads; every
/// checkpoint loads into a fresh store in which every listed, produced key reads back whole
/// (clears and overwrites wait for the copy, so none removes a cell it still has to read).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_taken_while_writers_run_restore_every_listed_key() {
    let tq = kv_on("memory://");
    let writers = Writers::start(&tq);
    for i in 0..5 {
        let dir = TempDir::new();
        tq.save_checkpoint_with(&dir_url(&dir), COPY).await.unwrap();
        let fresh = kv_on("memory://");
        fresh.load_checkpoint(&dir.0).await.unwrap();
        assert_listed_keys_whole(&fresh, i).await;
    }
    writers.stop().await;
}
