//! Dump and load of a partition's keys with links (`Dumps::kv_dump` / `kv_load` (`use tq::checkpoint::Dumps`)): a round
//! trip with every column kind, tags and links that stay links; the stale-link case of
//! upstream PR #200 (link keys to a public row, dump, clear and re-put the public row, load)
//! refused, and loaded with its original values from a dereferenced dump; damage and newer
//! formats refused by name; keys that exist, and a destination whose schema cannot take the
//! link, refused with nothing written.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and examples may panic

use tq_checkpoint::*;
use tq_client::*;
use tq_core::{Batch, Bytes, Column, ErrorKind, TagValue, Tags, Tensor};

#[path = "../../tq-backend-kv/tests/common/mod.rs"]
mod common;

use common::TempDir;

#[path = "support/batches.rs"]
mod batches;

use batches::every_kind;

fn url(dir: &TempDir) -> String {
    format!("file://{}", dir.0.display())
}

/// `rows` prompts of 6 i64 each, all equal to `value`.
fn prompt(rows: usize, value: i64) -> Batch {
    Batch::from_columns([(
        "prompt",
        Column::Dense(Tensor::from_slice(vec![rows, 6], &vec![value; rows * 6]).unwrap()),
    )])
    .unwrap()
}

const KEYS: [&str; 4] = ["r0", "r1", "r2", "r3"];

/// Four responses with every column kind, a tag each, and a `prompt` linked to public `v0`.
async fn job(tq: &Client) {
    tq.partition(tq_controller::PUBLIC_PARTITION)
        .kv_put("v0", &prompt(1, 5), None)
        .await
        .unwrap();
    let p = tq.partition("train");
    let tags: Vec<Tags> = (0..4)
        .map(|i| Tags::from([("score".to_string(), TagValue::Int(i))]))
        .collect();
    p.kv_batch_put(&KEYS, &every_kind(4, 0), Some(tags))
        .await
        .unwrap();
    p.kv_link(&KEYS, &["v0"; 4], &["prompt"], &LinkOptions::default())
        .await
        .unwrap();
}

async fn assert_job(p: &Partition) {
    assert_eq!(
        p.kv_batch_get(&KEYS, Some(&["x", "r", "o"])).await.unwrap(),
        every_kind(4, 0)
    );
    assert_eq!(
        p.kv_batch_get(&KEYS, Some(&["prompt"])).await.unwrap(),
        prompt(4, 5)
    );
    let tags = p.kv_tags(&KEYS).await.unwrap();
    for (i, t) in tags.iter().enumerate() {
        assert_eq!(t.get("score"), Some(&TagValue::Int(i as i64)));
    }
}

#[tokio::test]
async fn a_dump_round_trips_with_links_that_stay_links() {
    let tq = Client::embedded(Config::default()).unwrap();
    job(&tq).await;
    let dir = TempDir::new();
    let m = tq
        .partition("train")
        .kv_dump(&url(&dir), None, &DumpOptions::default())
        .await
        .unwrap();
    assert_eq!((m.keys, m.cells, m.links), (4, 12, 4));
    assert_eq!(m.format, DUMP_FORMAT);

    let restored = tq.partition("restored");
    restored.kv_load(&url(&dir)).await.unwrap();
    assert_job(&restored).await;
    // The prompt is a link again, not a copy: the restored keys' links point at v0.
    let meta = restored.kv_meta(&KEYS).await.unwrap();
    let v0 = tq
        .partition(tq_controller::PUBLIC_PARTITION)
        .kv_meta(&["v0"])
        .await
        .unwrap()
        .samples()[0];
    assert!(meta.links().iter().all(|l| l.get("prompt") == Some(&v0)));

    // Loading again into the same keys is refused and changes nothing.
    let e = restored.kv_load(&url(&dir)).await.unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Conflict, "{e}");
    assert_job(&restored).await;
}

/// Upstream PR #200's repro: link 4 keys to v0 (values 5), dump, clear them, put v0 = all 9s,
/// load. Upstream's load succeeded and the keys read 9s; here it is refused, and a dump with
/// dereferenced links loads the original 5s.
#[tokio::test]
async fn a_stale_link_is_refused_and_a_dereferenced_dump_keeps_the_original_values() {
    let tq = Client::embedded(Config::default()).unwrap();
    job(&tq).await;
    let linked = TempDir::new();
    let copied = TempDir::new();
    let train = tq.partition("train");
    train
        .kv_dump(&url(&linked), None, &DumpOptions::default())
        .await
        .unwrap();
    let m = train
        .kv_dump(
            &url(&copied),
            Some(&KEYS),
            &DumpOptions {
                dereference_links: true,
            },
        )
        .await
        .unwrap();
    assert_eq!(
        (m.cells, m.links),
        (16, 0),
        "the prompt is stored with each key"
    );

    train.kv_clear(&KEYS).await.unwrap();
    let public = tq.partition(tq_controller::PUBLIC_PARTITION);
    public.kv_clear(&["v0"]).await.unwrap();
    public.kv_put("v0", &prompt(1, 9), None).await.unwrap();

    let e = train.kv_load(&url(&linked)).await.unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Conflict, "{e}");
    assert!(e.message().contains("changed since the dump"), "{e}");
    assert!(e.message().contains("`v0`"), "{e}");
    assert!(
        train.kv_list().await.unwrap().entries.is_empty(),
        "nothing was loaded"
    );

    train.kv_load(&url(&copied)).await.unwrap();
    assert_job(&train).await;
    // The restored prompts are the keys' own cells now.
    assert!(train
        .kv_meta(&KEYS)
        .await
        .unwrap()
        .links()
        .iter()
        .all(|l| l.is_empty()));

    // Writing v0 back to the dumped bytes makes the linked dump load again: the fingerprint
    // is of the bytes, not of the write.
    train.kv_clear(&KEYS).await.unwrap();
    public.kv_clear(&["v0"]).await.unwrap();
    public.kv_put("v0", &prompt(1, 5), None).await.unwrap();
    train.kv_load(&url(&linked)).await.unwrap();
    assert_job(&train).await;
}

#[tokio::test]
async fn damage_newer_formats_and_incompatible_schemas_are_refused_before_writing() {
    let tq = Client::embedded(Config::default()).unwrap();
    job(&tq).await;
    let dir = TempDir::new();
    tq.partition("train")
        .kv_dump(&url(&dir), None, &DumpOptions::default())
        .await
        .unwrap();
    let target = tq.partition("target");

    // One flipped byte in each data file: refused, naming the file.
    let files: Vec<_> = std::fs::read_dir(&dir.0)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "bin" || e == "cells"))
        .collect();
    assert_eq!(files.len(), 2, "{files:?}");
    for f in &files {
        let good = std::fs::read(f).unwrap();
        let mut bad = good.clone();
        bad[good.len() / 2] ^= 4;
        std::fs::write(f, &bad).unwrap();
        let e = target.kv_load(&url(&dir)).await.unwrap_err();
        assert_eq!(e.kind(), &ErrorKind::Corrupted, "{e}");
        assert!(e.message().contains(f.to_str().unwrap()), "{e}");
        std::fs::write(f, &good).unwrap();
    }
    // A newer format.
    let manifest = dir.0.join("DUMP.toml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    let body = text[..text.rfind("# crc32 ").unwrap()].replacen(
        &format!("format = {DUMP_FORMAT}"),
        &format!("format = {}", DUMP_FORMAT + 1),
        1,
    );
    std::fs::write(
        &manifest,
        format!("{body}# crc32 {:08x}\n", crc32fast::hash(body.as_bytes())),
    )
    .unwrap();
    let e = target.kv_load(&url(&dir)).await.unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Invalid, "{e}");
    assert!(e.message().contains("newer"), "{e}");
    std::fs::write(&manifest, &text).unwrap();
    assert!(target.kv_list().await.unwrap().entries.is_empty());

    // A destination whose `prompt` holds objects cannot take an i64 link: refused by the
    // link step, which checks before it changes anything; no key of the dump is created.
    target
        .kv_put(
            "other",
            &Batch::from_columns([("prompt", Column::Objects(vec![Bytes::from_static(b"text")]))])
                .unwrap(),
            None,
        )
        .await
        .unwrap();
    let e = target.kv_load(&url(&dir)).await.unwrap_err();
    assert!(e.message().contains("prompt"), "{e}");
    let listed: Vec<String> = target
        .kv_list()
        .await
        .unwrap()
        .entries
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(
        listed,
        vec!["other".to_string()],
        "nothing of the dump was written"
    );
}
