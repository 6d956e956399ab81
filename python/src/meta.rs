//! The metadata API across the boundary: `BatchMeta` as a Python object, and status answers.

use super::raise;
use crate::convert::{tags_from_py, tags_to_py};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use tq::{BatchMeta, Error, FieldKind};

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

    /// Per sample, whether every field of the batch is produced.
    #[getter]
    fn production(&self) -> Vec<bool> {
        self.inner.production().to_vec()
    }

    /// Per field, what TransferQueue calls its schema: `{"dtype": str | None, "shape":
    /// tuple | None, "is_nested": bool, "is_non_tensor": bool, "per_sample_shapes": list |
    /// None}` (`dtype` is tq's dtype name; shapes are per sample, without the batch dimension).
    #[getter]
    fn schema<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let out = PyDict::new(py);
        for (name, meta) in self.inner.fields() {
            let d = PyDict::new(py);
            d.set_item("dtype", meta.dtype().map(|t| t.name()))?;
            let shape = match meta.sample_shape() {
                Some(s) => PyTuple::new(py, s)?.into_any(),
                None => py.None().into_bound(py),
            };
            d.set_item("shape", shape)?;
            d.set_item("is_nested", meta.kind() == FieldKind::Ragged)?;
            d.set_item("is_non_tensor", meta.kind() == FieldKind::Object)?;
            let per_sample = match meta.per_sample_shapes() {
                Some(shapes) => {
                    let l = PyList::empty(py);
                    for s in shapes {
                        l.append(PyTuple::new(py, s)?)?;
                    }
                    l.into_any()
                }
                None => py.None().into_bound(py),
            };
            d.set_item("per_sample_shapes", per_sample)?;
            out.set_item(name, d)?;
        }
        Ok(out)
    }

    /// The same samples with `tags` (one dict per sample) instead of theirs; what a put or
    /// `set_tags` of the result then publishes.
    fn with_tags(&self, py: Python<'_>, tags: Vec<Bound<'_, PyDict>>) -> PyResult<Meta> {
        let tags = tags
            .iter()
            .map(tags_from_py)
            .collect::<PyResult<Vec<_>>>()?;
        self.inner
            .clone()
            .with_tags(tags)
            .map(|inner| Meta { inner })
            .map_err(|e| raise(py, e))
    }

    /// The batches one after the other (same partition and fields; empty ones skipped).
    #[staticmethod]
    fn concat(py: Python<'_>, parts: Vec<PyRef<'_, Meta>>) -> PyResult<Meta> {
        let parts: Vec<BatchMeta> = parts.iter().map(|m| m.inner.clone()).collect();
        BatchMeta::concat(&parts)
            .map(|inner| Meta { inner })
            .map_err(|e| raise(py, e))
    }

    /// The fields of both batches, which must name the same samples in the same order
    /// (`other` wins on a field both have; production is AND-ed; tags merge per sample).
    fn union(&self, py: Python<'_>, other: &Meta) -> PyResult<Meta> {
        self.inner
            .union(&other.inner)
            .map(|inner| Meta { inner })
            .map_err(|e| raise(py, e))
    }

    /// Pickles as its JSON encoding (checked again when loaded, like a peer's).
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<(Bound<'py, PyAny>, (String,))> {
        let py = slf.py();
        let text = serde_json::to_string(&slf.get().inner).map_err(|e| {
            raise(
                py,
                Error::internal(format!("cannot encode a BatchMeta: {e}")),
            )
        })?;
        Ok((slf.getattr("_from_json")?, (text,)))
    }

    /// A `BatchMeta` from what `__reduce__` wrote; `Invalid` when the text is not one.
    #[staticmethod]
    fn _from_json(py: Python<'_>, text: &str) -> PyResult<Meta> {
        serde_json::from_str(text)
            .map(|inner| Meta { inner })
            .map_err(|e| raise(py, Error::invalid(format!("not a pickled BatchMeta: {e}"))))
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
