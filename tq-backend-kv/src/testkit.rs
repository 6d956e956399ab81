//! The conformance kit for [`KvStore`] implementations (feature `testkit`): one `pub async fn`
//! per contract the KV adapter relies on, and [`run_all`].
//!
//! ```ignore
//! #[tokio::test]
//! async fn my_store_conforms() {
//!     tq_backend_kv::testkit::run_all(|| async { Arc::new(MyStore::new()) as Arc<dyn KvStore> })
//!         .await;
//! }
//! ```
//!
//! Each case gets a fresh store from the factory and uses keys of its own (a random prefix),
//! so a factory may hand out the same server every time. Cases about deadlines wait for them
//! in real time (a store's TTL is the store's clock); they take about two seconds in all.
//! A store that declares no `native_ttl` / `native_expire` is held to the fallback instead:
//! TTLs ignored, `expire` deletes at once.

// A kit reports a violated contract by panicking with the case's name, like any test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::{KvStore, KvStoreExt, KvValue};
use bytes::Bytes;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The TTL the deadline cases write with; long enough for a noisy machine to do the steps in
/// between well within it.
const TTL: Duration = Duration::from_millis(900);

/// Runs every case against stores made by `make`, each case in its own task, then panics
/// naming every case that failed.
pub async fn run_all<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Arc<dyn KvStore>>,
{
    let mut failed: Vec<String> = Vec::new();
    macro_rules! case {
        ($name:ident) => {{
            let s = make().await;
            let case = async move { $name(s.as_ref()).await };
            if let Some(why) = tq_core::testkit::failure_of(case).await {
                failed.push(format!("{}: {why}", stringify!($name)));
            }
        }};
    }
    case!(values_round_trip);
    case!(missing_keys_come_back_as_missing);
    case!(delete_and_expire_are_idempotent);
    case!(every_write_rearms_the_ttl);
    case!(a_write_without_ttl_removes_the_deadline);
    case!(expire_sets_a_deadline_or_deletes);
    case!(batches_beyond_the_call_limit);
    case!(raise_generations_keeps_the_largest);
    case!(clear_generations_spares_newer_ones);
    case!(mset_then_raise_writes_and_raises);
    assert!(
        failed.is_empty(),
        "{} KvStore conformance case(s) failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

/// A prefix no other case (or earlier run on the same server) uses.
fn prefix(case: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "tq-kit/{case}/{}-{}-{}",
        std::process::id(),
        nanos,
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

fn value(head: &[u8], body: &[u8]) -> KvValue {
    KvValue::new(Bytes::copy_from_slice(head), Bytes::copy_from_slice(body))
}

async fn present(s: &dyn KvStore, key: &str) -> bool {
    s.mget(&[key.to_string()]).await.expect("mget")[0].is_some()
}

/// Values come back byte for byte (header then body), including empty ones; a second write
/// replaces the first.
pub async fn values_round_trip(s: &dyn KvStore) {
    let p = prefix("round-trip");
    let keys: Vec<String> = (0..3).map(|i| format!("{p}/{i}")).collect();
    let items = vec![
        (keys[0].clone(), value(b"head", b"body")),
        (keys[1].clone(), value(b"", &[0u8, 255, 7])),
        (keys[2].clone(), value(b"", b"")),
    ];
    s.mset(items, None).await.expect("mset");
    let got = s.mget(&keys).await.expect("mget");
    assert_eq!(
        got[0].as_deref(),
        Some(&b"headbody"[..]),
        "header then body"
    );
    assert_eq!(got[1].as_deref(), Some(&[0u8, 255, 7][..]), "binary body");
    assert_eq!(
        got[2].as_deref(),
        Some(&b""[..]),
        "an empty value is present, not missing"
    );
    s.mset(vec![(keys[0].clone(), value(b"", b"new"))], None)
        .await
        .expect("overwrite");
    assert_eq!(
        s.mget(&keys[..1]).await.expect("mget")[0].as_deref(),
        Some(&b"new"[..])
    );
    s.delete(&keys).await.expect("tidy");
}

/// `mget` answers every key, in order, with `None` for the ones not stored.
pub async fn missing_keys_come_back_as_missing(s: &dyn KvStore) {
    let p = prefix("missing");
    let (a, gone, b) = (format!("{p}/a"), format!("{p}/gone"), format!("{p}/b"));
    s.mset(
        vec![(a.clone(), value(b"", b"A")), (b.clone(), value(b"", b"B"))],
        None,
    )
    .await
    .expect("mset");
    let got = s
        .mget(&[a.clone(), gone.clone(), b.clone(), a.clone()])
        .await
        .expect("mget");
    assert_eq!(got.len(), 4, "one answer per key, duplicates included");
    assert_eq!(got[0].as_deref(), Some(&b"A"[..]));
    assert_eq!(got[1], None, "a missing key is None");
    assert_eq!(got[2].as_deref(), Some(&b"B"[..]));
    assert_eq!(got[3].as_deref(), Some(&b"A"[..]));
    assert_eq!(s.mget(&[]).await.expect("empty mget").len(), 0);
    s.delete(&[a, b]).await.expect("tidy");
}

/// Deleting or expiring keys that are not stored (or twice) succeeds and changes nothing else.
pub async fn delete_and_expire_are_idempotent(s: &dyn KvStore) {
    let p = prefix("idempotent");
    let (kept, gone) = (format!("{p}/kept"), format!("{p}/gone"));
    s.mset(vec![(kept.clone(), value(b"", b"K"))], None)
        .await
        .expect("mset");
    s.delete(std::slice::from_ref(&gone))
        .await
        .expect("delete of a missing key");
    s.delete(std::slice::from_ref(&gone))
        .await
        .expect("delete twice");
    s.expire(std::slice::from_ref(&gone), TTL)
        .await
        .expect("expire of a missing key");
    s.delete(&[]).await.expect("delete of nothing");
    s.expire(&[], TTL).await.expect("expire of nothing");
    assert!(present(s, &kept).await, "other keys untouched");
    s.delete(std::slice::from_ref(&kept)).await.expect("delete");
    s.delete(std::slice::from_ref(&kept))
        .await
        .expect("delete again");
    assert!(!present(s, &kept).await, "deleted");
}

/// With `native_ttl`, every write states the TTL and replaces the deadline the key had: a key
/// written again before its deadline lives a full TTL from the second write.
pub async fn every_write_rearms_the_ttl(s: &dyn KvStore) {
    let key = format!("{}/k", prefix("rearm"));
    s.mset(vec![(key.clone(), value(b"", b"1"))], Some(TTL))
        .await
        .expect("first write");
    if !s.capabilities().native_ttl {
        assert!(
            present(s, &key).await,
            "a store without native_ttl keeps the key"
        );
        s.delete(&[key]).await.expect("tidy");
        return;
    }
    tokio::time::sleep(TTL / 2).await;
    s.mset(vec![(key.clone(), value(b"", b"2"))], Some(TTL))
        .await
        .expect("second write");
    // Past the first write's deadline, within the second's.
    tokio::time::sleep(TTL * 3 / 4).await;
    assert!(present(s, &key).await, "the second write re-armed the TTL");
    tokio::time::sleep(TTL).await;
    assert!(
        !present(s, &key).await,
        "gone after the second write's deadline"
    );
}

/// With `native_ttl`, a write without a TTL removes the deadline an earlier write set.
pub async fn a_write_without_ttl_removes_the_deadline(s: &dyn KvStore) {
    let key = format!("{}/k", prefix("persist"));
    s.mset(vec![(key.clone(), value(b"", b"1"))], Some(TTL / 2))
        .await
        .expect("write with a TTL");
    s.mset(vec![(key.clone(), value(b"", b"2"))], None)
        .await
        .expect("write without");
    tokio::time::sleep(TTL).await;
    assert_eq!(
        s.mget(std::slice::from_ref(&key)).await.expect("mget")[0].as_deref(),
        Some(&b"2"[..]),
        "a write without TTL lives until deleted"
    );
    s.delete(&[key]).await.expect("tidy");
}

/// `expire` sets a deadline on existing keys (`native_expire`) or deletes them at once.
pub async fn expire_sets_a_deadline_or_deletes(s: &dyn KvStore) {
    let key = format!("{}/k", prefix("expire"));
    s.mset(vec![(key.clone(), value(b"", b"1"))], None)
        .await
        .expect("mset");
    s.expire(std::slice::from_ref(&key), TTL / 2)
        .await
        .expect("expire");
    if s.capabilities().native_expire {
        tokio::time::sleep(TTL).await;
    }
    assert!(!present(s, &key).await, "expired keys go away");
}

/// The batch helpers split work beyond `max_keys_per_call` (and survive a store that declares
/// zero) and keep answers in order.
pub async fn batches_beyond_the_call_limit(s: &dyn KvStore) {
    let p = prefix("batches");
    let n = s.capabilities().max_keys_per_call.clamp(1, 5000) * 2 + 3;
    let keys: Vec<String> = (0..n).map(|i| format!("{p}/{i}")).collect();
    let items = keys
        .iter()
        .enumerate()
        .map(|(i, k)| (k.clone(), value(b"", i.to_string().as_bytes())))
        .collect();
    s.mset_all(items, None).await.expect("mset_all");
    let got = s.mget_all(&keys).await.expect("mget_all");
    for (i, v) in got.iter().enumerate() {
        assert_eq!(v.as_deref(), Some(i.to_string().as_bytes()), "key {i}");
    }
    s.delete_all(&keys).await.expect("delete_all");
    assert!(s
        .mget_all(&keys)
        .await
        .expect("mget_all")
        .iter()
        .all(Option::is_none));
}

/// `mset_then_raise` writes every item and raises every generation key as the two calls do,
/// for more keys than one call takes, with and without a TTL; keys of one sample share a hash
/// tag, as the adapter's do.
pub async fn mset_then_raise_writes_and_raises(s: &dyn KvStore) {
    let p = prefix("mset-then-raise");
    let per_call = s.capabilities().max_keys_per_call.max(1);
    let samples = per_call + per_call / 2 + 3;
    let cell = |i: usize, f: usize| format!("{{{p}/{i}}}/c{f}");
    let gen = |i: usize| format!("{{{p}/{i}}}/gen");
    let items: Vec<(String, KvValue)> = (0..samples)
        .flat_map(|i| (0..2).map(move |f| (i, f)))
        .map(|(i, f)| (cell(i, f), value(b"h", format!("{i}-{f}").as_bytes())))
        .collect();
    let raise: Vec<(String, u32)> = (0..samples).map(|i| (gen(i), i as u32 % 5)).collect();
    let held = s
        .mset_then_raise(items, raise, None)
        .await
        .expect("mset_then_raise");
    assert_eq!(held, (0..samples).map(|i| i as u32 % 5).collect::<Vec<_>>());
    let keys: Vec<String> = (0..samples).map(|i| cell(i, 1)).collect();
    let got = s.mget(&keys).await.expect("mget");
    for (i, v) in got.iter().enumerate() {
        assert_eq!(v.as_deref(), Some(format!("h{i}-1").as_bytes()), "cell {i}");
    }
    // Again with a TTL, raising to lower generations for some keys: those answer the larger.
    let items = vec![(cell(0, 0), value(b"", b"again"))];
    let raise = vec![(gen(0), 9), (gen(3), 1)];
    let held = s
        .mset_then_raise(items, raise, Some(Duration::from_secs(60)))
        .await
        .expect("mset_then_raise with a TTL");
    assert_eq!(
        held,
        vec![9, 3],
        "a smaller generation leaves the larger one"
    );
    let got = s.mget(&[cell(0, 0)]).await.expect("mget");
    assert_eq!(got[0].as_deref(), Some(&b"again"[..]));
    // Without a TTL: a key holding a smaller generation is raised, a larger one stays.
    let items = vec![(cell(1, 0), value(b"", b"third"))];
    let raise = vec![(gen(1), 7), (gen(2), 0)];
    let held = s
        .mset_then_raise(items, raise, None)
        .await
        .expect("mset_then_raise over existing keys");
    assert_eq!(held, vec![7, 2]);
    let stored = s.mget(&[gen(1), gen(2)]).await.expect("mget");
    assert_eq!(
        stored[0].as_deref(),
        Some(&crate::codec::encode_generation(7)[..])
    );
    assert_eq!(
        stored[1].as_deref(),
        Some(&crate::codec::encode_generation(2)[..])
    );
}

/// `raise_generations` stores a generation unless the key holds a larger one and answers what
/// each key holds afterwards; with `atomic_generations`, two writers racing on one key can
/// never leave the smaller generation behind.
pub async fn raise_generations_keeps_the_largest(s: &dyn KvStore) {
    let p = prefix("generations");
    let (a, b) = (format!("{p}/a"), format!("{p}/b"));
    let held = s
        .raise_generations(vec![(a.clone(), 3), (b.clone(), 0)], None)
        .await
        .expect("raise");
    assert_eq!(held, vec![3, 0], "absent keys take the generation");
    let held = s
        .raise_generations(vec![(a.clone(), 2), (b.clone(), 5)], None)
        .await
        .expect("raise again");
    assert_eq!(
        held,
        vec![3, 5],
        "a smaller generation leaves the larger one"
    );
    let stored = s.mget(&[a.clone(), b.clone()]).await.expect("mget");
    assert_eq!(
        stored[0].as_deref(),
        Some(&crate::codec::encode_generation(3)[..]),
        "the key still holds 3"
    );
    if s.capabilities().atomic_generations {
        for round in 0..30u32 {
            let key = format!("{p}/race-{round}");
            let (x, y) = tokio::join!(
                s.raise_generations(vec![(key.clone(), 7)], None),
                s.raise_generations(vec![(key.clone(), 6)], None)
            );
            assert_eq!(x.expect("raise 7"), vec![7], "round {round}");
            assert!(
                matches!(y.expect("raise 6")[..], [6] | [7]),
                "round {round}"
            );
            let stored = s.mget(std::slice::from_ref(&key)).await.expect("mget");
            assert_eq!(
                stored[0].as_deref(),
                Some(&crate::codec::encode_generation(7)[..]),
                "round {round}: the larger generation stays"
            );
            s.delete(&[key]).await.expect("tidy");
        }
    }
    s.delete(&[a, b]).await.expect("tidy");
}

/// `clear_generations` deletes a generation key holding at most the given generation, keeps
/// one a newer sample raised, and passes over absent keys.
pub async fn clear_generations_spares_newer_ones(s: &dyn KvStore) {
    let p = prefix("clear-generations");
    let (a, b, absent) = (format!("{p}/a"), format!("{p}/b"), format!("{p}/absent"));
    s.raise_generations(vec![(a.clone(), 3), (b.clone(), 5)], None)
        .await
        .expect("raise");
    s.clear_generations(vec![(a.clone(), 3), (b.clone(), 4), (absent.clone(), 9)])
        .await
        .expect("clear");
    let stored = s
        .mget(&[a.clone(), b.clone(), absent.clone()])
        .await
        .expect("mget");
    assert_eq!(stored[0], None, "generation 3 cleared at generation 3");
    assert_eq!(
        stored[1].as_deref(),
        Some(&crate::codec::encode_generation(5)[..]),
        "generation 5 survives a clear of generation 4"
    );
    assert_eq!(stored[2], None, "an absent key stays absent");
    s.clear_generations(vec![(b.clone(), 6)])
        .await
        .expect("clear older");
    assert_eq!(s.mget(&[b]).await.expect("mget")[0], None);
    // Many keys, each in its own hash slot (a cluster clears them one script per node): the
    // ones holding at most the given generation go, the newer ones stay.
    let many: Vec<String> = (0..40).map(|i| format!("{p}/{{k{i}}}")).collect();
    let held = |i: usize| (i % 7) as u32 + 1;
    s.raise_generations(
        many.iter()
            .enumerate()
            .map(|(i, k)| (k.clone(), held(i)))
            .collect(),
        None,
    )
    .await
    .expect("raise many");
    s.clear_generations(many.iter().map(|k| (k.clone(), 4)).collect())
        .await
        .expect("clear many");
    let stored = s.mget(&many).await.expect("mget many");
    for (i, v) in stored.iter().enumerate() {
        if held(i) <= 4 {
            assert_eq!(
                v,
                &None,
                "{} held {} and was cleared at 4",
                many[i],
                held(i)
            );
        } else {
            assert_eq!(
                v.as_deref(),
                Some(&crate::codec::encode_generation(held(i))[..]),
                "{} holds {} and survives a clear at 4",
                many[i],
                held(i)
            );
        }
    }
    s.delete(&many).await.expect("tidy");
}
