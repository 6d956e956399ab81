//! A pool of read buffers, so that reading a batch costs the same in every process.
//!
//! Packing a column of 64 KiB – 4 MiB asks malloc for a buffer of that size. Whether that
//! buffer is warm memory or fresh pages depends on glibc's adaptive thresholds, that is on the
//! process's history: the same get of 1024 × 1 KiB rows took 0.7 ms in one benchmark process
//! and 3–4 ms in another, where every freed column went back to the kernel and the next get
//! faulted its pages in again. A pool keeps freed buffers (up to a byte limit) and hands them
//! out again, so a reader that drops one batch and reads the next reuses warm memory whatever
//! malloc would have done.
//!
//! Buffers are grouped in size classes of a quarter of a power of two (at most 25 % slack); a
//! buffer goes back to the pool when the last [`Bytes`] referring to it is dropped
//! ([`Bytes::from_owner`]). When the pool is full, the buffer just returned stays and older
//! buffers of other classes are freed, so the pool follows the current workload.
//!
//! Pooled buffers start at a page boundary ([`BUFFER_ALIGN`]), not where malloc puts a large
//! allocation (16 bytes past one). Packing copies rows of a few KiB, which glibc copies with
//! `rep movsb`; on the AMD EPYC VMs we measure on, that instruction ran 5–12 times slower when
//! the destination sat 16 bytes past a page boundary and the source at one (the case of rows
//! mapped from shared memory): a 1024 × 4 KiB column took 1.7–2.7 ms to pack into a malloc'd
//! buffer and 0.33 ms into one at another offset, in the same process (criterion's
//! `embedded/read-buffers-aligned` measures both).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use bytes::Bytes;

/// Where pooled buffers start: at a multiple of this (a page), see the module's doc.
pub const BUFFER_ALIGN: usize = 4096;

/// Buffers smaller than this are not pooled: malloc serves them from its bins, warm.
pub const POOL_MIN_BYTES: usize = 64 << 10;

/// The default limit of the process-wide pool, in MiB: the memory it may keep while no batch
/// uses it. `TQ_BUFFER_POOL_MIB` overrides it (0 turns pooling off).
pub const DEFAULT_POOL_MIB: usize = 256;

/// A pool of byte buffers for payloads read into fresh memory. Cloning shares the pool.
#[derive(Clone)]
pub struct BufferPool {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Most bytes of free buffers kept.
    limit: usize,
    /// Bytes of free buffers kept now.
    held: usize,
    /// Free buffers by size class.
    free: HashMap<usize, Vec<Slab>>,
    /// Frozen buffers no one has claimed yet ([`BufferPool::claim_filled`]), and memory other
    /// makers registered ([`BufferPool::register_unclaimed`]): start address → length. An entry
    /// goes when it is claimed, its buffer comes back, or its maker forgets it.
    unclaimed: HashMap<usize, usize>,
}

impl std::fmt::Debug for BufferPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.shared.lock();
        f.debug_struct("BufferPool")
            .field("limit", &state.limit)
            .field("held", &state.held)
            .finish()
    }
}

impl BufferPool {
    /// A pool that keeps at most `limit` bytes of free buffers (0: no pooling).
    pub fn new(limit: usize) -> Self {
        BufferPool {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    limit,
                    ..State::default()
                }),
            }),
        }
    }

    /// The process-wide pool that tq's read paths use ([`DEFAULT_POOL_MIB`], or
    /// `TQ_BUFFER_POOL_MIB` when set to a number).
    pub fn global() -> &'static BufferPool {
        static GLOBAL: OnceLock<BufferPool> = OnceLock::new();
        GLOBAL.get_or_init(|| {
            let mib = match std::env::var("TQ_BUFFER_POOL_MIB") {
                Ok(v) => v.trim().parse::<usize>().unwrap_or_else(|_| {
                    tracing::warn!(
                        value = %v,
                        default = DEFAULT_POOL_MIB,
                        "TQ_BUFFER_POOL_MIB is not a whole number of MiB; using the default"
                    );
                    DEFAULT_POOL_MIB
                }),
                Err(_) => DEFAULT_POOL_MIB,
            };
            BufferPool::new(mib.saturating_mul(1 << 20))
        })
    }

    /// Changes the limit; lowering it frees kept buffers beyond the new limit at once.
    pub fn set_limit(&self, limit: usize) {
        let evicted = {
            let mut state = self.shared.lock();
            state.limit = limit;
            state.evict_until_fits(0, None)
        };
        drop(evicted);
    }

    /// Bytes of free buffers the pool keeps now.
    pub fn held_bytes(&self) -> usize {
        self.shared.lock().held
    }

    /// A buffer of `len` bytes to fill, then [`PoolBuffer::freeze`] into `Bytes`. A recycled
    /// buffer holds an earlier batch's bytes: the caller must write every byte before it
    /// freezes. Pooled when `len` is at least [`POOL_MIN_BYTES`] and its class fits the
    /// limit; otherwise a fresh buffer as [`super::zeroed`] makes it. Dropped unfrozen, it goes
    /// back to the pool.
    pub fn buffer(&self, len: usize) -> PoolBuffer {
        let memory = match self.take(len) {
            Some((class, recycled)) => Memory::Pooled(
                recycled.unwrap_or_else(|| Slab::new(class)),
                Arc::clone(&self.shared),
            ),
            None => Memory::Plain(super::zeroed(len)),
        };
        PoolBuffer {
            memory: Some(memory),
            len,
        }
    }

    /// A buffer of `len` bytes filled by `fill`, which must write every byte of the slice it is
    /// given (see [`BufferPool::buffer`]).
    pub fn filled(&self, len: usize, fill: impl FnOnce(&mut [u8])) -> Bytes {
        let mut buf = self.buffer(len);
        fill(&mut buf);
        buf.freeze()
    }

    /// `parts` copied one after another into one buffer of their total length.
    pub fn concatenated<'a>(&self, parts: impl Iterator<Item = &'a [u8]> + Clone) -> Bytes {
        let total: usize = parts.clone().map(<[u8]>::len).sum();
        self.filled(total, |buf| {
            let mut at = 0;
            for p in parts {
                buf[at..at + p.len()].copy_from_slice(p);
                at += p.len();
            }
        })
    }

    /// Whether `bytes` is a whole buffer of this pool, filled and frozen, that no one has
    /// claimed yet; it is claimed now, so this answers `true` once per buffer.
    ///
    /// Why: a pooled buffer is shared with the pool (it returns there when dropped), so its
    /// `Bytes` never reports itself unique and cannot be turned back into a mutable buffer. A
    /// reader that hands a batch to code that writes into it (torch tensors are always
    /// writable) would copy it. The pool remembers which of its frozen buffers are still
    /// unclaimed instead; a reader that just received `bytes` as a read's result, and holds
    /// its only reference, may claim it and then write through it.
    ///
    /// The caller's part of the contract: call it only on bytes a read has just returned to
    /// it (a read's fresh column), never on bytes that anything else may hold, such as a
    /// store's cells. tq's read paths freeze pooled buffers only for what they return: a
    /// column they packed, or an answer read from a socket (whose header comes first, so no
    /// frame of it is a whole buffer).
    pub fn claim_filled(&self, bytes: &Bytes) -> bool {
        if bytes.len() < POOL_MIN_BYTES {
            return false;
        }
        let mut state = self.shared.lock();
        let start = bytes.as_ptr() as usize;
        match state.unclaimed.get(&start) {
            Some(&len) if len == bytes.len() => {
                state.unclaimed.remove(&start);
                true
            }
            _ => false,
        }
    }

    /// Registers `len` writable bytes at `start` that are not this pool's but are a fresh read
    /// result like its filled buffers (a column mapped copy-on-write from shared memory, in
    /// `tq-unit`), so that [`BufferPool::claim_filled`] claims them the same way. The maker
    /// calls [`BufferPool::forget_unclaimed`] before the memory goes away.
    pub fn register_unclaimed(&self, start: *const u8, len: usize) {
        self.shared.lock().unclaimed.insert(start as usize, len);
    }

    /// Forgets memory registered with [`BufferPool::register_unclaimed`], claimed or not.
    pub fn forget_unclaimed(&self, start: *const u8) {
        self.shared.lock().unclaimed.remove(&(start as usize));
    }

    /// For a pooled `len`: its size class and a free buffer of that class if the pool has one.
    /// `None` when buffers of `len` bytes are not pooled (too small, or a class over the limit).
    fn take(&self, len: usize) -> Option<(usize, Option<Slab>)> {
        if len < POOL_MIN_BYTES {
            return None;
        }
        let class = size_class(len);
        let mut state = self.shared.lock();
        if class > state.limit {
            return None;
        }
        let buf = state.free.get_mut(&class).and_then(Vec::pop);
        if buf.is_some() {
            state.held -= class;
        }
        Some((class, buf))
    }
}

/// `len` rounded up to a multiple of a quarter of its highest power of two.
fn size_class(len: usize) -> usize {
    let top = 1usize << (usize::BITS - 1 - len.leading_zeros());
    let step = (top / 4).max(1);
    len.div_ceil(step) * step
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // The state stays consistent at every point a panic could leave it (plain field
        // updates), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl State {
    /// Frees buffers (returned, to drop outside the lock) until `incoming` more bytes fit the
    /// limit, never from `keep`'s class. Empty when nothing needs to go.
    fn evict_until_fits(&mut self, incoming: usize, keep: Option<usize>) -> Vec<Slab> {
        let mut evicted = Vec::new();
        while self.held + incoming > self.limit {
            let Some(class) = self
                .free
                .iter()
                .find(|(c, bufs)| Some(**c) != keep && !bufs.is_empty())
                .map(|(c, _)| *c)
            else {
                break;
            };
            if let Some(buf) = self.free.get_mut(&class).and_then(Vec::pop) {
                self.held -= class;
                evicted.push(buf);
            }
            self.free.retain(|_, bufs| !bufs.is_empty());
        }
        evicted
    }
}

/// A pooled buffer's memory: `class` bytes starting at a multiple of [`BUFFER_ALIGN`] inside
/// `raw` (allocated that much larger).
struct Slab {
    raw: Vec<u8>,
    start: usize,
    class: usize,
}

impl Slab {
    fn new(class: usize) -> Slab {
        let raw = super::zeroed(class + BUFFER_ALIGN - 1);
        let start = raw.as_ptr().align_offset(BUFFER_ALIGN);
        Slab { raw, start, class }
    }

    fn region(&self, len: usize) -> &[u8] {
        &self.raw[self.start..self.start + len]
    }

    fn region_mut(&mut self, len: usize) -> &mut [u8] {
        &mut self.raw[self.start..self.start + len]
    }

    fn addr(&self) -> usize {
        self.raw.as_ptr() as usize + self.start
    }
}

/// What a [`PoolBuffer`] is made of.
enum Memory {
    /// A buffer of the pool, which it goes back to.
    Pooled(Slab, Arc<Shared>),
    /// A buffer of exactly its length, freed when dropped.
    Plain(Vec<u8>),
}

/// A buffer being filled ([`BufferPool::buffer`]); derefs to its `len` bytes.
pub struct PoolBuffer {
    /// `None` only once frozen.
    memory: Option<Memory>,
    len: usize,
}

impl std::ops::Deref for PoolBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.memory {
            Some(Memory::Pooled(slab, _)) => slab.region(self.len),
            Some(Memory::Plain(buf)) => &buf[..self.len],
            None => &[],
        }
    }
}

impl std::ops::DerefMut for PoolBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.memory {
            Some(Memory::Pooled(slab, _)) => slab.region_mut(self.len),
            Some(Memory::Plain(buf)) => &mut buf[..self.len],
            None => &mut [],
        }
    }
}

impl PoolBuffer {
    /// The filled buffer as `Bytes`; a pooled one goes back to its pool when the last `Bytes`
    /// referring to it is dropped.
    pub fn freeze(mut self) -> Bytes {
        match self.memory.take() {
            Some(Memory::Pooled(slab, pool)) => {
                pool.lock().unclaimed.insert(slab.addr(), self.len);
                Bytes::from_owner(Pooled {
                    slab,
                    len: self.len,
                    pool,
                })
            }
            // Not pooled: allocated at exactly `len`.
            Some(Memory::Plain(buf)) => Bytes::from(buf),
            None => Bytes::new(),
        }
    }
}

impl Drop for PoolBuffer {
    fn drop(&mut self) {
        if let Some(Memory::Pooled(slab, pool)) = self.memory.take() {
            pool.give_back(slab);
        }
    }
}

/// The owner behind a pooled [`Bytes`]: gives its buffer back when dropped.
struct Pooled {
    slab: Slab,
    len: usize,
    pool: Arc<Shared>,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        self.slab.region(self.len)
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        let slab = Slab {
            raw: std::mem::take(&mut self.slab.raw),
            ..self.slab
        };
        self.pool.give_back(slab);
    }
}

impl Shared {
    /// Keeps a freed buffer of a pooled class, evicting older buffers of other classes to make
    /// room; frees it if it still does not fit.
    fn give_back(&self, slab: Slab) {
        let class = slab.class;
        let mut state = self.lock();
        // Unclaimed or not, a buffer coming back is no one's any more.
        state.unclaimed.remove(&slab.addr());
        let evicted = state.evict_until_fits(class, Some(class));
        let freed = if state.held + class <= state.limit {
            state.held += class;
            state.free.entry(class).or_default().push(slab);
            None
        } else {
            Some(slab)
        };
        drop(state);
        // Freeing large buffers (munmap) happens outside the lock.
        drop(evicted);
        drop(freed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_round_up_by_at_most_a_quarter() {
        for len in [
            POOL_MIN_BYTES,
            POOL_MIN_BYTES + 1,
            1 << 20,
            (1 << 20) + 7,
            3 << 20,
            1000003,
        ] {
            let class = size_class(len);
            assert!(class >= len, "{len} -> {class}");
            assert!(class - len <= len / 4, "{len} -> {class}");
        }
        assert_eq!(size_class(1 << 20), 1 << 20);
        assert_eq!(size_class((1 << 20) + 1), (1 << 20) + (1 << 18));
    }

    #[test]
    fn a_dropped_buffer_is_reused_with_new_contents() {
        let pool = BufferPool::new(16 << 20);
        let a = pool.concatenated([&[1u8; 100_000][..], &[2u8; 50_000][..]].into_iter());
        assert_eq!(a.len(), 150_000);
        assert!(a[..100_000].iter().all(|&b| b == 1) && a[100_000..].iter().all(|&b| b == 2));
        let first = a.as_ptr();
        // A slice keeps the buffer in use.
        let tail = a.slice(100_000..);
        drop(a);
        assert_eq!(pool.held_bytes(), 0);
        drop(tail);
        assert_eq!(pool.held_bytes(), size_class(150_000));
        let b = pool.filled(140_000, |buf| buf.fill(7));
        assert_eq!(
            b.as_ptr(),
            first,
            "the same class reuses the returned buffer"
        );
        assert_eq!(b.len(), 140_000);
        assert!(b.iter().all(|&x| x == 7));
        assert_eq!(pool.held_bytes(), 0);
    }

    #[test]
    fn pooled_buffers_start_at_a_page_boundary() {
        let pool = BufferPool::new(16 << 20);
        for len in [POOL_MIN_BYTES, 100_003, 4 << 20] {
            let b = pool.filled(len, |b| b.fill(1));
            assert_eq!(b.as_ptr() as usize % BUFFER_ALIGN, 0, "{len} bytes");
            assert_eq!(b.len(), len);
            drop(b);
            // and again once recycled
            let again = pool.filled(len, |b| b.fill(2));
            assert_eq!(
                again.as_ptr() as usize % BUFFER_ALIGN,
                0,
                "{len} bytes, recycled"
            );
            assert!(again.iter().all(|&x| x == 2));
        }
    }

    #[test]
    fn small_or_oversized_buffers_and_a_zero_limit_bypass_the_pool() {
        let pool = BufferPool::new(1 << 20);
        drop(pool.filled(1000, |b| b.fill(1)));
        drop(pool.filled(2 << 20, |b| b.fill(1)));
        assert_eq!(pool.held_bytes(), 0);
        let off = BufferPool::new(0);
        let b = off.filled(1 << 20, |b| b.fill(3));
        assert!(b.iter().all(|&x| x == 3));
        drop(b);
        assert_eq!(off.held_bytes(), 0);
    }

    #[test]
    fn the_pool_never_keeps_more_than_its_limit_and_keeps_the_latest() {
        let pool = BufferPool::new(1 << 20);
        let olds: Vec<Bytes> = (0..4)
            .map(|_| pool.filled(256 << 10, |b| b.fill(0)))
            .collect();
        drop(olds);
        assert_eq!(pool.held_bytes(), 1 << 20);
        // A buffer of another class returned to a full pool evicts older ones.
        drop(pool.filled(512 << 10, |b| b.fill(0)));
        assert_eq!(pool.held_bytes(), 1 << 20);
        let state = pool.shared.lock();
        assert_eq!(state.free.get(&(512 << 10)).map(Vec::len), Some(1));
        assert_eq!(state.free.get(&(256 << 10)).map(Vec::len), Some(2));
        drop(state);
        pool.set_limit(300 << 10);
        assert!(pool.held_bytes() <= 300 << 10);
    }

    #[test]
    fn a_buffer_dropped_unfrozen_goes_back_to_the_pool() {
        let pool = BufferPool::new(4 << 20);
        let mut b = pool.buffer(100_000);
        b.fill(5);
        assert_eq!(b.len(), 100_000);
        drop(b);
        assert_eq!(pool.held_bytes(), size_class(100_000));
        let small = pool.buffer(10);
        assert_eq!(small.freeze().len(), 10);
    }

    #[test]
    fn a_filled_buffer_is_claimed_once_and_only_whole() {
        let pool = BufferPool::new(16 << 20);
        let a = pool.filled(200_000, |b| b.fill(4));
        // A slice is not the whole buffer, and small or unpooled bytes are no pool's.
        assert!(!pool.claim_filled(&a.slice(1..)));
        assert!(!pool.claim_filled(&a.slice(..a.len() - 1)));
        assert!(!pool.claim_filled(&Bytes::from(vec![0u8; 200_000])));
        assert!(
            !BufferPool::new(16 << 20).claim_filled(&a),
            "another pool's"
        );
        assert!(pool.claim_filled(&a));
        assert!(!pool.claim_filled(&a), "a second claim is refused");
        let first = a.as_ptr();
        drop(a);
        // The same memory filled again is a new buffer, claimable again; one dropped
        // unclaimed leaves nothing behind.
        let b = pool.filled(200_000, |b| b.fill(5));
        assert_eq!(b.as_ptr(), first);
        drop(b);
        assert!(pool.shared.lock().unclaimed.is_empty());
        let c = pool.filled(200_000, |b| b.fill(6));
        assert!(pool.claim_filled(&c));
    }

    #[test]
    fn registered_memory_is_claimed_once_and_only_whole() {
        let pool = BufferPool::new(16 << 20);
        let memory = Bytes::from(vec![3u8; POOL_MIN_BYTES + 10]);
        assert!(!pool.claim_filled(&memory), "not registered");
        pool.register_unclaimed(memory.as_ptr(), memory.len());
        assert!(
            !pool.claim_filled(&memory.slice(1..)),
            "not the whole result"
        );
        assert!(
            !pool.claim_filled(&memory.slice(..memory.len() - 1)),
            "not the whole result"
        );
        assert!(pool.claim_filled(&memory));
        assert!(!pool.claim_filled(&memory), "a second claim is refused");
        pool.register_unclaimed(memory.as_ptr(), memory.len());
        pool.forget_unclaimed(memory.as_ptr());
        assert!(!pool.claim_filled(&memory), "forgotten");
    }

    #[test]
    fn buffers_outlive_their_pool_handle() {
        let pool = BufferPool::new(4 << 20);
        let b = pool.filled(100_000, |b| b.fill(9));
        drop(pool);
        assert!(b.iter().all(|&x| x == 9));
    }
}
