//! `tq._native`: the Rust side of tq's Python package, a thin layer over the `tq` facade.
//!
//! The pure-Python package (`python/tq/`) is the API users call; this module only moves data
//! and errors across the boundary:
//! - every call that waits or moves data runs with the GIL released, on a tokio runtime owned
//!   by the client;
//! - dense data comes in from numpy arrays, which this module checks itself (an `ndarray`,
//!   C-contiguous, a dtype tq has) and copies once into tq's buffer while it holds the GIL;
//! - dense data goes out as `Buffer` objects that own tq's bytes and describe them with
//!   numpy's `__array_interface__`, so `numpy.asarray(buffer)` views them without a copy;
//! - errors become the exception classes of `tq.errors`, by kind, with the retry status.

use pyo3::prelude::*;
use pyo3::types::PyDict;
use tq::{Error, ErrorKind, Retry, Subject};

/// Small blocks from mimalloc, payload buffers from the system allocator (`tq::alloc`): a
/// 1024-key lookup from Python took 0.46 ms with glibc's malloc for everything and 0.26 ms
/// with this (docs/decisions/0050-programs-allocate-small-blocks-with-mimalloc.md).
#[global_allocator]
static ALLOCATOR: tq::alloc::SplitAllocator = tq::alloc::SplitAllocator;

mod answers;
mod bench;
mod calls;
mod client;
mod convert;
mod meta;
mod sampler;
mod serve;
use calls::Task;
use client::NativeClient;
use convert::Buffer;
use meta::Meta;

/// A tq error as the exception class of `tq.errors` for its kind.
pub(crate) fn raise(py: Python<'_>, e: Error) -> PyErr {
    let class = match e.kind() {
        ErrorKind::Invalid => "InvalidError",
        ErrorKind::NotFound => "NotFoundError",
        ErrorKind::Conflict => "ConflictError",
        ErrorKind::CapacityExceeded => "CapacityExceededError",
        ErrorKind::DataLost => "DataLostError",
        ErrorKind::Unsupported { .. } => "UnsupportedError",
        ErrorKind::Timeout => "TimeoutError",
        ErrorKind::Unavailable => "UnavailableError",
        ErrorKind::Corrupted => "CorruptedError",
        ErrorKind::PermissionDenied => "PermissionDeniedError",
        ErrorKind::Closed => "ClosedError",
        _ => "InternalError",
    };
    let retry = match e.retry() {
        Retry::Safe => "safe",
        Retry::OutcomeUnknown => "outcome_unknown",
        _ => "never",
    };
    let subjects = PyDict::new(py);
    for (name, subject) in [
        ("partition", Subject::Partition),
        ("key", Subject::Key),
        ("field", Subject::Field),
        ("unit", Subject::Unit),
    ] {
        if let Some(value) = e.subject(subject) {
            let _ = subjects.set_item(name, value);
        }
    }
    let made = py
        .import("tq.errors")
        .and_then(|m| m.getattr(class))
        .and_then(|c| c.call((e.to_string(), retry), Some(&subjects)));
    match made {
        Ok(exc) => PyErr::from_value(exc),
        Err(import_failed) => import_failed,
    }
}

pub(crate) fn runtime() -> Result<tokio::runtime::Runtime, Error> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("tq-python")
        .enable_all()
        .build()
        .map_err(|e| Error::internal(format!("cannot start tq's runtime: {e}")))
}

/// The configuration given as TOML text (`kind == "toml"`), a TOML file (`"path"`), JSON of
/// a dict (`"json"`) or nothing (`"default"`); the environment's `TQ_*` overrides apply to
/// every form, as for the Rust `Config::load`.
pub(crate) fn config(kind: &str, text: &str) -> Result<tq::Config, Error> {
    let mut config = match kind {
        "default" => tq::Config::default(),
        "toml" => tq::Config::from_toml(text)?,
        "path" => {
            let body = std::fs::read_to_string(text)
                .map_err(|e| Error::invalid(format!("cannot read configuration `{text}`: {e}")))?;
            tq::Config::from_toml(&body)
                .map_err(|e| e.context(format!("configuration `{text}`")))?
        }
        "json" => {
            let value: serde_json::Value = serde_json::from_str(text)
                .map_err(|e| Error::invalid(format!("configuration: {e}")))?;
            let table = toml::Value::try_from(value)
                .map_err(|e| Error::invalid(format!("configuration: {e}")))?;
            let body = toml::to_string(&table)
                .map_err(|e| Error::invalid(format!("configuration: {e}")))?;
            tq::Config::from_toml(&body)?
        }
        other => {
            return Err(Error::invalid(format!(
                "unknown configuration form `{other}`"
            )))
        }
    };
    config.apply_env(std::env::vars())?;
    Ok(config)
}

/// Installs this process's Prometheus exporter (once; later calls do nothing). What is built
/// after it records request metrics; what was built before does not (metric handles are taken
/// at construction), so call it before starting a deployment or a client.
#[pyfunction]
fn install_metrics(py: Python<'_>) -> PyResult<()> {
    tq::telemetry::MetricsExporter::install()
        .map(|_| ())
        .map_err(|e| raise(py, e))
}

/// What this process's exporter recorded, in the Prometheus text format (empty before
/// [`install_metrics`]): the request metrics of the deployments and clients in this process,
/// without any state gauges (for a storage unit's own endpoint).
#[pyfunction]
fn render_metrics() -> String {
    tq::telemetry::MetricsExporter::installed()
        .map(|exporter| exporter.render())
        .unwrap_or_default()
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<NativeClient>()?;
    m.add_class::<Buffer>()?;
    m.add_class::<Meta>()?;
    m.add_class::<Task>()?;
    m.add_class::<serve::NativeServer>()?;
    m.add_class::<serve::NativeUnit>()?;
    m.add_function(wrap_pyfunction!(bench::bench_kv, m)?)?;
    m.add_function(wrap_pyfunction!(install_metrics, m)?)?;
    m.add_function(wrap_pyfunction!(render_metrics, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // Benchmarks refuse a debug build (its figures say nothing about tq).
    m.add("debug_build", cfg!(debug_assertions))?;
    Ok(())
}
