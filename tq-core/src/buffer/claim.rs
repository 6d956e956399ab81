//! Read results that are a reader's own without being pooled buffers, claimable like them.
//!
//! A pooled column is claimed through [`super::BufferPool::claim_filled`]. Other makers of
//! fresh read results (a column mapped copy-on-write from a storage unit's shared memory, in
//! `tq-unit`) register their memory here when they hand it out, and unregister it when it is
//! dropped; [`claim`] answers for both. The contract is the pool's: claim only bytes a read
//! has just returned to you and that nothing else holds; a claimed result may be written
//! through.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use bytes::Bytes;

/// Registered results no one has claimed yet: start address → length.
static UNCLAIMED: Mutex<Option<HashMap<usize, usize>>> = Mutex::new(None);

fn unclaimed() -> MutexGuard<'static, Option<HashMap<usize, usize>>> {
    // Plain inserts and removes: a poisoned map is still a valid one.
    UNCLAIMED.lock().unwrap_or_else(|p| p.into_inner())
}

/// Registers `len` writable bytes at `start` as a fresh read result that its first holder may
/// claim. The maker must [`unregister_claimable`] them before the memory goes away.
pub fn register_claimable(start: *const u8, len: usize) {
    unclaimed()
        .get_or_insert_with(HashMap::new)
        .insert(start as usize, len);
}

/// Forgets bytes registered with [`register_claimable`], claimed or not.
pub fn unregister_claimable(start: *const u8) {
    if let Some(map) = unclaimed().as_mut() {
        map.remove(&(start as usize));
    }
}

/// Whether `bytes` is a whole fresh read result that no one has claimed yet, a pooled buffer
/// of the process-wide pool ([`super::BufferPool::claim_filled`]) or registered memory; it is
/// claimed now, so this answers `true` once per result.
pub fn claim(bytes: &Bytes) -> bool {
    if super::BufferPool::global().claim_filled(bytes) {
        return true;
    }
    let start = bytes.as_ptr() as usize;
    let mut guard = unclaimed();
    let Some(map) = guard.as_mut() else {
        return false;
    };
    match map.get(&start) {
        Some(&len) if len == bytes.len() && len > 0 => {
            map.remove(&start);
            true
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registered_memory_is_claimed_once_and_only_whole() {
        let memory = Bytes::from(vec![3u8; 10_000]);
        assert!(!claim(&memory), "not registered");
        register_claimable(memory.as_ptr(), memory.len());
        assert!(!claim(&memory.slice(1..)), "not the whole result");
        assert!(!claim(&memory.slice(..9_999)), "not the whole result");
        assert!(claim(&memory));
        assert!(!claim(&memory), "a second claim is refused");
        register_claimable(memory.as_ptr(), memory.len());
        unregister_claimable(memory.as_ptr());
        assert!(!claim(&memory), "unregistered");
    }

    #[test]
    fn pooled_buffers_are_claimed_here_too() {
        let b =
            super::super::BufferPool::global().filled(super::super::POOL_MIN_BYTES, |b| b.fill(1));
        assert!(claim(&b));
        assert!(!claim(&b));
    }
}
