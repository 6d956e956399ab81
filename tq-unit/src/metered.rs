//! [`MeteredUnit`]: the storage role's request metrics (`tq_storage_request_*{op_type}`) around
//! any [`StorageUnit`], recorded where the unit runs (in a storage-unit server, or in the process
//! of an embedded client), never by a remote caller, so a request is counted once.

use crate::api::{StorageUnit, UnitStats};
use crate::layer::{Layered, UnitCall, UnitLayer};
use crate::ops::UnitOp;
use std::sync::Arc;
use tq_core::telemetry::{RequestMeter, UnitStatus};

/// A [`StorageUnit`] that records `tq_storage_request_total`, `_duration_seconds`,
/// `_errors_total` and `_samples_total` (rows) for every metered operation it forwards (the
/// operation table's `metered`: puts, gets, updates and clears).
pub type MeteredUnit = Layered<RequestMetering>;

impl MeteredUnit {
    /// Meters `unit` with handles of the recorder installed now.
    pub fn new(unit: Arc<dyn StorageUnit>) -> Self {
        Layered::with_layer(
            unit,
            RequestMetering {
                meter: RequestMeter::new("storage", &UnitOp::metered_labels()),
            },
        )
    }

    /// `unit` behind its meter, as a unit again.
    pub fn wrap(unit: Arc<dyn StorageUnit>) -> Arc<dyn StorageUnit> {
        Arc::new(MeteredUnit::new(unit))
    }
}

/// The meter's layer.
pub struct RequestMetering {
    meter: RequestMeter,
}

impl UnitLayer for RequestMetering {
    async fn around<'a, T: Send + 'a>(
        &'a self,
        _unit: &'a str,
        op: UnitOp,
        rows: u64,
        call: UnitCall<'a, T>,
    ) -> tq_core::Result<T> {
        match op.meter_slot() {
            Some(slot) => self.meter.measure(slot, move |_| rows, call).await,
            None => call.await,
        }
    }

    /// The unit's stats, with the resident memory of this process (the one hosting the unit).
    fn finish_stats(&self, mut stats: UnitStats) -> UnitStats {
        stats.memory_rss_bytes = tq_core::telemetry::process_rss_bytes();
        stats
    }
}

impl UnitStats {
    /// The backend-neutral part, as `tq stats` and the `tq_storage_*` gauges show it.
    pub fn to_status(&self) -> UnitStatus {
        UnitStatus {
            id: self.unit_id.clone(),
            rows: self.rows as u64,
            cells: self.cells as u64,
            bytes: self.live_bytes,
            capacity: self.capacity.map(|c| c as u64),
            offloaded_bytes: self.offloaded_bytes,
            counters: self.counters.clone(),
            memory_rss_bytes: self.memory_rss_bytes,
            down: None,
        }
    }
}
