//! Hash maps and sets keyed by sample index.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// Hasher for sample indexes. Indexes are small integers handed out by the controller, not
/// attacker-chosen keys, so the DoS resistance of the default SipHash buys nothing here, while
/// hashing them costs on every cell of every put, get and clear. One multiply mixes the bits
/// (the rotation brings the well-mixed high bits down to where the table picks its bucket).
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
        self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(0xf135_7aea_2e62_a9c5);
    }
    fn finish(&self) -> u64 {
        self.0.rotate_left(26)
    }
}

/// A map keyed by sample index.
pub type IndexMap<V> = HashMap<u32, V, BuildHasherDefault<IndexHasher>>;
/// A set of sample indexes.
pub type IndexSet = HashSet<u32, BuildHasherDefault<IndexHasher>>;
