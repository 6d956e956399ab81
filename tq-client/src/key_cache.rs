//! What a remote client last saw of each key, so a small `kv_batch_get` can read storage in
//! parallel with the controller's key lookup instead of after it (one round trip instead of two).
//!
//! The cache is only ever a guess. A speculative read is used only when the controller's fresh
//! metadata for the request equals the cached metadata the read was made with (same samples with
//! the same generations, fields, shapes, tags, backend meta and links); otherwise its result is
//! dropped and storage is read again with the fresh metadata. A stale entry therefore costs one
//! wasted read, never a wrong answer: storage never serves a sample index under an older generation
//! than the one it holds (docs/architecture.md, "Data model (tq-core)"), and a cleared or reused
//! sample shows up as different metadata. Writes never trust the cache.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use tq_core::{BatchMeta, FieldKind};

/// Requests of more keys than this are never read speculatively: latency matters for small
/// requests, and a wasted read of a large one costs more than a round trip.
pub(crate) const SPECULATE_MAX_KEYS: usize = 64;

/// Nor are requests whose tensor payload (as the cached metadata describes it) exceeds this.
pub(crate) const SPECULATE_MAX_BYTES: usize = 1 << 20;

/// How often speculative reads were used and dropped (see [`crate::Client::key_cache_stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeyCacheStats {
    /// Speculative reads whose metadata the controller confirmed: answered in one round trip.
    pub hits: u64,
    /// Speculative reads dropped because the metadata had changed (or the read failed).
    pub misses: u64,
}

/// Per partition, per key: the one-row metadata this client last saw. Bounded: when it holds
/// `capacity` keys, it starts over empty (cheap, and a cold entry only costs one slower get).
#[derive(Debug)]
pub(crate) struct KeyCache {
    capacity: usize,
    entries: Mutex<Entries>,
    hits: AtomicU64,
    misses: AtomicU64,
}

#[derive(Debug, Default)]
struct Entries {
    len: usize,
    by_partition: HashMap<String, HashMap<String, BatchMeta>>,
}

impl KeyCache {
    pub(crate) fn new(capacity: usize) -> KeyCache {
        KeyCache {
            capacity,
            entries: Mutex::new(Entries::default()),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The metadata a key lookup would return for `keys`, if every key is cached and their
    /// rows combine the way the controller combines them (fields all keys hold); else `None`.
    pub(crate) fn guess(&self, partition: &str, keys: &[String]) -> Option<BatchMeta> {
        if keys.is_empty() || keys.len() > SPECULATE_MAX_KEYS {
            return None;
        }
        let rows: Vec<BatchMeta> = {
            let entries = self.lock();
            let known = entries.by_partition.get(partition)?;
            keys.iter()
                .map(|k| known.get(k).cloned())
                .collect::<Option<_>>()?
        };
        if rows.len() == 1 {
            return rows.into_iter().next();
        }
        let common: Vec<String> = rows[0]
            .field_names()
            .filter(|f| rows.iter().all(|r| r.fields().contains_key(*f)))
            .map(str::to_string)
            .collect();
        let rows = rows
            .iter()
            .map(|r| r.select_fields(&common))
            .collect::<tq_core::Result<Vec<_>>>()
            .ok()?;
        BatchMeta::concat(&rows).ok()
    }

    /// Remembers each key's row of `meta` (rows aligned with `keys`).
    pub(crate) fn remember(&self, partition: &str, keys: &[String], meta: &BatchMeta) {
        if keys.len() != meta.len() || keys.len() > SPECULATE_MAX_KEYS || self.capacity == 0 {
            return;
        }
        let rows: Vec<BatchMeta> = match (0..keys.len())
            .map(|r| meta.select_samples(&[r]).map(|m| m.with_lease(None)))
            .collect()
        {
            Ok(rows) => rows,
            Err(_) => return,
        };
        let mut entries = self.lock();
        if entries.len + keys.len() > self.capacity {
            *entries = Entries::default();
        }
        let Entries { len, by_partition } = &mut *entries;
        let known = by_partition.entry(partition.to_string()).or_default();
        for (k, row) in keys.iter().zip(rows) {
            if known.insert(k.clone(), row).is_none() {
                *len += 1;
            }
        }
    }

    /// Forgets `keys` (all of `partition` when `None`).
    pub(crate) fn forget(&self, partition: &str, keys: Option<&[String]>) {
        let mut entries = self.lock();
        let Entries { len, by_partition } = &mut *entries;
        match keys {
            None => {
                if let Some(known) = by_partition.remove(partition) {
                    *len -= known.len();
                }
            }
            Some(keys) => {
                if let Some(known) = by_partition.get_mut(partition) {
                    for k in keys {
                        if known.remove(k).is_some() {
                            *len -= 1;
                        }
                    }
                }
            }
        }
    }

    pub(crate) fn record(&self, hit: bool) {
        let counter = if hit { &self.hits } else { &self.misses };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn stats(&self) -> KeyCacheStats {
        KeyCacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
        }
    }
}

/// Bytes of the tensor fields `meta` describes (objects have no declared size and count 0).
pub(crate) fn tensor_bytes(meta: &BatchMeta) -> usize {
    meta.fields()
        .values()
        .filter(|s| s.kind() != FieldKind::Object)
        .map(|s| {
            let item = s.dtype().map_or(0, |d| d.size());
            (0..meta.len())
                .map(|r| s.row_shape(r).map_or(0, |sh| sh.iter().product::<usize>()) * item)
                .sum::<usize>()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use tq_core::{DType, FieldMeta, SampleId};

    fn row(index: u32, fields: &[&str]) -> BatchMeta {
        let schemas: BTreeMap<String, FieldMeta> = fields
            .iter()
            .map(|f| (f.to_string(), FieldMeta::dense(DType::F32, vec![4])))
            .collect();
        BatchMeta::new("p", vec![SampleId::new(index, 1)])
            .with_fields(schemas)
            .expect("meta")
    }

    fn keys(k: &[&str]) -> Vec<String> {
        k.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn guesses_only_when_every_key_is_known_and_keeps_the_fields_all_keys_hold() {
        let cache = KeyCache::new(100);
        cache.remember("p", &keys(&["a"]), &row(0, &["x", "y"]));
        cache.remember("p", &keys(&["b"]), &row(1, &["x"]));
        assert_eq!(cache.guess("p", &keys(&["a"])), Some(row(0, &["x", "y"])));
        let both = cache.guess("p", &keys(&["b", "a"])).expect("both cached");
        assert_eq!(
            both.samples(),
            &[SampleId::new(1, 1), SampleId::new(0, 1)][..]
        );
        assert_eq!(both.field_names().collect::<Vec<_>>(), vec!["x"]);
        assert_eq!(cache.guess("p", &keys(&["a", "c"])), None, "c unknown");
        assert_eq!(cache.guess("q", &keys(&["a"])), None, "other partition");
        cache.forget("p", Some(&keys(&["a"])));
        assert_eq!(cache.guess("p", &keys(&["a"])), None);
        cache.forget("p", None);
        assert_eq!(cache.guess("p", &keys(&["b"])), None);
    }

    #[test]
    fn starts_over_when_full_and_counts_each_key_once() {
        let cache = KeyCache::new(2);
        cache.remember("p", &keys(&["a"]), &row(0, &["x"]));
        cache.remember("p", &keys(&["a"]), &row(0, &["x"]));
        cache.remember("p", &keys(&["b"]), &row(1, &["x"]));
        assert!(
            cache.guess("p", &keys(&["a", "b"])).is_some(),
            "a counted once"
        );
        cache.remember("p", &keys(&["c"]), &row(2, &["x"]));
        assert_eq!(cache.guess("p", &keys(&["a"])), None, "evicted");
        assert!(cache.guess("p", &keys(&["c"])).is_some());
    }

    #[test]
    fn tensor_bytes_counts_rows_times_shape_times_item_size() {
        let two = BatchMeta::concat(&[row(0, &["x", "y"]), row(1, &["x", "y"])]).expect("concat");
        assert_eq!(tensor_bytes(&two), 2 * 2 * 4 * 4);
    }
}
