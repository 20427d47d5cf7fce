//! `Completions`: what the coordinator's `RemoteValue`s wait on, and `timed`,
//! the call that feeds TensorFlow's coordinator metrics.
//!
//! Why a `schedule()` leaves two objects rather than TensorFlow's twenty is
//! told in `docs/how-it-works.md` ("Two objects per `schedule()`"): the
//! closure (`_coordinator.function_cache.Closure`, a `__slots__` class) and
//! the `RemoteValue` (TensorFlow's class,
//! `_coordinator.remote_values.ClosureRemoteValue`), which needs no event or
//! lock of its own: its waiters wait on the one [`PyCompletions`] counter of
//! the process.

use parking_lot::{Condvar, Mutex};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use super::blocking::{threading_deadline, wait_sliced};
use super::clock::now_secs;

/// A count of completions that threads can wait on: one per process, for the
/// `RemoteValue`s of `_coordinator.remote_values` (a waiter reads the count,
/// checks its `RemoteValue`, and waits for the count to move; a completion
/// sets the `RemoteValue`, then advances the count).
#[pyclass(frozen, name = "Completions", module = "tf_failure_handling._native")]
pub struct PyCompletions {
    count: Mutex<u64>,
    /// Notified at every advance: what `wait` waits for.
    advanced: Condvar,
}

#[pymethods]
impl PyCompletions {
    #[new]
    fn new() -> Self {
        PyCompletions {
            count: Mutex::new(0),
            advanced: Condvar::new(),
        }
    }

    /// One more completion: wakes every waiter.
    fn advance(&self) {
        let mut count = self.count.lock();
        *count = count.wrapping_add(1);
        drop(count);
        self.advanced.notify_all();
    }

    /// Blocks until `ready()` is true (True) or `timeout` seconds pass
    /// (False, unless `ready()` became true meanwhile; None: no limit, ≤ 0:
    /// no wait). `ready()` is asked once at first, then each time the count
    /// moves. Releases the GIL between; on the main thread it answers
    /// Ctrl-C.
    #[pyo3(signature = (ready, timeout=None))]
    fn wait(&self, py: Python<'_>, ready: Bound<'_, PyAny>, timeout: Option<f64>) -> PyResult<bool> {
        let deadline = threading_deadline(timeout);
        loop {
            let seen = *self.count.lock();
            if ready.call0()?.is_truthy()? {
                return Ok(true);
            }
            let moved = wait_sliced(py, deadline, |slice| {
                let mut count = self.count.lock();
                if *count == seen {
                    self.advanced.wait_for(&mut count, slice);
                }
                (*count != seen).then_some(())
            })?;
            if moved.is_none() {
                return ready.call0()?.is_truthy();
            }
        }
    }
}

/// `timed(cell, function, *args, **kwargs)`: `function(*args, **kwargs)`,
/// whose duration in seconds is added to `cell` (a TensorFlow metric cell's
/// `add`) when it returns; with `cell` None, only the call. What TensorFlow's
/// `metric_utils.monitored_timer` measures, without its context manager.
#[pyfunction]
#[pyo3(signature = (cell, function, *args, **kwargs))]
fn timed<'py>(
    cell: Option<Bound<'py, PyAny>>,
    function: Bound<'py, PyAny>,
    args: Bound<'py, PyTuple>,
    kwargs: Option<Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyAny>> {
    let Some(cell) = cell else {
        return function.call(args, kwargs.as_ref());
    };
    let start = now_secs();
    let out = function.call(args, kwargs.as_ref())?;
    cell.call_method1(pyo3::intern!(cell.py(), "add"), ((now_secs() - start).max(0.0),))?;
    Ok(out)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyCompletions>()?;
    m.add_function(wrap_pyfunction!(timed, m)?)?;
    Ok(())
}
