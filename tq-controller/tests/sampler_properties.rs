//! Property tests of the built-in samplers over random sets of ready samples: answers come only
//! from what is ready, never repeat a sample, respect the batch size, and (GRPO) hand out only
//! whole, aligned groups.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic
use proptest::prelude::*;
use std::collections::HashSet;
use tq_controller::{
    Candidate, GrpoGroupNSampler, Sampler, SamplerContext, SeqlenBalancedSampler, SequentialSampler,
};
use tq_core::{SampleId, Tags};

fn ctx() -> SamplerContext<'static> {
    SamplerContext {
        partition: "p",
        task: "t",
        dp_rank: None,
        batch_index: None,
        args: None,
        draining: false,
    }
}

/// A ready set: a random subset of allocation slots `0..64`, in allocation order.
fn ready_seqs() -> impl Strategy<Value = Vec<u64>> {
    proptest::collection::btree_set(0u64..64, 0..64).prop_map(|s| s.into_iter().collect())
}

fn candidates<'a>(seqs: &[u64], tags: &'a Tags) -> Vec<Candidate<'a>> {
    seqs.iter()
        .map(|&s| Candidate {
            id: SampleId::new(s as u32 * 7 + 1, 0),
            seq: s,
            tags,
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn sequential_hands_out_the_oldest_ready_first(seqs in ready_seqs(), batch in 1usize..20) {
        let tags = Tags::new();
        let ready = candidates(&seqs, &tags);
        let got = SequentialSampler.sample(&ready, batch, &ctx()).unwrap();
        let want: Vec<SampleId> = ready.iter().take(batch).map(|c| c.id).collect();
        prop_assert_eq!(&got.sampled, &want);
        prop_assert_eq!(&got.consumed, &want);
    }

    #[test]
    fn grpo_hands_out_only_whole_aligned_groups(seqs in ready_seqs(), n in 1usize..6, groups in 1usize..5) {
        let tags = Tags::new();
        let ready = candidates(&seqs, &tags);
        let sampler = GrpoGroupNSampler::new(n).unwrap();
        let got = sampler.sample(&ready, groups * n, &ctx()).unwrap();
        let by_id: std::collections::HashMap<SampleId, u64> =
            ready.iter().map(|c| (c.id, c.seq)).collect();
        prop_assert!(got.sampled.len() <= groups * n);
        prop_assert_eq!(got.sampled.len() % n, 0);
        let mut seen = HashSet::new();
        for id in &got.sampled {
            prop_assert!(by_id.contains_key(id), "{:?} was not ready", id);
            prop_assert!(seen.insert(*id), "{:?} handed out twice", id);
        }
        for group in got.sampled.chunks(n) {
            let first = by_id[&group[0]];
            prop_assert_eq!(first % n as u64, 0, "a group starts on a multiple of n");
            for (k, id) in group.iter().enumerate() {
                prop_assert_eq!(by_id[id], first + k as u64, "a group is n consecutive slots");
            }
        }
        // Every sample handed out is consumed, and nothing else.
        let consumed: HashSet<SampleId> = got.consumed.iter().copied().collect();
        prop_assert_eq!(consumed, seen);
    }

    /// Seqlen balancing over `dp` ranks: the ranks' shares are disjoint whole groups, every rank
    /// gets the same number of groups, a later rank gets the share cached for it, and the
    /// heaviest share outweighs the lightest by at most the heaviest group.
    #[test]
    fn seqlen_balanced_shares_are_disjoint_whole_groups_within_one_group_of_balance(
        weights in proptest::collection::vec(1i64..1000, 4..40),
        n in 1usize..4,
        dp in 1usize..4,
        groups_per_rank in 1usize..3,
    ) {
        let count = weights.len() / n * n;
        let tags: Vec<Tags> = weights[..count]
            .iter()
            .map(|w| Tags::from([(
                SeqlenBalancedSampler::DEFAULT_WEIGHT_TAG.to_string(),
                tq_core::TagValue::Int(*w),
            )]))
            .collect();
        let ready: Vec<Candidate<'_>> = tags
            .iter()
            .enumerate()
            .map(|(s, t)| Candidate { id: SampleId::new(s as u32, 0), seq: s as u64, tags: t })
            .collect();
        let sampler = SeqlenBalancedSampler::new(n, dp).unwrap();
        let batch = groups_per_rank * n;
        let weight_of = |id: &SampleId| weights[id.index as usize];
        let mut seen = HashSet::new();
        let mut share_weights = Vec::new();
        for rank in 0..dp {
            let ctx = SamplerContext {
                partition: "p",
                task: "t",
                dp_rank: Some(rank as u32),
                batch_index: Some(0),
                args: None,
                draining: false,
            };
            let got = sampler.sample(&ready, batch, &ctx).unwrap();
            if got.sampled.is_empty() {
                // Too few complete groups for every rank: nobody gets anything.
                prop_assert!(count / n < groups_per_rank * dp);
                return Ok(());
            }
            prop_assert_eq!(got.sampled.len(), batch, "rank {}", rank);
            for id in &got.sampled {
                prop_assert!(seen.insert(*id), "sample {:?} handed to two ranks", id);
            }
            // Whole groups: index / n names the group, each present n times.
            let mut per_group = std::collections::HashMap::new();
            for id in &got.sampled {
                *per_group.entry(id.index as usize / n).or_insert(0usize) += 1;
            }
            prop_assert!(per_group.values().all(|c| *c == n));
            share_weights.push(got.sampled.iter().map(weight_of).sum::<i64>());
        }
        let heaviest_group = weights[..count]
            .chunks(n)
            .map(|g| g.iter().sum::<i64>())
            .max()
            .unwrap();
        let (lo, hi) = (
            *share_weights.iter().min().unwrap(),
            *share_weights.iter().max().unwrap(),
        );
        prop_assert!(hi - lo <= heaviest_group, "shares {:?}, heaviest group {}", share_weights, heaviest_group);
    }
}
