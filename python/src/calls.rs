//! How a [`NativeClient`] runs an operation: blocking with the GIL released (checking for
//! Ctrl-C), or started on its runtime with a `done` callback that is called exactly once
//! ([`Settle`]), as a [`Task`] Python can cancel.

use crate::client::{NativeClient, Running};
use crate::raise;
use pyo3::prelude::*;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tq::Error;

/// How often a waiting call looks for Ctrl-C (and other signals Python handles).
const SIGNAL_CHECK: Duration = Duration::from_millis(100);

impl NativeClient {
    pub(crate) fn running(&self, py: Python<'_>) -> PyResult<Arc<Running>> {
        if std::process::id() != self.pid {
            return Err(raise(
                py,
                Error::closed(format!(
                    "the client ({}) was made in process {}, before this process forked from \
                     it; make a new client here (each process needs its own)",
                    self.description, self.pid
                )),
            ));
        }
        let slot = self.running.lock().unwrap_or_else(|p| p.into_inner());
        slot.clone().ok_or_else(|| {
            raise(
                py,
                Error::closed(format!("the client ({}) is closed", self.description)),
            )
        })
    }

    /// Runs `call` on the client's runtime with the GIL released. Every [`SIGNAL_CHECK`] it
    /// takes the GIL back for a moment to let Python handle signals: on Ctrl-C the call is
    /// dropped (what it had not done yet is not done) and `KeyboardInterrupt` raised.
    pub(crate) fn run<T: Send, F>(
        &self,
        py: Python<'_>,
        call: impl FnOnce(tq::Client) -> F + Send,
    ) -> PyResult<T>
    where
        F: std::future::Future<Output = Result<T, Error>> + Send,
    {
        let running = self.running(py)?;
        if tokio::runtime::Handle::try_current().is_ok() {
            // A thread of a runtime (a `done` callback that calls back in): waiting here would
            // hold one of the workers the answer needs.
            return Err(raise(
                py,
                Error::invalid(format!(
                    "a blocking call on the client ({}) from a thread of its runtime (a `done` \
                     callback?); use the call's async form there",
                    self.description
                )),
            ));
        }
        let mut call = std::pin::pin!(call(running.client.clone()));
        loop {
            // On this thread, awake for a moment before it parks (`tq::wait`): an answer that
            // arrives within that moment needs no worker to wake this thread.
            let step = py.detach(|| {
                tq::wait::wait_at_most(running.runtime.handle(), call.as_mut(), SIGNAL_CHECK)
            });
            match step {
                std::task::Poll::Ready(outcome) => return outcome.map_err(|e| raise(py, e)),
                std::task::Poll::Pending => py.check_signals()?,
            }
        }
    }
}

impl NativeClient {
    /// One operation, blocking or started (see the comment above the operations): `start`
    /// makes its future, `answer` turns its value into Python's.
    pub(crate) fn call<T, F>(
        &self,
        py: Python<'_>,
        done: Option<Py<PyAny>>,
        answer: fn(Python<'_>, T) -> PyResult<Py<PyAny>>,
        start: impl FnOnce(tq::Client) -> F + Send,
    ) -> PyResult<Py<PyAny>>
    where
        T: Send + 'static,
        F: std::future::Future<Output = Result<T, Error>> + Send + 'static,
    {
        let Some(done) = done else {
            let value = self.run(py, start)?;
            return answer(py, value);
        };
        let running = self.running(py)?;
        let future = start(running.client.clone());
        let settle = Settle(Some(done));
        let handle = running.runtime.spawn(async move {
            let outcome = future.await;
            settle.with(move |py| {
                outcome
                    .map_err(|e| raise(py, e))
                    .and_then(|v| answer(py, v))
            });
        });
        let task = Task {
            abort: Mutex::new(Some(handle.abort_handle())),
        };
        Ok(Bound::new(py, task)?.into_any().unbind())
    }
}

impl NativeClient {
    /// [`NativeClient::call`] for an operation whose future is not `Send` (checkpoints): it
    /// runs on a blocking thread of the runtime (so the future never moves between threads),
    /// and, once started, runs to its end even if its awaiter is cancelled.
    pub(crate) fn call_pinned<T, F>(
        &self,
        py: Python<'_>,
        done: Option<Py<PyAny>>,
        answer: fn(Python<'_>, T) -> PyResult<Py<PyAny>>,
        start: impl FnOnce(tq::Client) -> F + Send + 'static,
    ) -> PyResult<Py<PyAny>>
    where
        T: Send + 'static,
        F: std::future::Future<Output = Result<T, Error>>,
    {
        let running = self.running(py)?;
        let client = running.client.clone();
        let Some(done) = done else {
            let value = py
                .detach(|| running.runtime.block_on(start(client)))
                .map_err(|e| raise(py, e))?;
            return answer(py, value);
        };
        let settle = Settle(Some(done));
        let runtime = running.runtime.handle().clone();
        running.runtime.spawn_blocking(move || {
            let outcome = runtime.block_on(start(client));
            settle.with(move |py| {
                outcome
                    .map_err(|e| raise(py, e))
                    .and_then(|v| answer(py, v))
            });
        });
        let task = Task {
            abort: Mutex::new(None),
        };
        Ok(Bound::new(py, task)?.into_any().unbind())
    }
}

/// The `done` callback of a started operation, called exactly once: with the outcome, or, if
/// the operation is dropped first (cancelled, or its client closed), with `ClosedError`, so an
/// awaiting coroutine never waits forever.
pub(crate) struct Settle(Option<Py<PyAny>>);

impl Settle {
    fn with(mut self, outcome: impl FnOnce(Python<'_>) -> PyResult<Py<PyAny>>) {
        if let Some(done) = self.0.take() {
            Python::attach(|py| deliver(py, &done, outcome(py)));
        }
    }
}

impl Drop for Settle {
    fn drop(&mut self) {
        if let Some(done) = self.0.take() {
            Python::attach(|py| {
                let gone = Error::closed("the operation was cancelled or its client closed");
                deliver(py, &done, Err(raise(py, gone)));
            });
        }
    }
}

fn deliver(py: Python<'_>, done: &Py<PyAny>, outcome: PyResult<Py<PyAny>>) {
    let called = match outcome {
        Ok(value) => done.call1(py, (true, value)),
        Err(e) => done.call1(py, (false, e.into_value(py))),
    };
    if let Err(e) = called {
        // Nobody to hand it to (the event loop closed, say): reported like any callback error.
        e.write_unraisable(py, None);
    }
}

/// A started operation (see `NativeClient::call`); `cancel()` drops it.
#[pyclass(frozen, module = "tq._native")]
pub(crate) struct Task {
    abort: Mutex<Option<tokio::task::AbortHandle>>,
}

#[pymethods]
impl Task {
    /// Stops the operation if it is still running (what it had not done yet is not done);
    /// its `done` callback is then called with `ClosedError`.
    fn cancel(&self) {
        if let Some(abort) = self.abort.lock().unwrap_or_else(|p| p.into_inner()).take() {
            abort.abort();
        }
    }
}
