//! Writers that put, overwrite and clear keys of partition `live` while checkpoints are taken,
//! and the check that a checkpoint restores every key it lists whole. Shared by the
//! checkpoint tests of storage units and of copied KV payloads.
#![allow(dead_code, clippy::unwrap_used)]

use super::batches::every_kind;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tq_client::Client;
use tq_core::ErrorKind;

/// Two writers on `live`, eight keys each: every put overwrites a key written before, and
/// every third round clears another key.
pub struct Writers {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<i64>>,
}

impl Writers {
    pub fn start(tq: &Client) -> Writers {
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = (0..2)
            .map(|w| {
                let tq = tq.clone();
                let stop = stop.clone();
                tokio::spawn(async move {
                    let p = tq.partition("live");
                    let mut round = 0i64;
                    while !stop.load(Ordering::Relaxed) {
                        let key = format!("w{w}-{}", round % 8);
                        p.kv_put(&key, &every_kind(1, round), None).await.unwrap();
                        if round % 3 == 0 {
                            p.kv_clear(&[format!("w{w}-{}", (round + 4) % 8)])
                                .await
                                .unwrap();
                        }
                        round += 1;
                    }
                    round
                })
            })
            .collect();
        Writers { stop, tasks }
    }

    /// Stops the writers and checks that they ran.
    pub async fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for w in self.tasks {
            assert!(w.await.unwrap() > 0, "the writers ran");
        }
    }
}

/// Every key of `live` that `fresh` (a deployment a checkpoint was loaded into) lists and
/// holds produced reads back whole; a key whose put was in flight may be listed but not
/// produced (at most one per writer). Returns how many keys are listed.
pub async fn assert_listed_keys_whole(fresh: &Client, checkpoint: usize) -> usize {
    let listed = match fresh.partition("live").kv_list().await {
        Ok(l) => l.entries.into_iter().map(|(k, _)| k).collect::<Vec<_>>(),
        Err(e) if e.kind() == &ErrorKind::NotFound => Vec::new(),
        Err(e) => panic!("{e}"),
    };
    let mut produced = 0;
    for key in &listed {
        match fresh
            .partition("live")
            .kv_batch_get(&[key], Some(&["x", "r", "o"]))
            .await
        {
            Ok(got) => {
                assert_eq!(got.len(), 1);
                produced += 1;
            }
            Err(e) if e.message().contains("is not produced") => {}
            Err(e) => panic!("checkpoint {checkpoint}: key `{key}` lost its data: {e}"),
        }
    }
    assert!(
        produced + 2 >= listed.len(),
        "at most one put in flight per writer"
    );
    listed.len()
}
