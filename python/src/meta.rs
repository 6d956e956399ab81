//! The metadata API across the boundary: `BatchMeta` as a Python object, and status answers.

use super::raise;
use crate::convert::tags_to_py;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use tq::BatchMeta;

/// The metadata of a batch of samples of one partition: what a fetch or a put answers, and
/// what `get_data`, `put` and `clear_samples` take. Immutable; `select_fields` and `chunk`
/// make new ones.
#[pyclass(frozen, name = "BatchMeta", module = "tq")]
#[derive(Clone)]
pub struct Meta {
    pub inner: BatchMeta,
}

#[pymethods]
impl Meta {
    /// The partition the samples belong to.
    #[getter]
    fn partition(&self) -> &str {
        self.inner.partition()
    }

    /// Number of samples.
    #[getter]
    fn size(&self) -> usize {
        self.inner.len()
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }

    /// The samples' global indexes (as TransferQueue calls them), in order.
    #[getter]
    fn global_indexes(&self) -> Vec<u64> {
        global_indexes(self.inner.samples())
    }

    /// The fields the batch describes, by name.
    #[getter]
    fn field_names(&self) -> Vec<String> {
        self.inner.fields().keys().cloned().collect()
    }

    /// Each sample's tags, in order.
    #[getter]
    fn tags<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let out = PyList::empty(py);
        for t in self.inner.tags() {
            out.append(tags_to_py(py, t)?)?;
        }
        Ok(out)
    }

    /// The lease the samples were fetched under (acknowledged mode), or `None`.
    #[getter]
    fn lease(&self) -> Option<u64> {
        self.inner.lease()
    }

    /// The same samples with only `fields`.
    fn select_fields(&self, py: Python<'_>, fields: Vec<String>) -> PyResult<Meta> {
        self.inner
            .select_fields(&fields)
            .map(|inner| Meta { inner })
            .map_err(|e| raise(py, e))
    }

    /// The samples at `positions`, in that order.
    fn select_samples(&self, py: Python<'_>, positions: Vec<usize>) -> PyResult<Meta> {
        self.inner
            .select_samples(&positions)
            .map(|inner| Meta { inner })
            .map_err(|e| raise(py, e))
    }

    /// `n` batches of (nearly) equal size, the remainder spread over the first ones.
    fn chunk(&self, py: Python<'_>, n: usize) -> PyResult<Vec<Meta>> {
        self.inner
            .chunk(n)
            .map(|parts| parts.into_iter().map(|inner| Meta { inner }).collect())
            .map_err(|e| raise(py, e))
    }

    fn __repr__(&self) -> String {
        format!(
            "BatchMeta(partition={:?}, size={}, fields={:?})",
            self.inner.partition(),
            self.inner.len(),
            self.inner.fields().keys().collect::<Vec<_>>()
        )
    }
}

/// Samples by the number TransferQueue calls their global index (the generation stays in tq).
fn global_indexes(samples: &[tq::SampleId]) -> Vec<u64> {
    samples.iter().map(|s| u64::from(s.index)).collect()
}

/// `production_status` for Python: `{"global_indexes": [...], "fields": [...],
/// "produced": [[bool per field] per sample]}`.
pub fn production_to_py(py: Python<'_>, status: tq::ProductionStatus) -> PyResult<Py<PyAny>> {
    let d = PyDict::new(py);
    let width = status.fields.len().max(1);
    let rows: Vec<Vec<bool>> = status
        .produced
        .chunks(width)
        .map(<[bool]>::to_vec)
        .collect();
    d.set_item("global_indexes", global_indexes(&status.samples))?;
    d.set_item("fields", status.fields)?;
    d.set_item("produced", rows)?;
    Ok(d.into_any().unbind())
}

/// `consumption_status` for Python: `{"global_indexes", "consumed", "leased"}`.
pub fn consumption_to_py(py: Python<'_>, status: tq::ConsumptionStatus) -> PyResult<Py<PyAny>> {
    let d = PyDict::new(py);
    d.set_item("global_indexes", global_indexes(&status.samples))?;
    d.set_item("consumed", status.consumed)?;
    d.set_item("leased", status.leased)?;
    Ok(d.into_any().unbind())
}
