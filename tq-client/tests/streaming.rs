//! Streaming consumers: several simulated ranks stream concurrently while producers write.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and examples may panic
use futures::StreamExt;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;
use tq_client::*;
use tq_core::{Batch, Column, ErrorKind, TagValue, Tags, Tensor};

fn client_with(samplers: &[(&str, &str)]) -> Client {
    let mut cfg = Config::default();
    for (name, spec) in samplers {
        cfg.controller
            .samplers
            .insert(name.to_string(), spec.to_string());
    }
    Client::embedded(cfg).unwrap()
}

/// `n` one-row-per-sample values `first..first+n` in field `id`, tagged with `total_lengths`.
fn ids(first: i64, n: usize) -> (Batch, Vec<Tags>) {
    let v: Vec<i64> = (first..first + n as i64).collect();
    let batch = Batch::from_columns([(
        "id",
        Column::Dense(Tensor::from_slice(vec![n], &v).unwrap()),
    )])
    .unwrap();
    let tags = v
        .iter()
        .map(|&i| {
            [(
                "total_lengths".to_string(),
                TagValue::Int(10 + (i % 7) * 13),
            )]
            .into()
        })
        .collect();
    (batch, tags)
}

async fn produce(tq: &Client, partition: &str, total: usize, chunk: usize) {
    let mut next = 0;
    while next < total {
        let n = chunk.min(total - next);
        let (batch, tags) = ids(next as i64, n);
        let mut meta = tq
            .get_meta(GetMetaRequest {
                partition: partition.into(),
                fields: vec![],
                mode: GetMetaMode::Insert { count: n },
                sampler: None,
                dp_rank: None,
                batch_index: None,
                sampler_args: None,
            })
            .await
            .unwrap();
        meta.tags_mut().clone_from_slice(&tags);
        tq.put(&meta, &batch).await.unwrap();
        next += n;
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    tq.partition(partition).complete().await.unwrap();
}

fn values(item: &StreamItem) -> Vec<i64> {
    let Column::Dense(t) = item.batch.column("id").unwrap() else {
        panic!("dense")
    };
    t.to_vec::<i64>().unwrap()
}

/// Streams partition `p` for task `t` as ranks 0 and 1 of sampler `balanced`, 4 per rank,
/// concurrently; returns each rank's batches.
async fn balanced_rank_streams(tq: &Client, idle: Duration) -> (Vec<Vec<i64>>, Vec<Vec<i64>>) {
    let ranks: Vec<_> = (0..2)
        .map(|rank| {
            let tq = tq.clone();
            tokio::spawn(async move {
                let mut s = tq
                    .partition("p")
                    .stream(
                        StreamConfig::new("t", &["id"], 4)
                            .sampler("balanced")
                            .dp_rank(rank)
                            .idle_timeout(idle),
                    )
                    .unwrap();
                let mut batches = Vec::new();
                while let Some(item) = s.next().await {
                    batches.push(values(&item.unwrap()));
                }
                batches
            })
        })
        .collect();
    let mut got = Vec::new();
    for r in ranks {
        got.push(r.await.unwrap());
    }
    let r1 = got.pop().expect("rank 1");
    (got.pop().expect("rank 0"), r1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_once_stream_ends_when_the_partition_is_complete() {
    let tq = client_with(&[]);
    let producer = tokio::spawn({
        let tq = tq.clone();
        async move { produce(&tq, "p", 40, 3).await }
    });
    let mut s = tq
        .partition("p")
        .stream(StreamConfig::new("t", &["id"], 5))
        .unwrap();
    let mut seen = Vec::new();
    while let Some(item) = s.next().await {
        let item = item.unwrap();
        assert_eq!(item.meta.len(), 5);
        seen.extend(values(&item));
    }
    producer.await.unwrap();
    seen.sort_unstable();
    assert_eq!(seen, (0..40).collect::<Vec<_>>());
    let p = s.progress();
    assert_eq!((p.batches, p.samples, p.bytes), (8, 40, 40 * 8));
}

#[tokio::test]
async fn a_stream_ends_after_its_idle_timeout() {
    let tq = client_with(&[]);
    let (b, _) = ids(0, 2);
    tq.partition("p").put_new(&b).await.unwrap();
    let mut s = tq
        .partition("p")
        .stream(StreamConfig::new("t", &["id"], 2).idle_timeout(Duration::from_millis(150)))
        .unwrap();
    assert_eq!(s.next().await.unwrap().unwrap().meta.len(), 2);
    let started = std::time::Instant::now();
    // Giving up waiting is said with a Timeout item, unlike the clean end of a completed
    // partition (`streams_of_a_completed_partition_end_cleanly` below).
    let e = s.next().await.unwrap().unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Timeout, "{e}");
    assert_eq!(e.retry(), tq_core::Retry::Safe, "nothing was consumed: {e}");
    assert!(e.message().contains("partition `p`, task `t`"), "{e}");
    assert!(started.elapsed() >= Duration::from_millis(140));
    assert!(s.next().await.is_none(), "ended after the Timeout item");
    // Bad configurations are refused up front.
    assert!(tq
        .partition("p")
        .stream(StreamConfig::new("t", &[], 2))
        .is_err());
    assert!(tq
        .partition("p")
        .stream(StreamConfig::new("t", &["id"], 0))
        .is_err());
    assert!(tq
        .partition("p")
        .stream(StreamConfig::new("t", &["id"], 1).acknowledged(Duration::ZERO))
        .is_err());
}

// Paused time: the sleep below ends only once the prefetcher has filled its queue and waits.
#[tokio::test(start_paused = true)]
async fn prefetch_fetches_ahead_but_boundedly() {
    let tq = client_with(&[]);
    let (b, _) = ids(0, 40);
    tq.partition("p").put_new(&b).await.unwrap();
    let mut s = tq
        .partition("p")
        .stream(StreamConfig::new("t", &["id"], 4).prefetch(2))
        .unwrap();
    let first = s.next().await.unwrap().unwrap();
    assert_eq!(first.meta.len(), 4);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let consumed = tq.partition("p").consumption_status("t").await.unwrap();
    let n = consumed.consumed.iter().filter(|&&c| c).count();
    // The one taken, up to 2 queued and one more in flight: fetched ahead, but not everything.
    assert!((8..=16).contains(&n), "consumed {n}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_consumer_has_its_leased_samples_redelivered() {
    let tq = client_with(&[]);
    let (b, _) = ids(0, 8);
    tq.partition("p").put_new(&b).await.unwrap();
    tq.partition("p").complete().await.unwrap();
    let lease = Duration::from_millis(300);
    // A consumer takes a batch and dies without acknowledging it.
    let taken = {
        let mut s = tq
            .partition("p")
            .stream(
                StreamConfig::new("t", &["id"], 4)
                    .acknowledged(lease)
                    .prefetch(1),
            )
            .unwrap();
        let item = s.next().await.unwrap().unwrap();
        values(&item)
    };
    // A second consumer gets everything exactly once: its own share at once, the dead
    // consumer's share (and anything it prefetched) after the lease expires.
    let mut s = tq
        .partition("p")
        .stream(StreamConfig::new("t", &["id"], 4).acknowledged(Duration::from_secs(10)))
        .unwrap();
    let mut seen = Vec::new();
    while let Some(item) = s.next().await {
        let item = item.unwrap();
        assert!(item.meta.lease().is_some());
        seen.extend(values(&item));
        assert_eq!(s.ack(&item).await.unwrap(), 4);
    }
    seen.sort_unstable();
    assert_eq!(seen, (0..8).collect::<Vec<_>>());
    assert!(
        taken.iter().all(|v| seen.contains(v)),
        "redelivered: {taken:?}"
    );
    assert!(tq
        .partition("p")
        .consumption_status("t")
        .await
        .unwrap()
        .all_consumed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rank_aware_groups_get_identical_batches_and_each_sample_once() {
    let tq = client_with(&[("rank", "rank-aware")]);
    let total = 96;
    let producer = tokio::spawn({
        let tq = tq.clone();
        async move { produce(&tq, "p", total, 8).await }
    });
    // Two data-parallel groups × two ranks each, acknowledged mode.
    let mut ranks = Vec::new();
    for group in 0..2u32 {
        for rank in 0..2 {
            let tq = tq.clone();
            ranks.push(tokio::spawn(async move {
                let cfg = StreamConfig::new("train", &["id"], 4)
                    .sampler("rank")
                    .dp_rank(group)
                    .acknowledged(Duration::from_secs(30))
                    .idle_timeout(Duration::from_secs(10));
                let mut s = tq.partition("p").stream(cfg).unwrap();
                let mut batches = Vec::new();
                while let Some(item) = s.next().await {
                    let item = item.unwrap();
                    batches.push(values(&item));
                    s.ack(&item).await.unwrap();
                }
                (group, rank, batches)
            }));
        }
    }
    producer.await.unwrap();
    let mut by_group: BTreeMap<u32, Vec<Vec<Vec<i64>>>> = BTreeMap::new();
    for r in ranks {
        let (group, _, batches) = r.await.unwrap();
        by_group.entry(group).or_default().push(batches);
    }
    let mut all = Vec::new();
    for (group, ranks) in &by_group {
        assert_eq!(
            ranks[0], ranks[1],
            "both ranks of group {group} got identical batches"
        );
        all.extend(ranks[0].iter().flatten().copied());
    }
    let unique: HashSet<i64> = all.iter().copied().collect();
    assert_eq!(unique.len(), all.len(), "no sample went to two groups");
    assert_eq!(unique.len(), total, "every sample delivered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpo_streams_hand_out_only_complete_groups() {
    let tq = client_with(&[("grpo", "grpo:2")]);
    // Three groups of 2 allocated together; the second group's partner is never produced.
    let meta = tq
        .get_meta(GetMetaRequest {
            partition: "p".into(),
            fields: vec![],
            mode: GetMetaMode::Insert { count: 6 },
            sampler: None,
            dp_rank: None,
            batch_index: None,
            sampler_args: None,
        })
        .await
        .unwrap();
    let (b, _) = ids(0, 6);
    let keep = [0, 1, 2, 4, 5];
    tq.put(
        &meta.select_samples(&keep).unwrap(),
        &b.select_rows(&keep).unwrap(),
    )
    .await
    .unwrap();
    let mut s = tq
        .partition("p")
        .stream(
            StreamConfig::new("t", &["id"], 2)
                .sampler("grpo")
                .idle_timeout(Duration::from_millis(200)),
        )
        .unwrap();
    let mut got = Vec::new();
    while let Some(item) = s.next().await {
        match item {
            Ok(item) => got.push(values(&item)),
            // The incomplete group never becomes ready: the stream stops waiting.
            Err(e) => assert_eq!(e.kind(), &ErrorKind::Timeout, "{e}"),
        }
    }
    assert_eq!(got, vec![vec![0, 1], vec![4, 5]]);
}

#[tokio::test]
async fn streams_of_a_completed_partition_end_cleanly() {
    let tq = client_with(&[]);
    let (b, _) = ids(0, 4);
    let p = tq.partition("p");
    p.put_new(&b).await.unwrap();
    p.complete().await.unwrap();
    let mut s = p
        .stream(StreamConfig::new("t", &["id"], 2).idle_timeout(Duration::from_secs(30)))
        .unwrap();
    let mut items = Vec::new();
    while let Some(item) = s.next().await {
        items.push(item.expect("no error item when the partition is complete"));
    }
    assert_eq!(items.len(), 2);
}

#[test]
fn a_blocking_stream_is_an_iterator_with_the_same_end() {
    let tq = BlockingClient::embedded(Config::default()).unwrap();
    let p = tq.partition("p");
    let (b, _) = ids(0, 4);
    p.put_new(&b).unwrap();
    let s = p
        .stream(StreamConfig::new("t", &["id"], 2).idle_timeout(Duration::from_millis(100)))
        .unwrap();
    let items: Vec<_> = s.collect();
    assert_eq!(items.len(), 3, "two batches, then the idle Timeout");
    assert!(items[0].is_ok() && items[1].is_ok());
    assert_eq!(items[2].as_ref().unwrap_err().kind(), &ErrorKind::Timeout);
    let mut s = p
        .stream(
            StreamConfig::new("acked", &["id"], 4)
                .acknowledged(Duration::from_secs(10))
                .idle_timeout(Duration::from_secs(30)),
        )
        .unwrap();
    let item = s.next().unwrap().unwrap();
    assert_eq!(s.renew(&item, Duration::from_secs(20)).unwrap(), 4);
    assert_eq!(
        tq.renew_lease("acked", &item.meta, Duration::from_secs(20))
            .unwrap(),
        4
    );
    assert_eq!(s.ack(&item).unwrap(), 4);
    assert_eq!(
        s.renew(&item, Duration::from_secs(20)).unwrap(),
        0,
        "acknowledged samples are no longer held"
    );
    p.complete().unwrap();
    assert!(s.next().is_none(), "complete and consumed: a clean end");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seqlen_balanced_ranks_get_disjoint_balanced_shares() {
    let tq = client_with(&[("balanced", "seqlen-balanced:2")]);
    let (b, tags) = ids(0, 32);
    let mut meta = tq
        .get_meta(GetMetaRequest {
            partition: "p".into(),
            fields: vec![],
            mode: GetMetaMode::Insert { count: 32 },
            sampler: None,
            dp_rank: None,
            batch_index: None,
            sampler_args: None,
        })
        .await
        .unwrap();
    meta.tags_mut().clone_from_slice(&tags);
    tq.put(&meta, &b).await.unwrap();
    tq.partition("p").complete().await.unwrap();
    let weight: HashMap<i64, i64> = (0..32).map(|i| (i, 10 + (i % 7) * 13)).collect();
    let (r0, r1) = balanced_rank_streams(&tq, Duration::from_secs(5)).await;
    assert_eq!(r0.len(), r1.len());
    let mut all: Vec<i64> = r0.iter().chain(&r1).flatten().copied().collect();
    all.sort_unstable();
    assert_eq!(
        all,
        (0..32).collect::<Vec<_>>(),
        "every sample to exactly one rank"
    );
    for (a, b) in r0.iter().zip(&r1) {
        let (wa, wb): (i64, i64) = (
            a.iter().map(|i| weight[i]).sum(),
            b.iter().map(|i| weight[i]).sum(),
        );
        let max_item = a.iter().chain(b).map(|i| weight[i]).max().unwrap();
        assert!((wa - wb).abs() <= max_item, "balanced batch: {wa} vs {wb}");
    }
    let e = tq
        .get_meta(GetMetaRequest::fetch("p", &["id"], "t", 1, Wait::NoWait))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Closed);
}

/// The rest of a complete partition, smaller than a global batch, is streamed too: the ranks'
/// streams end because the partition is finished, not at their idle timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seqlen_balanced_streams_drain_a_last_partial_batch() {
    let tq = client_with(&[("balanced", "seqlen-balanced:2")]);
    // 4 per rank, 2 ranks: 2 full global batches of 8 and a rest of 5.
    produce(&tq, "p", 21, 7).await;
    let started = std::time::Instant::now();
    let (r0, r1) = balanced_rank_streams(&tq, Duration::from_secs(60)).await;
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the streams waited for their idle timeout ({:?})",
        started.elapsed()
    );
    let mut all: Vec<i64> = r0.iter().chain(&r1).flatten().copied().collect();
    all.sort_unstable();
    assert_eq!(
        all,
        (0..21).collect::<Vec<_>>(),
        "every sample to exactly one rank"
    );
}
