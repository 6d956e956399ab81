//! Checkpoints through the client API, on a real redis-server: a round trip into a new
//! process's controller that reads the same keys; every damaged or missing file named; a newer
//! format refused; a save that did not finish leaves the previous checkpoint loadable; a KV
//! store in process memory, whose payloads a checkpoint can neither copy nor reattach, is
//! refused. (Storage units, whose cells are copied: `checkpoint_units.rs`.)
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and examples may panic

#[path = "../../tq-backend-kv/tests/common/mod.rs"]
mod common;

use common::{redis_available, RedisServer, TempDir};
use tq_checkpoint::*;
use tq_client::*;
use tq_core::{Batch, Column, ErrorKind, Tensor};

fn ints(rows: usize, base: i64) -> Batch {
    let v: Vec<i64> = (0..rows as i64 * 2).map(|i| base + i).collect();
    Batch::from_columns([(
        "x",
        Column::Dense(Tensor::from_slice(vec![rows, 2], &v).unwrap()),
    )])
    .unwrap()
}

fn client_on(redis: &RedisServer) -> Client {
    let config = Config::from_toml(&format!(
        "[storage]\nbackend = \"kv\"\n[storage.kv]\nstores = [{{ url = \"{}\" }}]\n",
        redis.url()
    ))
    .unwrap();
    Client::embedded(config).unwrap()
}

fn state_file(dir: &TempDir) -> std::path::PathBuf {
    std::fs::read_dir(&dir.0)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "state"))
        .expect("a state file")
}

#[tokio::test]
async fn a_checkpoint_round_trips_and_refuses_damage_by_name() {
    if !redis_available("a_checkpoint_round_trips_and_refuses_damage_by_name") {
        return;
    }
    let redis = RedisServer::start();
    let dir = TempDir::new();
    let first = client_on(&redis);
    let keys: Vec<String> = (0..6).map(|i| format!("k{i}")).collect();
    first
        .partition("p")
        .kv_batch_put(&keys, &ints(6, 0), None)
        .await
        .unwrap();
    let saved = first.save_checkpoint(&dir.0).await.unwrap();
    assert_eq!(saved.counts.samples, 6);
    assert_eq!(saved.format, CHECKPOINT_FORMAT);

    // Another process's controller (a new embedded client) takes the state over and reads the
    // payloads where they are.
    let second = client_on(&redis);
    let loaded = second.load_checkpoint(&dir.0).await.unwrap();
    assert_eq!(loaded, saved);
    assert_eq!(second.epoch(), first.epoch());
    assert_eq!(
        second
            .partition("p")
            .kv_batch_get(&keys, None)
            .await
            .unwrap(),
        ints(6, 0)
    );
    // Loading into a controller that holds something is refused.
    let e = second.load_checkpoint(&dir.0).await.unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Conflict, "{e}");

    // One flipped byte in the state file, then in the manifest: refused, naming the file.
    let state = state_file(&dir);
    let good = std::fs::read(&state).unwrap();
    let mut bad = good.clone();
    bad[good.len() / 2] ^= 1;
    std::fs::write(&state, &bad).unwrap();
    let e = client_on(&redis).load_checkpoint(&dir.0).await.unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Corrupted, "{e}");
    assert!(e.message().contains(state.to_str().unwrap()), "{e}");
    std::fs::write(&state, &good).unwrap();
    let manifest = dir.0.join("MANIFEST.toml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    std::fs::write(&manifest, text.replacen("samples = 6", "samples = 7", 1)).unwrap();
    let e = client_on(&redis).load_checkpoint(&dir.0).await.unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Corrupted, "{e}");
    assert!(e.message().contains("MANIFEST.toml"), "{e}");
    std::fs::write(&manifest, &text).unwrap();

    // A missing state file.
    std::fs::rename(&state, state.with_extension("gone")).unwrap();
    let e = client_on(&redis).load_checkpoint(&dir.0).await.unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::NotFound, "{e}");
    assert!(e.message().contains(state.to_str().unwrap()), "{e}");
    std::fs::rename(state.with_extension("gone"), &state).unwrap();

    // A newer format (a well-formed manifest from a later tq).
    let fresh = client_on(&redis);
    let mut newer = saved.clone();
    newer.format = CHECKPOINT_FORMAT + 1;
    let body = toml::to_string(&newer).unwrap();
    std::fs::write(
        &manifest,
        format!("{body}# crc32 {:08x}\n", crc32fast::hash(body.as_bytes())),
    )
    .unwrap();
    let e = fresh.load_checkpoint(&dir.0).await.unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Invalid, "{e}");
    assert!(e.message().contains("newer"), "{e}");
    std::fs::write(&manifest, &text).unwrap();

    // A save that stopped after its state file (no new manifest): the previous checkpoint
    // still loads, whole.
    std::fs::write(dir.0.join("controller-ffff-1.state"), b"half a save").unwrap();
    let third = client_on(&redis);
    third.load_checkpoint(&dir.0).await.unwrap();
    assert_eq!(
        third
            .partition("p")
            .kv_batch_get(&keys, None)
            .await
            .unwrap(),
        ints(6, 0)
    );
    // And the next save replaces it, leaving one state file.
    third
        .partition("p")
        .kv_put("late", &ints(1, 50), None)
        .await
        .unwrap();
    assert_eq!(
        third.save_checkpoint(&dir.0).await.unwrap().counts.samples,
        7
    );
    let states = std::fs::read_dir(&dir.0)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "state")
        })
        .count();
    assert_eq!(
        states, 1,
        "earlier state files are removed once the manifest is replaced"
    );
}

#[tokio::test]
async fn storage_a_checkpoint_cannot_reattach_is_refused() {
    let dir = TempDir::new();
    let kv_in_memory = Client::embedded(
        Config::from_toml(
            "[storage]\nbackend = \"kv\"\n[storage.kv]\nstores = [{ url = \"memory://\" }]\n",
        )
        .unwrap(),
    )
    .unwrap();
    let e = kv_in_memory.save_checkpoint(&dir.0).await.unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::Unsupported { .. }), "{e}");
    assert!(
        !dir.0.join("MANIFEST.toml").exists(),
        "a refused save writes nothing"
    );
}

/// The same through an object store (here `object_store`'s in-memory one, shared by the two
/// clients): written under a prefix, loaded back, earlier state objects removed, damage named.
#[cfg(feature = "object-store")]
#[tokio::test]
async fn a_checkpoint_round_trips_through_an_object_store() {
    use object_store::ObjectStoreExt;
    if !redis_available("a_checkpoint_round_trips_through_an_object_store") {
        return;
    }
    let redis = RedisServer::start();
    let store: std::sync::Arc<dyn object_store::ObjectStore> =
        std::sync::Arc::new(object_store::memory::InMemory::new());
    let first = client_on(&redis);
    let keys: Vec<String> = (0..3).map(|i| format!("k{i}")).collect();
    first
        .partition("p")
        .kv_batch_put(&keys, &ints(3, 10), None)
        .await
        .unwrap();
    first
        .save_checkpoint_to_store(store.clone(), "jobs/a")
        .await
        .unwrap();
    first
        .partition("p")
        .kv_put("k3", &ints(1, 40), None)
        .await
        .unwrap();
    let saved = first
        .save_checkpoint_to_store(store.clone(), "jobs/a/")
        .await
        .unwrap();
    assert_eq!(saved.counts.samples, 4);
    // One state object left: the earlier one went once the new manifest was in place.
    let listed: Vec<_> = futures::TryStreamExt::try_collect::<Vec<_>>(
        store.list(Some(&object_store::path::Path::from("jobs/a"))),
    )
    .await
    .unwrap();
    let states: Vec<String> = listed
        .iter()
        .map(|m| m.location.to_string())
        .filter(|l| l.ends_with(".state"))
        .collect();
    assert_eq!(states.len(), 1, "{states:?}");

    let second = client_on(&redis);
    assert_eq!(
        second
            .load_checkpoint_from_store(store.clone(), "jobs/a")
            .await
            .unwrap(),
        saved
    );
    let all: Vec<String> = (0..4).map(|i| format!("k{i}")).collect();
    let got = second
        .partition("p")
        .kv_batch_get(&all, None)
        .await
        .unwrap();
    assert_eq!(got.len(), 4);

    // A damaged state object is named.
    let state = object_store::path::Path::from(states[0].as_str());
    store
        .put(&state, b"not a snapshot".to_vec().into())
        .await
        .unwrap();
    let e = client_on(&redis)
        .load_checkpoint_from_store(store.clone(), "jobs/a")
        .await
        .unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Corrupted, "{e}");
    assert!(e.message().contains(&states[0]), "{e}");
    // Nothing at a prefix: not found, naming the manifest.
    let e = client_on(&redis)
        .load_checkpoint_from_store(store, "jobs/none")
        .await
        .unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::NotFound, "{e}");
    assert!(e.message().contains("MANIFEST.toml"), "{e}");
}

#[tokio::test]
async fn checkpoint_urls_are_checked() {
    let tq = Client::embedded(Config::default()).unwrap();
    let e = tq.save_checkpoint_to_url("memory://x").await.unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Invalid, "{e}");
    assert!(e.message().contains("s3://bucket/prefix"), "{e}");
}
