//! The rank-aware and seqlen-balanced samplers behind a real controller (reference §4.4, §4.5).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and examples may panic
use std::collections::HashSet;
use std::sync::Arc;
mod common;
use common::insert;
use tq_controller::*;
use tq_core::{DType, ErrorKind, FieldMeta, SampleId, TagValue, Tags};

fn controller() -> Controller {
    Controller::new(ControllerConfig {
        storage_units: 1,
        ..Default::default()
    })
    .unwrap()
}

/// Produces field `x` for `ids`, with tag `total_lengths` = `lengths[i]` when given.
async fn produce(c: &Controller, p: &str, ids: &[SampleId], lengths: Option<&[i64]>) {
    let tags = lengths.map(|l| {
        l.iter()
            .map(|&v| -> Tags { [("total_lengths".to_string(), TagValue::from(v))].into() })
            .collect()
    });
    c.notify_production(ProductionNotice {
        partition: p.into(),
        samples: ids.to_vec(),
        schemas: [("x".to_string(), FieldMeta::dense(DType::F32, vec![2]))].into(),
        tags,
        backend_meta: None,
    })
    .await
    .unwrap();
}

/// A polling fetch of `n` samples for task `train` as rank `dp_rank` of batch `batch_index`.
async fn fetch(
    c: &Controller,
    sampler: &str,
    dp_rank: u32,
    batch_index: u64,
    n: usize,
) -> tq_core::Result<Vec<u32>> {
    let req = GetMetaRequest {
        dp_rank: Some(dp_rank),
        batch_index: Some(batch_index),
        sampler_args: None,
        sampler: Some(sampler.into()),
        ..GetMetaRequest::fetch("p", &["x"], "train", n, Wait::NoWait)
    };
    Ok(c.get_meta(req)
        .await?
        .samples()
        .iter()
        .map(|s| s.index)
        .collect())
}

fn disjoint(a: &[u32], b: &[u32]) -> bool {
    let a: HashSet<_> = a.iter().collect();
    b.iter().all(|x| !a.contains(x))
}

async fn consumed(c: &Controller) -> usize {
    let cs = c.consumption_status("p", "train").await.unwrap();
    cs.consumed.iter().filter(|&&x| x).count()
}

#[tokio::test]
async fn rank_aware_groups_share_batches_and_never_overlap() {
    let c = controller();
    c.register_sampler("ra", Arc::new(RankAwareSampler::new()));
    let ids = insert(&c, "p", 8).await;
    produce(&c, "p", &ids, None).await;

    // Two ranks (say tensor-parallel peers) of group 0, then two of group 1.
    let g0a = fetch(&c, "ra", 0, 0, 3).await.unwrap();
    let g0b = fetch(&c, "ra", 0, 0, 3).await.unwrap();
    assert_eq!(g0a, vec![0, 1, 2]);
    assert_eq!(g0b, g0a, "same group, same batch although it is consumed");
    let g1a = fetch(&c, "ra", 1, 0, 3).await.unwrap();
    let g1b = fetch(&c, "ra", 1, 0, 3).await.unwrap();
    assert_eq!(g1a.len(), 3);
    assert_eq!(g1b, g1a);
    assert!(disjoint(&g0a, &g1a), "{g0a:?} {g1a:?}");
    assert_eq!(consumed(&c).await, 6);

    // Group 0's next batch: only 2 left, so nothing yet (and nothing remembered).
    assert!(fetch(&c, "ra", 0, 1, 3).await.unwrap().is_empty());
    let more = insert(&c, "p", 1).await;
    produce(&c, "p", &more, None).await;
    let g0_next = fetch(&c, "ra", 0, 1, 3).await.unwrap();
    assert_eq!(g0_next.len(), 3);
    assert!(disjoint(&g0_next, &g0a) && disjoint(&g0_next, &g1a));

    // A fetch without a rank is refused.
    let more = insert(&c, "p", 2).await;
    produce(&c, "p", &more, None).await;
    let e = c
        .get_meta(GetMetaRequest::fetch("p", &["x"], "train", 1, Wait::NoWait).with_sampler("ra"))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Invalid);
}

#[tokio::test]
async fn seqlen_balanced_reserves_every_rank_share() {
    let c = controller();
    c.register_sampler("sb", Arc::new(SeqlenBalancedSampler::new(1, 2).unwrap()));
    let ids = insert(&c, "p", 8).await;
    let lengths = [100, 100, 10, 10, 40, 30, 20, 10];
    produce(&c, "p", &ids, Some(&lengths)).await;
    let weight = |share: &[u32]| -> i64 { share.iter().map(|&i| lengths[i as usize]).sum() };

    // Rank 0 asks first for batch 0: 2 per rank, 4 selected, balanced 110/110.
    let r0 = fetch(&c, "sb", 0, 0, 2).await.unwrap();
    assert_eq!(r0.len(), 2);
    assert_eq!(weight(&r0), 110);
    // Rank 1's share is consumed too.
    assert_eq!(consumed(&c).await, 4);

    // Before rank 1 asks, rank 0 moves on to batch 1: it cannot take rank 1's share.
    let r0_next = fetch(&c, "sb", 0, 1, 2).await.unwrap();
    assert_eq!(r0_next.len(), 2);
    assert!(r0_next.iter().all(|&i| i >= 4), "{r0_next:?}");

    let r1 = fetch(&c, "sb", 1, 0, 2).await.unwrap();
    assert_eq!(r1.len(), 2);
    assert_eq!(weight(&r1), 110);
    assert!(disjoint(&r0, &r1), "{r0:?} {r1:?}");
    let mut batch0: Vec<u32> = r0.iter().chain(&r1).copied().collect();
    batch0.sort_unstable();
    assert_eq!(batch0, vec![0, 1, 2, 3]);

    // Batch 1 for rank 1: the rest, balanced too (40+10 / 30+20).
    let r1_next = fetch(&c, "sb", 1, 1, 2).await.unwrap();
    assert!(disjoint(&r0_next, &r1_next));
    assert_eq!((weight(&r0_next), weight(&r1_next)), (50, 50));
    assert_eq!(consumed(&c).await, 8);

    // A rank outside dp_size is refused.
    let more = insert(&c, "p", 4).await;
    produce(&c, "p", &more, None).await;
    let e = fetch(&c, "sb", 2, 2, 2).await.unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Invalid);
}

#[test]
fn samplers_by_name() {
    for ok in [
        "sequential",
        "grpo:4",
        "rank-aware",
        "seqlen-balanced:2",
        "seqlen-balanced:8:4",
    ] {
        assert!(sampler_from_name(ok).is_ok(), "{ok}");
    }
    for bad in [
        "rank-aware:1",
        "seqlen-balanced",
        "seqlen-balanced:",
        "seqlen-balanced:x",
        "seqlen-balanced:2:",
        "seqlen-balanced:2:y",
        "seqlen-balanced:2:4:1",
        "seqlen-balanced:0",
        "seqlen-balanced:2:0",
        "grpo:z",
        "random",
    ] {
        let e = match sampler_from_name(bad) {
            Ok(_) => panic!("`{bad}` accepted"),
            Err(e) => e,
        };
        assert_eq!(e.kind(), &ErrorKind::Invalid, "{bad}");
        if !bad.ends_with(":0") {
            assert!(
                e.to_string().contains("seqlen-balanced:<dp_size>:<n>"),
                "{bad}: {e}"
            );
        }
    }
    // As the default sampler of a controller.
    assert!(Controller::new(ControllerConfig {
        default_sampler: "seqlen-balanced:4:2".parse().unwrap(),
        ..Default::default()
    })
    .is_ok());
}

/// A complete partition whose rest is smaller than a full global batch still goes out: every
/// complete group left, whole groups per rank, every rank's share reserved by the first call;
/// a rank left without a group is told the partition is finished.
#[tokio::test]
async fn seqlen_balanced_hands_out_the_last_batch_of_a_complete_partition() {
    let c = controller();
    // Groups of 2, 2 ranks, 4 per rank: a full global batch is 4 groups.
    c.register_sampler("sb", Arc::new(SeqlenBalancedSampler::new(2, 2).unwrap()));
    let ids = insert(&c, "p", 6).await;
    let lengths = [50, 50, 10, 10, 30, 30];
    produce(&c, "p", &ids, Some(&lengths)).await;
    // Not complete yet: 3 groups are not a batch, more may come.
    assert!(fetch(&c, "sb", 1, 0, 4).await.unwrap().is_empty());
    assert_eq!(consumed(&c).await, 0);
    c.mark_complete("p").await.unwrap();

    // Rank 1 asks first: all 3 groups are shared out, whole, and all are reserved.
    let r1 = fetch(&c, "sb", 1, 0, 4).await.unwrap();
    assert_eq!(consumed(&c).await, 6);
    let r0 = fetch(&c, "sb", 0, 0, 4).await.unwrap();
    let mut all: Vec<u32> = r0.iter().chain(&r1).copied().collect();
    all.sort_unstable();
    assert_eq!(all, vec![0, 1, 2, 3, 4, 5], "r0 {r0:?} r1 {r1:?}");
    for share in [&r0, &r1] {
        for pair in [[0, 1], [2, 3], [4, 5]] {
            assert!(
                pair.iter().all(|i| share.contains(i)) || pair.iter().all(|i| !share.contains(i)),
                "group {pair:?} straddles ranks: r0 {r0:?} r1 {r1:?}"
            );
        }
    }
    // Balanced by weight as whole groups allow: {0,1} = 100 against {2,3} + {4,5} = 80.
    let weight = |share: &[u32]| -> i64 { share.iter().map(|&i| lengths[i as usize]).sum() };
    let mut weights = [weight(&r0), weight(&r1)];
    weights.sort_unstable();
    assert_eq!(weights, [80, 100]);
    let e = fetch(&c, "sb", 0, 1, 4).await.unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Closed, "{e}");

    // One group left for two ranks: the rank without a share is finished at once, and the
    // group is reserved for the other rank (another batch cannot take it).
    let more = insert(&c, "p", 2).await;
    produce(&c, "p", &more, Some(&[5, 5])).await;
    let first = fetch(&c, "sb", 1, 1, 4).await;
    let second = fetch(&c, "sb", 0, 1, 4).await;
    let (empty, got) = match (&first, &second) {
        (Err(_), Ok(g)) => (first.as_ref().unwrap_err(), g.clone()),
        (Ok(g), Err(_)) => (second.as_ref().unwrap_err(), g.clone()),
        other => panic!("one rank gets the group, the other is finished: {other:?}"),
    };
    assert_eq!(empty.kind(), &ErrorKind::Closed, "{empty}");
    let mut got = got;
    got.sort_unstable();
    assert_eq!(got, more.iter().map(|s| s.index).collect::<Vec<_>>());
    assert_eq!(consumed(&c).await, 8);
}

/// A controller with the rank-aware sampler registered as `ra`, 8 samples produced in `p`.
async fn ranked() -> Controller {
    let c = controller();
    c.register_sampler("ra", Arc::new(RankAwareSampler::new()));
    let ids = insert(&c, "p", 8).await;
    produce(&c, "p", &ids, None).await;
    c
}

#[tokio::test]
async fn a_restored_controller_gives_a_group_the_batch_it_gave_before() {
    let first = ranked().await;
    let batch = fetch(&first, "ra", 0, 0, 4).await.unwrap();
    assert_eq!(batch.len(), 4);
    let (snapshot, _) = first.snapshot().unwrap();

    // Another rank of group 0 asks the restored controller for batch 0: the same samples,
    // although they are consumed already.
    let second = controller();
    second.register_sampler("ra", Arc::new(RankAwareSampler::new()));
    second.restore(&snapshot).unwrap();
    assert_eq!(fetch(&second, "ra", 0, 0, 4).await.unwrap(), batch);
    // Group 1 still gets the other four.
    let other = fetch(&second, "ra", 1, 0, 4).await.unwrap();
    assert!(disjoint(&batch, &other));

    // Without the cached answers (the sampler not registered when restoring), another rank
    // of group 0 would get a different batch: its first batch's samples are consumed.
    let bare = controller();
    bare.restore(&snapshot).unwrap();
    bare.register_sampler("ra", Arc::new(RankAwareSampler::new()));
    assert!(disjoint(
        &fetch(&bare, "ra", 0, 0, 4).await.unwrap(),
        &batch
    ));
}

#[tokio::test]
async fn a_saved_state_of_another_sampler_kind_is_refused_and_nothing_is_restored() {
    let first = ranked().await;
    fetch(&first, "ra", 0, 0, 4).await.unwrap();
    let (snapshot, _) = first.snapshot().unwrap();
    let second = controller();
    second.register_sampler("ra", Arc::new(GrpoGroupNSampler::new(2).unwrap()));
    let e = second.restore(&snapshot).unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Invalid, "{e}");
    assert!(e.message().contains("sampler `ra`"), "{e}");
    assert!(e.message().contains("rank-aware"), "{e}");
    assert!(second.list_partitions().await.unwrap().is_empty());
}

#[tokio::test]
async fn snapshots_of_format_1_without_sampler_states_still_load() {
    let first = controller();
    let ids = insert(&first, "p", 3).await;
    produce(&first, "p", &ids, None).await;
    let (v2, _) = first.snapshot().unwrap();
    // Format 1 is format 2 without the trailing list of sampler states (empty here: one byte).
    let body = &v2[20..v2.len() - 1];
    assert_eq!(v2.last(), Some(&0u8));
    let mut v1 = Vec::new();
    v1.extend_from_slice(b"TQCS");
    v1.extend_from_slice(&1u32.to_le_bytes());
    v1.extend_from_slice(&(body.len() as u64).to_le_bytes());
    v1.extend_from_slice(&crc32fast::hash(body).to_le_bytes());
    v1.extend_from_slice(body);
    let second = controller();
    second.restore(&v1).unwrap();
    assert_eq!(
        second.list_partitions().await.unwrap(),
        vec!["p".to_string()]
    );
    assert_eq!(second.epoch(), first.epoch());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_dir_keeps_the_batches_given_to_groups() {
    let dir = std::env::temp_dir().join(format!(
        "tq-sampler-state-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    let first = Arc::new(ranked().await);
    let state = StateDir::open(&dir, first.clone()).unwrap();
    let batch = fetch(&first, "ra", 0, 0, 4).await.unwrap();
    state.changed().await.unwrap();
    drop(state);

    let second = Arc::new(controller());
    second.register_sampler("ra", Arc::new(RankAwareSampler::new()));
    let _state = StateDir::open(&dir, second.clone()).unwrap();
    assert_eq!(fetch(&second, "ra", 0, 0, 4).await.unwrap(), batch);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Takes the ready sample whose index is the call's input (one byte), if it is ready.
struct ByInput;

impl Sampler for ByInput {
    fn sample(
        &self,
        ready: &[Candidate<'_>],
        _batch_size: usize,
        ctx: &SamplerContext<'_>,
    ) -> tq_core::Result<Sampled> {
        let wanted = ctx
            .args
            .and_then(|a| a.first().copied())
            .ok_or_else(|| tq_core::Error::invalid("ByInput needs an input"))?;
        let picked: Vec<SampleId> = ready
            .iter()
            .filter(|c| c.id.index == u32::from(wanted))
            .map(|c| c.id)
            .collect();
        Ok(Sampled {
            sampled: picked.clone(),
            consumed: picked,
        })
    }

    fn takes_args(&self) -> bool {
        true
    }
}

#[tokio::test]
async fn per_call_inputs_reach_a_sampler_that_takes_them_and_no_other() {
    let c = controller();
    c.register_sampler("by-input", Arc::new(ByInput));
    let ids = insert(&c, "p", 4).await;
    produce(&c, "p", &ids, None).await;
    let with_input = |sampler: Option<&str>, input: u8| {
        let mut req = GetMetaRequest::fetch("p", &["x"], "train", 1, Wait::NoWait)
            .with_sampler_args(vec![input]);
        req.sampler = sampler.map(str::to_string);
        req
    };
    let got = c.get_meta(with_input(Some("by-input"), 2)).await.unwrap();
    assert_eq!(
        got.samples().iter().map(|s| s.index).collect::<Vec<_>>(),
        [2]
    );
    // The default (sequential) sampler takes no inputs: refused, naming the partition, and
    // nothing is consumed.
    let refused = c.get_meta(with_input(None, 0)).await.unwrap_err();
    assert_eq!(refused.kind(), &ErrorKind::Invalid);
    assert!(refused.message().contains("partition `p`"), "{refused}");
    assert!(refused.message().contains("takes none"), "{refused}");
    assert_eq!(consumed(&c).await, 1);
}
