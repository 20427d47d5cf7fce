//! `ClosureQueue`: [`crate::closure_queue::ClosureQueue`] for Python, with
//! TensorFlow's `_CoordinatedClosureQueue` interface (the Python subclass,
//! `_coordinator.closure_queue.ClosureQueue`, adds TensorFlow's names that
//! are not hot: `mark_failed`, `put_back`, `done`, and the cancellation
//! manager). Closures and errors are opaque Python objects; tags are ints
//! (TensorFlow's worker indices).
//!
//! Fast path: an operation that does not have to wait runs attached, with
//! one uncontended lock (its holders never wait for the GIL, so taking it
//! attached cannot deadlock). Only an operation that must block detaches
//! ([`wait_sliced`]: in slices on the main thread, which answers Ctrl-C).
//!
//! Cancellation follows the core's two phases; the Python side is reached
//! through two hook methods, when the class has them (the subclass does):
//! `_start_cancel()` before waiting for in-flight closures, and
//! `_cancel_done()` after the queued closures are marked cancelled.
//!
//! No Python object is dropped and no Python code runs under the core's lock:
//! the core hands back every closure or error it lets go of.

use pyo3::gc::PyVisit;
use pyo3::prelude::*;
use pyo3::types::PyString;
use pyo3::{intern, PyTraverseError};

use super::blocking::{threading_deadline, wait_sliced};
use super::errors;
use crate::closure_queue::{self as core, Cancellation, ClosureQueue, GetError, Outcome, Put, PutBack, Settled, DEFAULT_CAPACITY};

type Core = ClosureQueue<Py<PyAny>, Py<PyAny>, i64>;
type CoreCancellation<'q> = Cancellation<'q, Py<PyAny>, Py<PyAny>, i64>;

/// The coordinator's closure queue: TensorFlow's `_CoordinatedClosureQueue`
/// with a native core. Subclassed by `tf_failure_handling.ClosureQueue`,
/// which adds the cancellation manager.
#[pyclass(frozen, subclass, name = "ClosureQueue", module = "tf_failure_handling._native")]
pub struct PyClosureQueue {
    core: Core,
}

impl PyClosureQueue {
    /// Calls the hook `name` if the (sub)class has one.
    fn hook(slf: &Bound<'_, Self>, name: &Bound<'_, PyString>) -> PyResult<()> {
        match slf.getattr(name) {
            Ok(hook) => hook.call0().map(drop),
            Err(_) => Ok(()),
        }
    }

    /// Runs a cancellation to its end and returns the exception to raise:
    /// the pending error (the same object `mark_failed` received), or the
    /// first exception a hook or a `mark_cancelled()` raised.
    fn cancel_all(slf: &Bound<'_, Self>, mut cancellation: CoreCancellation<'_>) -> PyErr {
        let py = slf.py();
        // Phase 2: abort running closures; no Rust lock held.
        if let Err(e) = Self::hook(slf, intern!(py, "_start_cancel")) {
            return e; // Abandoned: the error stays pending.
        }
        // Phase 3: wait for in-flight closures.
        let cancelled = match wait_sliced(py, None, |slice| cancellation.finish_timeout(slice).ok()) {
            Ok(c) => c.expect("a wait without a deadline ends with its value"),
            Err(e) => return e,
        };
        drop(cancellation);
        // Phase 4: mark the drained closures cancelled, then let the shim
        // replace its cancellation manager.
        let mut first: Option<PyErr> = None;
        for item in cancelled.items {
            if let Err(e) = item.bind(py).call_method0(intern!(py, "mark_cancelled")) {
                first.get_or_insert(e);
            }
        }
        if let Err(e) = Self::hook(slf, intern!(py, "_cancel_done")) {
            first.get_or_insert(e);
        }
        first.unwrap_or_else(|| PyErr::from_value(cancelled.error.into_bound(py)))
    }
}

#[pymethods]
impl PyClosureQueue {
    /// A queue whose main queue holds at most `max_size` closures (≤ 0:
    /// unbounded, as `queue.Queue`).
    #[new]
    #[pyo3(signature = (max_size=DEFAULT_CAPACITY as i64))]
    fn new(max_size: i64) -> Self {
        PyClosureQueue {
            core: Core::new(usize::try_from(max_size).unwrap_or(0)),
        }
    }

    /// Sets `closure.tag = tag`, then enqueues it: on `tag`'s queue (never
    /// blocks) or on the main queue, waiting while it is full or a `wait()`
    /// runs. Raises the pending error, if any, after enqueuing (cancelling
    /// everything queued, this closure too).
    #[pyo3(signature = (closure, tag=None))]
    fn put(slf: &Bound<'_, Self>, closure: Bound<'_, PyAny>, tag: Option<Bound<'_, PyAny>>) -> PyResult<()> {
        let py = slf.py();
        let key = tag.as_ref().map(|t| t.extract::<i64>()).transpose()?;
        closure.setattr(intern!(py, "tag"), tag)?;
        let core = &slf.get().core;
        if let Some(key) = key {
            core.put_tagged(closure.unbind(), key);
            return Ok(());
        }
        let outcome = match core.try_put(closure.unbind()) {
            Ok(outcome) => outcome,
            Err(full) => {
                let mut item = Some(full.into_inner());
                let put = wait_sliced(py, None, |slice| {
                    match core.put_timeout(item.take().expect("held between slices"), slice) {
                        Ok(outcome) => Some(outcome),
                        Err(full) => {
                            item = Some(full.into_inner());
                            None
                        }
                    }
                })?;
                put.expect("a wait without a deadline ends with its value")
            }
        };
        match outcome {
            Put::Queued => Ok(()),
            Put::Failed(c) => Err(Self::cancel_all(slf, c)),
        }
    }

    /// The next closure: from `tag`'s queue first, then the main queue (then
    /// it counts in flight). None after `timeout` seconds (a real deadline)
    /// or once stopped.
    #[pyo3(signature = (timeout=None, tag=None))]
    fn get(&self, py: Python<'_>, timeout: Option<f64>, tag: Option<i64>) -> PyResult<Option<Py<PyAny>>> {
        let tag = tag.as_ref();
        match self.core.try_get(tag) {
            Ok(item) => return Ok(Some(item)),
            Err(GetError::Stopped) => return Ok(None),
            Err(GetError::Timeout) => {}
        }
        let got = wait_sliced(py, threading_deadline(timeout), |slice| match self.core.get_timeout(tag, slice) {
            Ok(item) => Some(Some(item)),
            Err(GetError::Stopped) => Some(None),
            Err(GetError::Timeout) => None,
        })?;
        Ok(got.flatten())
    }

    /// Reports a closure a worker took (the subclass names it TensorFlow's
    /// way): `finish()` it finished (`mark_finished`), `finish(e)` it failed
    /// with `e` (`mark_failed`: the first error is kept and wakes `wait()`),
    /// `finish(put_back=closure)` it goes back to the tail of the main queue
    /// (`put_back`; marked cancelled instead when an error is pending).
    /// AssertionError when nothing is in flight, or for a tagged closure put
    /// back. `finish(e, in_flight=False)`: a worker thread stopped outside
    /// a closure; `e` becomes the pending error all the same, so that the
    /// next put, `wait()` or `done()` raises it.
    #[pyo3(signature = (error=None, *, put_back=None, in_flight=true))]
    fn finish(&self, py: Python<'_>, error: Option<Py<PyAny>>, put_back: Option<Bound<'_, PyAny>>, in_flight: bool) -> PyResult<()> {
        let outcome = match (error, put_back) {
            // The hot path (every closure that ran): straight to the core.
            (None, None) => return Ok(self.core.mark_finished()?),
            (Some(e), None) if in_flight => Outcome::Failed(e),
            (Some(e), None) => Outcome::Stopped(e),
            (None, Some(closure)) if closure.getattr(intern!(py, "tag"))?.is_none() => Outcome::PutBack(closure.unbind()),
            _ => return Err(errors::assertion()),
        };
        match self.core.finish(outcome)? {
            PutBack::Queued => Ok(()),
            PutBack::Cancel { item, slot } => {
                let marked = item.call_method0(py, intern!(py, "mark_cancelled"));
                drop(slot);
                marked.map(drop)
            }
        }
    }

    /// Blocks until nothing is queued or in flight (True), or `timeout`
    /// seconds pass (False; ≤ 0: no wait, `done()`), or raises the pending
    /// error after cancelling what is queued. Untagged puts wait meanwhile.
    #[pyo3(signature = (timeout=None))]
    fn wait(slf: &Bound<'_, Self>, timeout: Option<f64>) -> PyResult<bool> {
        let py = slf.py();
        let deadline = threading_deadline(timeout);
        let mut waiter = slf.get().core.waiter();
        let settled = match waiter.try_wait() {
            Ok(settled) => Some(settled),
            Err(_) => wait_sliced(py, deadline, |slice| waiter.wait_timeout(slice).ok())?,
        };
        match settled {
            None => Ok(false),
            Some(Settled::Done) => Ok(true),
            Some(Settled::Failed(c)) => Err(Self::cancel_all(slf, c)),
        }
    }

    /// Every get, blocked or later, returns None.
    fn stop(&self) {
        self.core.stop();
    }

    /// Drops the closures queued under `tag` (not cancelled, as TensorFlow's).
    fn clear_tag_unlocked(&self, tag: i64) {
        drop(self.core.clear_tag(&tag));
    }

    /// Closures taken from the main queue and not yet reported. Settable, as
    /// TensorFlow's (its tests add 1 to hold a `join()` open).
    #[getter]
    fn inflight_closure_count(&self) -> usize {
        self.core.inflight()
    }

    #[setter]
    fn set_inflight_closure_count(&self, count: usize) {
        self.core.set_inflight(count);
    }

    /// The pending error (TensorFlow's `_error`, which its fault-tolerance
    /// tests poll): what the next put, wait or done raises; None when there
    /// is none.
    #[getter]
    fn _error(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        // A new reference, taken under the queue's lock; no Python runs.
        self.core.with_error(|e| e.map(|e| e.clone_ref(py)))
    }

    /// Closures in the main queue (a worker held softly takes one while it
    /// is full; the coordinator's save counts them).
    fn qsize(&self) -> usize {
        self.core.queued()
    }

    /// Moves `closures` (those of them in the main queue) to its head, in the
    /// order given; returns how many were moved. Closures are told apart by
    /// identity, under the queue's lock, with no Python run there.
    fn promote(&self, closures: Vec<Py<PyAny>>) -> usize {
        let rank: std::collections::HashMap<usize, usize> = closures.iter().enumerate().map(|(i, c)| (c.as_ptr() as usize, i)).collect();
        self.core.promote(|item| rank.get(&(item.as_ptr() as usize)).copied())
    }

    /// The closures queued now (the main queue, then each tag's), as a new
    /// list: references taken under the queue's lock, no Python run there.
    fn queued_closures(&self, py: Python<'_>) -> Vec<Py<PyAny>> {
        let mut found = Vec::new();
        self.core.visit(|item| found.push(item.clone_ref(py)));
        found
    }

    /// Seconds a worker thread of this package waits on `get`, or on its
    /// holds, before it looks at its holds again (`held`: None on the queue,
    /// True on a strict hold, False on a hold that lets it take a closure
    /// while the queue is full).
    #[staticmethod]
    #[pyo3(signature = (held=None))]
    fn poll_timeout(held: Option<bool>) -> f64 {
        core::worker_poll_timeout(held).as_secs_f64()
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        self.core.try_visit(|item| visit.call(item), |error| visit.call(error)).map(drop)
    }

    fn __clear__(&self) {
        drop(self.core.take_all());
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyClosureQueue>()?;
    // TF's `_CLOSURE_QUEUE_MAX_SIZE`: the queue's default capacity, on the queue.
    m.py().get_type::<PyClosureQueue>().setattr("MAX_SIZE", DEFAULT_CAPACITY)?;
    Ok(())
}
