//! Mappings are removed off the caller's path.
//!
//! A same-host get maps the units' segments, and dropping what it read unmaps them: `munmap`
//! of a populated range tears down its page tables and flushes the TLBs of every core the
//! process ran on, and when the reader held the last reference it also frees the pages. `perf`
//! of a 1024 × 4 KiB `kv_batch_get` under Ray put 9.5 % of the reader's CPU there, on the
//! thread that was about to hand the batch to its caller. So a dropped mapping goes to one
//! background thread that unmaps it; the address range stays reserved until then, and nothing
//! can reach it any more (the last reference is gone). When that thread cannot be started, or
//! too many mappings wait already, the caller unmaps at once as before.

use super::background::Background;

/// Mappings that may wait for the unmapping thread; one more is unmapped by its dropper.
const MAX_WAITING: usize = 4096;

/// A mapping's address range, owned by the job.
struct Unmap {
    addr: usize,
    len: usize,
}

static UNMAPPER: Background<Unmap> = Background::new(
    "tq-unmap",
    MAX_WAITING,
    unmap_now,
    "readers unmap segments themselves",
);

fn unmap_now(Unmap { addr, len }: Unmap) {
    // SAFETY: `addr..addr + len` is a mapping its owner handed over when it dropped the last
    // reference to it; nothing reads it any more.
    unsafe { libc::munmap(addr as *mut libc::c_void, len) };
}

/// Unmaps `addr..addr + len` soon, on the unmapping thread (at once when it cannot take it).
/// The caller must own the mapping and never touch it again.
pub(crate) fn unmap_later(addr: *mut libc::c_void, len: usize) {
    let job = Unmap {
        addr: addr as usize,
        len,
    };
    if let Err(job) = UNMAPPER.try_run(job) {
        unmap_now(job);
    }
}

#[cfg(test)]
mod tests {
    use super::super::page_is_mapped;
    use super::*;

    #[test]
    fn a_handed_over_mapping_is_gone_once_settled() {
        let len = 1 << 20;
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        assert_ne!(addr, libc::MAP_FAILED);
        assert!(page_is_mapped(addr));
        unmap_later(addr, len);
        UNMAPPER.settle();
        assert!(!page_is_mapped(addr));
    }
}
