//! `SignalWatch`: [`SignalWatch`] for Python; its wait releases the GIL.

use std::sync::Arc;

use parking_lot::Mutex;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

use super::{deadline_after, next_slice};
use crate::termination::{SignalWatch, Wake};

/// Watches signals for one handler; `wait` releases the GIL.
#[pyclass(frozen, name = "SignalWatch", module = "tf_failure_handling._native")]
pub struct PySignalWatch {
    inner: Mutex<Option<Arc<SignalWatch>>>,
}

impl PySignalWatch {
    fn inner(&self) -> PyResult<Arc<SignalWatch>> {
        self.inner
            .lock()
            .clone()
            .ok_or_else(|| PyRuntimeError::new_err("the signal watch is closed"))
    }

    /// The core watch, for sources that trigger it from Rust
    /// (`MetadataWatch`).
    ///
    /// # Errors
    ///
    /// `RuntimeError` once closed.
    pub(crate) fn watch(&self) -> PyResult<Arc<SignalWatch>> {
        self.inner()
    }
}

#[pymethods]
impl PySignalWatch {
    /// Installs handlers for `signals` from any thread, chaining the
    /// previous handlers.
    #[new]
    fn new(signals: Vec<i32>) -> PyResult<Self> {
        let watch = SignalWatch::new(&signals).map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(PySignalWatch {
            inner: Mutex::new(Some(Arc::new(watch))),
        })
    }

    /// Blocks up to `timeout` seconds (None: until woken) for a watched
    /// signal (returns its number) or a trigger (returns 0); None on timeout.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<i32>> {
        let watch = self.inner()?;
        let deadline = deadline_after(timeout)?;
        loop {
            let Some(slice) = next_slice(deadline) else {
                return Ok(watch.poll().map(wake_code));
            };
            let w = Arc::clone(&watch);
            if let Some(wake) = super::detach(py, move || w.wait(slice)) {
                return Ok(Some(wake_code(wake)));
            }
            py.check_signals()?;
        }
    }

    /// Reports a pending delivery or trigger without blocking.
    fn poll(&self) -> PyResult<Option<i32>> {
        Ok(self.inner()?.poll().map(wake_code))
    }

    /// Wakes the waiter (a notice from a source that is not a signal).
    fn trigger(&self) -> PyResult<()> {
        self.inner()?.trigger();
        Ok(())
    }

    /// The signals watched.
    #[getter]
    fn signals(&self) -> PyResult<Vec<i32>> {
        Ok(self.inner()?.signals().to_vec())
    }

    /// Uninstalls (restoring previous handlers once nothing else watches);
    /// a waiter is woken first. Idempotent.
    fn close(&self) {
        if let Some(w) = self.inner.lock().take() {
            w.trigger();
        }
    }
}

fn wake_code(wake: Wake) -> i32 {
    match wake {
        Wake::Signal(s) => s,
        Wake::Triggered => 0,
    }
}

/// Number of times `signal` was delivered to this process.
#[pyfunction]
fn signal_deliveries(signal: i32) -> u64 {
    crate::termination::delivered(signal)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PySignalWatch>()?;
    m.add_function(wrap_pyfunction!(signal_deliveries, m)?)?;
    Ok(())
}
