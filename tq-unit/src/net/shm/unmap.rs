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

use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::OnceLock;

/// Mappings that may wait for the unmapping thread; one more is unmapped by its dropper.
const MAX_WAITING: usize = 4096;

enum Job {
    Unmap {
        addr: usize,
        len: usize,
    },
    /// Answered once every mapping queued before it is gone.
    #[cfg(test)]
    Settle(std::sync::mpsc::Sender<()>),
}

fn worker() -> Option<&'static SyncSender<Job>> {
    static WORKER: OnceLock<Option<SyncSender<Job>>> = OnceLock::new();
    WORKER
        .get_or_init(|| {
            let (tx, rx) = sync_channel(MAX_WAITING);
            let started = std::thread::Builder::new()
                .name("tq-unmap".into())
                .spawn(move || run(rx));
            match started {
                Ok(_) => Some(tx),
                Err(e) => {
                    tracing::warn!(error = %e, "no thread for unmapping segments: readers unmap them themselves");
                    None
                }
            }
        })
        .as_ref()
}

fn run(jobs: Receiver<Job>) {
    for job in jobs {
        match job {
            Job::Unmap { addr, len } => unmap_now(addr, len),
            #[cfg(test)]
            Job::Settle(done) => {
                let _ = done.send(());
            }
        }
    }
}

fn unmap_now(addr: usize, len: usize) {
    // SAFETY: `addr..addr + len` is a mapping its owner handed over when it dropped the last
    // reference to it; nothing reads it any more.
    unsafe { libc::munmap(addr as *mut libc::c_void, len) };
}

/// Unmaps `addr..addr + len` soon, on the unmapping thread (at once when it cannot take it).
/// The caller must own the mapping and never touch it again.
pub(crate) fn unmap_later(addr: *mut libc::c_void, len: usize) {
    let job = Job::Unmap {
        addr: addr as usize,
        len,
    };
    let Some(worker) = worker() else {
        return unmap_now(addr as usize, len);
    };
    if let Err(
        TrySendError::Full(Job::Unmap { addr, len })
        | TrySendError::Disconnected(Job::Unmap { addr, len }),
    ) = worker.try_send(job)
    {
        unmap_now(addr, len);
    }
}

/// Waits until every mapping handed over before this call is unmapped.
#[cfg(test)]
pub(crate) fn settle() {
    let (tx, rx) = std::sync::mpsc::channel();
    if let Some(worker) = worker() {
        if worker.send(Job::Settle(tx)).is_ok() {
            let _ = rx.recv();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether the page at `addr` is mapped in this process (`mincore` fails with `ENOMEM`
    /// on an unmapped range).
    fn mapped(addr: *mut libc::c_void) -> bool {
        let mut vec = [0u8; 1];
        unsafe { libc::mincore(addr, 4096, vec.as_mut_ptr()) == 0 }
    }

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
        assert!(mapped(addr));
        unmap_later(addr, len);
        settle();
        assert!(!mapped(addr));
    }
}
