//! `NativeClient`: one tq client (embedded, connected, or a deployment's own) and its
//! operations, as `tq.Client` and `tq.Partition` call them.

use crate::answers::*;
use crate::convert;
use crate::meta::{self, Meta};
use crate::{config, raise, runtime};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::sync::{Arc, Mutex};
use tq::checkpoint::Checkpoints;
use tq::telemetry::Metrics;
use tq::{Error, GetMetaMode, GetMetaRequest};

/// What a client needs to run: the facade client and the runtime its calls run on.
pub(crate) struct Running {
    pub(crate) runtime: tokio::runtime::Runtime,
    pub(crate) client: tq::Client,
}

impl Drop for Running {
    /// Lets the requests the client sent without waiting for their answer (a clear's release,
    /// `Client::settle`) finish before the runtime stops and drops them: on `close()` and when
    /// a client that was never closed goes (as `tq::BlockingClient` does). Not from a thread of
    /// a runtime, where blocking is not allowed.
    fn drop(&mut self) {
        if tokio::runtime::Handle::try_current().is_err() {
            self.runtime.block_on(self.client.settle());
        }
    }
}

/// A tq client (embedded or connected); `tq.Client` wraps it.
#[pyclass(frozen, module = "tq._native")]
pub(crate) struct NativeClient {
    pub(crate) running: Mutex<Option<Arc<Running>>>,
    pub(crate) description: String,
    /// Whether storage lives in this process and keeps the bytes a put hands it (so the
    /// Python layer copies arrays in unless told they may be taken over).
    #[pyo3(get)]
    is_embedded: bool,
    /// The process that made the client: its runtime's threads live there only. A forked
    /// child that inherits the client must make its own (see `running` and `Drop`).
    pub(crate) pid: u32,
}

impl NativeClient {
    /// A client running `client` on `runtime` (`is_embedded`: the storage keeps the bytes a
    /// put hands it, in this process).
    pub(crate) fn new(
        runtime: tokio::runtime::Runtime,
        client: tq::Client,
        description: String,
        is_embedded: bool,
    ) -> NativeClient {
        NativeClient {
            running: Mutex::new(Some(Arc::new(Running { runtime, client }))),
            pid: std::process::id(),
            description,
            is_embedded,
        }
    }
}

impl Drop for NativeClient {
    fn drop(&mut self) {
        if std::process::id() != self.pid {
            // A copy in a forked child: the runtime's threads are not in this process, so
            // shutting it down would wait for them forever. The parent's copy is the real one.
            let inherited = self.running.get_mut().map(Option::take);
            std::mem::forget(inherited);
        }
    }
}

#[pymethods]
impl NativeClient {
    /// Everything in this process: a controller and storage units, no servers.
    #[staticmethod]
    fn embedded(py: Python<'_>, kind: &str, text: &str) -> PyResult<NativeClient> {
        let built = py.detach(|| -> Result<Running, Error> {
            let config = config(kind, text)?;
            let runtime = runtime()?;
            // Built inside the runtime: the storage may start tasks.
            let client =
                runtime.block_on(async { tq::Client::builder().config(config).build() })?;
            Ok(Running { runtime, client })
        });
        let running = built.map_err(|e| raise(py, e))?;
        Ok(NativeClient {
            running: Mutex::new(Some(Arc::new(running))),
            pid: std::process::id(),
            description: "embedded".into(),
            is_embedded: true,
        })
    }

    /// A running deployment at `url` (`tcp://host:port`), with `token` if it needs one.
    #[staticmethod]
    #[pyo3(signature = (url, kind, text, token=None))]
    fn connect(
        py: Python<'_>,
        url: &str,
        kind: &str,
        text: &str,
        token: Option<String>,
    ) -> PyResult<NativeClient> {
        let built = py.detach(|| -> Result<Running, Error> {
            let mut config = config(kind, text)?;
            if let Some(token) = token {
                config.net.token = Some(token);
            }
            let runtime = runtime()?;
            let client = runtime.block_on(tq::Client::builder().config(config).connect(url))?;
            Ok(Running { runtime, client })
        });
        let running = built.map_err(|e| raise(py, e))?;
        Ok(NativeClient {
            running: Mutex::new(Some(Arc::new(running))),
            pid: std::process::id(),
            description: url.to_string(),
            is_embedded: false,
        })
    }

    /// Closes the client; calls after this raise `ClosedError`. Closing twice is harmless.
    fn close(&self, py: Python<'_>) {
        if std::process::id() != self.pid {
            return; // a forked child's copy: see `Drop`
        }
        let taken = self
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        // The runtime stops without the GIL: its threads may be waiting to take it.
        py.detach(move || drop(taken));
    }

    #[getter]
    fn closed(&self) -> bool {
        self.running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_none()
    }

    fn __repr__(&self) -> String {
        format!("NativeClient({})", self.description)
    }

    // Each operation below runs to completion with the GIL released when `done` is `None`,
    // and answers its result; with a `done` callback it starts on the runtime at once,
    // answers a `Task`, and calls `done(ok, value)` from a runtime thread when it ends (the
    // asyncio layer in `tq/_aio.py` turns that into an awaitable). See `NativeClient::call`.

    /// Writes `keys` with the fields in `columns` (field name → `(kind, payload, bf16)`, see
    /// `convert.rs`), row `i` for `keys[i]`, and `tags[i]` merged into the tags of `keys[i]`.
    #[pyo3(signature = (partition, keys, columns, tags=None, done=None))]
    fn kv_batch_put(
        &self,
        py: Python<'_>,
        partition: String,
        keys: Vec<String>,
        columns: &Bound<'_, PyDict>,
        tags: Option<Vec<Bound<'_, PyDict>>>,
        done: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let batch = batch_from_py(py, columns)?;
        let tags = tags
            .map(|t| {
                t.iter()
                    .map(convert::tags_from_py)
                    .collect::<PyResult<Vec<_>>>()
            })
            .transpose()?;
        self.call(py, done, kv_meta_to_py, move |client| async move {
            let p = client.partition(partition);
            p.kv_batch_put(&keys, &batch, tags).await
        })
    }

    /// Reads `keys` (rows in that order): field name → `(kind, payload)`, with a `Buffer`
    /// (dense), a list of `Buffer`s (ragged) or a list of `bytes` (objects).
    #[pyo3(signature = (partition, keys, fields=None, done=None))]
    fn kv_batch_get(
        &self,
        py: Python<'_>,
        partition: String,
        keys: Vec<String>,
        fields: Option<Vec<String>>,
        done: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        self.call(py, done, columns_to_dict, move |client| async move {
            let names: Option<Vec<&str>> = fields
                .as_ref()
                .map(|f| f.iter().map(String::as_str).collect());
            let p = client.partition(partition);
            p.kv_batch_get(&keys, names.as_deref()).await
        })
    }

    /// The keys of `partition` with their tags, as `(key, tags)` pairs.
    #[pyo3(signature = (partition, done=None))]
    fn kv_list(
        &self,
        py: Python<'_>,
        partition: String,
        done: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        self.call(py, done, listing_to_py, move |client| async move {
            client.partition(partition).kv_list().await
        })
    }

    /// Removes `keys` of `partition` (keys that do not exist are skipped).
    #[pyo3(signature = (partition, keys, done=None))]
    fn kv_clear(
        &self,
        py: Python<'_>,
        partition: String,
        keys: Vec<String>,
        done: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        self.call(py, done, none, move |client| async move {
            client.partition(partition).kv_clear(&keys).await
        })
    }

    /// Removes the cells of `fields` of `keys`; the keys stay.
    #[pyo3(signature = (partition, keys, fields, done=None))]
    fn kv_clear_fields(
        &self,
        py: Python<'_>,
        partition: String,
        keys: Vec<String>,
        fields: Vec<String>,
        done: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        self.call(py, done, none, move |client| async move {
            let names: Vec<&str> = fields.iter().map(String::as_str).collect();
            client
                .partition(partition)
                .kv_clear_fields(&keys, &names)
                .await
        })
    }

    /// Merges `tags[i]` into the tags of `keys[i]` (creating keys that do not exist), writing
    /// no field.
    #[pyo3(signature = (partition, keys, tags, done=None))]
    fn kv_set_tags(
        &self,
        py: Python<'_>,
        partition: String,
        keys: Vec<String>,
        tags: Vec<Bound<'_, PyDict>>,
        done: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let tags = tags
            .iter()
            .map(convert::tags_from_py)
            .collect::<PyResult<Vec<_>>>()?;
        self.call(py, done, kv_meta_to_py, move |client| async move {
            client.partition(partition).kv_set_tags(&keys, tags).await
        })
    }

    /// The tags of `keys`, in order.
    #[pyo3(signature = (partition, keys, done=None))]
    fn kv_tags(
        &self,
        py: Python<'_>,
        partition: String,
        keys: Vec<String>,
        done: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        self.call(py, done, tag_list_to_py, move |client| async move {
            client.partition(partition).kv_tags(&keys).await
        })
    }

    /// Merges `columns` into the cells of `keys` by `merge` (`"replace"`, `"add"`, `"max"`,
    /// `"concat"` along `dim`, or the name of a merge function registered with the storage).
    #[pyo3(signature = (partition, keys, columns, merge, dim=0, done=None))]
    #[allow(clippy::too_many_arguments)] // one per keyword of the Python call
    fn kv_batch_update(
        &self,
        py: Python<'_>,
        partition: String,
        keys: Vec<String>,
        columns: &Bound<'_, PyDict>,
        merge: String,
        dim: usize,
        done: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let batch = batch_from_py(py, columns)?;
        let merge = match merge.as_str() {
            "replace" => tq::MergeOp::Replace,
            "add" => tq::MergeOp::Add,
            "max" => tq::MergeOp::Max,
            "concat" => tq::MergeOp::Concat { dim },
            _ => tq::MergeOp::Named(merge),
        };
        self.call(py, done, none, move |client| async move {
            let p = client.partition(partition);
            p.kv_batch_update(&keys, &batch, &merge).await.map(drop)
        })
    }

    /// Makes `fields` of `keys` read the payloads of `public_keys` in the public partition
    /// (no copy); keys are created on first use.
    #[pyo3(signature = (partition, keys, public_keys, fields, public_partition=None, replace_private=false, done=None))]
    #[allow(clippy::too_many_arguments)] // one per keyword of the Python call
    fn kv_link(
        &self,
        py: Python<'_>,
        partition: String,
        keys: Vec<String>,
        public_keys: Vec<String>,
        fields: Vec<String>,
        public_partition: Option<String>,
        replace_private: bool,
        done: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let mut options = tq::LinkOptions {
            replace_private,
            ..Default::default()
        };
        if let Some(public) = public_partition {
            options.public_partition = public;
        }
        self.call(py, done, none, move |client| async move {
            let names: Vec<&str> = fields.iter().map(String::as_str).collect();
            let p = client.partition(partition);
            p.kv_link(&keys, &public_keys, &names, &options)
                .await
                .map(drop)
        })
    }

    /// Drops the links of `fields` of `keys`; answers how many links there were.
    #[pyo3(signature = (partition, keys, fields, done=None))]
    fn kv_unlink(
        &self,
        py: Python<'_>,
        partition: String,
        keys: Vec<String>,
        fields: Vec<String>,
        done: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        self.call(py, done, count_to_py, move |client| async move {
            let names: Vec<&str> = fields.iter().map(String::as_str).collect();
            client.partition(partition).kv_unlink(&keys, &names).await
        })
    }

    /// What the deployment holds (what `tq stats` shows), as JSON.
    #[pyo3(signature = (done=None))]
    fn status(&self, py: Python<'_>, done: Option<Py<PyAny>>) -> PyResult<Py<PyAny>> {
        self.call(py, done, json_to_py, |client| async move {
            let status = client.status().await?;
            to_json(&status)
        })
    }

    /// This process's metrics in the Prometheus text format: what the exporter recorded once
    /// [`install_metrics`] ran, then the deployment's state gauges (what a scrape of
    /// `tq serve --metrics-listen` shows).
    #[pyo3(signature = (done=None))]
    fn metrics_text(&self, py: Python<'_>, done: Option<Py<PyAny>>) -> PyResult<Py<PyAny>> {
        self.call(py, done, str_to_py, |client| async move {
            client.metrics_text().await
        })
    }

    /// Saves the controller's state and the payloads into directory `path`; answers the
    /// checkpoint's manifest as JSON.
    #[pyo3(signature = (path, done=None))]
    fn save_checkpoint(
        &self,
        py: Python<'_>,
        path: String,
        done: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        self.call_pinned(py, done, json_to_py, move |client| async move {
            to_json(&client.save_checkpoint(&path).await?)
        })
    }

    /// Restores the checkpoint in directory `path` into this client's controller (which must
    /// hold no partition yet); answers its manifest as JSON.
    #[pyo3(signature = (path, done=None))]
    fn load_checkpoint(
        &self,
        py: Python<'_>,
        path: String,
        done: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        self.call_pinned(py, done, json_to_py, move |client| async move {
            to_json(&client.load_checkpoint(&path).await?)
        })
    }

    /// Partition names, in creation order.
    #[pyo3(signature = (done=None))]
    fn list_partitions(&self, py: Python<'_>, done: Option<Py<PyAny>>) -> PyResult<Py<PyAny>> {
        self.call(py, done, strings_to_py, |client| async move {
            client.list_partitions().await
        })
    }

    /// Writes `columns` into new samples of `partition`; answers their `BatchMeta`.
    #[pyo3(signature = (partition, columns, done=None))]
    fn put_new(
        &self,
        py: Python<'_>,
        partition: String,
        columns: &Bound<'_, PyDict>,
        done: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let batch = batch_from_py(py, columns)?;
        self.call(py, done, meta_to_py, move |client| async move {
            client.partition(partition).put_new(&batch).await
        })
    }

    /// Writes `columns` into the samples `meta` names (a stage filling in its fields);
    /// answers the samples' `BatchMeta` with those fields.
    #[pyo3(signature = (meta, columns, done=None))]
    fn put(
        &self,
        py: Python<'_>,
        meta: &Meta,
        columns: &Bound<'_, PyDict>,
        done: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let batch = batch_from_py(py, columns)?;
        let meta = meta.inner.clone();
        self.call(py, done, meta_to_py, move |client| async move {
            client.put(&meta, &batch).await
        })
    }

    /// The metadata API's one request (TransferQueue's `get_meta`; `Partition.fetch` is its
    /// fetch mode): `mode` is `"fetch"` (up to `batch_size` samples whose `fields` are produced
    /// and that `task` has not consumed, as `sampler` picks with `dp_rank` and `batch_index`;
    /// `timeout`: seconds to wait for enough, `None` the configured `controller.fetch_timeout_ms`,
    /// 0 none; `lease`: seconds they stay reserved until `ack` instead of consumed at once),
    /// `"insert"`
    /// (`batch_size` new samples that will hold `fields`) or `"force"` (every live sample,
    /// production for `fields`, nothing consumed). `sampler_args`: this call's inputs for a
    /// sampler written in Python, encoded by `tq._sampler_args`.
    #[pyo3(signature = (partition, fields, mode, batch_size, task=None, timeout=None, sampler=None, dp_rank=None, batch_index=None, lease=None, sampler_args=None, done=None))]
    #[allow(clippy::too_many_arguments)] // one per keyword of the Python call
    fn get_meta(
        &self,
        py: Python<'_>,
        partition: String,
        fields: Vec<String>,
        mode: &str,
        batch_size: usize,
        task: Option<String>,
        timeout: Option<f64>,
        sampler: Option<String>,
        dp_rank: Option<u32>,
        batch_index: Option<u64>,
        lease: Option<f64>,
        sampler_args: Option<Vec<u8>>,
        done: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let timeout = seconds(py, "timeout", timeout)?;
        let lease = seconds(py, "lease", lease)?;
        let mode = match (mode, task) {
            ("fetch", Some(task)) => Mode::Fetch(task),
            ("fetch", None) => {
                return Err(raise(py, Error::invalid("a fetch needs a task name")));
            }
            ("insert", _) => Mode::Insert,
            ("force", _) => Mode::Force,
            (other, _) => {
                return Err(raise(
                    py,
                    Error::invalid(format!(
                        "get_meta mode must be `fetch`, `insert` or `force`, got `{other}`"
                    )),
                ))
            }
        };
        self.call(py, done, meta_to_py, move |client| async move {
            let mode = match mode {
                Mode::Fetch(task) => GetMetaMode::Fetch {
                    task,
                    batch_size,
                    wait: fetch_wait(&client, timeout),
                    lease,
                },
                Mode::Insert => GetMetaMode::Insert { count: batch_size },
                Mode::Force => GetMetaMode::Force,
            };
            client
                .get_meta(GetMetaRequest {
                    partition,
                    fields,
                    mode,
                    sampler,
                    dp_rank,
                    batch_index,
                    sampler_args,
                })
                .await
        })
    }

    /// Merges `meta`'s tags into its samples (TransferQueue's `set_custom_meta`).
    #[pyo3(signature = (meta, done=None))]
    fn set_tags(
        &self,
        py: Python<'_>,
        meta: &Meta,
        done: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let meta = meta.inner.clone();
        self.call(py, done, none, move |client| async move {
            client.set_tags(&meta).await
        })
    }

    /// The metadata of `keys` of `partition` (`NotFound` for missing keys, or, with `create`,
    /// new samples for them).
    #[pyo3(signature = (partition, keys, create=false, done=None))]
    fn kv_meta(
        &self,
        py: Python<'_>,
        partition: String,
        keys: Vec<String>,
        create: bool,
        done: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        self.call(py, done, meta_to_py, move |client| async move {
            let p = client.partition(partition);
            if create {
                p.kv_meta_or_create(&keys).await
            } else {
                p.kv_meta(&keys).await
            }
        })
    }

    /// Acknowledges samples fetched with a lease by `task`; answers how many this lease
    /// acknowledged (a repeat answers the same).
    #[pyo3(signature = (task, meta, done=None))]
    fn ack(
        &self,
        py: Python<'_>,
        task: String,
        meta: &Meta,
        done: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let meta = meta.inner.clone();
        self.call(py, done, count_to_py, move |client| async move {
            client.ack(&task, &meta).await
        })
    }

    /// Keeps samples fetched with a lease by `task` leased for `seconds` from now; answers
    /// how many were still held.
    #[pyo3(signature = (task, meta, seconds, done=None))]
    fn renew_lease(
        &self,
        py: Python<'_>,
        task: String,
        meta: &Meta,
        seconds: f64,
        done: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let meta = meta.inner.clone();
        let extend = crate::answers::seconds(py, "seconds", Some(seconds))?.unwrap_or_default();
        self.call(py, done, count_to_py, move |client| async move {
            client.renew_lease(&task, &meta, extend).await
        })
    }

    /// The payloads of `meta`'s samples (only `fields`, if given), as `kv_batch_get` answers.
    #[pyo3(signature = (meta, fields=None, done=None))]
    fn get_data(
        &self,
        py: Python<'_>,
        meta: &Meta,
        fields: Option<Vec<String>>,
        done: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let meta = match fields {
            Some(f) => meta.inner.select_fields(&f).map_err(|e| raise(py, e))?,
            None => meta.inner.clone(),
        };
        self.call(py, done, columns_to_dict, move |client| async move {
            client.get_data(&meta).await
        })
    }

    /// Removes `meta`'s samples (payloads and metadata).
    #[pyo3(signature = (meta, done=None))]
    fn clear_samples(
        &self,
        py: Python<'_>,
        meta: &Meta,
        done: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let meta = meta.inner.clone();
        self.call(py, done, none, move |client| async move {
            client.clear_samples(&meta).await
        })
    }

    #[pyo3(signature = (partition, fields, done=None))]
    fn production_status(
        &self,
        py: Python<'_>,
        partition: String,
        fields: Vec<String>,
        done: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        self.call(py, done, meta::production_to_py, move |client| async move {
            let names: Vec<&str> = fields.iter().map(String::as_str).collect();
            client.partition(partition).production_status(&names).await
        })
    }

    #[pyo3(signature = (partition, task, done=None))]
    fn consumption_status(
        &self,
        py: Python<'_>,
        partition: String,
        task: String,
        done: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        self.call(py, done, meta::consumption_to_py, move |client| async move {
            client.partition(partition).consumption_status(&task).await
        })
    }

    /// Declares that no more samples will be added to `partition`.
    #[pyo3(signature = (partition, done=None))]
    fn complete(
        &self,
        py: Python<'_>,
        partition: String,
        done: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        self.call(py, done, none, move |client| async move {
            client.partition(partition).complete().await
        })
    }

    /// Clears every sample of `partition` and drops it.
    #[pyo3(signature = (partition, done=None))]
    fn clear_partition(
        &self,
        py: Python<'_>,
        partition: String,
        done: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        self.call(py, done, none, move |client| async move {
            client.partition(partition).clear().await
        })
    }

    /// Forgets what `task` (every task, if `None`) consumed of `partition`.
    #[pyo3(signature = (partition, task=None, done=None))]
    fn reset_consumption(
        &self,
        py: Python<'_>,
        partition: String,
        task: Option<String>,
        done: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        self.call(py, done, none, move |client| async move {
            let p = client.partition(partition);
            match task {
                Some(t) => p.reset_consumption(&t).await,
                None => p.reset_all_consumption().await,
            }
        })
    }
}

/// The mode of a `get_meta` call, checked before the call starts.
enum Mode {
    Fetch(String),
    Insert,
    Force,
}
