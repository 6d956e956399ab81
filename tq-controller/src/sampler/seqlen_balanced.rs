//! Sequence-length balanced sampling across data-parallel ranks.

use super::kk::karmarkar_karp;
use super::{Candidate, GrpoGroupNSampler, PartitionCache, Sampled, Sampler, SamplerContext};
use tq_core::{Error, Result, SampleId};

/// (partition, task, batch_index).
type BalancedKey = (String, String, u64);

/// Hands each of `dp_size` data-parallel ranks a share of one global batch, with the shares'
/// total weights (typically token counts) balanced (reference §4.5).
///
/// `batch_size` is per rank. The first rank to ask for a `batch_index` selects
/// `batch_size × dp_size` samples the way [`GrpoGroupNSampler`] does (only complete groups of
/// `n`; same grouping rule, including [`SeqlenBalancedSampler::with_group_tag`]) and splits them
/// into `dp_size` shares with the Karmarkar–Karp largest-differencing method. A sample's weight
/// is the numeric tag `weight_tag` (default [`SeqlenBalancedSampler::DEFAULT_WEIGHT_TAG`], i.e.
/// `total_lengths`; 1 when absent; a non-numeric, negative or non-finite value is `Invalid`).
/// When the selected groups divide
/// evenly among the ranks (always, when `batch_size` is a multiple of `n`) groups are balanced
/// as units with the same number of groups per rank, so a group never straddles two ranks;
/// otherwise samples are balanced one by one and shares may differ in size. Each share lists its
/// samples in allocation order; shares are ordered by their oldest sample and rank `r` gets
/// share `r`. All shares are cached under (partition, task, batch_index); a later rank gets its
/// cached share (and [`Sampler::has_cached`] reports it, so the fetch goes through although
/// those samples are no longer ready).
///
/// **Fix over the original:** the first call marks the shares of *all* ranks consumed (leased,
/// in acknowledged mode): `Sampled::consumed` holds every share, `sampled` only the caller's.
/// The original marked only the caller's share, leaving the other ranks' samples ready until
/// those ranks asked, so a fetch for another `batch_index` could take them first and the sample
/// was handed out twice (to that fetch and, from the cache, to the rank it was meant for). The
/// flip side: the shares of ranks that never ask are consumed anyway. Later ranks' calls return
/// `consumed` = their share, which re-marks it (idempotent).
///
/// Both `dp_rank` (`< dp_size`) and `batch_index` are required (`Invalid` otherwise; the
/// original defaulted both to 0, which silently hands the same batch out forever). Too few
/// complete groups → nothing handed out, nothing cached, unless the controller is draining a
/// complete partition ([`SamplerContext::draining`]): then every complete group left is shared
/// out as whole groups, balanced as far as whole groups allow (shares may differ in size, and a
/// rank may get none). Cached shares are dropped only by [`Sampler::clear_partition`].
pub struct SeqlenBalancedSampler {
    grpo: GrpoGroupNSampler,
    dp_size: usize,
    weight_tag: String,
    cache: PartitionCache<BalancedKey, Vec<Vec<SampleId>>>,
}

impl SeqlenBalancedSampler {
    /// The tag holding a sample's weight unless [`Self::with_weight_tag`] says otherwise.
    pub const DEFAULT_WEIGHT_TAG: &'static str = "total_lengths";

    /// `n` samples per group and `dp_size` ranks, both at least 1 (`Invalid` otherwise).
    pub fn new(n: usize, dp_size: usize) -> Result<Self> {
        if n == 0 {
            return Err(Error::invalid("SeqlenBalancedSampler needs n >= 1"));
        }
        if dp_size == 0 {
            return Err(Error::invalid("SeqlenBalancedSampler needs dp_size >= 1"));
        }
        Ok(SeqlenBalancedSampler {
            grpo: GrpoGroupNSampler::new(n)?,
            dp_size,
            weight_tag: Self::DEFAULT_WEIGHT_TAG.to_string(),
            cache: PartitionCache::default(),
        })
    }

    /// Reads each sample's weight from tag `key` instead of [`Self::DEFAULT_WEIGHT_TAG`].
    pub fn with_weight_tag(mut self, key: impl Into<String>) -> Self {
        self.weight_tag = key.into();
        self
    }

    /// Groups samples by the value of tag `key` instead of by allocation order (as
    /// [`GrpoGroupNSampler::with_group_tag`]).
    pub fn with_group_tag(mut self, key: impl Into<String>) -> Self {
        self.grpo = self.grpo.with_group_tag(key);
        self
    }

    pub fn n(&self) -> usize {
        self.grpo.n()
    }

    pub fn dp_size(&self) -> usize {
        self.dp_size
    }

    pub fn weight_tag(&self) -> &str {
        &self.weight_tag
    }

    /// The caller's rank and the cache key, validated.
    fn rank_and_key(&self, ctx: &SamplerContext<'_>) -> Result<(usize, BalancedKey)> {
        let (Some(rank), Some(batch)) = (ctx.dp_rank, ctx.batch_index) else {
            return Err(Error::invalid(format!(
                "partition `{}`: the seqlen-balanced sampler needs a dp_rank and a batch_index \
                 (got dp_rank {:?}, batch_index {:?})",
                ctx.partition, ctx.dp_rank, ctx.batch_index
            )));
        };
        let rank = rank as usize;
        if rank >= self.dp_size {
            return Err(Error::invalid(format!(
                "partition `{}`: dp_rank {rank} is out of range for dp_size {}",
                ctx.partition, self.dp_size
            )));
        }
        Ok((
            rank,
            (ctx.partition.to_string(), ctx.task.to_string(), batch),
        ))
    }

    fn weight(&self, c: &Candidate<'_>) -> Result<f64> {
        let Some(v) = c.tags.get(&self.weight_tag) else {
            return Ok(1.0);
        };
        match v.as_f64() {
            Some(w) if w.is_finite() && w >= 0.0 => Ok(w),
            _ => Err(Error::invalid(format!(
                "sample {}: weight tag `{}` is {v:?}, not a non-negative number",
                c.id, self.weight_tag
            ))),
        }
    }

    /// Splits `weights` (the selection, groups of `n` consecutive) into `dp_size` parts of
    /// positions into it.
    fn split(&self, weights: &[f64]) -> Vec<Vec<usize>> {
        let (n, k) = (self.n(), self.dp_size);
        if weights.len().is_multiple_of(n) && (weights.len() / n).is_multiple_of(k) {
            self.split_groups(weights, true)
        } else {
            karmarkar_karp(weights, k, false)
        }
    }

    /// Splits `weights` (groups of `n` consecutive) into `dp_size` parts of whole groups: with
    /// `equal_size` the same number of groups per part, otherwise the parts' sizes may differ
    /// (a last batch too small for equal shares).
    fn split_groups(&self, weights: &[f64], equal_size: bool) -> Vec<Vec<usize>> {
        let n = self.n();
        let group_weights: Vec<f64> = weights.chunks(n).map(|g| g.iter().sum()).collect();
        karmarkar_karp(&group_weights, self.dp_size, equal_size)
            .into_iter()
            .map(|groups| {
                groups
                    .into_iter()
                    .flat_map(|g| g * n..(g + 1) * n)
                    .collect()
            })
            .collect()
    }
}

impl Sampler for SeqlenBalancedSampler {
    fn sample(
        &self,
        ready: &[Candidate<'_>],
        batch_size: usize,
        ctx: &SamplerContext<'_>,
    ) -> Result<Sampled> {
        let (rank, key) = self.rank_and_key(ctx)?;
        let mut cache = self.cache.lock();
        if let Some(shares) = cache.get(&key) {
            return Ok(Sampled::same(shares[rank].clone()));
        }
        if batch_size == 0 {
            return Ok(Sampled::default());
        }
        let n = self.n();
        let total = batch_size
            .checked_mul(self.dp_size)
            .filter(|t| t % n == 0)
            .ok_or_else(|| {
                Error::invalid(format!(
                    "batch size {batch_size} × dp_size {} must be a multiple of n = {n} samples \
                     per group",
                    self.dp_size
                ))
            });
        let full = match total {
            Ok(total) => self.grpo.complete_groups(ready, total / n),
            Err(_) if ctx.draining => Vec::new(),
            Err(e) => return Err(e),
        };
        // The last batch of a complete partition: every complete group left, shared out as
        // evenly as groups allow (some ranks may get fewer samples, or none).
        let (picked, last) = if full.is_empty() && ctx.draining {
            (self.grpo.all_complete_groups(ready), true)
        } else {
            (full, false)
        };
        if picked.is_empty() {
            return Ok(Sampled::default());
        }
        let weights = picked
            .iter()
            .map(|&i| self.weight(&ready[i]))
            .collect::<Result<Vec<f64>>>()?;
        let parts = if last {
            self.split_groups(&weights, false)
        } else {
            self.split(&weights)
        };
        let mut shares: Vec<Vec<&Candidate<'_>>> = parts
            .into_iter()
            .map(|part| {
                let mut share: Vec<&Candidate<'_>> =
                    part.into_iter().map(|j| &ready[picked[j]]).collect();
                share.sort_by_key(|c| c.seq);
                share
            })
            .collect();
        shares.sort_by_key(|s| s.first().map_or(u64::MAX, |c| c.seq));
        let shares: Vec<Vec<SampleId>> = shares
            .into_iter()
            .map(|s| s.into_iter().map(|c| c.id).collect())
            .collect();
        let picked = Sampled {
            sampled: shares[rank].clone(),
            consumed: shares.concat(),
        };
        cache.insert(key, shares);
        Ok(picked)
    }

    fn has_cached(&self, ctx: &SamplerContext<'_>) -> bool {
        self.rank_and_key(ctx)
            .is_ok_and(|(_, k)| self.cache.contains(&k))
    }

    /// The global batch is the earliest complete groups (as [`GrpoGroupNSampler`] picks them),
    /// balanced among themselves.
    fn takes_oldest(&self) -> bool {
        self.grpo.takes_oldest()
    }

    fn clear_partition(&self, partition: &str) {
        self.cache.clear_partition(partition);
    }

    fn save_state(&self) -> Result<Option<Vec<u8>>> {
        self.cache.encode("seqlen-balanced").map(Some)
    }

    fn load_state(&self, state: &[u8]) -> Result<()> {
        self.cache.replace_from("seqlen-balanced", state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    const DEFAULT_WEIGHT_TAG: &str = SeqlenBalancedSampler::DEFAULT_WEIGHT_TAG;
    use std::collections::HashSet;
    use tq_core::{ErrorKind, TagValue, Tags};

    /// One tag set per weight (`None` → no weight tag).
    fn tags(weights: &[Option<f64>]) -> Vec<Tags> {
        weights
            .iter()
            .map(|w| match w {
                Some(w) => [(DEFAULT_WEIGHT_TAG.to_string(), TagValue::from(*w))].into(),
                None => Tags::new(),
            })
            .collect()
    }

    /// Candidates with indexes = allocation order = position.
    fn cands(tags: &[Tags]) -> Vec<Candidate<'_>> {
        tags.iter()
            .enumerate()
            .map(|(i, t)| Candidate {
                id: SampleId::new(i as u32, 0),
                seq: i as u64,
                tags: t,
            })
            .collect()
    }

    fn ctx<'a>(partition: &'a str, rank: u32, batch: u64) -> SamplerContext<'a> {
        SamplerContext {
            partition,
            task: "t",
            dp_rank: Some(rank),
            batch_index: Some(batch),
            args: None,
            draining: false,
        }
    }

    fn idx(ids: &[SampleId]) -> Vec<u32> {
        ids.iter().map(|i| i.index).collect()
    }

    fn weight_of(ids: &[SampleId], weights: &[Option<f64>]) -> f64 {
        ids.iter()
            .map(|i| weights[i.index as usize].unwrap_or(1.0))
            .sum()
    }

    #[test]
    fn draining_shares_out_every_complete_group_left() {
        // Groups of 4, one rank: {0..3} is complete, {4, 5} is not.
        let t = tags(&[None; 6]);
        let ready = cands(&t);
        let s = SeqlenBalancedSampler::new(4, 1).unwrap();
        // A fetch of the 6 ready samples is not a whole number of groups: refused normally.
        let e = s.sample(&ready, 6, &ctx("p", 0, 0)).unwrap_err();
        assert_eq!(e.kind(), &ErrorKind::Invalid);
        let draining = SamplerContext {
            draining: true,
            ..ctx("p", 0, 0)
        };
        let got = s.sample(&ready, 6, &draining).unwrap();
        assert_eq!(idx(&got.sampled), vec![0, 1, 2, 3]);
        assert_eq!(idx(&got.consumed), vec![0, 1, 2, 3]);
        // Two ranks, one complete group: one share holds it, the other is empty, and both
        // calls name the group as consumed.
        let s = SeqlenBalancedSampler::new(4, 2).unwrap();
        let first = s.sample(
            &ready,
            6,
            &SamplerContext {
                draining: true,
                ..ctx("p", 1, 0)
            },
        );
        let first = first.unwrap();
        assert!(first.sampled.is_empty());
        assert_eq!(idx(&first.consumed), vec![0, 1, 2, 3]);
        let other = s
            .sample(
                &ready,
                6,
                &SamplerContext {
                    draining: true,
                    ..ctx("p", 0, 0)
                },
            )
            .unwrap();
        assert_eq!(idx(&other.sampled), vec![0, 1, 2, 3]);
    }

    #[test]
    fn constructor_rejects_zero() {
        assert!(SeqlenBalancedSampler::new(0, 1).is_err());
        assert!(SeqlenBalancedSampler::new(1, 0).is_err());
        let s = SeqlenBalancedSampler::new(2, 4)
            .unwrap()
            .with_weight_tag("w");
        assert_eq!((s.n(), s.dp_size(), s.weight_tag()), (2, 4, "w"));
        assert_eq!(
            SeqlenBalancedSampler::new(1, 1).unwrap().weight_tag(),
            DEFAULT_WEIGHT_TAG
        );
    }

    #[test]
    fn reference_example_balances_110_110_and_consumes_every_share() {
        let w = [Some(100.0), Some(100.0), Some(10.0), Some(10.0)];
        let t = tags(&w);
        let ready = cands(&t);
        let s = SeqlenBalancedSampler::new(1, 2).unwrap();
        let r0 = s.sample(&ready, 2, &ctx("p", 0, 0)).unwrap();
        // A contiguous split would give 200/20.
        assert_eq!(idx(&r0.sampled), vec![0, 3]);
        assert_eq!(weight_of(&r0.sampled, &w), 110.0);
        // The fix: both ranks' shares are consumed by the first call.
        let mut consumed = idx(&r0.consumed);
        consumed.sort_unstable();
        assert_eq!(consumed, vec![0, 1, 2, 3]);
        // Rank 1 asks later, with those samples no longer ready.
        let r1 = s.sample(&[], 2, &ctx("p", 1, 0)).unwrap();
        assert_eq!(idx(&r1.sampled), vec![1, 2]);
        assert_eq!(weight_of(&r1.sampled, &w), 110.0);
        assert_eq!(r1.consumed, r1.sampled);
    }

    #[test]
    fn groups_stay_together_and_group_sums_are_balanced() {
        // Pairs (0,1) (2,3) (4,5) (6,7) with sums 100, 100, 10, 10; members are lopsided so a
        // sample-level split would tear pairs apart.
        let w = [
            Some(95.0),
            Some(5.0),
            Some(60.0),
            Some(40.0),
            Some(9.0),
            Some(1.0),
            Some(2.0),
            Some(8.0),
        ];
        let t = tags(&w);
        let ready = cands(&t);
        let s = SeqlenBalancedSampler::new(2, 2).unwrap();
        let r0 = s.sample(&ready, 4, &ctx("p", 0, 0)).unwrap();
        let r1 = s.sample(&[], 4, &ctx("p", 1, 0)).unwrap();
        for share in [&r0.sampled, &r1.sampled] {
            assert_eq!(share.len(), 4);
            let members: HashSet<u32> = idx(share).into_iter().collect();
            for m in &members {
                assert!(members.contains(&(m ^ 1)), "pair of {m} split: {share:?}");
            }
            assert_eq!(weight_of(share, &w), 110.0);
            assert!(share.windows(2).all(|p| p[0].index < p[1].index));
        }
        assert_eq!(idx(&r0.sampled), vec![0, 1, 6, 7]);
        assert_eq!(idx(&r1.sampled), vec![2, 3, 4, 5]);
    }

    #[test]
    fn incomplete_groups_are_skipped() {
        // Pair (2,3) lacks 3; (0,1) and (4,5) are complete.
        let w = [Some(1.0); 6];
        let t = tags(&w);
        let mut ready = cands(&t);
        ready.remove(3);
        let s = SeqlenBalancedSampler::new(2, 2).unwrap();
        let r0 = s.sample(&ready, 2, &ctx("p", 0, 0)).unwrap();
        let r1 = s.sample(&ready, 2, &ctx("p", 1, 0)).unwrap();
        let mut all = idx(&r0.sampled);
        all.extend(idx(&r1.sampled));
        all.sort_unstable();
        assert_eq!(all, vec![0, 1, 4, 5]);
        // Not enough complete groups for a second batch: nothing, nothing cached.
        let c = ctx("p", 0, 1);
        assert!(s.sample(&ready[..3], 2, &c).unwrap().sampled.is_empty());
        assert!(!s.has_cached(&c));
        // A per-rank batch whose global size is not a multiple of n is refused.
        let e = SeqlenBalancedSampler::new(2, 1)
            .unwrap()
            .sample(&ready, 3, &ctx("p", 0, 0))
            .unwrap_err();
        assert_eq!(e.kind(), &ErrorKind::Invalid);
    }

    #[test]
    fn uneven_group_counts_fall_back_to_sample_level_balancing() {
        // n = 2, dp 2, 3 per rank → 3 pairs cannot be split evenly by groups.
        let w = [Some(50.0), Some(10.0), Some(20.0), Some(20.0), None, None];
        let t = tags(&w);
        let ready = cands(&t);
        let s = SeqlenBalancedSampler::new(2, 2).unwrap();
        let r0 = s.sample(&ready, 3, &ctx("p", 0, 0)).unwrap();
        let r1 = s.sample(&[], 3, &ctx("p", 1, 0)).unwrap();
        assert!(!r0.sampled.is_empty() && !r1.sampled.is_empty());
        let mut all = idx(&r0.sampled);
        all.extend(idx(&r1.sampled));
        all.sort_unstable();
        assert_eq!(all, vec![0, 1, 2, 3, 4, 5]);
        // 102 in total: KK finds 51/51 (e.g. {50, 1} and {10, 20, 20, 1}).
        assert_eq!(weight_of(&r0.sampled, &w), 51.0);
        assert_eq!(weight_of(&r1.sampled, &w), 51.0);
    }

    #[test]
    fn state_cached_per_batch_index_and_populated_for_all_ranks() {
        let w = [
            Some(3.0),
            Some(1.0),
            Some(4.0),
            Some(1.0),
            Some(5.0),
            Some(9.0),
        ];
        let t = tags(&w);
        let ready = cands(&t);
        let s = SeqlenBalancedSampler::new(1, 3).unwrap();
        assert!(!s.has_cached(&ctx("p", 0, 0)));
        let r2 = s.sample(&ready[..3], 1, &ctx("p", 2, 0)).unwrap();
        assert_eq!(r2.consumed.len(), 3);
        for r in 0..3 {
            assert!(s.has_cached(&ctx("p", r, 0)), "rank {r}");
            assert!(!s.has_cached(&ctx("p", r, 1)), "rank {r}, other batch");
        }
        // Every rank gets a distinct share of batch 0, whatever is ready now.
        let shares: Vec<Vec<u32>> = (0..3)
            .map(|r| idx(&s.sample(&ready[3..], 1, &ctx("p", r, 0)).unwrap().sampled))
            .collect();
        assert_eq!(shares, vec![vec![0], vec![1], vec![2]]);
        // Asking again is stable.
        assert_eq!(
            idx(&s.sample(&[], 1, &ctx("p", 2, 0)).unwrap().sampled),
            shares[2]
        );
        // Batch 1 samples afresh from what is ready.
        let b1 = s.sample(&ready[3..], 1, &ctx("p", 0, 1)).unwrap();
        let mut consumed = idx(&b1.consumed);
        consumed.sort_unstable();
        assert_eq!(consumed, vec![3, 4, 5]);
        // Another task has its own state.
        let other = SamplerContext {
            task: "u",
            ..ctx("p", 0, 0)
        };
        assert!(!s.has_cached(&other));
    }

    #[test]
    fn clear_partition_drops_only_that_partition() {
        let t = tags(&[None, None]);
        let ready = cands(&t);
        let s = SeqlenBalancedSampler::new(1, 2).unwrap();
        s.sample(&ready, 1, &ctx("p", 0, 0)).unwrap();
        s.sample(&ready, 1, &ctx("q", 0, 0)).unwrap();
        s.clear_partition("p");
        assert!(!s.has_cached(&ctx("p", 1, 0)));
        assert!(s.has_cached(&ctx("q", 1, 0)));
        assert!(s
            .sample(&[], 1, &ctx("p", 1, 0))
            .unwrap()
            .sampled
            .is_empty());
        assert_eq!(s.sample(&[], 1, &ctx("q", 1, 0)).unwrap().sampled.len(), 1);
    }

    #[test]
    fn rank_out_of_range_or_missing_is_invalid() {
        let t = tags(&[None; 4]);
        let ready = cands(&t);
        let s = SeqlenBalancedSampler::new(1, 2).unwrap();
        let e = s.sample(&ready, 1, &ctx("p", 2, 0)).unwrap_err();
        assert_eq!(e.kind(), &ErrorKind::Invalid);
        for (dp_rank, batch_index) in [(None, Some(0)), (Some(0), None)] {
            let c = SamplerContext {
                partition: "p",
                task: "t",
                dp_rank,
                batch_index,
                args: None,
                draining: false,
            };
            assert_eq!(
                s.sample(&ready, 1, &c).unwrap_err().kind(),
                &ErrorKind::Invalid
            );
        }
        // Cached or not, rank 2 stays out of range.
        s.sample(&ready, 1, &ctx("p", 0, 0)).unwrap();
        assert!(!s.has_cached(&ctx("p", 2, 0)));
        assert!(s.sample(&ready, 1, &ctx("p", 2, 0)).is_err());
    }

    #[test]
    fn bad_weights_are_invalid_and_grouping_by_tag_works() {
        let mut t = tags(&[Some(1.0), None]);
        t[1].insert(DEFAULT_WEIGHT_TAG.into(), TagValue::from(-3.0));
        let s = SeqlenBalancedSampler::new(1, 2).unwrap();
        let e = s.sample(&cands(&t), 1, &ctx("p", 0, 0)).unwrap_err();
        assert_eq!(e.kind(), &ErrorKind::Invalid);
        t[1].insert(DEFAULT_WEIGHT_TAG.into(), TagValue::from("long"));
        assert!(s.sample(&cands(&t), 1, &ctx("p", 0, 0)).is_err());

        // Groups by `uid`, interleaved in allocation order; custom weight tag.
        let t: Vec<Tags> = [("a", 10), ("b", 1), ("a", 10), ("b", 1), ("c", 5), ("c", 5)]
            .iter()
            .map(|(u, w)| {
                [
                    ("uid".to_string(), TagValue::from(*u)),
                    ("len".to_string(), TagValue::from(*w as i64)),
                ]
                .into()
            })
            .collect();
        let s = SeqlenBalancedSampler::new(2, 2)
            .unwrap()
            .with_group_tag("uid")
            .with_weight_tag("len");
        let r0 = s.sample(&cands(&t), 2, &ctx("p", 0, 0)).unwrap();
        let r1 = s.sample(&[], 2, &ctx("p", 1, 0)).unwrap();
        // Groups a (20) and b (2) are taken; c is not needed. One group per rank.
        assert_eq!(idx(&r0.sampled), vec![0, 2]);
        assert_eq!(idx(&r1.sampled), vec![1, 3]);
    }

    #[test]
    fn deterministic_with_ties_in_allocation_order() {
        let t = tags(&[None; 4]);
        let ready = cands(&t);
        let run = || {
            let s = SeqlenBalancedSampler::new(1, 2).unwrap();
            let r0 = s.sample(&ready, 2, &ctx("p", 0, 0)).unwrap();
            let r1 = s.sample(&[], 2, &ctx("p", 1, 0)).unwrap();
            (idx(&r0.sampled), idx(&r1.sampled))
        };
        assert_eq!(run(), (vec![0, 3], vec![1, 2]));
        assert_eq!(run(), run());
    }
}
