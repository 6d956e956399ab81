//! Samplers written in Python (a `tq.compat.BaseSampler` subclass, or any object with the same
//! methods), run by a controller hosted in this process (`tq.serve(samplers=...)`).
//!
//! The controller calls a sampler inside its critical section, so a Python sampler holds up
//! every other request while it runs: it takes the GIL (every tq call that waits has released
//! it, so this cannot deadlock against tq itself) and should be quick.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use std::collections::HashMap;
use tq::sampler::{Candidate, Sampled, Sampler, SamplerContext};
use tq::{Error, Result, SampleId};

/// A Python object with `sample(ready, batch_size, **context) -> (sampled, consumed)` (lists
/// of global indexes) and optionally `has_cached_result`, `clear_cache`, `save_checkpoint` and
/// `load_checkpoint`, as TransferQueue's `BaseSampler` has them.
pub struct PySampler {
    name: String,
    object: Py<PyAny>,
}

impl PySampler {
    pub fn new(name: String, object: Py<PyAny>) -> PySampler {
        PySampler { name, object }
    }

    /// A Python exception raised by the sampler, as a tq error naming it.
    fn error(&self, py: Python<'_>, e: PyErr) -> Error {
        let kind = e
            .get_type(py)
            .name()
            .map(|n| n.to_string())
            .unwrap_or_else(|_| "exception".into());
        Error::invalid(format!("sampler `{}`: {kind}: {}", self.name, e.value(py)))
    }

    /// The context as the original passes it: keyword arguments.
    fn context<'py>(py: Python<'py>, ctx: &SamplerContext<'_>) -> PyResult<Bound<'py, PyDict>> {
        let kwargs = PyDict::new(py);
        kwargs.set_item("partition_id", ctx.partition)?;
        kwargs.set_item("task_name", ctx.task)?;
        if let Some(rank) = ctx.dp_rank {
            kwargs.set_item("dp_rank", rank)?;
        }
        if let Some(index) = ctx.batch_index {
            kwargs.set_item("batch_index", index)?;
        }
        if let Some(args) = ctx.args {
            // The call's own inputs (tq.compat: the sampling_config entries), decoded here by
            // the restricted decoder: only plain values and numpy arrays.
            let decoded = py
                .import("tq._sampler_args")?
                .call_method1("loads", (PyBytes::new(py, args),))?;
            let decoded = decoded.cast::<PyDict>()?;
            for (name, value) in decoded.iter() {
                if kwargs.contains(&name)? {
                    return Err(pyo3::exceptions::PyValueError::new_err(format!(
                        "sampler_args: `{name}` is part of the fetch's context, not an input"
                    )));
                }
                kwargs.set_item(name, value)?;
            }
        }
        Ok(kwargs)
    }

    fn has_method(&self, py: Python<'_>, name: &str) -> bool {
        self.object.bind(py).hasattr(name).unwrap_or(false)
    }
}

impl Sampler for PySampler {
    fn sample(
        &self,
        ready: &[Candidate<'_>],
        batch_size: usize,
        ctx: &SamplerContext<'_>,
    ) -> Result<Sampled> {
        let by_index: HashMap<u32, SampleId> = ready.iter().map(|c| (c.id.index, c.id)).collect();
        let indexes: Vec<u32> = ready.iter().map(|c| c.id.index).collect();
        let (sampled, consumed): (Vec<u32>, Vec<u32>) = Python::attach(|py| {
            let kwargs = Self::context(py, ctx).map_err(|e| self.error(py, e))?;
            let answer = self
                .object
                .bind(py)
                .call_method("sample", (indexes, batch_size), Some(&kwargs))
                .map_err(|e| self.error(py, e))?;
            answer.extract().map_err(|_| {
                Error::invalid(format!(
                    "sampler `{}`: sample() must return (sampled, consumed), two lists of global \
                     indexes; it returned {answer}",
                    self.name
                ))
            })
        })?;
        let resolve = |which: &str, list: Vec<u32>| -> Result<Vec<SampleId>> {
            list.into_iter()
                .map(|i| {
                    by_index.get(&i).copied().ok_or_else(|| {
                        Error::invalid(format!(
                            "sampler `{}`: {which} index {i} is not among the ready samples of \
                             partition `{}`",
                            self.name, ctx.partition
                        ))
                    })
                })
                .collect()
        };
        Ok(Sampled {
            sampled: resolve("sampled", sampled)?,
            consumed: resolve("consumed", consumed)?,
        })
    }

    fn takes_args(&self) -> bool {
        true
    }

    fn has_cached(&self, ctx: &SamplerContext<'_>) -> bool {
        Python::attach(|py| {
            if !self.has_method(py, "has_cached_result") {
                return false;
            }
            let config = match Self::context(py, ctx) {
                Ok(c) => c,
                Err(_) => return false,
            };
            match self
                .object
                .bind(py)
                .call_method1("has_cached_result", (ctx.partition, ctx.task, config))
            {
                Ok(answer) => answer.is_truthy().unwrap_or(false),
                Err(e) => {
                    tracing::warn!(sampler = %self.name, error = %self.error(py, e), "has_cached_result failed; taken as no");
                    false
                }
            }
        })
    }

    fn clear_partition(&self, partition: &str) {
        Python::attach(|py| {
            if self.has_method(py, "clear_cache") {
                if let Err(e) = self
                    .object
                    .bind(py)
                    .call_method1("clear_cache", (partition,))
                {
                    tracing::warn!(sampler = %self.name, partition, error = %self.error(py, e), "clear_cache failed");
                }
            }
        });
    }

    /// `save_checkpoint()`'s answer, pickled (it is the sampler's own state, loaded only into
    /// a sampler of this process's deployment).
    fn save_state(&self) -> Result<Option<Vec<u8>>> {
        Python::attach(|py| {
            if !self.has_method(py, "save_checkpoint") {
                return Ok(None);
            }
            let state = self
                .object
                .bind(py)
                .call_method0("save_checkpoint")
                .map_err(|e| self.error(py, e))?;
            let bytes = py
                .import("pickle")
                .and_then(|m| m.call_method1("dumps", (state,)))
                .map_err(|e| self.error(py, e))?;
            let bytes = bytes.cast::<PyBytes>().map_err(|_| {
                Error::internal(format!("sampler `{}`: pickle gave no bytes", self.name))
            })?;
            Ok(Some(bytes.as_bytes().to_vec()))
        })
    }

    fn load_state(&self, state: &[u8]) -> Result<()> {
        Python::attach(|py| {
            if !self.has_method(py, "load_checkpoint") {
                return Err(Error::invalid(format!(
                    "sampler `{}` has no load_checkpoint, but the saved state has some for it",
                    self.name
                )));
            }
            let loaded = py
                .import("pickle")
                .and_then(|m| m.call_method1("loads", (PyBytes::new(py, state),)))
                .map_err(|e| self.error(py, e))?;
            self.object
                .bind(py)
                .call_method1("load_checkpoint", (loaded,))
                .map_err(|e| self.error(py, e))?;
            Ok(())
        })
    }
}
