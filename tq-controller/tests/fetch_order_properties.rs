//! Property test of what a fetch hands out, against a model: after any mix of inserts (which
//! reuse released indexes), partial production, at-most-once and leased fetches, acks, samples
//! given back, clears and a restore from a snapshot, a sequential fetch of `n` hands out the `n`
//! oldest ready samples in allocation order, or nothing when fewer are ready. This is what the
//! controller's allocation order and per-task scan cursor (which let a fetch cost its batch
//! instead of the partition) must keep.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::time::Duration;
use tq_controller::*;
use tq_core::{DType, FieldMeta, LeaseId, SampleId};

#[derive(Debug, Clone)]
enum Op {
    Insert(usize),
    /// Produce the not yet produced samples whose position (in the model's order) has this
    /// bit pattern.
    Produce(u64),
    Fetch(usize),
    FetchLeased(usize),
    AckLast,
    ReturnLastLeased,
    ReturnLastConsumed,
    /// Clear the samples at these positions (modulo the live count).
    Clear(Vec<usize>),
    Restore,
    /// Declare the partition complete (a fetch may then hand out a last, smaller batch).
    Complete,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1usize..12).prop_map(Op::Insert),
        3 => any::<u64>().prop_map(Op::Produce),
        3 => (1usize..8).prop_map(Op::Fetch),
        2 => (1usize..8).prop_map(Op::FetchLeased),
        1 => Just(Op::AckLast),
        1 => Just(Op::ReturnLastLeased),
        1 => Just(Op::ReturnLastConsumed),
        2 => proptest::collection::vec(0usize..64, 1..6).prop_map(Op::Clear),
        1 => Just(Op::Restore),
        1 => Just(Op::Complete),
    ]
}

/// One sample as the model sees it.
#[derive(Debug, Clone, Default)]
struct Row {
    produced: bool,
    consumed: bool,
    leased: bool,
}

/// Live samples in allocation order.
#[derive(Default)]
struct Model {
    rows: Vec<(SampleId, Row)>,
    complete: bool,
}

impl Model {
    fn ready(&self) -> Vec<SampleId> {
        self.rows
            .iter()
            .filter(|(_, r)| r.produced && !r.consumed && !r.leased)
            .map(|(id, _)| *id)
            .collect()
    }

    /// Complete, and every sample not consumed is ready: nothing else will become ready.
    fn draining(&self) -> bool {
        let unconsumed = self.rows.iter().filter(|(_, r)| !r.consumed).count();
        self.complete && !self.ready().is_empty() && unconsumed == self.ready().len()
    }

    fn row(&mut self, id: SampleId) -> &mut Row {
        &mut self.rows.iter_mut().find(|(i, _)| *i == id).unwrap().1
    }
}

fn schema() -> BTreeMap<String, FieldMeta> {
    BTreeMap::from([("x".to_string(), FieldMeta::dense(DType::F32, vec![1]))])
}

async fn run(ops: Vec<Op>) {
    let mut c = Controller::new(ControllerConfig::default()).unwrap();
    let mut model = Model::default();
    let mut last_leased: Option<(LeaseId, Vec<SampleId>)> = None;
    let mut last_consumed: Vec<SampleId> = Vec::new();
    for op in ops {
        match op {
            Op::Insert(k) => {
                let inserted = c
                    .get_meta(GetMetaRequest {
                        partition: "p".into(),
                        fields: vec![],
                        mode: GetMetaMode::Insert { count: k },
                        sampler: None,
                        dp_rank: None,
                        batch_index: None,
                        sampler_args: None,
                    })
                    .await;
                // A complete partition takes no more samples.
                let Ok(meta) = inserted else {
                    assert!(model.complete, "{inserted:?}");
                    continue;
                };
                for id in meta.samples() {
                    model.rows.push((*id, Row::default()));
                }
            }
            Op::Produce(bits) => {
                let ids: Vec<SampleId> = model
                    .rows
                    .iter()
                    .enumerate()
                    .filter(|(i, (_, r))| !r.produced && bits & (1 << (i % 64)) != 0)
                    .map(|(_, (id, _))| *id)
                    .collect();
                if ids.is_empty() {
                    continue;
                }
                c.notify_production(ProductionNotice {
                    partition: "p".into(),
                    samples: ids.clone(),
                    schemas: schema(),
                    tags: None,
                    backend_meta: None,
                })
                .await
                .unwrap();
                for id in ids {
                    model.row(id).produced = true;
                }
            }
            Op::Fetch(n) | Op::FetchLeased(n) => {
                let leased = matches!(op, Op::FetchLeased(_));
                let mut req = GetMetaRequest::fetch("p", &["x"], "t", n, Wait::NoWait);
                if leased {
                    req = req.with_lease(Duration::from_secs(3600));
                }
                let got = match c.get_meta(req).await {
                    Ok(m) => m,
                    // The end of a complete partition the task consumed.
                    Err(e) => {
                        assert_eq!(e.kind(), &tq_core::ErrorKind::Closed, "{e}");
                        assert!(model.complete && model.rows.iter().all(|(_, r)| r.consumed));
                        continue;
                    }
                };
                let ready = model.ready();
                let expected: Vec<SampleId> = if ready.len() >= n {
                    ready[..n].to_vec()
                } else if model.draining() {
                    ready
                } else {
                    Vec::new()
                };
                assert_eq!(
                    got.samples(),
                    &expected[..],
                    "fetch of {n} (leased: {leased})"
                );
                for id in got.samples() {
                    if leased {
                        model.row(*id).leased = true;
                    } else {
                        model.row(*id).consumed = true;
                    }
                }
                if !got.is_empty() {
                    if leased {
                        last_leased = Some((got.lease().unwrap(), got.samples().to_vec()));
                    } else {
                        last_consumed = got.samples().to_vec();
                    }
                }
            }
            Op::AckLast => {
                if let Some((lease, ids)) = last_leased.take() {
                    c.ack("p", "t", lease, &ids).await.unwrap();
                    for id in ids {
                        let r = model.row(id);
                        r.leased = false;
                        r.consumed = true;
                    }
                }
            }
            Op::ReturnLastLeased => {
                if let Some((lease, ids)) = last_leased.take() {
                    c.return_fetched("p", "t", Some(lease), &ids).await.unwrap();
                    for id in ids {
                        model.row(id).leased = false;
                    }
                }
            }
            Op::ReturnLastConsumed => {
                let ids = std::mem::take(&mut last_consumed);
                let live: Vec<SampleId> = ids
                    .into_iter()
                    .filter(|id| model.rows.iter().any(|(i, _)| i == id))
                    .collect();
                if live.is_empty() {
                    continue;
                }
                c.return_fetched("p", "t", None, &live).await.unwrap();
                for id in live {
                    model.row(id).consumed = false;
                }
            }
            Op::Clear(positions) => {
                if model.rows.is_empty() {
                    continue;
                }
                let mut ids: Vec<SampleId> = positions
                    .iter()
                    .map(|p| model.rows[p % model.rows.len()].0)
                    .collect();
                ids.sort();
                ids.dedup();
                let marked = c.mark_clearing("p", Some(&ids)).await.unwrap();
                c.release("p", marked.samples()).await.unwrap();
                model.rows.retain(|(id, _)| !ids.contains(id));
                if model.rows.is_empty() && !model.complete {
                    // An incomplete partition left empty is removed.
                    model = Model::default();
                }
                if let Some((_, leased)) = &mut last_leased {
                    leased.retain(|id| !ids.contains(id));
                }
            }
            Op::Complete => {
                if model.rows.is_empty() {
                    // No partition to mark (an empty one is removed).
                    continue;
                }
                c.mark_complete("p").await.unwrap();
                model.complete = true;
            }
            Op::Restore => {
                let (snapshot, _) = c.snapshot().unwrap();
                let fresh = Controller::new(ControllerConfig::default()).unwrap();
                fresh.restore(&snapshot).unwrap();
                c = fresh;
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn a_fetch_hands_out_the_oldest_ready_samples(ops in proptest::collection::vec(op(), 1..60)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(run(ops));
    }
}
