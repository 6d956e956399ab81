//! Rank-aware sampling: every rank of one data-parallel group gets the same batch.

use super::{Candidate, PartitionCache, Sampled, Sampler, SamplerContext};
use tq_core::{Error, Result, SampleId};

/// (partition, task, dp_rank, batch_index).
type RankKey = (String, String, u32, u64);

/// Gives every rank of one data-parallel group the identical batch (reference §4.4).
///
/// The ranks of a group (tensor/pipeline-parallel peers) share a `dp_rank`; each asks for batch
/// `batch_index`. The first to ask takes the oldest `batch_size` ready samples, which are marked
/// consumed for the task and remembered under (partition, task, dp_rank, batch_index); the
/// others get the remembered batch even though its samples are no longer ready (the controller
/// lets a fetch through when [`Sampler::has_cached`] says so). Different groups or batch
/// indexes sample independently from what is still ready, so two groups never share a sample.
///
/// Fewer than `batch_size` ready → nothing is handed out and nothing remembered. Both `dp_rank`
/// and `batch_index` are required (`Invalid` otherwise). Remembered batches are dropped only by
/// [`Sampler::clear_partition`], since the number of ranks per group is unknown; a batch that
/// names samples cleared since is no longer served.
#[derive(Debug, Default)]
pub struct RankAwareSampler {
    cache: PartitionCache<RankKey, Vec<SampleId>>,
}

impl RankAwareSampler {
    pub fn new() -> Self {
        Self::default()
    }

    fn key(ctx: &SamplerContext<'_>) -> Option<RankKey> {
        Some((
            ctx.partition.to_string(),
            ctx.task.to_string(),
            ctx.dp_rank?,
            ctx.batch_index?,
        ))
    }
}

impl Sampler for RankAwareSampler {
    fn sample(
        &self,
        ready: &[Candidate<'_>],
        batch_size: usize,
        ctx: &SamplerContext<'_>,
    ) -> Result<Sampled> {
        let key = Self::key(ctx).ok_or_else(|| {
            Error::invalid(format!(
                "partition `{}`: the rank-aware sampler needs a dp_rank and a batch_index \
                 (got dp_rank {:?}, batch_index {:?})",
                ctx.partition, ctx.dp_rank, ctx.batch_index
            ))
        })?;
        let mut cache = self.cache.lock();
        if let Some(hit) = cache.get(&key) {
            return Ok(Sampled::same(hit.clone()));
        }
        if batch_size == 0 || ready.len() < batch_size {
            return Ok(Sampled::default());
        }
        let ids: Vec<SampleId> = ready[..batch_size].iter().map(|c| c.id).collect();
        cache.insert(key, ids.clone());
        Ok(Sampled::same(ids))
    }

    fn has_cached(&self, ctx: &SamplerContext<'_>) -> bool {
        Self::key(ctx).is_some_and(|k| self.cache.contains(&k))
    }

    /// A group's batch is the oldest `batch_size` ready samples.
    fn takes_oldest(&self) -> bool {
        true
    }

    fn clear_partition(&self, partition: &str) {
        self.cache.clear_partition(partition);
    }

    fn save_state(&self) -> Result<Option<Vec<u8>>> {
        self.cache.encode("rank-aware").map(Some)
    }

    fn load_state(&self, state: &[u8]) -> Result<()> {
        self.cache.replace_from("rank-aware", state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tq_core::{ErrorKind, Tags};

    fn cands<'a>(indexes: impl IntoIterator<Item = u32>, tags: &'a Tags) -> Vec<Candidate<'a>> {
        indexes
            .into_iter()
            .map(|i| Candidate {
                id: SampleId::new(i, 0),
                seq: i as u64,
                tags,
            })
            .collect()
    }

    fn ctx<'a>(partition: &'a str, task: &'a str, rank: u32, batch: u64) -> SamplerContext<'a> {
        SamplerContext {
            partition,
            task,
            dp_rank: Some(rank),
            batch_index: Some(batch),
            args: None,
            draining: false,
        }
    }

    fn idx(s: &Sampled) -> Vec<u32> {
        s.sampled.iter().map(|i| i.index).collect()
    }

    #[test]
    fn same_key_gets_the_identical_cached_list() {
        let t = Tags::new();
        let s = RankAwareSampler::new();
        let c = ctx("p", "t", 0, 0);
        assert!(!s.has_cached(&c));
        let first = s.sample(&cands(0..6, &t), 2, &c).unwrap();
        assert_eq!(idx(&first), vec![0, 1]);
        assert_eq!(first.consumed, first.sampled);
        assert!(s.has_cached(&c));
        // Another rank of the group: the first rank consumed 0 and 1, yet it gets them too.
        let second = s.sample(&cands(2..6, &t), 2, &c).unwrap();
        assert_eq!(second, first);
        // Even with nothing ready at all.
        assert_eq!(s.sample(&[], 2, &c).unwrap(), first);
    }

    #[test]
    fn other_batch_rank_task_or_partition_sample_independently() {
        let t = Tags::new();
        let s = RankAwareSampler::new();
        s.sample(&cands(0..8, &t), 2, &ctx("p", "t", 0, 0)).unwrap();
        // What is still ready after that first batch was consumed.
        let rest = cands(2..8, &t);
        for c in [
            ctx("p", "t", 0, 1),
            ctx("p", "t", 1, 0),
            ctx("p", "u", 0, 0),
            ctx("q", "t", 0, 0),
        ] {
            assert!(!s.has_cached(&c), "{c:?}");
            let got = s.sample(&rest, 2, &c).unwrap();
            assert_eq!(idx(&got), vec![2, 3], "{c:?} sampled afresh");
            assert!(s.has_cached(&c));
        }
        // The first key still answers with its own batch.
        assert_eq!(
            idx(&s.sample(&rest, 2, &ctx("p", "t", 0, 0)).unwrap()),
            vec![0, 1]
        );
    }

    #[test]
    fn insufficient_gives_nothing_and_caches_nothing() {
        let t = Tags::new();
        let s = RankAwareSampler::new();
        let c = ctx("p", "t", 0, 0);
        assert!(s
            .sample(&cands(0..3, &t), 4, &c)
            .unwrap()
            .sampled
            .is_empty());
        assert!(s
            .sample(&cands(0..3, &t), 0, &c)
            .unwrap()
            .sampled
            .is_empty());
        assert!(!s.has_cached(&c));
        // Once enough are ready, the batch is taken then.
        assert_eq!(
            idx(&s.sample(&cands(0..4, &t), 4, &c).unwrap()),
            vec![0, 1, 2, 3]
        );
    }

    #[test]
    fn needs_dp_rank_and_batch_index() {
        let t = Tags::new();
        let s = RankAwareSampler::new();
        let ready = cands(0..4, &t);
        for (dp_rank, batch_index) in [(None, Some(0)), (Some(0), None), (None, None)] {
            let c = SamplerContext {
                partition: "p",
                task: "t",
                dp_rank,
                batch_index,
                args: None,
                draining: false,
            };
            let e = s.sample(&ready, 2, &c).unwrap_err();
            assert_eq!(e.kind(), &ErrorKind::Invalid);
            assert!(!s.has_cached(&c));
        }
    }

    #[test]
    fn clear_partition_drops_only_that_partition() {
        let t = Tags::new();
        let s = RankAwareSampler::new();
        let (p, q) = (ctx("p", "t", 0, 0), ctx("q", "t", 0, 0));
        s.sample(&cands(0..2, &t), 2, &p).unwrap();
        s.sample(&cands(0..2, &t), 2, &q).unwrap();
        s.clear_partition("p");
        assert!(!s.has_cached(&p));
        assert!(s.has_cached(&q));
        // p samples afresh.
        assert_eq!(idx(&s.sample(&cands(5..7, &t), 2, &p).unwrap()), vec![5, 6]);
    }
}
