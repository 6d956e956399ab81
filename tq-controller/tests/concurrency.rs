//! Requests for different partitions run side by side (per-partition locks under a shared
//! state lock), and many threads on many partitions still see every sample exactly once.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic
use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;
mod common;
use common::insert;
use tq_controller::*;
use tq_core::{DType, ErrorKind, FieldMeta, SampleId};

fn controller() -> Arc<Controller> {
    Arc::new(Controller::new(ControllerConfig::default()).unwrap())
}

async fn produce(c: &Controller, p: &str, ids: &[SampleId]) {
    let notice = ProductionNotice {
        partition: p.into(),
        samples: ids.to_vec(),
        schemas: BTreeMap::from([("x".to_string(), FieldMeta::dense(DType::F32, vec![2]))]),
        tags: None,
        backend_meta: None,
    };
    c.notify_production(notice).await.unwrap();
}

/// A sampler that, on its first call, says so and then waits to be let go: it holds its
/// partition's lock (and the shared state lock) for as long as the test wants.
struct Gate {
    entered: Mutex<Option<mpsc::Sender<()>>>,
    release: Mutex<mpsc::Receiver<()>>,
}

impl Sampler for Gate {
    fn sample(
        &self,
        ready: &[Candidate<'_>],
        batch_size: usize,
        _ctx: &SamplerContext<'_>,
    ) -> tq_core::Result<Sampled> {
        if let Some(entered) = self.entered.lock().unwrap().take() {
            entered.send(()).unwrap();
            self.release.lock().unwrap().recv().unwrap();
        }
        let ids: Vec<SampleId> = ready.iter().take(batch_size).map(|c| c.id).collect();
        Ok(Sampled {
            consumed: ids.clone(),
            sampled: ids,
        })
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn a_partition_busy_in_its_critical_section_does_not_hold_up_another() {
    let c = controller();
    let (entered_tx, entered) = mpsc::channel();
    let (release, release_rx) = mpsc::channel();
    c.register_sampler(
        "gate",
        Arc::new(Gate {
            entered: Mutex::new(Some(entered_tx)),
            release: Mutex::new(release_rx),
        }),
    );
    runtime().block_on(async {
        for p in ["busy", "free"] {
            let ids = insert(&c, p, 16).await;
            produce(&c, p, &ids).await;
        }
    });

    // A fetch on `busy` stops inside its critical section.
    let busy = {
        let c = c.clone();
        std::thread::spawn(move || {
            let mut req = GetMetaRequest::fetch("busy", &["x"], "t", 4, Wait::NoWait);
            req.sampler = Some("gate".into());
            runtime().block_on(c.get_meta(req)).unwrap().len()
        })
    };
    entered.recv().unwrap();

    // Meanwhile everything that touches only `free` goes on: insert, production, fetch with a
    // lease, ack, status queries, clear.
    let (done_tx, done) = mpsc::channel();
    {
        let c = c.clone();
        std::thread::spawn(move || {
            let outcome = runtime().block_on(async {
                let ids = insert(&c, "free", 8).await;
                produce(&c, "free", &ids).await;
                let mut req = GetMetaRequest::fetch("free", &["x"], "t", 8, Wait::NoWait);
                if let GetMetaMode::Fetch { lease, .. } = &mut req.mode {
                    *lease = Some(Duration::from_secs(60));
                }
                let meta = c.get_meta(req).await.unwrap();
                let acked = c
                    .ack("free", "t", meta.lease().unwrap(), meta.samples())
                    .await
                    .unwrap();
                let produced = c.production_status("free", &["x".into()]).await.unwrap();
                let consumed = c.consumption_status("free", "t").await.unwrap();
                // A clear of samples that nothing links to releases under the shared lock.
                let marked = c.mark_clearing("free", Some(meta.samples())).await.unwrap();
                c.release("free", marked.samples()).await.unwrap();
                (meta.len(), acked, produced, consumed)
            });
            done_tx.send(outcome).unwrap();
        });
    }
    // (The timeout only turns a hang into a failure; nothing waits on it in a passing run.)
    let (fetched, acked, produced, consumed) = done
        .recv_timeout(Duration::from_secs(30))
        .expect("requests for `free` waited for the busy partition");
    assert_eq!((fetched, acked), (8, 8));
    assert!(produced.all_produced(), "{produced:?}");
    assert_eq!(produced.samples.len(), 24);
    let done = consumed.consumed.iter().filter(|&&c| c).count();
    assert_eq!(
        done, 8,
        "the acknowledged batch counts as consumed: {consumed:?}"
    );

    release.send(()).unwrap();
    assert_eq!(
        busy.join().unwrap(),
        4,
        "the held fetch finishes once let go"
    );
}

#[test]
fn many_threads_on_many_partitions_consume_every_sample_exactly_once() {
    const PARTITIONS: usize = 6;
    const SAMPLES: usize = 600;
    const CONSUMERS: usize = 3;
    let c = controller();
    let cleared = Arc::new(AtomicUsize::new(0));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    let consumed: Vec<Vec<SampleId>> = rt.block_on(async {
        let mut producers = Vec::new();
        let mut consumers = Vec::new();
        for i in 0..PARTITIONS {
            let p = format!("p{i}");
            let (c1, p1) = (c.clone(), p.clone());
            producers.push(tokio::spawn(async move {
                for _ in 0..SAMPLES / 10 {
                    let ids = insert(&c1, &p1, 10).await;
                    produce(&c1, &p1, &ids).await;
                }
                c1.mark_complete(&p1).await.unwrap();
            }));
            for k in 0..CONSUMERS {
                let (c2, p2, cleared) = (c.clone(), p.clone(), cleared.clone());
                consumers.push(tokio::spawn(async move {
                    let mut got = Vec::new();
                    let mut batches = 0usize;
                    loop {
                        let mut req = GetMetaRequest::fetch(
                            p2.as_str(),
                            &["x"],
                            "t",
                            8,
                            Wait::For(Duration::from_secs(20)),
                        );
                        // Half the consumers lease and acknowledge, half consume at once.
                        if k % 2 == 0 {
                            if let GetMetaMode::Fetch { lease, .. } = &mut req.mode {
                                *lease = Some(Duration::from_secs(60));
                            }
                        }
                        match c2.get_meta(req).await {
                            Ok(meta) => {
                                if let Some(lease) = meta.lease() {
                                    c2.ack(&p2, "t", lease, meta.samples()).await.unwrap();
                                }
                                got.extend_from_slice(meta.samples());
                                batches += 1;
                                // Every consumer clears every second batch it consumed, so
                                // clears run alongside fetches however the batches are
                                // shared out (600 samples per partition in batches of at
                                // most 8: some consumer gets two). Before, one consumer in
                                // three cleared, and under load it could get none.
                                if batches.is_multiple_of(2) {
                                    let marked =
                                        c2.mark_clearing(&p2, Some(meta.samples())).await.unwrap();
                                    assert_eq!(marked.len(), meta.len());
                                    c2.release(&p2, marked.samples()).await.unwrap();
                                    cleared.fetch_add(meta.len(), Ordering::Relaxed);
                                }
                            }
                            Err(e) if e.kind() == &ErrorKind::Closed => break,
                            Err(e) => panic!("fetch on {p2}: {e}"),
                        }
                    }
                    (p2, got)
                }));
            }
        }
        // Whole-state readers run alongside: snapshots (exclusive) and status (shared).
        let reader = {
            let c = c.clone();
            tokio::spawn(async move {
                let mut snapshots = 0;
                for _ in 0..50 {
                    c.snapshot().unwrap();
                    let _ = c.status();
                    snapshots += 1;
                    tokio::task::yield_now().await;
                }
                snapshots
            })
        };
        for p in producers {
            p.await.unwrap();
        }
        assert_eq!(reader.await.unwrap(), 50);
        let mut by_partition = vec![Vec::new(); PARTITIONS];
        for t in consumers {
            let (p, got) = t.await.unwrap();
            let i: usize = p[1..].parse().unwrap();
            by_partition[i].extend(got);
        }
        by_partition
    });
    for (i, ids) in consumed.iter().enumerate() {
        let unique: HashSet<_> = ids.iter().collect();
        assert_eq!(ids.len(), SAMPLES, "p{i}: every sample consumed once");
        assert_eq!(unique.len(), SAMPLES, "p{i}: no sample consumed twice");
    }
    // The state the threads left is whole: it snapshots, restores, and says the same.
    let left = PARTITIONS * SAMPLES - cleared.load(Ordering::Relaxed);
    assert!(left < PARTITIONS * SAMPLES, "some batches were cleared");
    let (snapshot, counts) = c.snapshot().unwrap();
    assert_eq!(counts.samples as usize, left);
    assert_eq!(c.samples_in_use(), left);
    let restored = Controller::new(ControllerConfig::default()).unwrap();
    restored.restore(&snapshot).unwrap();
    let status = restored.status();
    assert_eq!(status.partitions.len(), PARTITIONS);
    assert_eq!(restored.samples_in_use(), left);
}
