//! Where a cell lives: its store and its write version, kept per cell in the controller's
//! backend meta.
//!
//! A first write of a field stores its cells at version 0 (the plain cell key). A write that
//! replaces cells the controller already describes writes them under a fresh random version
//! instead, next to the old ones, and the controller keeps describing the old cells until the
//! write is published. So an overwrite that fails half-way leaves the old cells readable and
//! complete, and a reader never sees some fields new and some old as one successful read. Once
//! published, the replaced cells are retired ([`super::KvStorageManager`]'s
//! `retire_replaced`).
//!
//! The backend meta value of a cell is its store's routing tag, followed for a nonzero version
//! by [`VERSION_MARK`] and the version in 16 hex digits. Store names cannot contain the mark.

use bytes::{BufMut, Bytes, BytesMut};
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use tq_core::{Error, Result};

/// Separates a routing tag from a cell's write version in backend meta.
pub const VERSION_MARK: u8 = 0x1f;

/// A cell's place: the routing tag of its store and its write version (0: the first write).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct CellLoc {
    pub tag: Bytes,
    pub version: u64,
}

impl CellLoc {
    /// Reads a backend meta value (a tag with an optional version).
    pub fn decode(raw: &Bytes) -> Result<CellLoc> {
        let Some(mark) = raw.iter().position(|b| *b == VERSION_MARK) else {
            return Ok(CellLoc {
                tag: raw.clone(),
                version: 0,
            });
        };
        let hex = std::str::from_utf8(&raw[mark + 1..]).ok();
        let version = hex
            .filter(|h| h.len() == 16)
            .and_then(|h| u64::from_str_radix(h, 16).ok())
            .ok_or_else(|| {
                Error::corrupted(format!(
                    "kv backend meta `{}` names no valid cell version",
                    String::from_utf8_lossy(raw).escape_debug()
                ))
            })?;
        Ok(CellLoc {
            tag: raw.slice(..mark),
            version,
        })
    }

    /// The backend meta value of this place (the bare tag at version 0: no extra bytes for
    /// first writes, which are most writes).
    pub fn encode(&self) -> Bytes {
        if self.version == 0 {
            return self.tag.clone();
        }
        let mut out = BytesMut::with_capacity(self.tag.len() + 17);
        out.put_slice(&self.tag);
        out.put_u8(VERSION_MARK);
        out.put_slice(format!("{:016x}", self.version).as_bytes());
        out.freeze()
    }
}

/// A write version no other write uses: random per process, distinct within it. Never 0 (the
/// first write's version).
pub(super) fn fresh_version() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_u32(std::process::id());
    h.finish().max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_round_trip() {
        for version in [0, 1, u64::MAX, fresh_version()] {
            let loc = CellLoc {
                tag: Bytes::from_static(b"redis"),
                version,
            };
            assert_eq!(CellLoc::decode(&loc.encode()).unwrap(), loc);
        }
        // Version 0 is the bare tag, as backend meta written before versions existed.
        assert_eq!(
            CellLoc::decode(&Bytes::from_static(b"hot"))
                .unwrap()
                .version,
            0
        );
    }

    #[test]
    fn damaged_versions_are_refused() {
        for raw in [&b"redis\x1f12"[..], b"redis\x1fzzzzzzzzzzzzzzzz", b"\x1f"] {
            let e = CellLoc::decode(&Bytes::copy_from_slice(raw)).unwrap_err();
            assert_eq!(e.kind(), &tq_core::ErrorKind::Corrupted, "{e}");
        }
    }

    #[test]
    fn fresh_versions_differ() {
        let a: std::collections::HashSet<u64> = (0..10_000).map(|_| fresh_version()).collect();
        assert_eq!(a.len(), 10_000);
        assert!(!a.contains(&0));
    }
}
