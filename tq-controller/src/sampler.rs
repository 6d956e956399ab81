//! Samplers choose which ready samples a fetch hands out.
//!
//! The controller calls a sampler with the samples that are produced for every requested field
//! and not yet consumed by the task, in allocation order. The sampler returns what to hand out
//! and what to mark consumed (usually the same). Returning nothing means "not enough yet".
//!
//! Built in: [`SequentialSampler`] and [`GrpoGroupNSampler`] here, [`RankAwareSampler`]
//! (identical batches for the ranks of one data-parallel group) and [`SeqlenBalancedSampler`]
//! (one global batch split across data-parallel ranks with balanced token counts) in
//! submodules, which share the Karmarkar–Karp partitioner of `kk`.

mod kk;
mod rank_aware;
mod seqlen_balanced;
mod spec;

pub use rank_aware::RankAwareSampler;
pub use seqlen_balanced::SeqlenBalancedSampler;
pub use spec::SamplerSpec;

use std::collections::HashMap;
use std::sync::Mutex;
use tq_core::{Error, Result, SampleId, TagValue, Tags};

/// A ready sample as a sampler sees it.
#[derive(Debug, Clone, Copy)]
pub struct Candidate<'a> {
    pub id: SampleId,
    /// Allocation order within the partition: samples allocated by one call get consecutive
    /// numbers, so a put of a whole group is contiguous in `seq` even when indexes are reused.
    pub seq: u64,
    pub tags: &'a Tags,
}

/// Who is asking, for samplers that keep per-rank or per-batch state.
#[derive(Debug, Clone, Copy)]
pub struct SamplerContext<'a> {
    pub partition: &'a str,
    pub task: &'a str,
    pub dp_rank: Option<u32>,
    pub batch_index: Option<u64>,
    /// This call's inputs for the sampler (`GetMetaRequest::sampler_args`); only a sampler
    /// whose [`Sampler::takes_args`] is true is ever given any.
    pub args: Option<&'a [u8]>,
    /// The partition is complete and `ready` is everything the task has left: nothing else
    /// will become ready, so a sampler that waits for more would wait forever. (The fetch then
    /// asks for at most what is ready.)
    pub draining: bool,
}

/// The sampler's answer.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Sampled {
    /// Handed out, in this order.
    pub sampled: Vec<SampleId>,
    /// Marked consumed for the task.
    pub consumed: Vec<SampleId>,
}

impl Sampled {
    fn same(ids: Vec<SampleId>) -> Self {
        Sampled {
            consumed: ids.clone(),
            sampled: ids,
        }
    }
}

/// Chooses samples for fetches. Implementations keep their own state behind interior
/// mutability; the controller calls them inside its critical section, so they must be quick.
pub trait Sampler: Send + Sync + 'static {
    /// Picks up to `batch_size` of `ready`. Every returned id must come from `ready`.
    fn sample(
        &self,
        ready: &[Candidate<'_>],
        batch_size: usize,
        ctx: &SamplerContext<'_>,
    ) -> Result<Sampled>;

    /// Whether this sampler picks from the oldest ready samples, so that the controller may
    /// hand it only the oldest ones: a non-empty answer it gives for a prefix of the ready list
    /// (in allocation order) must be the answer it would give for the whole list. The
    /// controller then offers the oldest `batch_size`, four times more each time the answer is
    /// empty, so a fetch costs its batch instead of the partition. The default, `false`, is for a
    /// sampler that looks at every ready sample (grouping by tag, choosing by weight over
    /// everything): it is always given the whole list.
    fn takes_oldest(&self) -> bool {
        false
    }

    /// Whether this sampler takes per-call inputs ([`SamplerContext::args`]). A fetch that
    /// brings inputs to a sampler that does not (the default) is refused, never run without
    /// them.
    fn takes_args(&self) -> bool {
        false
    }

    /// True when a cached answer exists for this context, so a fetch may proceed even if fewer
    /// than `batch_size` samples are ready (rank-aware sampling).
    fn has_cached(&self, _ctx: &SamplerContext<'_>) -> bool {
        false
    }

    /// Drops any state kept for `partition` (called when the partition is cleared).
    fn clear_partition(&self, _partition: &str) {}

    /// What this sampler remembers between fetches (cached answers), encoded, to be saved with
    /// the controller's state (checkpoints and `--state-dir`), so that a restored controller
    /// gives the ranks of a group the batches it gave them before. `None` (the default):
    /// nothing to keep.
    fn save_state(&self) -> Result<Option<Vec<u8>>> {
        Ok(None)
    }

    /// Replaces what this sampler remembers with `state`, saved by [`Sampler::save_state`] of
    /// a sampler of the same kind. Checks and decodes everything before changing anything; the
    /// default refuses, since a sampler that saves nothing has nothing to load.
    fn load_state(&self, _state: &[u8]) -> Result<()> {
        Err(Error::invalid(
            "this sampler keeps no state, but the saved state has some for it",
        ))
    }
}

/// Hands out the oldest ready samples first.
#[derive(Debug, Default, Clone, Copy)]
pub struct SequentialSampler;

impl Sampler for SequentialSampler {
    fn sample(
        &self,
        ready: &[Candidate<'_>],
        batch_size: usize,
        _ctx: &SamplerContext<'_>,
    ) -> Result<Sampled> {
        Ok(Sampled::same(
            ready.iter().take(batch_size).map(|c| c.id).collect(),
        ))
    }

    fn takes_oldest(&self) -> bool {
        true
    }
}

/// A key of per-partition sampler state: its first part is the partition.
pub(crate) trait PartitionKey: Eq + std::hash::Hash {
    fn partition(&self) -> &str;
}

impl<A: Eq + std::hash::Hash, B: Eq + std::hash::Hash> PartitionKey for (String, A, B) {
    fn partition(&self) -> &str {
        &self.0
    }
}

impl<A: Eq + std::hash::Hash, B: Eq + std::hash::Hash, C: Eq + std::hash::Hash> PartitionKey
    for (String, A, B, C)
{
    fn partition(&self) -> &str {
        &self.0
    }
}

/// Answers a sampler remembers (per rank, per batch index, ...), dropped with their partition.
/// Shared by the samplers that cache, so the locking and the per-partition cleanup live once.
#[derive(Debug)]
pub(crate) struct PartitionCache<K, V> {
    map: Mutex<HashMap<K, V>>,
}

impl<K, V> Default for PartitionCache<K, V> {
    fn default() -> Self {
        PartitionCache {
            map: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: PartitionKey, V> PartitionCache<K, V> {
    /// The map, for a lookup and an insert under one lock.
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<K, V>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn contains(&self, key: &K) -> bool {
        self.lock().contains_key(key)
    }

    pub(crate) fn clear_partition(&self, partition: &str) {
        self.lock().retain(|k, _| k.partition() != partition);
    }
}

impl<K, V> PartitionCache<K, V>
where
    K: PartitionKey + serde::Serialize + serde::de::DeserializeOwned,
    V: serde::Serialize + serde::de::DeserializeOwned,
{
    /// Every entry, encoded with the sampler's `kind` (so that a state is never loaded into a
    /// sampler of another kind registered under the same name).
    pub(crate) fn encode(&self, kind: &str) -> Result<Vec<u8>> {
        let map = self.lock();
        let entries: Vec<(&K, &V)> = map.iter().collect();
        postcard::to_allocvec(&(kind, entries))
            .map_err(|e| Error::internal(format!("cannot encode the {kind} sampler's cache: {e}")))
    }

    /// Replaces every entry with those of [`PartitionCache::encode`]'s output, after decoding
    /// all of it and checking its kind.
    pub(crate) fn replace_from(&self, kind: &str, bytes: &[u8]) -> Result<()> {
        let bad = |e: postcard::Error| {
            Error::corrupted(format!(
                "the saved state of a {kind} sampler does not decode: {e}"
            ))
        };
        // The kind first, so that another kind's state is named as such.
        let (saved_kind, rest): (String, &[u8]) = postcard::take_from_bytes(bytes).map_err(bad)?;
        if saved_kind != kind {
            return Err(Error::invalid(format!(
                "the saved state is a {saved_kind} sampler's; this sampler is a {kind} sampler"
            )));
        }
        let entries: Vec<(K, V)> = postcard::from_bytes(rest).map_err(bad)?;
        *self.lock() = entries.into_iter().collect();
        Ok(())
    }
}

type CacheKey = (String, String, u32, Option<u64>);

/// Hands out only complete groups of `n` samples (the `n` responses of one GRPO prompt).
///
/// A group is either the samples sharing one value of a tag (`with_group_tag`), or — the
/// default — `n` consecutive allocation slots aligned to a multiple of `n`, which is what a
/// producer gets when it puts each prompt's `n` responses in one call of a multiple of `n`
/// samples. (The original grouped by consecutive global indexes, which broke on index reuse and
/// could splice two prompts' halves into one group.)
///
/// With a `dp_rank` in the context, the answer is cached per (partition, task, rank, batch index)
/// so every member of a data-parallel group gets the same batch.
pub struct GrpoGroupNSampler {
    n: usize,
    group_tag: Option<String>,
    cache: PartitionCache<CacheKey, Sampled>,
}

impl GrpoGroupNSampler {
    /// `n` samples per group; `n == 0` is `Invalid`.
    pub fn new(n: usize) -> Result<Self> {
        if n == 0 {
            return Err(Error::invalid("GrpoGroupNSampler needs n >= 1"));
        }
        Ok(GrpoGroupNSampler {
            n,
            group_tag: None,
            cache: PartitionCache::default(),
        })
    }

    /// Groups samples by the value of tag `key` instead of by allocation order.
    pub fn with_group_tag(mut self, key: impl Into<String>) -> Self {
        self.group_tag = Some(key.into());
        self
    }

    pub fn n(&self) -> usize {
        self.n
    }

    fn key(ctx: &SamplerContext<'_>) -> Option<CacheKey> {
        ctx.dp_rank.map(|r| {
            (
                ctx.partition.to_string(),
                ctx.task.to_string(),
                r,
                ctx.batch_index,
            )
        })
    }

    /// Positions in `ready` of the first `groups_wanted` complete groups, each group's `n`
    /// members consecutive in the answer; empty when fewer groups are complete.
    fn complete_groups(&self, ready: &[Candidate<'_>], groups_wanted: usize) -> Vec<usize> {
        let mut out = self.groups_up_to(ready, groups_wanted);
        if out.len() < groups_wanted * self.n {
            out.clear();
        }
        out
    }

    /// Positions in `ready` of every complete group, as [`Self::complete_groups`] orders them.
    fn all_complete_groups(&self, ready: &[Candidate<'_>]) -> Vec<usize> {
        self.groups_up_to(ready, ready.len() / self.n)
    }

    /// Up to `groups_wanted` complete groups (fewer when fewer are complete).
    fn groups_up_to(&self, ready: &[Candidate<'_>], groups_wanted: usize) -> Vec<usize> {
        let n = self.n;
        let mut out = Vec::with_capacity(groups_wanted * n);
        match &self.group_tag {
            Some(tag) => {
                // Groups in order of their first ready member.
                let mut order: Vec<String> = Vec::new();
                let mut members: HashMap<String, Vec<usize>> = HashMap::new();
                for (pos, c) in ready.iter().enumerate() {
                    let Some(v) = c.tags.get(tag) else { continue };
                    let k = tag_key(v);
                    let m = members.entry(k.clone()).or_default();
                    if m.is_empty() {
                        order.push(k);
                    }
                    m.push(pos);
                }
                for k in order {
                    let m = &members[&k];
                    if m.len() >= n {
                        out.extend_from_slice(&m[..n]);
                        if out.len() == groups_wanted * n {
                            break;
                        }
                    }
                }
            }
            None => {
                let mut i = 0;
                while i < ready.len() && out.len() < groups_wanted * n {
                    let start = ready[i].seq;
                    let window = &ready[i..(i + n).min(ready.len())];
                    let aligned = start.is_multiple_of(n as u64);
                    let complete = window.len() == n
                        && window
                            .iter()
                            .enumerate()
                            .all(|(k, c)| c.seq == start + k as u64);
                    if aligned && complete {
                        out.extend(i..i + n);
                        i += n;
                    } else {
                        i += 1;
                    }
                }
            }
        }
        out
    }
}

fn tag_key(v: &TagValue) -> String {
    match v {
        TagValue::Str(s) => s.clone(),
        other => format!("{other:?}"),
    }
}

impl Sampler for GrpoGroupNSampler {
    fn sample(
        &self,
        ready: &[Candidate<'_>],
        batch_size: usize,
        ctx: &SamplerContext<'_>,
    ) -> Result<Sampled> {
        let key = Self::key(ctx);
        if let Some(k) = &key {
            if let Some(hit) = self.cache.lock().get(k) {
                return Ok(hit.clone());
            }
        }
        if !batch_size.is_multiple_of(self.n) {
            return Err(Error::invalid(format!(
                "batch size {batch_size} must be a multiple of n = {} samples per group",
                self.n
            )));
        }
        let picked = Sampled::same(
            self.complete_groups(ready, batch_size / self.n)
                .into_iter()
                .map(|i| ready[i].id)
                .collect(),
        );
        if let (Some(k), false) = (key, picked.sampled.is_empty()) {
            self.cache.lock().entry(k).or_insert_with(|| picked.clone());
        }
        Ok(picked)
    }

    fn has_cached(&self, ctx: &SamplerContext<'_>) -> bool {
        Self::key(ctx).is_some_and(|k| self.cache.contains(&k))
    }

    /// Groups of consecutive allocations are the earliest complete ones among the oldest
    /// samples; groups by tag may have members anywhere, so those need the whole list.
    fn takes_oldest(&self) -> bool {
        self.group_tag.is_none()
    }

    fn clear_partition(&self, partition: &str) {
        self.cache.clear_partition(partition);
    }

    fn save_state(&self) -> Result<Option<Vec<u8>>> {
        self.cache.encode("grpo-group-n").map(Some)
    }

    fn load_state(&self, state: &[u8]) -> Result<()> {
        self.cache.replace_from("grpo-group-n", state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cands<'a>(seqs: &[u64], tags: &'a Tags) -> Vec<Candidate<'a>> {
        seqs.iter()
            .map(|&s| Candidate {
                id: SampleId::new(s as u32 + 100, 0),
                seq: s,
                tags,
            })
            .collect()
    }

    const CTX: SamplerContext<'static> = SamplerContext {
        partition: "p",
        task: "t",
        dp_rank: None,
        batch_index: None,
        args: None,
        draining: false,
    };

    #[test]
    fn sequential_takes_first_n() {
        let t = Tags::new();
        let c = cands(&[0, 1, 2, 3], &t);
        let s = SequentialSampler.sample(&c, 3, &CTX).unwrap();
        assert_eq!(s.sampled.len(), 3);
        assert_eq!(s.sampled, s.consumed);
        assert_eq!(
            SequentialSampler
                .sample(&c, 10, &CTX)
                .unwrap()
                .sampled
                .len(),
            4
        );
        assert!(SequentialSampler
            .sample(&c, 0, &CTX)
            .unwrap()
            .sampled
            .is_empty());
    }

    #[test]
    fn grpo_takes_only_complete_aligned_groups() {
        let t = Tags::new();
        // Groups of 3: {0,1,2} {3,4,5} {6,7,8} {9,10,11}. 2 is missing; 3..5 and 9..11 complete;
        // 6,7 ready but 8 not.
        let c = cands(&[0, 1, 3, 4, 5, 6, 7, 9, 10, 11], &t);
        let g = GrpoGroupNSampler::new(3).unwrap();
        let s = g.sample(&c, 6, &CTX).unwrap();
        let seqs: Vec<u32> = s.sampled.iter().map(|i| i.index - 100).collect();
        assert_eq!(seqs, vec![3, 4, 5, 9, 10, 11]);
        // Not enough complete groups → nothing.
        assert!(g.sample(&c, 9, &CTX).unwrap().sampled.is_empty());
        assert!(g.sample(&c, 4, &CTX).is_err());
        assert!(GrpoGroupNSampler::new(0).is_err());
        // A misaligned run (seq 1,2,3) is not a group.
        let c = cands(&[1, 2, 3], &t);
        assert!(g.sample(&c, 3, &CTX).unwrap().sampled.is_empty());
    }

    #[test]
    fn grpo_by_tag_and_rank_cache() {
        let tags: Vec<Tags> = ["a", "b", "a", "b", "c"]
            .iter()
            .map(|v| [("uid".to_string(), TagValue::from(*v))].into())
            .collect();
        let c: Vec<Candidate> = tags
            .iter()
            .enumerate()
            .map(|(i, t)| Candidate {
                id: SampleId::new(i as u32, 0),
                seq: i as u64 * 7,
                tags: t,
            })
            .collect();
        let g = GrpoGroupNSampler::new(2).unwrap().with_group_tag("uid");
        let ctx = SamplerContext {
            dp_rank: Some(0),
            batch_index: Some(0),
            args: None,
            ..CTX
        };
        let s = g.sample(&c, 2, &ctx).unwrap();
        assert_eq!(s.sampled, vec![SampleId::new(0, 0), SampleId::new(2, 0)]);
        assert!(g.has_cached(&ctx));
        // Same rank and batch index → same answer even with nothing ready.
        assert_eq!(g.sample(&[], 2, &ctx).unwrap(), s);
        g.clear_partition("p");
        assert!(!g.has_cached(&ctx));
    }
}
