//! What tq's libraries report about themselves: request metrics through the `metrics` facade,
//! request ids that travel with an operation, and the plain status records servers turn into
//! gauges.
//!
//! Libraries only *record* (the `metrics` facade is a no-op until an application installs a
//! recorder, such as the Prometheus exporter of `tq serve --metrics-listen`); they never depend
//! on an exporter. Recording never fails and never blocks: every handle is created once, when the
//! component is built, and an update is a few atomic operations.
//!
//! Metric names and labels follow the original TransferQueue system, so dashboards and alerts
//! written for it keep working: `tq_<role>_request_total`, `tq_<role>_request_duration_seconds`,
//! `tq_<role>_request_errors_total` and `tq_<role>_request_samples_total`, labelled `op_type`
//! (role `controller` or `storage`). `docs/operations.md` lists every metric.

use crate::Result;
use metrics::{Counter, Histogram, Label};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::future::Future;
use std::time::Instant;

/// Upper bounds of the request-duration histogram buckets, in seconds (the original's).
pub const DURATION_BUCKETS: [f64; 10] = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0];

/// The four request metrics of one operation type.
#[derive(Clone)]
struct OpHandles {
    total: Counter,
    errors: Counter,
    samples: Counter,
    duration: Histogram,
}

/// Request metrics of one role (`controller`, `storage`), with a handle per operation type
/// registered up front: recording is then a handful of atomic updates, no lookup by name.
///
/// Operation types are given as a list of names; callers index it with their own enum
/// (`op as usize`), so an unknown index is impossible to construct by mistake and, should it
/// happen anyway, is ignored rather than panicking.
#[derive(Clone)]
pub struct RequestMeter {
    ops: Vec<OpHandles>,
}

impl std::fmt::Debug for RequestMeter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestMeter")
            .field("ops", &self.ops.len())
            .finish()
    }
}

impl RequestMeter {
    /// Registers `tq_<role>_request_*{op_type}` for each of `op_types`, with the recorder
    /// installed at this moment (metrics recorded before an exporter is installed go nowhere).
    pub fn new(role: &str, op_types: &[&'static str]) -> RequestMeter {
        let name = |what: &str| format!("tq_{role}_request_{what}");
        let (total, errors, samples, duration) = (
            name("total"),
            name("errors_total"),
            name("samples_total"),
            name("duration_seconds"),
        );
        let ops = op_types
            .iter()
            .map(|&op| {
                let labels = || vec![Label::new("op_type", op)];
                OpHandles {
                    total: metrics::counter!(total.clone(), labels()),
                    errors: metrics::counter!(errors.clone(), labels()),
                    samples: metrics::counter!(samples.clone(), labels()),
                    duration: metrics::histogram!(duration.clone(), labels()),
                }
            })
            .collect();
        RequestMeter { ops }
    }

    /// Runs `work` as one request of operation type `op`: counts it, times it, counts it as an
    /// error if it fails, and adds `samples(&output)` to the samples counter if it succeeds.
    pub async fn measure<T, F>(
        &self,
        op: usize,
        samples: impl FnOnce(&T) -> u64,
        work: F,
    ) -> Result<T>
    where
        F: Future<Output = Result<T>>,
    {
        self.measure_with(op, samples, |_| true, work).await
    }

    /// [`RequestMeter::measure`] where only errors for which `failed` holds count as errors:
    /// some operations end normally with an error value (a fetch of a finished partition
    /// answers `Closed`, the end of a stream), which must not look like a failure on the
    /// error-rate alert.
    pub async fn measure_with<T, F>(
        &self,
        op: usize,
        samples: impl FnOnce(&T) -> u64,
        failed: impl FnOnce(&crate::Error) -> bool,
        work: F,
    ) -> Result<T>
    where
        F: Future<Output = Result<T>>,
    {
        let start = Instant::now();
        let result = work.await;
        if let Some(h) = self.ops.get(op) {
            h.total.increment(1);
            h.duration.record(start.elapsed().as_secs_f64());
            match &result {
                Ok(out) => {
                    let n = samples(out);
                    if n > 0 {
                        h.samples.increment(n);
                    }
                }
                Err(e) => {
                    if failed(e) {
                        h.errors.increment(1);
                    }
                }
            }
        }
        result
    }

    /// Counts a request of type `op` that was refused before it reached its handler (an epoch
    /// mismatch, an undecodable body): one request, one error, no duration.
    pub fn rejected(&self, op: usize) {
        if let Some(h) = self.ops.get(op) {
            h.total.increment(1);
            h.errors.increment(1);
        }
    }
}

/// What a storage unit reports about itself for `tq stats` and the `tq_storage_*` gauges: the
/// same for every kind of unit (in-memory, SSD, remote), so dashboards do not depend on the
/// backend.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct UnitStatus {
    /// The unit's id (the `storage_unit_id` label).
    pub id: String,
    /// Distinct sample indexes with at least one cell (the "active keys" of the original).
    pub rows: u64,
    /// Cells stored.
    pub cells: u64,
    /// Payload bytes of the stored cells.
    pub bytes: u64,
    /// Capacity in samples, if limited.
    pub capacity: Option<u64>,
    /// Payload bytes kept outside memory (the SSD unit: on disk); included in `bytes`.
    pub offloaded_bytes: u64,
    /// Figures particular to one kind of unit (counters end in `_total`, the rest are gauges),
    /// by metric name without the `tq_storage_` prefix (the SSD unit reports
    /// `ssd_fallback_values_total`, a memory unit `memory_free_pending_bytes` and more).
    pub counters: BTreeMap<String, u64>,
    /// Resident memory of the process the unit runs in, where known.
    pub memory_rss_bytes: Option<u64>,
    /// Why the unit did not answer (the other numbers are then zero); `None` when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub down: Option<String>,
}

impl UnitStatus {
    /// The status of unit `id` that could not be asked: `error` says why.
    pub fn unreachable(id: impl Into<String>, error: &crate::Error) -> Self {
        UnitStatus {
            id: id.into(),
            down: Some(error.to_string()),
            ..UnitStatus::default()
        }
    }
}

/// The resident memory of this process in bytes (`VmRSS` of `/proc/self/status`), or `None`
/// where that is not available.
pub fn process_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

tokio::task_local! {
    static TRACE_ID: u32;
}

/// A fresh request id: 32 random-looking bits, printed as 8 hex digits like the original's.
/// Never 0 (0 on the wire means "no id").
pub fn new_trace_id() -> u32 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    // A per-process random start (the epoch generator's entropy) plus a counter scrambled by
    // an odd multiplier: unique within a process, unlikely to collide across processes.
    static BASE: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    let base = *BASE.get_or_init(|| crate::new_epoch() as u32);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let id = base.wrapping_add(n.wrapping_mul(0x9E37_79B9));
    if id == 0 {
        1
    } else {
        id
    }
}

/// The request id of the operation the current task is running, if it runs inside
/// [`with_trace_id`].
pub fn current_trace_id() -> Option<u32> {
    TRACE_ID.try_with(|id| *id).ok()
}

/// The current request id, or a fresh one when the task has none.
pub fn current_or_new_trace_id() -> u32 {
    current_trace_id().unwrap_or_else(new_trace_id)
}

/// Runs `work` with `id` as its request id: requests it sends carry the id, and servers log
/// their handling of them under it. Use it to correlate one operation's log lines across
/// client, controller and storage units (`tq_core::telemetry::with_trace_id(0xabcd0001, client.put(..))`).
pub async fn with_trace_id<F: Future>(id: u32, work: F) -> F::Output {
    TRACE_ID.scope(id, work).await
}

/// Formats a request id as the logs print it.
pub fn format_trace_id(id: u32) -> String {
    format!("{id:08x}")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn trace_ids_are_distinct_and_never_zero() {
        let ids: std::collections::HashSet<u32> = (0..10_000).map(|_| new_trace_id()).collect();
        assert_eq!(ids.len(), 10_000);
        assert!(!ids.contains(&0));
    }

    #[tokio::test]
    async fn the_trace_id_is_seen_inside_its_scope_only() {
        assert_eq!(current_trace_id(), None);
        let inside = with_trace_id(0xdead_beef, async { current_trace_id() }).await;
        assert_eq!(inside, Some(0xdead_beef));
        assert_eq!(format_trace_id(0xbeef), "0000beef");
        assert_eq!(current_trace_id(), None);
    }

    #[test]
    fn rss_is_read_on_linux() {
        let rss = process_rss_bytes().expect("VmRSS");
        assert!(rss > 1 << 20, "rss {rss}");
    }
}
