//! Seeing inside a deployment: [`Client::status`] and [`Metrics::metrics`] (what `tq stats` and
//! a scrape of `tq serve --metrics-listen` show), request ids that correlate one operation's
//! log lines across processes, and (feature `metrics`) the Prometheus exporter.
//! `docs/operations.md` lists every metric.
//!
//! The Prometheus text format lives here rather than in the client: the state gauges rendered
//! from a [`DeploymentStatus`] ([`render_status`], `prometheus.rs`) and a scrape parsed
//! ([`MetricsSnapshot`], `snapshot.rs`). The client only reports status; a process that serves
//! or reads metrics (`tq serve`, the Python package, tests) uses this module.

mod prometheus;
mod snapshot;

pub use prometheus::{render_status, render_units};
pub use snapshot::{Labels, MetricsSnapshot};
pub use tq_client::DeploymentStatus;
#[cfg(feature = "metrics")]
pub use tq_client::MetricsExporter;
pub use tq_controller::{ControllerStatus, PartitionStatus, TaskStatus};
pub use tq_core::telemetry::{
    current_trace_id, format_trace_id, new_trace_id, with_trace_id, UnitStatus,
};

use crate::Client;
use std::future::Future;
use tq_core::Result;

/// A client's metrics in the Prometheus text format (`use tq::telemetry::Metrics`).
pub trait Metrics {
    /// This process's metrics in the Prometheus text format: what the exporter recorded (with
    /// feature `metrics`, once installed: see [`crate::ClientBuilder::metrics`]) followed by
    /// the state gauges of [`Client::status`], as a scrape of `tq serve` shows them.
    fn metrics_text(&self) -> impl Future<Output = Result<String>> + Send;

    /// [`Metrics::metrics_text`], parsed.
    fn metrics(&self) -> impl Future<Output = Result<MetricsSnapshot>> + Send;
}

impl Metrics for Client {
    async fn metrics_text(&self) -> Result<String> {
        let mut text = String::new();
        #[cfg(feature = "metrics")]
        if let Some(exporter) = MetricsExporter::installed() {
            text.push_str(&exporter.render());
        }
        text.push_str(&render_status(&self.status().await?));
        Ok(text)
    }

    async fn metrics(&self) -> Result<MetricsSnapshot> {
        MetricsSnapshot::parse(&self.metrics_text().await?)
    }
}
