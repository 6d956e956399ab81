//! Hash maps and sets keyed by sample index.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// Hasher for sample indexes. Indexes are small integers handed out by the controller, not
/// attacker-chosen keys, so the DoS resistance of the default SipHash buys nothing here, while
/// hashing them costs on every cell of every put, get and clear.
///
/// The hash keeps neighbouring indexes in neighbouring buckets: its low 6 bits are the index's
/// own, so a run of 64 consecutive indexes (a batch is usually such a run, or every n-th of
/// one on each of n units) shares a few cache lines and one page of the table, and a lookup
/// of the next row finds its bucket already in the cache. Runs of 64 are then spread over the
/// table by a multiply of the index's upper bits, and the 7 top bits (the tag the table compares
/// first) come from a multiply of the whole index, so tags of neighbours differ.
#[derive(Default, Clone, Copy)]
pub struct IndexHasher(u64);

impl Hasher for IndexHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }
    fn write_u32(&mut self, i: u32) {
        self.write_u64(i as u64);
    }
    fn write_u64(&mut self, i: u64) {
        // One write (every key of tq's index maps) leaves the index itself.
        self.0 = self.0.rotate_left(7) ^ i;
    }
    fn finish(&self) -> u64 {
        const RUN_BITS: u32 = 6;
        const TAG_BITS: u32 = 7;
        let i = self.0;
        let runs = (i >> RUN_BITS).wrapping_mul(0x9e37_79b9_7f4a_7c15) << RUN_BITS;
        let place = runs | (i & ((1 << RUN_BITS) - 1));
        let tag = i.wrapping_mul(0xf135_7aea_2e62_a9c5);
        let tag_mask = !(u64::MAX >> TAG_BITS);
        (place & !tag_mask) | (tag & tag_mask)
    }
}

/// A map keyed by sample index.
pub type IndexMap<V> = HashMap<u32, V, BuildHasherDefault<IndexHasher>>;
/// A set of sample indexes.
pub type IndexSet = HashSet<u32, BuildHasherDefault<IndexHasher>>;

/// Makes all of an emptied map's room free again. Removing an entry from a run of full
/// buckets leaves a tombstone (so that lookups probing past it keep going), and tombstones use
/// up the room for inserts: a table emptied by removals then has to rehash on a later insert.
/// `HashMap::clear` skips a map that is already empty, so one `filler` entry goes in first.
/// Neighbouring indexes fill neighbouring buckets (see [`IndexHasher`]), so a table emptied by
/// removals is mostly tombstones.
pub fn reset_emptied<V>(map: &mut IndexMap<V>, filler: V) {
    debug_assert!(map.is_empty());
    map.insert(0, filler);
    map.clear();
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    fn hash(i: u32) -> u64 {
        BuildHasherDefault::<IndexHasher>::default().hash_one(i)
    }

    const TAG_SHIFT: u32 = 57;

    #[test]
    fn a_run_of_64_indexes_shares_its_buckets_neighbourhood() {
        for run in [0u32, 1, 7, 1000, 65_535] {
            let first = hash(run * 64);
            for i in run * 64..run * 64 + 64 {
                let h = hash(i);
                assert_eq!(
                    h & 63,
                    u64::from(i & 63),
                    "index {i} keeps its place in the run"
                );
                let without_tag = |h: u64| (h << 7) >> 7;
                assert_eq!(without_tag(h) >> 6, without_tag(first) >> 6, "index {i}");
            }
        }
    }

    #[test]
    fn runs_spread_over_the_table_and_neighbours_get_different_tags() {
        // Consecutive runs land on distinct run positions of a table of 1024 runs (a
        // multiply by an odd number is a bijection modulo a power of two).
        let places: std::collections::HashSet<u64> =
            (0..1024u32).map(|r| (hash(r * 64) >> 6) & 1023).collect();
        assert_eq!(places.len(), 1024);
        // The tag the table compares first varies between neighbours.
        let tags: std::collections::HashSet<u64> =
            (0..64u32).map(|i| hash(i) >> TAG_SHIFT).collect();
        assert!(
            tags.len() >= 32,
            "only {} distinct tags among 64 neighbours",
            tags.len()
        );
    }

    #[test]
    fn strided_index_sets_insert_find_and_remove() {
        // Every n-th index (what one of n units holds) in tables that grow and shrink.
        for stride in [1u32, 2, 3, 4, 16, 64, 1024] {
            let mut map: IndexMap<u32> = IndexMap::default();
            let keys: Vec<u32> = (0..20_000u32).map(|k| k * stride).collect();
            for &k in &keys {
                assert!(map.insert(k, k ^ 0x5a5a).is_none());
            }
            assert!(keys.iter().all(|k| map.get(k) == Some(&(k ^ 0x5a5a))));
            assert!(!map.contains_key(&u32::MAX));
            for &k in keys.iter().step_by(2) {
                assert_eq!(map.remove(&k), Some(k ^ 0x5a5a));
            }
            assert_eq!(map.len(), keys.len() / 2);
        }
    }

    #[test]
    fn an_emptied_map_gets_all_its_room_back() {
        let mut map: IndexMap<u64> = IndexMap::with_capacity_and_hasher(1000, Default::default());
        let room = map.capacity();
        for round in 0..3u32 {
            for i in 0..1000 {
                map.insert(round * 1000 + i, 1);
            }
            for i in 0..1000 {
                map.remove(&(round * 1000 + i));
            }
            reset_emptied(&mut map, 0);
            assert!(map.is_empty());
            assert_eq!(map.capacity(), room, "round {round}");
        }
    }
}
