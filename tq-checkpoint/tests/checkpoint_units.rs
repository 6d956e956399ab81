//! Checkpoints of storage that keeps payloads in its own units (SimpleStorage in memory, and
//! with SSD offload): the cells are copied next to the controller state and come back in a
//! fresh deployment, with every column kind, tags, keys, links and leases; damage in a cells
//! file is named; a deployment with another unit count is refused; a checkpoint taken while
//! writers put and clear restores data for every sample it lists.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and examples may panic

use futures::StreamExt;
use std::time::Duration;
use tq_checkpoint::*;
use tq_client::*;
use tq_controller::PUBLIC_PARTITION;
use tq_core::{Batch, Column, ErrorKind, TagValue, Tags, Tensor};

#[path = "../../tq-backend-kv/tests/common/mod.rs"]
mod common;

use common::TempDir;

#[path = "support/batches.rs"]
mod batches;

use batches::every_kind;

#[path = "support/writers.rs"]
mod writers;

use writers::{assert_listed_keys_whole, Writers};

fn prompts(rows: usize) -> Batch {
    let v: Vec<i64> = (0..rows as i64 * 4).map(|i| 1000 + i).collect();
    Batch::from_columns([(
        "prompt",
        Column::Dense(Tensor::from_slice(vec![rows, 4], &v).unwrap()),
    )])
    .unwrap()
}

const KEYS: [&str; 6] = ["k0", "k1", "k2", "k3", "k4", "k5"];

/// A job's state: keys with every column kind, tags, two keys linked to public prompts, one
/// batch leased to an acknowledged stream (not acknowledged).
async fn fill(tq: &Client) {
    let p = tq.partition("train");
    p.kv_batch_put(&KEYS, &every_kind(KEYS.len(), 0), None)
        .await
        .unwrap();
    let mut tags = Tags::new();
    tags.insert("score".into(), TagValue::Float(0.5));
    p.kv_set_tags(&["k1"], vec![tags]).await.unwrap();
    let public = tq.partition(PUBLIC_PARTITION);
    public
        .kv_batch_put(&["q0", "q1"], &prompts(2), None)
        .await
        .unwrap();
    p.kv_link(
        &["k0", "k1"],
        &["q0", "q1"],
        &["prompt"],
        &LinkOptions::default(),
    )
    .await
    .unwrap();
    let leased = tq
        .get_meta(
            GetMetaRequest::fetch("train", &["x"], "train", 2, Wait::NoWait)
                .with_lease(Duration::from_secs(600)),
        )
        .await
        .unwrap();
    assert_eq!(leased.len(), 2);
}

async fn assert_filled(tq: &Client) {
    let p = tq.partition("train");
    assert_eq!(
        p.kv_batch_get(&KEYS, Some(&["x", "r", "o"])).await.unwrap(),
        every_kind(KEYS.len(), 0)
    );
    assert_eq!(
        p.kv_tags(&["k1"]).await.unwrap()[0].get("score"),
        Some(&TagValue::Float(0.5))
    );
    assert_eq!(
        p.kv_batch_get(&["k0", "k1"], Some(&["prompt"]))
            .await
            .unwrap(),
        prompts(2),
        "linked fields read the public rows"
    );
}

fn in_memory(units: u32) -> Client {
    let mut config = Config::default();
    config.storage.num_units = units;
    Client::embedded(config).unwrap()
}

fn files_with(dir: &TempDir, ext: &str) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(&dir.0)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    v.sort();
    v
}

#[tokio::test]
async fn in_memory_units_round_trip_through_a_checkpoint() {
    let dir = TempDir::new();
    let first = in_memory(3);
    fill(&first).await;
    let saved = first.save_checkpoint(&dir.0).await.unwrap();
    assert_eq!(saved.units.len(), 3, "one entry per unit");
    assert_eq!(saved.counts.leases, 2, "two samples leased");
    assert_eq!(saved.counts.keys, 8);
    // 6 keys x 3 fields, 2 public prompts; the links hold no cells of their own.
    assert_eq!(saved.units.iter().map(|u| u.cells).sum::<u64>(), 6 * 3 + 2);
    assert!(!files_with(&dir, "cells").is_empty());

    let second = in_memory(3);
    let loaded = second.load_checkpoint(&dir.0).await.unwrap();
    assert_eq!(loaded, saved);
    assert_filled(&second).await;
    // The restored deployment goes on: the leased batch is still leased (another consumer
    // of the task gets the other samples), and new writes land beside the restored ones.
    let mut rest = second
        .partition("train")
        .stream(StreamConfig::new("train", &["x"], 4).acknowledged(Duration::from_secs(600)))
        .unwrap();
    let item = rest.next().await.unwrap().unwrap();
    assert_eq!(
        item.meta.len(),
        4,
        "6 samples, 2 leased before the checkpoint"
    );
    second
        .partition("train")
        .kv_batch_put(&["k6", "k7"], &every_kind(2, 60), None)
        .await
        .unwrap();
    assert_eq!(
        second
            .partition("train")
            .kv_batch_get(&["k6", "k7"], Some(&["x", "r", "o"]))
            .await
            .unwrap(),
        every_kind(2, 60)
    );

    // Saving again replaces the files of the earlier checkpoint.
    let before = files_with(&dir, "cells");
    second.save_checkpoint(&dir.0).await.unwrap();
    let after = files_with(&dir, "cells");
    assert!(
        after.iter().all(|f| !before.contains(f)),
        "{before:?} {after:?}"
    );
    assert_eq!(files_with(&dir, "state").len(), 1);
}

#[tokio::test]
async fn damaged_cells_and_other_deployments_are_refused_before_anything_changes() {
    let dir = TempDir::new();
    let first = in_memory(2);
    fill(&first).await;
    first.save_checkpoint(&dir.0).await.unwrap();

    // One flipped byte in a cells file: refused, naming the file; the controller stays empty.
    let cells = files_with(&dir, "cells");
    let victim = &cells[cells.len() - 1];
    let good = std::fs::read(victim).unwrap();
    let mut bad = good.clone();
    let at = good.len() - 3;
    bad[at] ^= 0x10;
    std::fs::write(victim, &bad).unwrap();
    let fresh = in_memory(2);
    let e = fresh.load_checkpoint(&dir.0).await.unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Corrupted, "{e}");
    assert!(e.message().contains(victim.to_str().unwrap()), "{e}");
    assert!(
        fresh.list_partitions().await.unwrap().is_empty(),
        "nothing loaded"
    );
    // A missing cells file, named.
    std::fs::remove_file(victim).unwrap();
    let e = fresh.load_checkpoint(&dir.0).await.unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::NotFound, "{e}");
    assert!(e.message().contains(victim.to_str().unwrap()), "{e}");
    std::fs::write(victim, &good).unwrap();

    // Another unit count, or storage that keeps payloads elsewhere: refused, saying why.
    let e = in_memory(3).load_checkpoint(&dir.0).await.unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Invalid, "{e}");
    assert!(e.message().contains("2 storage units"), "{e}");
    assert!(e.message().contains("3 units"), "{e}");

    // The intact checkpoint still loads into the fresh deployment the refusals left alone.
    fresh.load_checkpoint(&dir.0).await.unwrap();
    assert_filled(&fresh).await;
}

#[tokio::test]
async fn ssd_units_round_trip_through_a_checkpoint() {
    let disk = TempDir::new();
    let dir = TempDir::new();
    let ssd = |sub: &str| {
        let mut config = Config::default();
        config.storage.num_units = 2;
        config.storage.ssd.enabled = true;
        config.storage.ssd.path = Some(disk.0.join(sub));
        // Every cell of more than 8 bytes on disk: the dense rows (16 bytes) and objects.
        config.storage.ssd.threshold_bytes = 8;
        Client::embedded(config).unwrap()
    };
    let first = ssd("a");
    fill(&first).await;
    let offloaded: u64 = first
        .storage()
        .status()
        .await
        .unwrap()
        .iter()
        .map(|u| u.offloaded_bytes)
        .sum();
    assert!(offloaded > 0, "cells are on disk before the checkpoint");
    let saved = first.save_checkpoint(&dir.0).await.unwrap();
    assert_eq!(saved.units.iter().map(|u| u.cells).sum::<u64>(), 6 * 3 + 2);
    drop(first);

    let second = ssd("b");
    second.load_checkpoint(&dir.0).await.unwrap();
    assert_filled(&second).await;
}

/// Writers put and clear all the time while checkpoints are taken; every checkpoint loads
/// into a fresh deployment in which every listed key reads back whole (the hold keeps a
/// clear from deleting cells between the controller state and the capture).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_taken_while_writers_run_restore_every_listed_sample() {
    let tq = in_memory(2);
    let writers = Writers::start(&tq);
    for i in 0..5 {
        let dir = TempDir::new();
        let saved = tq.save_checkpoint(&dir.0).await.unwrap();
        let fresh = in_memory(2);
        fresh.load_checkpoint(&dir.0).await.unwrap();
        let listed = assert_listed_keys_whole(&fresh, i).await;
        // The counts include keys whose clear was under way; listings do not.
        assert!(listed as u64 <= saved.counts.keys);
    }
    writers.stop().await;
}
