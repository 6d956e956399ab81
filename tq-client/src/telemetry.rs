//! Seeing inside a deployment from a client: [`DeploymentStatus`] (what `tq stats` shows) and
//! (feature `metrics`) the Prometheus exporter an application or `tq serve` installs. The text
//! format itself (the state gauges rendered from a status, a scrape parsed) is not the
//! client's: it is the `tq` crate's `telemetry` module.
//!
//! Request counters and histograms are recorded by the libraries through the `metrics` facade
//! and rendered by the exporter. State gauges (partitions, progress, units) are *not* kept in
//! the recorder: they are computed from a status snapshot at the moment of each scrape, so the
//! label sets of a dropped partition or task disappear with it (the exporter has no way to
//! forget a label set once recorded) and a scrape never shows state older than itself.

use serde::{Deserialize, Serialize};
use tq_controller::ControllerStatus;
use tq_core::telemetry::UnitStatus;
use tq_core::Result;

/// The controller's status and every storage unit's, for `tq stats` and the state gauges.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DeploymentStatus {
    /// The storage backend's name (`simple`, `redis`, ...).
    pub storage_backend: String,
    pub controller: ControllerStatus,
    /// Storage units in routing order (none for a KV backend: its store has its own
    /// monitoring).
    pub units: Vec<UnitStatus>,
}

impl crate::Client {
    /// What the deployment holds: the controller's partitions, progress, leases and index
    /// allocation, and every storage unit's cells and bytes (what `tq stats` shows). Units
    /// that cannot be reached make this an error naming them.
    pub async fn status(&self) -> Result<DeploymentStatus> {
        let controller = self.control().status().await?;
        let units = self.storage().status().await?;
        Ok(DeploymentStatus {
            storage_backend: self.storage().name().to_string(),
            controller,
            units,
        })
    }

    /// The controller's part of [`crate::Client::status`] alone: partitions, progress, leases,
    /// index allocation. It asks no storage unit, so it answers while a unit is down (for
    /// backpressure and health loops that must not wait on storage).
    pub async fn controller_status(&self) -> Result<ControllerStatus> {
        self.control().status().await
    }
}

/// The Prometheus exporter of this process (feature `metrics`): a recorder installed as the
/// `metrics` facade's global recorder, with the original system's histogram buckets. Install it
/// before building clients or servers: components take their metric handles when they are
/// built, and handles taken earlier record nowhere.
#[cfg(feature = "metrics")]
#[derive(Clone)]
pub struct MetricsExporter {
    handle: metrics_exporter_prometheus::PrometheusHandle,
}

/// The exporter this process installed (at most one: the facade has one global recorder).
#[cfg(feature = "metrics")]
static INSTALLED: std::sync::OnceLock<MetricsExporter> = std::sync::OnceLock::new();

#[cfg(feature = "metrics")]
impl MetricsExporter {
    /// Installs the exporter, or returns the one this process installed before. Fails if
    /// another recorder was installed by someone else.
    pub fn install() -> Result<MetricsExporter> {
        use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
        static INSTALLING: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _one_at_a_time = INSTALLING.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(done) = INSTALLED.get() {
            return Ok(done.clone());
        }
        let cannot = |e: &dyn std::fmt::Display| {
            tq_core::Error::invalid(format!("cannot install the Prometheus exporter: {e}"))
        };
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(
                Matcher::Suffix("duration_seconds".into()),
                &tq_core::telemetry::DURATION_BUCKETS,
            )
            .map_err(|e| cannot(&e))?
            .build_recorder();
        let handle = recorder.handle();
        metrics::set_global_recorder(recorder).map_err(|e| cannot(&e))?;
        let exporter = MetricsExporter { handle };
        let _ = INSTALLED.set(exporter.clone());
        Ok(exporter)
    }

    /// Everything recorded so far (request counters, histograms, ...), in the text format.
    pub fn render(&self) -> String {
        self.handle.render()
    }

    /// The exporter this process installed, if any.
    pub fn installed() -> Option<MetricsExporter> {
        INSTALLED.get().cloned()
    }
}
