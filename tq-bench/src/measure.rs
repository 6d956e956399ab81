//! Repetitions with a warm-up, reported as median, min and max.

use std::time::{Duration, Instant};

/// Timing of repeated runs.
#[derive(Debug, Clone, Copy)]
pub struct Stats {
    pub median: Duration,
    pub min: Duration,
    pub max: Duration,
}

impl Stats {
    pub fn from_samples(mut v: Vec<Duration>) -> Stats {
        assert!(!v.is_empty(), "at least one repetition");
        v.sort_unstable();
        Stats {
            median: v[v.len() / 2],
            min: v[0],
            max: v[v.len() - 1],
        }
    }

    /// Payload Gbit/s (decimal) at the median.
    pub fn gbit_per_s(&self, bytes: usize) -> f64 {
        bytes as f64 * 8.0 / 1e9 / self.median.as_secs_f64()
    }

    /// Items per second at the median.
    pub fn per_s(&self, items: usize) -> f64 {
        items as f64 / self.median.as_secs_f64()
    }
}

/// Runs `f` `warmup` times untimed, then `reps` times timed.
pub fn measure(warmup: usize, reps: usize, mut f: impl FnMut()) -> Stats {
    for _ in 0..warmup {
        f();
    }
    let v = (0..reps.max(1))
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect();
    Stats::from_samples(v)
}

/// Runs `round` `warmup` times, then `reps` times, keeping the times the timed rounds report
/// (a round that times only part of itself: an untimed clear after it, say); stops at the
/// first error.
pub fn measure_rounds(
    warmup: usize,
    reps: usize,
    mut round: impl FnMut() -> tq_core::Result<Duration>,
) -> tq_core::Result<Stats> {
    for _ in 0..warmup {
        round()?;
    }
    let v = (0..reps.max(1))
        .map(|_| round())
        .collect::<tq_core::Result<Vec<Duration>>>()?;
    Ok(Stats::from_samples(v))
}

/// Current and peak resident set size of this process, from `/proc/self/status`.
pub fn rss_bytes() -> (Option<u64>, Option<u64>) {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return (None, None);
    };
    let read = |key: &str| {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .map(|kib| kib * 1024)
    };
    (read("VmRSS:"), read("VmHWM:"))
}

/// The memcpy baseline: copy every payload buffer of `batch` into new buffers, holding all
/// copies until the whole batch is copied (as a reader holds a batch it got), then free them.
/// Returns the bytes copied.
pub fn copy_batch(batch: &tq_core::Batch) -> usize {
    // Each copy goes into the same kind of buffer tq packs a read into (`tq_core::buffer`:
    // recycled by its pool from 64 KiB, huge pages when large), so the baseline pays no page
    // faults that tq avoids: it is the floor of moving the bytes once in memory.
    let copy = |b: &[u8]| tq_core::buffer::concatenated(std::iter::once(b));
    let mut copies: Vec<tq_core::Bytes> = Vec::new();
    for col in batch.columns().values() {
        match col {
            tq_core::Column::Dense(t) => copies.push(copy(t.data())),
            tq_core::Column::Ragged(v) => copies.extend(v.iter().map(|t| copy(t.data()))),
            tq_core::Column::Objects(v) => copies.extend(v.iter().map(|b| copy(b))),
        }
    }
    std::hint::black_box(&copies);
    copies.iter().map(|b| b.len()).sum()
}

/// What a process holds, from `/proc/<pid>/status` and `/proc/<pid>/maps`: its private
/// (anonymous) resident memory, RSS and peak RSS, and the bytes of shared-memory cell segments
/// (`memfd:tq-cells`) it maps. Shared-memory pages count in no process's private memory, and in
/// a process's RSS only once it touches them, so what processes hold together is their private
/// memory plus the growth of the system's shared memory ([`system_shmem`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcessMemory {
    pub private: u64,
    pub rss: u64,
    pub peak_rss: u64,
    pub segments: u64,
}

fn kib_field(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<u64>().ok())
        .map(|k| k * 1024)
}

/// The system's shared memory in bytes (`Shmem` of `/proc/meminfo`: tmpfs, memfd and shared
/// anonymous pages).
pub fn system_shmem() -> Option<u64> {
    kib_field(&std::fs::read_to_string("/proc/meminfo").ok()?, "Shmem:")
}

impl ProcessMemory {
    /// Reads the figures of process `pid`; `None` where /proc cannot say (not Linux, the
    /// process is gone).
    pub fn of(pid: u32) -> Option<ProcessMemory> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
        let segments = maps
            .lines()
            .filter(|l| l.contains("memfd:tq-cells"))
            .filter_map(|l| {
                let (start, end) = l.split_whitespace().next()?.split_once('-')?;
                let start = u64::from_str_radix(start, 16).ok()?;
                Some(u64::from_str_radix(end, 16).ok()? - start)
            })
            .sum();
        Some(ProcessMemory {
            private: kib_field(&status, "RssAnon:")?,
            rss: kib_field(&status, "VmRSS:")?,
            peak_rss: kib_field(&status, "VmHWM:")?,
            segments,
        })
    }

    /// Restarts the peak RSS count of process `pid` from its current RSS (`clear_refs` 5), so a
    /// later [`ProcessMemory::of`] shows the peak of what ran in between. False when the kernel
    /// refused.
    pub fn reset_peak(pid: u32) -> bool {
        std::fs::write(format!("/proc/{pid}/clear_refs"), "5").is_ok()
    }

    /// The sum over `pids`; `None` if any cannot be read.
    pub fn total(pids: &[u32]) -> Option<ProcessMemory> {
        pids.iter().try_fold(ProcessMemory::default(), |sum, &pid| {
            let m = ProcessMemory::of(pid)?;
            Some(ProcessMemory {
                private: sum.private + m.private,
                rss: sum.rss + m.rss,
                peak_rss: sum.peak_rss + m.peak_rss,
                segments: sum.segments + m.segments,
            })
        })
    }
}
