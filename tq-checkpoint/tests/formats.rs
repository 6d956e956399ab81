//! The file formats tq-checkpoint writes, pinned by committed files (`tests/data/`): a checkpoint
//! of in-memory storage units (`CHECKPOINT_FORMAT`: the manifest, the controller state and the
//! units' cells files; and, with feature `kv`, one of the in-memory KV store with its payloads
//! copied: the pages of encoded cells) and a dump of a partition (`DUMP_FORMAT`: `DUMP.toml`, the rows file
//! and the cells file). Each was written by the build that introduced its format, with a
//! `.view` file of what the deployment showed; every build must load them and show the same.
//! A format change adds a version, a decoder for the old one and new files
//! (`cargo test -p tq-client --test formats -- --ignored write_format_files`), and the old
//! files keep loading. (The controller snapshot and state dir inside a checkpoint are pinned
//! by tq-controller's own committed files.)
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and examples may panic

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tq_checkpoint::*;
use tq_client::*;
use tq_controller::PUBLIC_PARTITION;
use tq_core::{Batch, Column, TagValue, Tags, Tensor, Value};

#[path = "../../tq-backend-kv/tests/common/mod.rs"]
mod common;

#[path = "support/batches.rs"]
mod batches;

use batches::every_kind;

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data")
}

fn checkpoint_dir(format: u32) -> PathBuf {
    data_dir().join(format!("checkpoint-format{format}"))
}

fn dump_dir(format: u32) -> PathBuf {
    data_dir().join(format!("dump-format{format}"))
}

fn in_memory(units: u32) -> Client {
    let mut config = Config::default();
    config.storage.num_units = units;
    Client::embedded(config).unwrap()
}

const KEYS: [&str; 4] = ["k0", "k1", "k2", "k3"];

/// The state the files hold: keys of every column kind with tags, two of them linked to public
/// prompts, two leased to a task (unacknowledged).
async fn fill(tq: &Client) {
    let p = tq.partition("train");
    p.kv_batch_put(&KEYS, &every_kind(KEYS.len(), 7), None)
        .await
        .unwrap();
    let mut tags = Tags::new();
    tags.insert("score".into(), TagValue::Float(0.25));
    tags.insert("name".into(), TagValue::from("second"));
    p.kv_set_tags(&["k1"], vec![tags]).await.unwrap();
    let v: Vec<i64> = (0..8).map(|i| 100 + i).collect();
    let prompts = Batch::from_columns([(
        "prompt",
        Column::Dense(Tensor::from_slice(vec![2, 4], &v).unwrap()),
    )])
    .unwrap();
    let public = tq.partition(PUBLIC_PARTITION);
    public
        .kv_batch_put(&["q0", "q1"], &prompts, None)
        .await
        .unwrap();
    p.kv_link(
        &["k0", "k2"],
        &["q0", "q1"],
        &["prompt"],
        &LinkOptions::default(),
    )
    .await
    .unwrap();
    tq.get_meta(
        GetMetaRequest::fetch("train", &["x"], "train", 2, Wait::NoWait)
            .with_lease(Duration::from_secs(3600)),
    )
    .await
    .unwrap();
}

/// What `tq` shows of `partitions`, as text: every key with its tags, and every field it
/// holds, row by row (dtype, shape and bytes).
async fn view(tq: &Client, partitions: &[&str]) -> String {
    let mut out = String::new();
    for name in partitions {
        let p = tq.partition(*name);
        let mut entries = p.kv_list().await.unwrap().entries;
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        for (key, tags) in &entries {
            writeln!(out, "{name}/{key} tags {tags:?}").unwrap();
            let batch = p.kv_batch_get(&[key.as_str()], None).await.unwrap();
            for (field, column) in batch.columns() {
                for value in column.values() {
                    match value {
                        Value::Tensor(t) => writeln!(
                            out,
                            "  {field}: {:?} {:?} {:02x?}",
                            t.dtype(),
                            t.shape(),
                            &t.data()[..]
                        ),
                        Value::Object(b) => writeln!(out, "  {field}: object {:02x?}", &b[..]),
                    }
                    .unwrap();
                }
            }
        }
    }
    let consumed = tq
        .partition("train")
        .consumption_status("train")
        .await
        .unwrap();
    writeln!(
        out,
        "train/train consumed {:?} leased {:?}",
        consumed.consumed, consumed.leased
    )
    .unwrap();
    out
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e} (committed test data is missing)", path.display()))
}

/// The formats that have committed files: every one from the first that has them to the
/// current one.
fn committed(current: u32, first: u32, dir: fn(u32) -> PathBuf) -> Vec<u32> {
    let formats: Vec<u32> = (first..=current).collect();
    for f in &formats {
        assert!(
            dir(*f).is_dir(),
            "format {f} has no committed files at {}: write them with \
             `cargo test -p tq-client --test formats -- --ignored write_format_files`",
            dir(*f).display()
        );
    }
    formats
}

#[tokio::test]
async fn committed_checkpoints_of_every_format_load() {
    for format in committed(CHECKPOINT_FORMAT, 3, checkpoint_dir) {
        let dir = checkpoint_dir(format);
        let tq = in_memory(2);
        let manifest = tq
            .load_checkpoint(&dir)
            .await
            .unwrap_or_else(|e| panic!("checkpoint format {format}: {e}"));
        assert_eq!(manifest.format, format);
        assert_eq!(
            view(&tq, &["train", PUBLIC_PARTITION]).await,
            read(&dir.with_extension("view")),
            "checkpoint format {format} shows something else than when it was written"
        );
    }
}

#[tokio::test]
async fn committed_dumps_of_every_format_load() {
    for format in committed(DUMP_FORMAT, 1, dump_dir) {
        let dir = dump_dir(format);
        let tq = in_memory(2);
        // The dump keeps its links: the public prompts must be there first.
        let v: Vec<i64> = (0..8).map(|i| 100 + i).collect();
        let prompts = Batch::from_columns([(
            "prompt",
            Column::Dense(Tensor::from_slice(vec![2, 4], &v).unwrap()),
        )])
        .unwrap();
        tq.partition(PUBLIC_PARTITION)
            .kv_batch_put(&["q0", "q1"], &prompts, None)
            .await
            .unwrap();
        let manifest = tq
            .partition("train")
            .kv_load(&format!("file://{}", dir.display()))
            .await
            .unwrap_or_else(|e| panic!("dump format {format}: {e}"));
        assert_eq!(manifest.format, format);
        // A dump holds keys, tags, cells and links; not consumption.
        let shown = view(&tq, &["train"]).await;
        let expected = read(&dir.with_extension("view"));
        assert_eq!(
            shown
                .lines()
                .filter(|l| !l.contains("consumed"))
                .collect::<Vec<_>>(),
            expected
                .lines()
                .filter(|l| !l.contains("consumed"))
                .collect::<Vec<_>>(),
            "dump format {format} shows something else than when it was written"
        );
    }
}

fn kv_copy_dir(format: u32) -> PathBuf {
    data_dir().join(format!("checkpoint-format{format}-kv-copy"))
}

/// A deployment on the in-memory KV store (no units), which only a checkpoint that copies the
/// payloads can bring back.
fn in_memory_kv() -> Client {
    let config = Config::from_toml(
        "[storage]\nbackend = \"kv\"\n[storage.kv]\nstores = [{ url = \"memory://\" }]\n",
    )
    .unwrap();
    Client::embedded(config).unwrap()
}

/// What the KV deployment holds: every column kind, tags, a key overwritten (its cells under a
/// write version), two leased. (KV storage resolves no links.)
async fn fill_kv(tq: &Client) {
    let p = tq.partition("train");
    p.kv_batch_put(&KEYS, &every_kind(KEYS.len(), 3), None)
        .await
        .unwrap();
    p.kv_batch_put(&["k2"], &every_kind(1, 40), None)
        .await
        .unwrap();
    let mut tags = Tags::new();
    tags.insert("score".into(), TagValue::Int(-4));
    p.kv_set_tags(&["k3"], vec![tags]).await.unwrap();
    tq.get_meta(
        GetMetaRequest::fetch("train", &["x"], "train", 2, Wait::NoWait)
            .with_lease(Duration::from_secs(3600)),
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn committed_kv_copy_checkpoints_of_every_format_load() {
    for format in committed(CHECKPOINT_FORMAT, 3, kv_copy_dir) {
        let dir = kv_copy_dir(format);
        let tq = in_memory_kv();
        let manifest = tq
            .load_checkpoint(&dir)
            .await
            .unwrap_or_else(|e| panic!("KV-copy checkpoint format {format}: {e}"));
        assert_eq!(manifest.format, format);
        assert_eq!(
            view(&tq, &["train"]).await,
            read(&dir.with_extension("view")),
            "KV-copy checkpoint format {format} shows something else than when it was written"
        );
    }
}

/// Writes this build's files for the current formats (run once, by the change that
/// introduces a format; never rewrite the files of an existing format).
#[tokio::test]
#[ignore = "writes committed test data"]
async fn write_format_files() {
    let tq = in_memory(2);
    fill(&tq).await;

    let dir = checkpoint_dir(CHECKPOINT_FORMAT);
    assert!(
        !dir.exists(),
        "{} exists: formats are never rewritten",
        dir.display()
    );
    tq.save_checkpoint(&dir).await.unwrap();
    let loaded = in_memory(2);
    loaded.load_checkpoint(&dir).await.unwrap();
    let shown = view(&loaded, &["train", PUBLIC_PARTITION]).await;
    assert_eq!(shown, view(&tq, &["train", PUBLIC_PARTITION]).await);
    std::fs::write(dir.with_extension("view"), shown).unwrap();

    let dir = dump_dir(DUMP_FORMAT);
    assert!(
        !dir.exists(),
        "{} exists: formats are never rewritten",
        dir.display()
    );
    std::fs::create_dir_all(&dir).unwrap();
    tq.partition("train")
        .kv_dump(
            &format!("file://{}", dir.display()),
            None,
            &DumpOptions::default(),
        )
        .await
        .unwrap();
    std::fs::write(dir.with_extension("view"), view(&tq, &["train"]).await).unwrap();

    {
        let tq = in_memory_kv();
        fill_kv(&tq).await;
        let dir = kv_copy_dir(CHECKPOINT_FORMAT);
        assert!(
            !dir.exists(),
            "{} exists: formats are never rewritten",
            dir.display()
        );
        tq.save_checkpoint_with(
            dir.to_str().unwrap(),
            CheckpointOptions {
                copy_payloads: true,
            },
        )
        .await
        .unwrap();
        let loaded = in_memory_kv();
        loaded.load_checkpoint(&dir).await.unwrap();
        let shown = view(&loaded, &["train"]).await;
        assert_eq!(shown, view(&tq, &["train"]).await);
        std::fs::write(dir.with_extension("view"), shown).unwrap();
    }
}
