//! `ClosureQueue`: [`crate::closure_queue::ClosureQueue`] for Python, with
//! TensorFlow's `_CoordinatedClosureQueue` interface. Closures and errors are
//! opaque Python objects; tags are ints (TensorFlow's worker indices).
//!
//! Fast path: an operation that does not have to wait runs attached, with
//! one uncontended lock (its holders never wait for the GIL, so taking it
//! attached cannot deadlock). Only an operation that must block detaches, for
//! at most [`SLICE`] at a time, then runs pending signal handlers (Ctrl-C)
//! and checks its deadline.
//!
//! Cancellation follows the core's two phases; the Python side is reached
//! through two hook methods that the shim's subclass overrides (here they do
//! nothing): `_start_cancel()` before waiting for in-flight closures, and
//! `_cancel_done()` after the queued closures are marked cancelled.
//!
//! No Python object is dropped and no Python code runs under the core's lock:
//! the core hands back every closure or error it lets go of.

use pyo3::gc::PyVisit;
use pyo3::prelude::*;
use pyo3::{intern, PyTraverseError};

use super::blocking::{self, next_slice, threading_deadline, SLICE};
use super::errors;
use crate::closure_queue::{Cancellation, ClosureQueue, Done, GetError, Put, PutBack, Settled, DEFAULT_CAPACITY};

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
    /// Runs a cancellation to its end and returns the exception to raise:
    /// the pending error (the same object `mark_failed` received), or the
    /// first exception a hook or a `mark_cancelled()` raised.
    fn cancel_all(slf: &Bound<'_, Self>, mut cancellation: CoreCancellation<'_>) -> PyErr {
        let py = slf.py();
        // Phase 2: abort running closures; no Rust lock held.
        if let Err(e) = slf.call_method0(intern!(py, "_start_cancel")) {
            return e; // Abandoned: the error stays pending.
        }
        // Phase 3: wait for in-flight closures, in slices.
        let cancelled = loop {
            match blocking::detach(py, || cancellation.finish_timeout(SLICE)) {
                Ok(c) => break c,
                Err(_) => {
                    if let Err(e) = py.check_signals() {
                        return e;
                    }
                }
            }
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
        if let Err(e) = slf.call_method0(intern!(py, "_cancel_done")) {
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
                let mut item = full.into_inner();
                loop {
                    match blocking::detach(py, || core.put_timeout(item, SLICE)) {
                        Ok(outcome) => break outcome,
                        Err(full) => item = full.into_inner(),
                    }
                    py.check_signals()?;
                }
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
        let deadline = threading_deadline(timeout);
        loop {
            let Some(slice) = next_slice(deadline) else { return Ok(None) };
            match blocking::detach(py, || self.core.get_timeout(tag, slice)) {
                Ok(item) => return Ok(Some(item)),
                Err(GetError::Stopped) => return Ok(None),
                Err(GetError::Timeout) => py.check_signals()?,
            }
        }
    }

    /// Reports an in-flight closure as finished; AssertionError when none is.
    fn mark_finished(&self) -> PyResult<()> {
        Ok(self.core.mark_finished()?)
    }

    /// Returns an in-flight closure to the tail of the main queue, or marks
    /// it cancelled when an error is pending. AssertionError when nothing is
    /// in flight or the closure is tagged.
    fn put_back(&self, closure: Bound<'_, PyAny>) -> PyResult<()> {
        let py = closure.py();
        if !closure.getattr(intern!(py, "tag"))?.is_none() {
            return Err(errors::assertion());
        }
        match self.core.put_back(closure.unbind())? {
            PutBack::Queued => Ok(()),
            PutBack::Cancel { item, slot } => {
                let marked = item.call_method0(py, intern!(py, "mark_cancelled"));
                drop(slot);
                marked.map(drop)
            }
        }
    }

    /// Reports an in-flight closure as failed with `e` (the first error is
    /// kept) and wakes `wait()`. AssertionError when nothing is in flight.
    fn mark_failed(&self, e: Py<PyAny>) -> PyResult<()> {
        Ok(self.core.mark_failed(e)?)
    }

    /// Makes `e` the pending error (the first is kept) without an in-flight
    /// closure: a worker thread that stopped outside a closure reports it so
    /// that the next put, `wait()` or `done()` raises it.
    fn _fail(&self, e: Py<PyAny>) {
        self.core.fail(e);
    }

    /// Blocks until nothing is queued or in flight (True), or `timeout`
    /// seconds pass (False), or raises the pending error after cancelling
    /// what is queued. Untagged puts wait meanwhile.
    #[pyo3(signature = (timeout=None))]
    fn wait(slf: &Bound<'_, Self>, timeout: Option<f64>) -> PyResult<bool> {
        let py = slf.py();
        let deadline = threading_deadline(timeout);
        let mut waiter = slf.get().core.waiter();
        let mut settled = waiter.try_wait();
        loop {
            if let Ok(s) = settled {
                return match s {
                    Settled::Done => Ok(true),
                    Settled::Failed(c) => Err(Self::cancel_all(slf, c)),
                };
            }
            let Some(slice) = next_slice(deadline) else { return Ok(false) };
            settled = blocking::detach(py, || waiter.wait_timeout(slice));
            if settled.is_err() {
                py.check_signals()?;
            }
        }
    }

    /// True when nothing is queued or in flight; raises the pending error
    /// (after cancelling what is queued) like TensorFlow.
    fn done(slf: &Bound<'_, Self>) -> PyResult<bool> {
        match slf.get().core.done() {
            Done::Yes => Ok(true),
            Done::No => Ok(false),
            Done::Failed(c) => Err(Self::cancel_all(slf, c)),
        }
    }

    /// Every get, blocked or later, returns None.
    fn stop(&self) {
        self.core.stop();
    }

    /// Drops the closures queued under `tag` (TensorFlow's
    /// `clear_tag_unlocked`; they are not cancelled).
    fn clear_tag(&self, tag: i64) {
        drop(self.core.clear_tag(&tag));
    }

    /// Closures taken from the main queue and not yet reported.
    #[getter]
    fn inflight_closure_count(&self) -> usize {
        self.core.inflight()
    }

    /// Sets the count `wait()` and a cancellation wait for (TensorFlow's
    /// setter, which its tests use to hold a `join()` open).
    #[setter]
    fn set_inflight_closure_count(&self, count: usize) {
        self.core.set_inflight(count);
    }

    /// The pending error (TensorFlow's `_error`): what the next put, wait
    /// or done raises; None when there is none.
    #[getter]
    fn _error(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        // A new reference, taken under the queue's lock; no Python runs.
        self.core.with_error(|e| e.map(|e| e.clone_ref(py)))
    }

    /// Whether `stop()` was called (every get returns None).
    #[getter]
    fn stopped(&self) -> bool {
        self.core.is_stopped()
    }

    /// Closures in the main queue.
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

    /// Hook: called before waiting for in-flight closures when cancelling.
    fn _start_cancel(&self) {}

    /// Hook: called after queued closures were marked cancelled.
    fn _cancel_done(&self) {}

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        self.core.try_visit(|item| visit.call(item), |error| visit.call(error)).map(drop)
    }

    fn __clear__(&self) {
        drop(self.core.take_all());
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyClosureQueue>()?;
    m.add("CLOSURE_QUEUE_MAX_SIZE", DEFAULT_CAPACITY)?;
    Ok(())
}
