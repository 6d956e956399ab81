//! Segments allocated ahead of the puts that will fill them.
//!
//! A same-host put copies its cells into a fresh memfd; `perf` of a 1024 × 4 KiB put loop under
//! Ray put 44 % of the writer's CPU in that `pwritev`, half of it the kernel allocating the
//! segment's pages (`shmem_alloc_and_add_folio`) and half the copy. A writer tends to put
//! batches of one shape again and again, so once a segment's length repeats, a background
//! thread allocates the next one of that length after each put of it (`fallocate`: zeroed
//! pages, nothing of anyone's), and the next put of that length only copies. Lengths that do
//! not repeat within the last puts (ragged rows) get nothing ahead. At most [`SPARES_PER_LEN`]
//! per length and [`MAX_SPARE_BYTES`] in all are kept; a length not seen again keeps its spare
//! until newer lengths push it out.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Mutex;

use super::background::Background;

/// Most bytes of spare segments a process keeps.
pub const MAX_SPARE_BYTES: u64 = 64 << 20;
/// Spare segments kept per length.
const SPARES_PER_LEN: usize = 2;

/// What a process keeps for its puts, under one lock (`take` runs on every same-host put).
struct Kept {
    /// Spare segments with their lengths, oldest first.
    spares: Vec<(u64, OwnedFd)>,
    /// Lengths of the last [`RECENT_PUTS`] puts, newest last: a length is allocated ahead
    /// only once it repeats.
    recent: VecDeque<u64>,
}

static KEPT: Mutex<Kept> = Mutex::new(Kept {
    spares: Vec::new(),
    recent: VecDeque::new(),
});

fn kept() -> std::sync::MutexGuard<'static, Kept> {
    // Only pushes and removes run under the lock; a poisoned state is still a valid one.
    KEPT.lock().unwrap_or_else(|p| p.into_inner())
}

/// Allocates segments of the lengths asked for (at most 64 waiting: more means allocations are
/// behind already, and a put's length can wait for the next one).
static ALLOCATOR: Background<u64> = Background::new(
    "tq-segments",
    64,
    allocate_spare,
    "puts allocate their own segments",
);

fn allocate_spare(len: u64) {
    if let Some(fd) = allocated(len) {
        keep(len, fd);
    }
}

/// A new unsealed memfd of `len` bytes with its pages allocated, or `None`.
fn allocated(len: u64) -> Option<OwnedFd> {
    let fd = super::segment::create(len).ok()?;
    let done = unsafe { libc::fallocate(fd.as_raw_fd(), 0, 0, len as libc::off_t) };
    (done == 0).then_some(fd)
}

fn keep(len: u64, fd: OwnedFd) {
    let spares = &mut kept().spares;
    if spares.iter().filter(|(l, _)| *l == len).count() >= SPARES_PER_LEN {
        return;
    }
    spares.push((len, fd));
    let mut total: u64 = spares.iter().map(|(l, _)| *l).sum();
    while total > MAX_SPARE_BYTES && !spares.is_empty() {
        total -= spares.remove(0).0;
    }
}

/// How many puts back a length must have been put before to be allocated ahead.
const RECENT_PUTS: usize = 16;

/// A spare segment of exactly `len` bytes, if one is ready. Another of that length is asked
/// for when this one was there or the length was put within the last [`RECENT_PUTS`] puts:
/// a writer of ragged rows, whose segment lengths rarely repeat, allocates nothing ahead.
pub(crate) fn take(len: u64) -> Option<OwnedFd> {
    if len > MAX_SPARE_BYTES / SPARES_PER_LEN as u64 {
        return None;
    }
    let (found, repeated) = {
        let mut kept = kept();
        let found = kept
            .spares
            .iter()
            .position(|(l, _)| *l == len)
            .map(|i| kept.spares.remove(i).1);
        let repeated = kept.recent.contains(&len);
        if kept.recent.len() == RECENT_PUTS {
            kept.recent.pop_front();
        }
        kept.recent.push_back(len);
        (found, repeated)
    };
    if found.is_none() && !repeated {
        return None;
    }
    // Not queued (no thread, or allocations are behind): this put's length can wait.
    let _ = ALLOCATOR.try_run(len);
    found
}

#[cfg(test)]
mod tests {
    use super::super::segment::{write_sealed, Segment};
    use super::*;

    /// Bytes of `fd` that have pages (`st_blocks` counts 512-byte units).
    fn allocated_bytes(fd: &OwnedFd) -> u64 {
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) }, 0);
        st.st_blocks as u64 * 512
    }

    #[test]
    fn a_length_put_again_finds_its_pages_allocated_and_zeroed() {
        // A length no other test uses, so that spares of other tests do not interfere.
        let len = 3 * 4096 + 4096 * 7;
        assert!(take(len).is_none(), "nothing of this length was put before");
        ALLOCATOR.settle();
        assert!(take(len).is_none(), "put once: nothing allocated ahead");
        ALLOCATOR.settle();
        // Put twice: the next take finds a spare. Other tests put through `take` in parallel
        // and may push this length out of the recent ones in between; a few more puts of it
        // bring it back.
        let spare = (0..8)
            .find_map(|_| {
                let got = take(len);
                ALLOCATOR.settle();
                got
            })
            .expect("a length put again and again gets a spare");
        assert_eq!(
            allocated_bytes(&spare),
            len,
            "its pages are allocated ahead"
        );
        drop(spare);
        ALLOCATOR.settle();
        // A put of that length writes into a spare: the gap between its parts reads as zeros,
        // and the bytes are the put's.
        let (a, b) = (vec![7u8; 100], vec![9u8; 4096]);
        let segment =
            Segment::map(write_sealed(&[&a[..], &b[..]], &[0, 8192], len).unwrap()).unwrap();
        let back = segment.slice(0, len).unwrap();
        assert_eq!(&back[..100], &a[..]);
        assert!(back[100..8192].iter().all(|&x| x == 0));
        assert_eq!(&back[8192..8192 + 4096], &b[..]);
        assert!(back[8192 + 4096..].iter().all(|&x| x == 0));
    }

    #[test]
    fn lengths_that_do_not_repeat_get_no_spare() {
        let lengths: Vec<u64> = (0..40).map(|i| 4096 * (1000 + i)).collect();
        for &len in &lengths {
            assert!(take(len).is_none());
        }
        ALLOCATOR.settle();
        let kept = kept();
        assert!(
            !kept.spares.iter().any(|(l, _)| lengths.contains(l)),
            "a writer of ragged rows allocates nothing ahead"
        );
    }

    #[test]
    fn spares_stay_under_their_byte_limit() {
        let big = MAX_SPARE_BYTES / SPARES_PER_LEN as u64 + 4096;
        assert!(take(big).is_none());
        ALLOCATOR.settle();
        assert!(take(big).is_none(), "a length over the limit is never kept");
        let held: u64 = kept().spares.iter().map(|(l, _)| *l).sum();
        assert!(held <= MAX_SPARE_BYTES);
    }
}
