//! `Completions`: what the coordinator's `RemoteValue`s wait on, and `Timed`,
//! what times TensorFlow's coordinator metrics.
//!
//! Why a `schedule()` leaves two objects rather than TensorFlow's twenty is
//! told in `docs/how-it-works.md` ("Two objects per `schedule()`"): the
//! closure (`_coordinator.function_cache.Closure`, a `__slots__` class) and
//! the `RemoteValue` (TensorFlow's class,
//! `_coordinator.remote_values.ClosureRemoteValue`), which needs no event or
//! lock of its own: its waiters wait on the one [`PyCompletions`] counter of
//! the process.

use parking_lot::{Condvar, Mutex};
use pyo3::intern;
use pyo3::prelude::*;

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
    /// The status of a `RemoteValue` that is not ready (TensorFlow's
    /// `RemoteValueStatus.NOT_READY`).
    not_ready: Py<PyAny>,
}

#[pymethods]
impl PyCompletions {
    /// The count for `RemoteValue`s whose `_status` is `not_ready` until
    /// they are set.
    #[new]
    fn new(not_ready: Py<PyAny>) -> Self {
        PyCompletions {
            count: Mutex::new(0),
            advanced: Condvar::new(),
            not_ready,
        }
    }

    /// One more completion: wakes every waiter.
    fn advance(&self) {
        let mut count = self.count.lock();
        *count = count.wrapping_add(1);
        drop(count);
        self.advanced.notify_all();
    }

    /// Blocks until `remote_value._status` is no longer `not_ready` (True) or
    /// `timeout` seconds pass (False, unless it became ready meanwhile; None:
    /// no limit, ≤ 0: no wait). The status is read at first, then each time
    /// the count moves: a plain attribute read, no Python code runs from here
    /// (a daemon thread must not be inside a native frame when it re-attaches
    /// at exit: `blocking::detach`). Releases the GIL between; on the main
    /// thread it answers Ctrl-C.
    #[pyo3(signature = (remote_value, timeout=None))]
    fn wait(&self, py: Python<'_>, remote_value: Bound<'_, PyAny>, timeout: Option<f64>) -> PyResult<bool> {
        let status = intern!(py, "_status");
        let ready = || -> PyResult<bool> { Ok(!remote_value.getattr(status)?.is(&self.not_ready)) };
        let deadline = threading_deadline(timeout);
        loop {
            let seen = *self.count.lock();
            if ready()? {
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
                return ready();
            }
        }
    }
}

/// `Timed(cell)` starts timing; `.add()` adds the seconds since to `cell` (a
/// TensorFlow coordinator metric's cell): what TensorFlow's
/// `metric_utils.monitored_timer` measures, without its context manager, and
/// without a time in Python. The timed call runs in Python between the two
/// (not under a native frame: a worker thread may be inside it when the
/// interpreter exits).
#[pyclass(frozen, name = "Timed", module = "tf_failure_handling._native")]
pub struct PyTimed {
    cell: Py<PyAny>,
    start: f64,
}

#[pymethods]
impl PyTimed {
    #[new]
    fn new(cell: Py<PyAny>) -> Self {
        PyTimed { cell, start: now_secs() }
    }

    /// Adds the seconds since the start to the cell.
    fn add(&self, py: Python<'_>) -> PyResult<()> {
        let seconds = (now_secs() - self.start).max(0.0);
        self.cell.call_method1(py, intern!(py, "add"), (seconds,)).map(drop)
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyCompletions>()?;
    m.add_class::<PyTimed>()?;
    Ok(())
}
