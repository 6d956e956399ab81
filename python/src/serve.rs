//! `tq.serve`: a controller and storage units hosted by this Python process, serving over TCP
//! (`tq::server::Deployment`, what `tq serve` runs).

use crate::{config, raise, runtime};
use pyo3::prelude::*;
use std::sync::Mutex;
use tq::server::{Deployment, ServeOptions};
use tq::Error;

/// A running deployment; `tq.Server` wraps it.
#[pyclass(frozen, module = "tq._native")]
pub struct NativeServer {
    url: String,
    units: Vec<(String, String)>,
    running: Mutex<Option<(tokio::runtime::Runtime, Deployment)>>,
}

#[pymethods]
impl NativeServer {
    /// Starts a deployment with the configuration (see `config`) and `tq serve`'s options.
    #[staticmethod]
    #[pyo3(signature = (kind, text, listen, units=None, unit_host=None, advertise_host=None, capacity_per_unit=None, default_sampler=None, insecure=false))]
    #[allow(clippy::too_many_arguments)] // one per keyword of the Python call
    fn start(
        py: Python<'_>,
        kind: &str,
        text: &str,
        listen: String,
        units: Option<u32>,
        unit_host: Option<String>,
        advertise_host: Option<String>,
        capacity_per_unit: Option<usize>,
        default_sampler: Option<String>,
        insecure: bool,
    ) -> PyResult<NativeServer> {
        let started = py.detach(|| -> Result<_, Error> {
            let config = config(kind, text)?;
            // (`..default()`: builds with the facade's `ssd` feature add a field.)
            let mut options = ServeOptions {
                listen,
                units,
                advertise_host,
                capacity_per_unit,
                default_sampler: default_sampler.map(|s| s.parse()).transpose()?,
                insecure,
                ..ServeOptions::default()
            };
            if let Some(host) = unit_host {
                options.unit_host = host;
            }
            let runtime = runtime()?;
            let deployment = runtime.block_on(Deployment::start(config, options))?;
            Ok((runtime, deployment))
        });
        let (runtime, deployment) = started.map_err(|e| raise(py, e))?;
        Ok(NativeServer {
            url: deployment.url().to_string(),
            units: deployment.unit_endpoints().to_vec(),
            running: Mutex::new(Some((runtime, deployment))),
        })
    }

    /// Where clients connect (`tcp://host:port`).
    #[getter]
    fn url(&self) -> &str {
        &self.url
    }

    /// Each storage unit's `(id, endpoint)`.
    #[getter]
    fn units(&self) -> Vec<(String, String)> {
        self.units.clone()
    }

    #[getter]
    fn closed(&self) -> bool {
        self.running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_none()
    }

    /// Stops serving: connections end, the units stop, their data is gone. Twice is fine.
    fn close(&self, py: Python<'_>) {
        let taken = self
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some((runtime, deployment)) = taken {
            py.detach(move || {
                runtime.block_on(deployment.shutdown());
                drop(runtime);
            });
        }
    }

    fn __repr__(&self) -> String {
        format!("NativeServer({}, {} units)", self.url, self.units.len())
    }
}
