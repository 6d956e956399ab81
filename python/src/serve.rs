//! `tq.serve`: a controller and storage units hosted by this Python process, serving over TCP
//! (`tq::server::Deployment`, what `tq serve` runs); `tq.serve_unit`: one storage unit that
//! registers with a controller elsewhere (`tq::server::RegisteredUnit`, what
//! `tq storage-unit` runs).

use crate::sampler::PySampler;
use crate::{config, raise, runtime, NativeClient};
use pyo3::prelude::*;
use std::sync::Mutex;
use tq::server::{check_exposure, Deployment, Endpoint, RegisteredUnit, ServeOptions, UnitOptions};
use tq::Error;

/// A running deployment; `tq.Server` wraps it.
#[pyclass(frozen, module = "tq._native")]
pub struct NativeServer {
    url: String,
    units: Vec<(String, String)>,
    running: Hosted<Deployment>,
}

/// What a server object runs until closed: the runtime and the servers on it.
struct Hosted<T>(Mutex<Option<(tokio::runtime::Runtime, T)>>);

impl<T: Send> Hosted<T> {
    fn new(runtime: tokio::runtime::Runtime, servers: T) -> Self {
        Hosted(Mutex::new(Some((runtime, servers))))
    }

    fn is_closed(&self) -> bool {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).is_none()
    }

    /// `f` of the servers, or `None` once closed.
    fn with<R>(&self, f: impl FnOnce(&T) -> R) -> Option<R> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|(_, servers)| f(servers))
    }

    /// Stops the servers with `shutdown`, without the GIL; closing twice does nothing.
    fn close<F: std::future::Future<Output = ()>>(
        &self,
        py: Python<'_>,
        shutdown: impl FnOnce(T) -> F + Send,
    ) {
        let taken = self.0.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some((runtime, servers)) = taken {
            py.detach(move || {
                runtime.block_on(shutdown(servers));
                drop(runtime);
            });
        }
    }
}

#[pymethods]
impl NativeServer {
    /// Starts a deployment with the configuration (see `config`) and `tq serve`'s options.
    #[staticmethod]
    #[pyo3(signature = (kind, text, listen, units=None, unit_host=None, advertise_host=None, capacity_per_unit=None, default_sampler=None, insecure=false, remote_units=false, samplers=None))]
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
        remote_units: bool,
        samplers: Option<Vec<(String, Py<PyAny>)>>,
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
                remote_units,
                ..ServeOptions::default()
            };
            if let Some(host) = unit_host {
                options.unit_host = host;
            }
            // The servers' own runtime, sized by `net.server_threads` (decision 0051).
            let runtime = tq::server::server_runtime(&config)?;
            let deployment = runtime.block_on(Deployment::start(config, options))?;
            // Before anyone has the address, so no fetch can name them before they exist.
            for (name, object) in samplers.unwrap_or_default() {
                let sampler = PySampler::new(name.clone(), object);
                deployment
                    .controller_service()
                    .controller()
                    .register_sampler(name, std::sync::Arc::new(sampler));
            }
            Ok((runtime, deployment))
        });
        let (runtime, deployment) = started.map_err(|e| raise(py, e))?;
        Ok(NativeServer {
            url: deployment.url().to_string(),
            units: deployment.unit_endpoints().to_vec(),
            running: Hosted::new(runtime, deployment),
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
        self.running.is_closed()
    }

    /// A client in this process that calls the controller and units directly (no socket):
    /// see `tq::server::Deployment::local_client`. Its calls run on a runtime of its own.
    fn local_client(&self, py: Python<'_>) -> PyResult<NativeClient> {
        let client = self
            .running
            .with(|deployment| deployment.local_client())
            .unwrap_or_else(|| {
                Err(Error::closed(format!(
                    "the deployment at {} is closed",
                    self.url
                )))
            })
            .map_err(|e| raise(py, e))?;
        let runtime = runtime().map_err(|e| raise(py, e))?;
        Ok(NativeClient::new(
            runtime,
            client,
            format!("in process: {}", self.url),
            true,
        ))
    }

    /// Stops serving: connections end, the units stop, their data is gone. Twice is fine.
    fn close(&self, py: Python<'_>) {
        self.running.close(py, Deployment::shutdown);
    }

    fn __repr__(&self) -> String {
        format!("NativeServer({}, {} units)", self.url, self.units.len())
    }
}

/// A running storage unit registered with a controller; `tq.UnitServer` wraps it.
#[pyclass(frozen, module = "tq._native")]
pub struct NativeUnit {
    id: String,
    endpoint: String,
    running: Hosted<RegisteredUnit>,
}

#[pymethods]
impl NativeUnit {
    /// Starts unit `id` on `listen` and registers it with the controller at `controller`
    /// (retrying for 30 s while the controller is not reachable yet).
    #[staticmethod]
    #[pyo3(signature = (kind, text, controller, id, listen, advertise=None, capacity=None, insecure=false))]
    #[allow(clippy::too_many_arguments)] // one per keyword of the Python call
    fn start(
        py: Python<'_>,
        kind: &str,
        text: &str,
        controller: String,
        id: String,
        listen: String,
        advertise: Option<String>,
        capacity: Option<usize>,
        insecure: bool,
    ) -> PyResult<NativeUnit> {
        let started = py.detach(|| -> Result<_, Error> {
            let config = config(kind, text)?;
            let controller: Endpoint = controller.parse()?;
            check_exposure(&listen.parse()?, config.net.token.as_deref(), insecure)?;
            let options = UnitOptions {
                id: id.clone(),
                listen,
                advertise,
                capacity,
                ssd: None,
            };
            let runtime = tq::server::server_runtime(&config)?;
            let unit = runtime.block_on(RegisteredUnit::start(&config, &controller, options))?;
            Ok((runtime, unit))
        });
        let (runtime, unit) = started.map_err(|e| raise(py, e))?;
        Ok(NativeUnit {
            id,
            endpoint: unit.endpoint().to_string(),
            running: Hosted::new(runtime, unit),
        })
    }

    /// The unit's id.
    #[getter]
    fn id(&self) -> &str {
        &self.id
    }

    /// Where clients reach the unit (`tcp://host:port`).
    #[getter]
    fn endpoint(&self) -> &str {
        &self.endpoint
    }

    #[getter]
    fn closed(&self) -> bool {
        self.running.is_closed()
    }

    /// Stops serving (the unit's data is gone). Twice is fine.
    fn close(&self, py: Python<'_>) {
        self.running.close(py, RegisteredUnit::shutdown);
    }

    fn __repr__(&self) -> String {
        format!("NativeUnit({}, {})", self.id, self.endpoint)
    }
}
