//! Same-host figures: what a client and the storage-unit processes on its machine hold while a
//! batch moves between them (the throughput itself is [`crate::kv::run`] with a client whose
//! `net.shared_memory` is on, next to one whose is off, against the same units).

use crate::measure::{system_shmem, ProcessMemory};
use crate::workloads;
use tq_client::Client;
use tq_core::{Batch, Error, Result};

/// What the client and the units hold together at one point: their private memory, the
/// system's shared memory (where segments live), and their summed RSS figures.
#[derive(Debug, Clone, Copy)]
pub struct Snapshot {
    pub processes: ProcessMemory,
    pub shmem: u64,
}

impl Snapshot {
    /// Private memory of the processes plus the system's shared memory.
    pub fn held(&self) -> u64 {
        self.processes.private + self.shmem
    }
}

/// Memory around one put, one get held, and a clear.
#[derive(Debug, Clone, Copy)]
pub struct MemorySteps {
    pub before: Snapshot,
    /// After the put; its peak RSS is the put's.
    pub after_put: Snapshot,
    /// While the client holds the batch it got; its peak RSS is the get's.
    pub holding_get: Snapshot,
    pub after_clear: Snapshot,
}

fn snapshot(pids: &[u32]) -> Result<Snapshot> {
    let unreadable = || {
        Error::unavailable(format!(
            "cannot read /proc memory figures of processes {pids:?}"
        ))
    };
    Ok(Snapshot {
        processes: ProcessMemory::total(pids).ok_or_else(unreadable)?,
        shmem: system_shmem().ok_or_else(unreadable)?,
    })
}

fn reset_peaks(pids: &[u32]) -> Result<()> {
    for &pid in pids {
        if !ProcessMemory::reset_peak(pid) {
            return Err(Error::unavailable(format!(
                "cannot reset the peak RSS of process {pid} (/proc/{pid}/clear_refs)"
            )));
        }
    }
    Ok(())
}

/// One untimed put → get (held) → clear of `batch` through `tq`, reading the memory of `pids`
/// (the client's own process and the units') between the steps.
pub fn memory_steps(
    runtime: &tokio::runtime::Runtime,
    tq: &Client,
    batch: &Batch,
    pids: &[u32],
) -> Result<MemorySteps> {
    let keys = workloads::keys(batch.len());
    let partition = tq.partition("bench-memory");
    runtime.block_on(async {
        reset_peaks(pids)?;
        let before = snapshot(pids)?;
        partition.kv_batch_put(&keys, batch, None).await?;
        let after_put = snapshot(pids)?;
        reset_peaks(pids)?;
        let back = partition.kv_batch_get(&keys, None).await?;
        let holding_get = snapshot(pids)?;
        if &back != batch {
            return Err(Error::internal(
                "same-host memory run: data read back differs from data written",
            ));
        }
        drop(back);
        partition.kv_clear(&keys).await?;
        let after_clear = snapshot(pids)?;
        Ok(MemorySteps {
            before,
            after_put,
            holding_get,
            after_clear,
        })
    })
}

fn mib(b: u64) -> f64 {
    b as f64 / 1048576.0
}

fn growth(to: u64, from: u64) -> String {
    format!("{:+.0}", (to as f64 - from as f64) / 1048576.0)
}

/// Markdown header of [`MemorySteps::row`].
pub const TABLE_HEADER: &str = "| workload | client | payload MiB | held after put | of it shared | peak RSS during put | held while holding the get | peak RSS during get | segments mapped MiB | held after clear |\n|---|---|---|---|---|---|---|---|---|---|";

impl MemorySteps {
    /// A markdown row: MiB of growth over `before` (held = private memory of the processes +
    /// the system's shared memory; peak RSS over the RSS the step started from).
    pub fn row(&self, workload: &str, client: &str, payload: usize) -> String {
        let b = &self.before;
        format!(
            "| {workload} | {client} | {:.0} | {} | {} | {} | {} | {} | {:.0} | {} |",
            mib(payload as u64),
            growth(self.after_put.held(), b.held()),
            growth(self.after_put.shmem, b.shmem),
            growth(self.after_put.processes.peak_rss, b.processes.rss),
            growth(self.holding_get.held(), b.held()),
            growth(
                self.holding_get.processes.peak_rss,
                self.after_put.processes.rss
            ),
            mib(self.holding_get.processes.segments),
            growth(self.after_clear.held(), b.held()),
        )
    }
}
