//! Seeded, deterministic interleavings: several tasks write, read, clear and consume on one
//! embedded client, on a single-threaded runtime whose clock is paused, yielding to each other
//! at points a seeded generator picks. The same seed always gives the same run (checked by
//! running it twice and comparing traces), so a failure found here can be replayed exactly.
//!
//! Invariants checked on every run: a read returns the key's own data (some version written to
//! that key, never another key's) or an error saying it is not there; no sample is handed to a
//! task twice; every sample fetched reads back its own data; after everything is cleared, no
//! index stays in use. With acknowledged delivery (leases on the controller's clock, which is
//! the paused runtime clock here, advanced by the tasks): a sample is handed out again only
//! after a lease on it was abandoned and ran out, and every sample is acknowledged exactly once.
//! Keys also link a field to public rows and have fields cleared: a linked read returns its
//! public row's own data or an error, never another row's.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic
use std::cell::RefCell;
use std::collections::{BTreeMap, HashSet};
use std::rc::Rc;
use std::time::Duration;
use tq_client::{Client, Config, GetMetaRequest, LinkOptions, Wait};
use tq_core::{Batch, Column, ErrorKind, Tensor};

/// xorshift64*: small, seedable, and the same on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Payload of `key` at `version`: the key's id in every element but the last, the version there.
fn payload(key_id: i64, version: i64) -> Batch {
    Batch::from_columns([(
        "x",
        Column::Dense(Tensor::from_slice(vec![1, 4], &[key_id, key_id, key_id, version]).unwrap()),
    )])
    .unwrap()
}

fn ids_batch(ids: &[i64]) -> Batch {
    Batch::from_columns([(
        "id",
        Column::Dense(Tensor::from_slice(vec![ids.len()], ids).unwrap()),
    )])
    .unwrap()
}

/// The `id` column of a fetched batch.
async fn read_ids(tq: &Client, meta: &tq_core::BatchMeta, seed: u64) -> Vec<i64> {
    let data = tq.get_data(meta).await.unwrap();
    let Some(Column::Dense(ids)) = data.column("id") else {
        panic!("seed {seed}: `id` is not dense")
    };
    ids.to_vec::<i64>().unwrap()
}

/// Reads `field` of `key`: data marked `mark` (every element but the last, which is the
/// version) or an error saying it is not there — never another key's or row's data. Returns
/// the trace line, `"{what} {key} v{version}"` or the error's kind.
async fn read_marked(
    kv: &tq_client::Partition,
    key: &str,
    field: &str,
    mark: i64,
    seed: u64,
    what: &str,
) -> String {
    match kv.kv_batch_get(&[key], Some(&[field])).await {
        Ok(b) => {
            let Some(Column::Dense(x)) = b.column(field) else {
                panic!("seed {seed}: `{field}` is not dense")
            };
            let v = x.to_vec::<i64>().unwrap();
            assert_eq!(
                &v[..3],
                &[mark; 3],
                "seed {seed}: {what} {key}: another's data"
            );
            format!("{what} {key} v{}", v[3])
        }
        Err(e) => {
            // Not there, or not produced (yet): never a caller's mistake.
            assert_eq!(
                e.kind(),
                &ErrorKind::NotFound,
                "seed {seed}: {what} {key}: {e}"
            );
            format!("{what} {key} {:?}", e.kind())
        }
    }
}

/// One run: `tasks` tasks of `steps` random operations each. Returns the trace of outcomes.
fn run(seed: u64, tasks: usize, steps: usize) -> Vec<String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    runtime.block_on(async move {
        let tq = Client::embedded(Config::default()).unwrap();
        let trace = Rc::new(RefCell::new(Vec::new()));
        let fetched = Rc::new(RefCell::new(HashSet::new()));
        let next_id = Rc::new(RefCell::new(0i64));
        // Acknowledged delivery on partition "a": ids acknowledged, and ids whose lease a task
        // abandoned (they may be handed out again once it runs out).
        let acked = Rc::new(RefCell::new(HashSet::new()));
        let abandoned = Rc::new(RefCell::new(HashSet::new()));
        let leased = Rc::new(RefCell::new(HashSet::new()));
        let redelivered = Rc::new(std::cell::Cell::new(0usize));
        let local = tokio::task::LocalSet::new();
        for t in 0..tasks {
            let (tq, trace, fetched, next_id) =
                (tq.clone(), trace.clone(), fetched.clone(), next_id.clone());
            let (acked, abandoned, leased) = (acked.clone(), abandoned.clone(), leased.clone());
            let redelivered = redelivered.clone();
            let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (t as u64 + 1));
            local.spawn_local(async move {
                let kv = tq.partition("kv");
                let meta_p = tq.partition("m");
                let mut version = 0i64;
                for step in 0..steps {
                    // Keys 0..8 are shared by every task; each writes its own versions.
                    let key_id = rng.below(8) as i64;
                    let key = format!("k{key_id}");
                    let pub_key = format!("pub{key_id}");
                    let outcome = match rng.below(13) {
                        0 | 1 => {
                            version += 1;
                            let v = (t as i64) * 1000 + version;
                            match kv.kv_put(&key, &payload(key_id, v), None).await {
                                Ok(_) => format!("put {key} v{v}"),
                                Err(e) => {
                                    assert_eq!(e.kind(), &ErrorKind::Conflict, "{e}");
                                    format!("put {key} refused")
                                }
                            }
                        }
                        2 => read_marked(&kv, &key, "x", key_id, seed, "get").await,
                        3 => match kv.kv_clear(&[&key]).await {
                            Ok(()) => format!("clear {key}"),
                            Err(e) => {
                                assert_eq!(e.kind(), &ErrorKind::Conflict, "seed {seed}: {e}");
                                format!("clear {key} refused")
                            }
                        },
                        4 => {
                            let n = 1 + rng.below(3) as usize;
                            let ids: Vec<i64> = (0..n)
                                .map(|_| {
                                    let mut g = next_id.borrow_mut();
                                    *g += 1;
                                    *g
                                })
                                .collect();
                            meta_p.put_new(&ids_batch(&ids)).await.unwrap();
                            tq.partition("a").put_new(&ids_batch(&ids)).await.unwrap();
                            format!("produce {ids:?}")
                        }
                        6 | 7 => {
                            // A leased fetch, acknowledged or abandoned.
                            let req = GetMetaRequest::fetch("a", &["id"], "score", 2, Wait::NoWait)
                                .with_lease(Duration::from_secs(5));
                            let meta = tq.get_meta(req).await.unwrap();
                            if meta.is_empty() {
                                "lease nothing".to_string()
                            } else {
                                let ids = read_ids(&tq, &meta, seed).await;
                                for id in &ids {
                                    assert!(
                                        !acked.borrow().contains(id),
                                        "seed {seed}: {id} handed out after its acknowledgement"
                                    );
                                    // Handed out again only after an abandoned lease ran out.
                                    if !leased.borrow_mut().insert(*id) {
                                        assert!(
                                            abandoned.borrow_mut().remove(id),
                                            "seed {seed}: {id} handed out while leased"
                                        );
                                        redelivered.set(redelivered.get() + 1);
                                    }
                                }
                                if rng.below(3) == 0 {
                                    abandoned.borrow_mut().extend(ids.iter().copied());
                                    format!("abandon {ids:?}")
                                } else {
                                    let n = tq.ack("score", &meta).await.unwrap();
                                    assert_eq!(
                                        n,
                                        ids.len(),
                                        "seed {seed}: lease of {ids:?} ran out before its ack"
                                    );
                                    for id in &ids {
                                        assert!(
                                            acked.borrow_mut().insert(*id),
                                            "seed {seed}: {id} acknowledged twice"
                                        );
                                    }
                                    format!("ack {ids:?}")
                                }
                            }
                        }
                        8 => {
                            // Time passes (every lease handed out before now runs out).
                            tokio::time::advance(Duration::from_secs(6)).await;
                            "time +6 s".to_string()
                        }
                        9 => {
                            // A public row, marked `100 + key_id` in both its fields.
                            version += 1;
                            let v = (t as i64) * 1000 + version;
                            let x = payload(100 + key_id, v);
                            let row = x.clone().with("p", x.column("x").unwrap().clone()).unwrap();
                            match tq
                                .partition("__public__")
                                .kv_put(&pub_key, &row, None)
                                .await
                            {
                                Ok(_) => format!("publish {pub_key} v{v}"),
                                Err(e) => {
                                    assert_eq!(e.kind(), &ErrorKind::Conflict, "seed {seed}: {e}");
                                    format!("publish {pub_key} refused")
                                }
                            }
                        }
                        10 => match kv
                            .kv_link(&[&key], &[&pub_key], &["p"], &LinkOptions::default())
                            .await
                        {
                            Ok(_) => format!("link {key} -> {pub_key}"),
                            Err(e) => {
                                assert!(
                                    matches!(
                                        e.kind(),
                                        ErrorKind::Conflict
                                            | ErrorKind::Invalid
                                            | ErrorKind::NotFound
                                    ),
                                    "seed {seed}: link {key}: {e}"
                                );
                                format!("link {key} {:?}", e.kind())
                            }
                        },
                        11 => read_marked(&kv, &key, "p", 100 + key_id, seed, "get linked").await,
                        12 => match kv.kv_clear_fields(&[&key], &["x"]).await {
                            Ok(()) => format!("clear {key}.x"),
                            Err(e) => {
                                assert!(
                                    matches!(
                                        e.kind(),
                                        ErrorKind::Conflict
                                            | ErrorKind::Invalid
                                            | ErrorKind::NotFound
                                    ),
                                    "seed {seed}: clear {key}.x: {e}"
                                );
                                format!("clear {key}.x {:?}", e.kind())
                            }
                        },
                        _ => {
                            let req = GetMetaRequest::fetch("m", &["id"], "train", 2, Wait::NoWait);
                            match tq.get_meta(req).await {
                                Ok(meta) if !meta.is_empty() => {
                                    let ids = read_ids(&tq, &meta, seed).await;
                                    for id in &ids {
                                        assert!(
                                            fetched.borrow_mut().insert(*id),
                                            "seed {seed}: sample {id} handed out twice"
                                        );
                                    }
                                    tq.clear_samples(&meta).await.unwrap();
                                    format!("consume {ids:?}")
                                }
                                Ok(_) => "consume nothing".to_string(),
                                Err(e) => panic!("seed {seed}: fetch: {e}"),
                            }
                        }
                    };
                    trace.borrow_mut().push(format!("t{t} s{step}: {outcome}"));
                    for _ in 0..rng.below(3) {
                        tokio::task::yield_now().await;
                    }
                }
            });
        }
        local.await;
        // Drain: consume what is left, clear every key; nothing may stay in use.
        loop {
            let req = GetMetaRequest::fetch("m", &["id"], "train", 64, Wait::NoWait);
            let meta = tq.get_meta(req).await.unwrap();
            if meta.is_empty() {
                break;
            }
            tq.clear_samples(&meta).await.unwrap();
        }
        // Leases left abandoned run out; then everything left is acknowledged, once. (Complete:
        // a last batch smaller than asked goes out, and a drained partition says so.)
        tokio::time::advance(Duration::from_secs(6)).await;
        tq.partition("a").complete().await.unwrap();
        loop {
            let req = GetMetaRequest::fetch("a", &["id"], "score", 64, Wait::NoWait)
                .with_lease(Duration::from_secs(5));
            let meta = match tq.get_meta(req).await {
                Ok(meta) if !meta.is_empty() => meta,
                Ok(_) => break,
                Err(e) if e.kind() == &ErrorKind::Closed => break,
                Err(e) => panic!("seed {seed}: drain: {e}"),
            };
            for id in read_ids(&tq, &meta, seed).await {
                assert!(
                    acked.borrow_mut().insert(id),
                    "seed {seed}: {id} acknowledged twice"
                );
            }
            assert_eq!(tq.ack("score", &meta).await.unwrap(), meta.len());
        }
        let produced = *next_id.borrow();
        assert_eq!(
            acked.borrow().len() as i64,
            produced,
            "seed {seed}: every sample acknowledged exactly once"
        );
        let all = tq.partition("a").consumption_status("score").await.unwrap();
        assert!(all.all_consumed(), "seed {seed}");
        let keys: Vec<String> = (0..8).map(|k| format!("k{k}")).collect();
        tq.partition("kv").kv_clear(&keys).await.unwrap();
        let public: Vec<String> = (0..8).map(|k| format!("pub{k}")).collect();
        tq.partition("__public__").kv_clear(&public).await.unwrap();
        let left: BTreeMap<String, usize> = tq
            .kv_list_all()
            .await
            .unwrap()
            .into_iter()
            .map(|l| (l.partition, l.entries.len()))
            .filter(|(_, n)| *n > 0)
            .collect();
        assert!(left.is_empty(), "seed {seed}: keys left {left:?}");
        let mut trace = trace.borrow().clone();
        trace.push(format!("redelivered {}", redelivered.get()));
        trace
    })
}

#[test]
fn random_interleavings_keep_the_invariants_and_replay_exactly() {
    let (mut redelivered, mut linked_reads, mut field_clears) = (0, 0, 0);
    for seed in 0..24 {
        let first = run(seed, 4, 40);
        let again = run(seed, 4, 40);
        assert_eq!(first, again, "seed {seed} did not replay the same run");
        assert_eq!(first.len(), 4 * 40 + 1);
        linked_reads += first
            .iter()
            .filter(|l| l.contains("get linked") && l.contains(" v"))
            .count();
        field_clears += first.iter().filter(|l| l.ends_with(".x")).count();
        let last = first.last().unwrap();
        redelivered += last
            .strip_prefix("redelivered ")
            .unwrap()
            .parse::<usize>()
            .unwrap();
    }
    // The runs did exercise the rule that matters: samples whose lease ran out came back.
    assert!(
        redelivered > 0,
        "no run handed out a sample whose lease ran out"
    );
    assert!(linked_reads > 0, "no run read through a link");
    assert!(field_clears > 0, "no run cleared a field");
}
