//! What operations answer, as Python values, and the arguments they take from Python that
//! need converting (seconds, fetch waits, batches of columns).

use crate::convert::{self, column_from_py, column_to_py};
use crate::meta::Meta;
use crate::raise;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use std::time::Duration;
use tq::{Batch, Error, Wait};

/// A number of seconds from Python (`what` names the argument when it is not one).
pub(crate) fn seconds(py: Python<'_>, what: &str, s: Option<f64>) -> PyResult<Option<Duration>> {
    let Some(t) = s else { return Ok(None) };
    // `try_from`: a value too large for a Duration is an error, not a panic.
    match Duration::try_from_secs_f64(t) {
        Ok(d) if t.is_finite() => Ok(Some(d)),
        _ => Err(raise(
            py,
            Error::invalid(format!(
                "{what} must be a number of seconds >= 0 (and below 2^64), got {t}"
            )),
        )),
    }
}

/// How long a fetch waits: the client's configured fetch timeout (`None`), not at all (0), or
/// `timeout`.
pub(crate) fn fetch_wait(client: &tq::Client, timeout: Option<Duration>) -> Wait {
    match timeout {
        None => Wait::For(client.config().fetch_timeout()),
        Some(t) if t.is_zero() => Wait::NoWait,
        Some(t) => Wait::For(t),
    }
}

/// Results for Python: each takes the GIL token and the operation's value.
pub(crate) fn none(py: Python<'_>, (): ()) -> PyResult<Py<PyAny>> {
    Ok(py.None())
}

/// What a KV write answers, for Python: `{"tags" (each key's after the write, in the order of
/// the keys written), "fields" (what every key now holds, sorted)}`. The keys themselves are
/// the caller's, in its order: not built again as 1024 new `str` (about half of this answer's
/// time, `perf` of a put loop under Ray).
pub(crate) fn kv_meta_to_py(py: Python<'_>, meta: tq::KvBatchMeta) -> PyResult<Py<PyAny>> {
    let d = PyDict::new(py);
    let tags = PyList::empty(py);
    for t in &meta.tags {
        tags.append(convert::tags_to_py(py, t)?)?;
    }
    d.set_item("tags", tags)?;
    d.set_item("fields", meta.fields)?;
    Ok(d.into_any().unbind())
}

pub(crate) fn strings_to_py(py: Python<'_>, names: Vec<String>) -> PyResult<Py<PyAny>> {
    Ok(PyList::new(py, names)?.into_any().unbind())
}

pub(crate) fn count_to_py(py: Python<'_>, n: usize) -> PyResult<Py<PyAny>> {
    Ok(n.into_pyobject(py)?.into_any().unbind())
}

pub(crate) fn tag_list_to_py(py: Python<'_>, tags: Vec<tq::Tags>) -> PyResult<Py<PyAny>> {
    let out = PyList::empty(py);
    for t in &tags {
        out.append(convert::tags_to_py(py, t)?)?;
    }
    Ok(out.into_any().unbind())
}

pub(crate) fn to_json<T: serde::Serialize>(value: &T) -> Result<String, Error> {
    serde_json::to_string(value).map_err(|e| Error::internal(format!("cannot encode JSON: {e}")))
}

/// Text as a Python `str`.
pub(crate) fn str_to_py(py: Python<'_>, text: String) -> PyResult<Py<PyAny>> {
    Ok(pyo3::types::PyString::new(py, &text).into_any().unbind())
}

/// JSON text as the Python value it encodes.
pub(crate) fn json_to_py(py: Python<'_>, text: String) -> PyResult<Py<PyAny>> {
    Ok(py.import("json")?.call_method1("loads", (text,))?.unbind())
}

pub(crate) fn meta_to_py(py: Python<'_>, inner: tq::BatchMeta) -> PyResult<Py<PyAny>> {
    Ok(Bound::new(py, Meta { inner })?.into_any().unbind())
}

pub(crate) fn listing_to_py(py: Python<'_>, listing: tq::KeyListing) -> PyResult<Py<PyAny>> {
    let out = PyList::empty(py);
    for (key, tags) in listing.entries {
        let pair = PyTuple::new(
            py,
            [
                key.into_pyobject(py)?.into_any(),
                convert::tags_to_py(py, &tags)?.into_any(),
            ],
        )?;
        out.append(pair)?;
    }
    Ok(out.into_any().unbind())
}

/// A batch as field name → column for the Python layer.
pub(crate) fn columns_to_dict(py: Python<'_>, batch: Batch) -> PyResult<Py<PyAny>> {
    let out = PyDict::new(py);
    for (name, column) in batch.into_columns() {
        out.set_item(name, column_to_py(py, column)?)?;
    }
    Ok(out.into_any().unbind())
}

/// A batch from field name → column, every column checked (same number of rows).
pub(crate) fn batch_from_py(py: Python<'_>, columns: &Bound<'_, PyDict>) -> PyResult<Batch> {
    let mut parts = Vec::with_capacity(columns.len());
    for (name, value) in columns.iter() {
        let name: String = name
            .extract()
            .map_err(|_| PyTypeError::new_err("field names must be str"))?;
        let column = column_from_py(py, &name, &value)?;
        parts.push((name, column));
    }
    Batch::from_columns(parts).map_err(|e| raise(py, e))
}
