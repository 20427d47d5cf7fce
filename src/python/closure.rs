//! `Closure` and `Completions`: what the coordinator allocates per
//! `schedule()`, at the least cost to the cyclic garbage collector.
//!
//! Why two objects per `schedule()` rather than TensorFlow's twenty is told in
//! `docs/how-it-works.md` ("Two objects per `schedule()`"). Here a
//! `schedule()` leaves this module's `Closure` and the `RemoteValue`
//! (TensorFlow's class, `_coordinator.remote_values.ClosureRemoteValue`), which
//! needs no event or lock of its own: its waiters wait on the one
//! [`PyCompletions`] counter of the process.
//!
//! `Closure` is tracked, with `__traverse__` and `__clear__`: it holds the
//! user's arguments, and a cycle through them (an error whose traceback holds
//! a frame that holds the closure, a per-worker resource whose error is that
//! error) must stay collectable.
//!
//! The closure's behaviour is the Python side's (`_coordinator.function_cache._Entry`, the
//! entry of the concrete-function cache the closure was made from): the
//! closure only holds the data TensorFlow's `Closure` holds, under
//! TensorFlow's attribute names, and its output `RemoteValue`. TensorFlow
//! holds that `RemoteValue` through a weak reference (one more tracked object);
//! this closure holds it strongly until the closure is finished, and answers
//! "is it still wanted" from the reference count, as the weak reference would
//! have: a `RemoteValue` the caller dropped is neither filled nor fetched.
//!
//! No Python object is dropped and no Python code runs while a Rust lock is
//! held: references are cloned or taken out under the lock and used after.

use std::sync::atomic::{AtomicI64, Ordering};

use parking_lot::{Condvar, Mutex};
use pyo3::gc::PyVisit;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple, PyWeakrefReference};
use pyo3::{ffi, intern, PyTraverseError};

use super::blocking::{threading_deadline, wait_sliced};
use super::errors;

// ----------------------------------------------------------------------------- Closure

/// `obj`'s reference count.
fn refcount(obj: &Py<PyAny>) -> ffi::Py_ssize_t {
    // SAFETY: `obj` is a live object; reading its count has no precondition.
    unsafe { ffi::Py_REFCNT(obj.as_ptr()) }
}

/// Where the closure's output `RemoteValue` is.
enum Output {
    /// `build_output_remote_value()` was not called.
    NotBuilt,
    /// Built, and held until the closure is finished (values or error set,
    /// or cancelled).
    Held(Py<PyAny>),
    /// Finished: the closure no longer holds it.
    Released,
}

/// Everything the closure refers to; `None` once `__clear__` ran.
struct Refs {
    entry: Py<PyAny>,
    function: Py<PyAny>,
    args: Py<PyAny>,
    /// None for no keyword arguments: `_kwargs` then makes TensorFlow's `{}`
    /// when read, so a call without them allocates no dict.
    kwargs: Option<Py<PyAny>>,
    tag: Option<Py<PyAny>>,
    output: Output,
}

/// A scheduled function call: TensorFlow's `Closure` as data, made from a
/// cache entry of `tf_failure_handling._coordinator.function_cache` (which runs it).
#[pyclass(frozen, name = "Closure", module = "tf_failure_handling._native")]
pub struct PyClosure {
    refs: Mutex<Option<Refs>>,
    /// The index of the `PreemptionCheckpointHandler.run()` that scheduled
    /// it (its run count then), -1 for a closure scheduled outside a run
    /// (`_tfh_run`; set by the coordinator before it queues the closure).
    run: AtomicI64,
}

impl PyClosure {
    /// A new reference to one field (None after `__clear__`).
    fn field(&self, py: Python<'_>, pick: impl FnOnce(&Refs) -> &Py<PyAny>) -> Py<PyAny> {
        self.refs.lock().as_ref().map_or_else(|| py.None(), |r| pick(r).clone_ref(py))
    }

    /// An attribute of the cache entry (TensorFlow's closure attributes that
    /// every closure of one entry shares).
    fn entry_attr<'py>(&self, py: Python<'py>, name: &Bound<'py, pyo3::types::PyString>) -> PyResult<Bound<'py, PyAny>> {
        self.field(py, |r| &r.entry).into_bound(py).getattr(name)
    }

    /// The output `RemoteValue` if it is held and anything besides this
    /// closure refers to it (what TensorFlow's weak reference would give).
    fn wanted_output(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        let refs = self.refs.lock();
        match refs.as_ref().map(|r| &r.output) {
            Some(Output::Held(rv)) if refcount(rv) > 1 => Some(rv.clone_ref(py)),
            _ => None,
        }
    }

    /// Releases the output `RemoteValue`; returns it if anything else still
    /// refers to it.
    fn release_output(&self) -> Option<Py<PyAny>> {
        let taken = {
            let mut refs = self.refs.lock();
            match refs.as_mut() {
                Some(r) if matches!(r.output, Output::Held(_)) => std::mem::replace(&mut r.output, Output::Released),
                _ => Output::Released,
            }
        };
        match taken {
            // Ours is the only reference: dropping it (after the lock) frees it.
            Output::Held(rv) if refcount(&rv) > 1 => Some(rv),
            _ => None,
        }
    }
}

#[pymethods]
impl PyClosure {
    /// A closure of `entry` (a `_coordinator.function_cache._Entry`) on `args`/`kwargs`
    /// (None: none, as TensorFlow's `args or ()`), whose function runs
    /// under `cancellation_mgr` (`entry.cancelable_function(cancellation_mgr)`).
    #[new]
    #[pyo3(signature = (entry, cancellation_mgr, args=None, kwargs=None))]
    fn new<'py>(
        entry: Bound<'py, PyAny>,
        cancellation_mgr: Bound<'py, PyAny>,
        args: Option<Bound<'py, PyAny>>,
        kwargs: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Self> {
        let py = entry.py();
        let function = entry.call_method1(intern!(py, "cancelable_function"), (cancellation_mgr,))?;
        let args = match args {
            Some(a) if a.is_truthy()? => a,
            _ => PyTuple::empty(py).into_any(),
        };
        let kwargs = match kwargs {
            Some(k) if k.is_truthy()? => Some(k.unbind()),
            _ => None,
        };
        Ok(PyClosure {
            refs: Mutex::new(Some(Refs {
                entry: entry.unbind(),
                function: function.unbind(),
                args: args.unbind(),
                kwargs,
                tag: None,
                output: Output::NotBuilt,
            })),
            run: AtomicI64::new(-1),
        })
    }

    /// The `RemoteValue` the closure's outputs go to (TensorFlow's; made by
    /// the entry). ValueError the second time, as TensorFlow.
    fn build_output_remote_value(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let entry = {
            let refs = self.refs.lock();
            match refs.as_ref() {
                Some(r) if matches!(r.output, Output::NotBuilt) => r.entry.clone_ref(py),
                _ => return Err(built_twice()),
            }
        };
        let rv = entry.call_method0(py, intern!(py, "new_remote_value"))?;
        let mut refs = self.refs.lock();
        match refs.as_mut() {
            Some(r) if matches!(r.output, Output::NotBuilt) => {
                r.output = Output::Held(rv.clone_ref(py));
                Ok(rv)
            }
            _ => {
                drop(refs);
                Err(built_twice())
            }
        }
    }

    /// The output `RemoteValue` while the closure holds it and its caller
    /// still refers to it, else None.
    fn _output_remote_value(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.wanted_output(py)
    }

    /// Finishes the closure with error `e`: the output `RemoteValue` (if
    /// still wanted) gets it through `_set_error(e)`, and the closure lets
    /// the `RemoteValue` go (an error's traceback may refer to the closure).
    fn _set_output_error(&self, py: Python<'_>, e: Bound<'_, PyAny>) -> PyResult<()> {
        match self.release_output() {
            Some(rv) => rv.call_method1(py, intern!(py, "_set_error"), (e,)).map(drop),
            None => Ok(()),
        }
    }

    /// Lets the output `RemoteValue` go (the closure succeeded; its values
    /// are set).
    fn _release_output_remote_value(&self) {
        drop(self.release_output());
    }

    /// TensorFlow's `Closure.mark_cancelled`: the output `RemoteValue`, if
    /// still wanted, gets TensorFlow's `CancelledError`.
    fn mark_cancelled(&self, py: Python<'_>) -> PyResult<()> {
        match self.release_output() {
            Some(rv) => rv.call_method0(py, intern!(py, "_mark_cancelled")).map(drop),
            None => Ok(()),
        }
    }

    /// TensorFlow's `Closure.maybe_call_with_output_remote_value`.
    fn maybe_call_with_output_remote_value(&self, py: Python<'_>, method: Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        match self.wanted_output(py) {
            Some(rv) => Ok(method.call1((rv,))?.unbind()),
            None => Ok(py.None()),
        }
    }

    /// Runs the closure on `worker` and sets its outputs (TensorFlow's
    /// `execute_on`; the entry's `execute_on` does it).
    fn execute_on(slf: &Bound<'_, Self>, worker: Bound<'_, PyAny>) -> PyResult<()> {
        let py = slf.py();
        let entry = slf.get().field(py, |r| &r.entry);
        entry.call_method1(py, intern!(py, "execute_on"), (slf, worker)).map(drop)
    }

    /// A weak reference to the output `RemoteValue` while the closure holds
    /// it, else None (TensorFlow's attribute; here only for code that reads it).
    #[getter]
    fn _output_remote_value_ref<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let held = {
            let refs = self.refs.lock();
            match refs.as_ref().map(|r| &r.output) {
                Some(Output::Held(rv)) => Some(rv.clone_ref(py)),
                _ => None,
            }
        };
        held.map(|rv| PyWeakrefReference::new(rv.bind(py)).map(Bound::into_any)).transpose()
    }

    /// The cache entry the closure was made from.
    /// The index of the handler's `run()` that scheduled this closure, or
    /// None (scheduled outside a run).
    #[getter]
    fn _tfh_run(&self) -> Option<i64> {
        let run = self.run.load(Ordering::Relaxed);
        (run >= 0).then_some(run)
    }

    #[setter(_tfh_run)]
    fn set_run(&self, run: Option<i64>) {
        self.run.store(run.filter(|r| *r >= 0).unwrap_or(-1), Ordering::Relaxed);
    }

    #[getter]
    fn _entry(&self, py: Python<'_>) -> Py<PyAny> {
        self.field(py, |r| &r.entry)
    }

    /// What the worker calls: the concrete function wrapped by the
    /// cancellation manager (replaceable, as TensorFlow's attribute).
    #[getter]
    fn _function(&self, py: Python<'_>) -> Py<PyAny> {
        self.field(py, |r| &r.function)
    }

    #[setter(_function)]
    fn set_function(&self, function: Py<PyAny>) {
        let old = self.refs.lock().as_mut().map(|r| std::mem::replace(&mut r.function, function));
        drop(old);
    }

    #[getter]
    fn _args(&self, py: Python<'_>) -> Py<PyAny> {
        self.field(py, |r| &r.args)
    }

    #[getter]
    fn _kwargs(&self, py: Python<'_>) -> Py<PyAny> {
        let kwargs = self.refs.lock().as_ref().and_then(|r| r.kwargs.as_ref().map(|k| k.clone_ref(py)));
        kwargs.unwrap_or_else(|| PyDict::new(py).into_any().unbind())
    }

    #[getter]
    fn _concrete_function<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.entry_attr(py, intern!(py, "concrete_function"))
    }

    #[getter]
    fn _output_type_spec<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.entry_attr(py, intern!(py, "output_type_spec"))
    }

    /// Where the `PerWorkerValues` are among the arguments (see
    /// `_coordinator.function_cache.argument_key`); None: TensorFlow's slice selection.
    #[getter]
    fn _per_worker<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.entry_attr(py, intern!(py, "per_worker"))
    }

    /// The queue's tag (a worker index, or None), set by `ClosureQueue.put`.
    #[getter]
    fn tag(&self, py: Python<'_>) -> Py<PyAny> {
        self.refs
            .lock()
            .as_ref()
            .and_then(|r| r.tag.as_ref().map(|t| t.clone_ref(py)))
            .unwrap_or_else(|| py.None())
    }

    #[setter]
    fn set_tag(&self, tag: Option<Py<PyAny>>) {
        let old = self.refs.lock().as_mut().map(|r| std::mem::replace(&mut r.tag, tag));
        drop(old);
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        // The collector runs attached, on a thread that holds no closure's
        // lock (no Python runs under it); try_lock only guards against a bug.
        let Some(refs) = self.refs.try_lock() else { return Ok(()) };
        if let Some(r) = refs.as_ref() {
            visit.call(&r.entry)?;
            visit.call(&r.function)?;
            visit.call(&r.args)?;
            if let Some(kwargs) = &r.kwargs {
                visit.call(kwargs)?;
            }
            if let Some(tag) = &r.tag {
                visit.call(tag)?;
            }
            if let Output::Held(rv) = &r.output {
                visit.call(rv)?;
            }
        }
        Ok(())
    }

    fn __clear__(&self) {
        let taken = self.refs.lock().take();
        drop(taken);
    }
}

// ----------------------------------------------------------------------------- Completions

/// A count of completions that threads can wait on: one per process, for the
/// `RemoteValue`s of `_coordinator.remote_values` (a waiter reads the count, checks its
/// `RemoteValue`, and waits for the count to move; a completion sets the
/// `RemoteValue`, then advances the count).
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

    /// The count now.
    fn count(&self) -> u64 {
        *self.count.lock()
    }

    /// One more completion: wakes every waiter.
    fn advance(&self) {
        let mut count = self.count.lock();
        *count = count.wrapping_add(1);
        drop(count);
        self.advanced.notify_all();
    }

    /// Blocks until the count differs from `seen` (True) or `timeout` seconds
    /// pass (False; None: no limit, ≤ 0: no wait). Releases the GIL; on the
    /// main thread it answers Ctrl-C.
    #[pyo3(signature = (seen, timeout=None))]
    fn wait(&self, py: Python<'_>, seen: u64, timeout: Option<f64>) -> PyResult<bool> {
        if *self.count.lock() != seen {
            return Ok(true);
        }
        let moved = wait_sliced(py, threading_deadline(timeout), |slice| {
            let mut count = self.count.lock();
            if *count == seen {
                self.advanced.wait_for(&mut count, slice);
            }
            (*count != seen).then_some(())
        })?;
        Ok(moved.is_some())
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyClosure>()?;
    m.add_class::<PyCompletions>()?;
    Ok(())
}

/// `ValueError`, as TensorFlow's `Closure.build_output_remote_value` raises it.
fn built_twice() -> PyErr {
    errors::bad_value("The output of the Closure cannot be built more than once.")
}
