//! Freeing cleared payloads behind the request: a clear takes the cells out of the unit's maps
//! (from then on nothing can read them) and hands their buffers to a thread that drops them.
//!
//! Why: dropping the last reference to a large buffer returns its pages to the kernel, and for
//! a remote unit, whose cells are slices of the frames it received, that is most of a clear's
//! time (a 1 GiB clear spent 20–80 ms in `munmap`, where hiding the cells takes 2 ms). The
//! caller only needs the cells to be unreachable, not the memory to be back.
//!
//! Only where it pays: a unit frees behind when asked to
//! ([`crate::MemoryUnit::free_cleared_behind`]; units served over the network are), and only
//! clears of at least [`INLINE_BYTES`] or of cells in shared memory (segments a same-host
//! client handed over: unmapping one costs like a large free). Measured on 2 cores
//! (docs/benchmarks.md, "Clears"):
//! handing over a clear whose buffers the caller still holds (an embedded unit storing slices
//! of the caller's batch) or whose buffers the allocator takes back cheaply (below glibc's
//! largest mmap threshold, 32 MiB) made the clear up to 1.8 × slower, the reclaiming thread
//! competing for the cores and for the buffers' reference counts.
//!
//! Bounded: at most [`MAX_PENDING_BYTES`] wait to be freed in a process. A clear that would go
//! over the bound frees its own buffers before it answers, as every clear did before, so a
//! burst of clears slows to the speed the memory can be given back instead of piling up.
//!
//! One thread serves every unit of the process; it starts with the first hand-over. Each unit
//! counts its own bytes (pending, freed behind, freed inline), reported in its stats
//! ([`RECLAIM_PENDING`] and the other counter names) and so in `tq stats`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use tq_core::Value;

/// Payload bytes that may wait to be freed, over every unit of the process.
pub const MAX_PENDING_BYTES: u64 = 4 << 30;
/// Clears freeing fewer bytes than this do it themselves (glibc serves allocations up to
/// 32 MiB from its heap once its mmap threshold has adapted, and takes them back cheaply).
pub const INLINE_BYTES: u64 = 32 << 20;

/// Counter names in [`crate::UnitStats::counters`].
pub const RECLAIM_PENDING: &str = "memory_free_pending_bytes";
pub const RECLAIMED_BEHIND: &str = "memory_freed_behind_bytes_total";
pub const RECLAIMED_INLINE: &str = "memory_freed_inline_bytes_total";

/// One unit's share of the reclaimer's work.
#[derive(Debug, Default)]
pub(crate) struct ReclaimCounters {
    pending: AtomicU64,
    behind: AtomicU64,
    inline: AtomicU64,
}

impl ReclaimCounters {
    /// (pending, freed behind, freed inline) bytes.
    pub fn read(&self) -> (u64, u64, u64) {
        (
            self.pending.load(Ordering::Acquire),
            self.behind.load(Ordering::Relaxed),
            self.inline.load(Ordering::Relaxed),
        )
    }
}

struct Job {
    values: Vec<Value>,
    bytes: u64,
    counters: Arc<ReclaimCounters>,
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    /// Bytes of `jobs` plus the job being freed.
    pending: u64,
}

struct Reclaimer {
    queue: Mutex<Queue>,
    /// Signalled when a job arrives (the thread waits on it) and when one is done (drains wait).
    changed: Condvar,
}

impl Reclaimer {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        // Nothing that runs under this lock can panic; recover the queue if it ever did.
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn run(&self) {
        lowest_cpu_priority();
        let mut q = self.lock();
        loop {
            let Some(job) = q.jobs.pop_front() else {
                q = self.changed.wait(q).unwrap_or_else(|p| p.into_inner());
                continue;
            };
            drop(q);
            let Job {
                values,
                bytes,
                counters,
            } = job;
            drop(values);
            counters.behind.fetch_add(bytes, Ordering::Relaxed);
            counters.pending.fetch_sub(bytes, Ordering::AcqRel);
            q = self.lock();
            q.pending -= bytes;
            self.changed.notify_all();
        }
    }
}

/// Puts the calling thread in Linux's `SCHED_IDLE` class: it runs when nothing else of the
/// machine wants the core, and whatever wakes up takes the core from it at once.
///
/// Why: the reclaimer gives pages back to the kernel (a gigabyte is tens of milliseconds of
/// `munmap`) right after a clear answered, while the caller's next request (the clear's release
/// at the controller, the next put) wants the same cores. At normal priority the freeing thread
/// kept its time slice, and a 1 GiB remote clear measured 5–16 × the embedded one on 2 cores
/// (docs/benchmarks.md, "Clears"). Starving it under a saturated machine is safe: the pending
/// bytes are bounded, and past the bound clears free inline again. Units free behind only when
/// served over the network (the `net` feature, which brings `libc`); elsewhere this does nothing.
fn lowest_cpu_priority() {
    #[cfg(all(target_os = "linux", feature = "net"))]
    {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: `param` is a valid sched_param for the call; pid 0 is the calling thread.
        let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
        if rc != 0 {
            tracing::debug!(
                error = %std::io::Error::last_os_error(),
                "the thread that frees cleared payloads keeps normal priority"
            );
        }
    }
}

/// The process's reclaimer, its thread started on first use; `None` if the thread cannot be
/// started (then every clear frees inline).
fn reclaimer() -> Option<&'static Reclaimer> {
    static RECLAIMER: OnceLock<Option<&'static Reclaimer>> = OnceLock::new();
    *RECLAIMER.get_or_init(|| {
        let r: &'static Reclaimer = Box::leak(Box::new(Reclaimer {
            queue: Mutex::new(Queue::default()),
            changed: Condvar::new(),
        }));
        match std::thread::Builder::new()
            .name("tq-unit-reclaim".into())
            .spawn(move || r.run())
        {
            Ok(_) => Some(r),
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the thread that frees cleared payloads; clears free them inline");
                None
            }
        }
    })
}

/// Frees `values` (cells a clear took out of a unit, `bytes` payload bytes) behind the caller
/// when `behind` is set and they are many, else now; now too when the bound is reached.
pub(crate) fn free_behind(
    values: Vec<Value>,
    bytes: u64,
    behind: bool,
    counters: &Arc<ReclaimCounters>,
) {
    if values.is_empty() {
        return;
    }
    if behind && (bytes >= INLINE_BYTES || in_shared_memory(&values)) {
        if let Some(r) = reclaimer() {
            let mut q = r.lock();
            if q.pending + bytes <= MAX_PENDING_BYTES {
                q.pending += bytes;
                counters.pending.fetch_add(bytes, Ordering::AcqRel);
                q.jobs.push_back(Job {
                    values,
                    bytes,
                    counters: counters.clone(),
                });
                r.changed.notify_all();
                return;
            }
            drop(q);
            tracing::debug!(
                bytes,
                "cleared payloads waiting to be freed reached the bound; this clear frees its own"
            );
        }
    }
    drop(values);
    counters.inline.fetch_add(bytes, Ordering::Relaxed);
}

/// Whether `values` (a clear's cells) lie in shared-memory segments a same-host client handed
/// over ([`crate::net`]'s `shm`). The last cell of a segment unmaps it and, the unit holding its
/// last descriptor, the kernel then takes the segment's pages out of its file: that costs like
/// the free of a large buffer whatever the clear's size (same-host clears of 1024 × 4 KiB took
/// 1.3–2.0 ms freeing inline against 1.0–1.5 ms behind; docs/benchmarks.md, "Clears"). The
/// first and the last cell decide: a clear's cells come from a few puts, and a wrong guess only
/// moves where some buffers are freed.
fn in_shared_memory(values: &[Value]) -> bool {
    #[cfg(all(feature = "net", target_os = "linux"))]
    {
        let segment = |v: &Value| crate::net::in_shared_memory(v.bytes());
        values.first().is_some_and(segment) || values.last().is_some_and(segment)
    }
    #[cfg(not(all(feature = "net", target_os = "linux")))]
    {
        let _ = values;
        false
    }
}

/// Blocks until every payload handed over so far, by any unit, is freed.
pub fn wait_freed() {
    let Some(r) = reclaimer() else { return };
    let mut q = r.lock();
    while q.pending > 0 {
        q = r.changed.wait(q).unwrap_or_else(|p| p.into_inner());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn object(len: usize) -> Value {
        Value::Object(Bytes::from(vec![7u8; len]))
    }

    #[test]
    fn small_clears_free_inline_and_large_ones_behind() {
        let c = Arc::new(ReclaimCounters::default());
        free_behind(vec![object(10)], 10, true, &c);
        assert_eq!(c.read(), (0, 0, 10));
        let big = INLINE_BYTES as usize;
        free_behind(vec![object(big)], big as u64, true, &c);
        assert_eq!(c.read().2, 10, "not inline");
        free_behind(vec![object(big)], big as u64, false, &c);
        assert_eq!(
            c.read().2,
            10 + big as u64,
            "inline when not asked to free behind"
        );
        wait_freed();
        assert_eq!(c.read(), (0, big as u64, 10 + big as u64));
    }

    /// The freeing thread yields the cores to everything else (`lowest_cpu_priority`).
    #[cfg(all(target_os = "linux", feature = "net"))]
    #[test]
    fn the_freeing_thread_runs_at_idle_priority() {
        let c = Arc::new(ReclaimCounters::default());
        free_behind(vec![object(INLINE_BYTES as usize)], INLINE_BYTES, true, &c);
        wait_freed();
        let mut policies = Vec::new();
        for task in std::fs::read_dir("/proc/self/task").unwrap() {
            let task = task.unwrap().path();
            let comm = std::fs::read_to_string(task.join("comm")).unwrap_or_default();
            if comm.trim() == "tq-unit-reclaim" {
                let tid: libc::pid_t = task.file_name().unwrap().to_str().unwrap().parse().unwrap();
                // SAFETY: a plain query of a thread of this process.
                policies.push(unsafe { libc::sched_getscheduler(tid) });
            }
        }
        assert_eq!(
            policies,
            vec![libc::SCHED_IDLE],
            "one freeing thread, at idle priority"
        );
    }

    #[test]
    fn a_buffer_handed_over_is_really_dropped() {
        let c = Arc::new(ReclaimCounters::default());
        let payload = Bytes::from(vec![1u8; INLINE_BYTES as usize]);
        let weak_probe = payload.clone();
        free_behind(vec![Value::Object(payload)], INLINE_BYTES, true, &c);
        wait_freed();
        // Only the probe is left: the reclaimer dropped its reference.
        assert!(weak_probe.is_unique());
    }
}
