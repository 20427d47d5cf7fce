//! `HandlerCore`: the native base of `PreemptionCheckpointHandler`.
//!
//! It holds the hot path, `run()`, and the [`Resolver`]. With nothing going
//! on, `run()` reads the clock once and takes one mutex for the step-time
//! sample, loads two atomics (a notice or an agreed step needs attention; a
//! background thread left an error), calls the user's function and counts
//! the run. Anything else goes to Python methods of the shim
//! (`_run_check`, `_run_failed`), which ask the [`Resolver`] through the
//! handler's [`ProtocolCore`] what to do and perform it against TensorFlow.
//!
//! `run()` is not a PyO3 method but a raw `METH_FASTCALL` function
//! ([`run_fastcall`]), for one reason: a daemon thread that CPython ends
//! during finalization (`pthread_exit`, when it re-takes the GIL inside the
//! user's step or a coordination call) unwinds its stack, and PyO3's
//! trampoline beneath that Python code catches the forced unwind and aborts
//! the process ("FATAL: exception not rethrown", exit 134 instead of the 42
//! it asked for). [`run_fastcall`] is `extern "C-unwind"`, has no
//! `catch_unwind`, and holds only raw pointers and plain values while Python
//! runs, so a forced unwind passes through it untouched. It must not panic:
//! it calls nothing that can.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use pyo3::{ffi, intern, Borrowed};

use super::clock;
use super::errors;
use super::retry::{Retry, RetryVerdict, WriteCall, WriteKind};
use crate::grace::Fit;
use crate::protocol::{Config, ConfigError, Protocol, SetCall};
use crate::shares::Waiter;
use crate::step_resolution::{self as core, Notice, Round};

/// What to do about a termination notice (`ProtocolCore.notice`).
#[pyclass(frozen, module = "tf_failure_handling._native")]
pub enum NoticeAction {
    /// Local mode, or a worker that already won the claim: lead the response.
    Lead {},
    /// Claim `key` (TERMINATED_WORKER) with `value` (this worker's id); the
    /// outcome goes back through `ProtocolCore.claim`.
    Claim { key: String, value: String },
    /// A tighter deadline while a notice is being handled: the final round is
    /// planned for it from now on; nothing to write.
    Replan {},
    /// A notice is already being handled (or was, and the handler exited),
    /// and this one ends no earlier: absorbed.
    Absorb {},
}

/// What to do before the next step (`ProtocolCore.before_step`).
#[pyclass(frozen, module = "tf_failure_handling._native")]
pub enum StepAction {
    /// Nothing to do: run the step.
    Proceed {},
    /// This worker leads: publish `round_key` = `step`, write its own
    /// `own_ack_key` (None in local mode), and wait for every key in `ack_keys`.
    Publish {
        round_key: String,
        step: u64,
        ack_keys: Vec<String>,
        own_ack_key: Option<String>,
    },
    /// The agreed `step` of `round_key` is reached: save now.
    Save { round_key: String, step: u64 },
}

/// What to do with a step key a leader published (`ProtocolCore.step_key`).
#[pyclass(frozen, module = "tf_failure_handling._native")]
pub enum KeyAction {
    /// Write `ack_key`; then watch `next_round_key` (the final round), if any.
    Acknowledge { ack_key: String, next_round_key: Option<String> },
    /// `STOP_WATCHER`: the protocol is over for this watcher.
    Stop {},
}

/// What the leader waiting for acknowledgements does next (`ProtocolCore.ack_next`).
#[pyclass(frozen, module = "tf_failure_handling._native")]
pub enum AckStep {
    /// Read `key` for at most `timeout` seconds.
    Read { key: String, timeout: f64 },
    /// Every worker acknowledged.
    Done {},
    /// The peer timeout passed with the `missing` keys unwritten.
    Over { missing: Vec<String> },
}

/// What follows a save (`ProtocolCore.saved`).
#[pyclass(frozen, eq, eq_int, module = "tf_failure_handling._native")]
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum SaveAction {
    /// Clean up and call `exit_fn`.
    Exit,
    /// Keep training until the final round of the grace period.
    Countdown,
}

pub(crate) fn round_from_key(key: &str) -> PyResult<Round> {
    match key {
        k if k == Round::Initial.key() => Ok(Round::Initial),
        k if k == Round::Final.key() => Ok(Round::Final),
        other => Err(errors::bad_value(format!("{other:?} is not a step key"))),
    }
}

/// A refusal of the core's [`Protocol`], as TensorFlow's error types say it.
fn refused(e: ConfigError) -> PyErr {
    match e {
        ConfigError::NotConfigured => errors::misuse(e.to_string()),
        _ => errors::bad_value(e.to_string()),
    }
}

/// What `HandlerCore` (the hot path) and its [`ProtocolCore`] (the decisions the
/// handler's parts ask for) share: the flags `run()` reads and the resolver.
struct Shared {
    /// Mirrors [`Resolver::needs_attention`]; the only thing `run()` reads
    /// when nothing is going on.
    attention: AtomicBool,
    /// Set when a background thread of the handler has something the next
    /// step must see (an error it met): `run()` then takes the slow path.
    pending: AtomicBool,
    /// TensorFlow's `_run_counter`: completed `run()` calls, restored from
    /// the checkpoint.
    run_counter: AtomicU64,
    /// The thread (`threading.get_ident()`) that called `run()` last, 0
    /// before the first: the training thread, whose waits on a result may
    /// make the step's checks. Its [`IN_RUN`] bit is set while that `run()`
    /// calls its function: a `ClusterCoordinator.schedule()` made then
    /// schedules one of the handler's runs, which the run count counts. One
    /// word, two plain stores per `run()` (no read-modify-write on the hot
    /// path; two threads in `run()` at once are not supported anyway).
    run_thread: AtomicU64,
    /// The protocol: resolver, planner, step timing and every bound from them.
    state: Mutex<Protocol>,
}

/// Native base of `PreemptionCheckpointHandler`.
#[pyclass(frozen, subclass, module = "tf_failure_handling._native")]
pub struct HandlerCore {
    shared: Arc<Shared>,
}

/// The handler's decisions, for the parts of the handler that perform them: the
/// same resolver as its `HandlerCore`, without the handler (`_protocol_core()`).
#[pyclass(frozen, module = "tf_failure_handling._native")]
pub struct ProtocolCore {
    shared: Arc<Shared>,
}

impl Shared {
    /// A step starts now: one clock read per call ([`Protocol::step_started`]
    /// times the interval between consecutive starts).
    fn step_started(&self) {
        let now = clock::now_secs();
        self.state.lock().step_started(now);
        // A step after an exit guard was armed: its SystemExit was caught and training
        // went on, so no later exit is the one it was armed for.
        super::exit_guard::training_goes_on();
    }

    /// The resolver's answer to `notice`, in the binding's words.
    fn notice(&self, notice: Notice) -> PyResult<NoticeAction> {
        let outcome = self.with_protocol(|p| p.handle_notice(notice).map_err(refused))?;
        Ok(match outcome {
            core::NoticeAction::Lead => NoticeAction::Lead {},
            core::NoticeAction::Claim { key, value } => NoticeAction::Claim {
                key: key.to_string(),
                value,
            },
            core::NoticeAction::Replan => NoticeAction::Replan {},
            core::NoticeAction::Absorb => NoticeAction::Absorb {},
        })
    }

    /// Runs `f` on the protocol and mirrors whether the next step needs
    /// attention into the flag `run()` reads.
    fn with_protocol<T>(&self, f: impl FnOnce(&mut Protocol) -> PyResult<T>) -> PyResult<T> {
        let mut protocol = self.state.lock();
        let out = f(&mut protocol);
        self.attention.store(protocol.needs_attention(), Ordering::Release);
        out
    }
}

/// `HandlerCore.run(distributed_train_function, *args, **kwargs)`; see the
/// module doc for why it is raw.
///
/// # Safety
///
/// Called by CPython as a `METH_FASTCALL | METH_KEYWORDS` method of
/// `HandlerCore` (the descriptor checks `slf`'s type), with the GIL held.
unsafe extern "C-unwind" fn run_fastcall(
    slf: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    nargs: ffi::Py_ssize_t,
    kwnames: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // SAFETY: CPython calls methods with the GIL held.
    let py = unsafe { Python::assume_attached() };
    if nargs < 1 {
        // `run(distributed_train_function=f, ...)`: the Python signature sorts
        // it out (and raises TF's TypeError when the function is missing).
        let name = intern!(py, "_run_with_keywords").as_ptr();
        // SAFETY: a new reference to the bound method, or NULL with an error.
        let method = unsafe { ffi::PyObject_GetAttr(slf, name) };
        if method.is_null() {
            return std::ptr::null_mut();
        }
        // SAFETY: forwarding our own vectorcall arguments; we own `method`.
        return unsafe {
            let result = vectorcall(method, args, 0, kwnames);
            ffi::Py_DECREF(method);
            result
        };
    }
    // SAFETY: `slf` is a live object for the duration of the call; the
    // method descriptor already checked that it is a HandlerCore.
    let core = unsafe { Borrowed::from_ptr(py, slf).cast_unchecked::<HandlerCore>() }.get();
    let core = &*core.shared;
    core.step_started();
    if core.attention.load(Ordering::Acquire) || core.pending.load(Ordering::Acquire) {
        let name = intern!(py, "_run_check").as_ptr();
        // SAFETY: a method call with owned result, NULL-terminated varargs.
        let checked = unsafe { ffi::PyObject_CallMethodObjArgs(slf, name, std::ptr::null_mut::<ffi::PyObject>()) };
        if checked.is_null() {
            return std::ptr::null_mut();
        }
        // SAFETY: we own the result.
        unsafe { ffi::Py_DECREF(checked) };
    }
    #[allow(clippy::cast_sign_loss)]
    let positional = (nargs - 1) as usize;
    // The function runs on this thread: what it schedules is the handler's
    // (`threading.get_ident()` is `pthread_self()` on the platforms we build for).
    let thread = current_thread();
    let previous = core.run_thread.load(Ordering::Relaxed);
    core.run_thread.store(thread | IN_RUN, Ordering::Relaxed);
    // SAFETY: `args` holds `nargs` positional arguments followed by the
    // keyword values named by `kwnames`; the first is the function.
    let result = unsafe { vectorcall(*args, args.add(1), positional, kwnames) };
    // A run() inside this one's function keeps the outer one in its run.
    let after = if previous == thread | IN_RUN { previous } else { thread };
    core.run_thread.store(after, Ordering::Relaxed);
    if result.is_null() {
        // Only raw pointers live across the Python call below.
        let error = PyErr::fetch(py).into_value(py).into_ptr();
        let name = intern!(py, "_run_failed").as_ptr();
        // SAFETY: a method call with owned result, NULL-terminated varargs;
        // `error` is owned and released after it.
        let raised = unsafe {
            let raised = ffi::PyObject_CallMethodObjArgs(slf, name, error, std::ptr::null_mut::<ffi::PyObject>());
            ffi::Py_DECREF(error);
            raised
        };
        if !raised.is_null() {
            // SAFETY: we own `raised`, the exception to raise.
            PyErr::from_value(unsafe { Bound::from_owned_ptr(py, raised) }).restore(py);
        }
        return std::ptr::null_mut();
    }
    core.run_counter.fetch_add(1, Ordering::Relaxed);
    result
}

/// The bit of [`Shared::run_thread`] set while `run()` calls its function
/// (thread ids are `pthread_t` addresses, aligned: their low bit is free).
const IN_RUN: u64 = 1;

/// This thread's id as Python's `threading.get_ident()` gives it.
fn current_thread() -> u64 {
    // SAFETY: pthread_self has no precondition.
    #[allow(clippy::useless_conversion)]
    u64::from(unsafe { libc::pthread_self() })
}

/// The signature of `PyObject_Vectorcall` and `PyObject_VectorcallDict`.
#[cfg(feature = "abi3")]
type Vectorcall =
    unsafe extern "C-unwind" fn(*mut ffi::PyObject, *const *mut ffi::PyObject, usize, *mut ffi::PyObject) -> *mut ffi::PyObject;

/// The interpreter's vectorcall entry points, looked up once.
#[cfg(feature = "abi3")]
enum Entry {
    Vectorcall(Vectorcall),
    VectorcallDict(Vectorcall),
    Call,
}

#[cfg(feature = "abi3")]
static VECTORCALL_ENTRY: std::sync::OnceLock<Entry> = std::sync::OnceLock::new();

/// The entry point [`vectorcall`] uses. A std `OnceLock`: its initializer
/// only calls `dlsym` (no Python, no GIL), and [`resolve_vectorcall`] fills
/// it in the module's init anyway (`mod.rs`, "Locks and the GIL").
#[cfg(feature = "abi3")]
fn vectorcall_entry() -> &'static Entry {
    fn lookup(name: &std::ffi::CStr) -> Option<Vectorcall> {
        // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name.
        let symbol = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
        // SAFETY: both names have this signature (PEP 590) in every CPython
        // that exports them; the last argument is kwnames or a kwargs dict.
        (!symbol.is_null()).then(|| unsafe { std::mem::transmute::<*mut libc::c_void, Vectorcall>(symbol) })
    }
    VECTORCALL_ENTRY.get_or_init(|| {
        lookup(c"PyObject_Vectorcall")
            .map(Entry::Vectorcall)
            .or_else(|| lookup(c"PyObject_VectorcallDict").map(Entry::VectorcallDict))
            .unwrap_or(Entry::Call)
    })
}

/// Looks up [`vectorcall`]'s entry point now (the module's init).
pub(crate) fn resolve_vectorcall() {
    #[cfg(feature = "abi3")]
    let _ = vectorcall_entry();
}

/// `PyObject_Vectorcall` (a version-specific build).
///
/// # Safety
///
/// As `PyObject_Vectorcall`: the GIL held, `args` holds `nargs` positional
/// arguments followed by the values of `kwnames` (a tuple of str, or NULL).
#[cfg(not(feature = "abi3"))]
#[inline]
unsafe fn vectorcall(
    callable: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    nargs: usize,
    kwnames: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // SAFETY: the caller's contract.
    unsafe { ffi::PyObject_Vectorcall(callable, args, nargs, kwnames) }
}

/// `PyObject_Vectorcall` in the stable-ABI build (feature `abi3`, the
/// wheel's): the stable ABI has it from 3.12 only, so it is looked up in the
/// running interpreter, which exports it from 3.11; on 3.10 the call goes
/// through `PyObject_VectorcallDict` (exported from 3.9), with the keyword
/// arguments, when there are any, in a dict. Either way the positional
/// arguments are not copied into a tuple.
///
/// # Safety
///
/// As `PyObject_Vectorcall`: the GIL held, `args` holds `nargs` positional
/// arguments followed by the values of `kwnames` (a tuple of str, or NULL).
#[cfg(feature = "abi3")]
unsafe fn vectorcall(
    callable: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    nargs: usize,
    kwnames: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    let entry = vectorcall_entry();
    if let Entry::Vectorcall(f) = entry {
        // SAFETY: the caller's contract.
        return unsafe { f(callable, args, nargs, kwnames) };
    }
    // SAFETY: the caller's contract; every reference created here is released.
    unsafe {
        #[allow(clippy::cast_possible_wrap)]
        let positional = nargs as ffi::Py_ssize_t;
        let mut kwargs = std::ptr::null_mut();
        if !kwnames.is_null() {
            kwargs = ffi::PyDict_New();
            if kwargs.is_null() {
                return std::ptr::null_mut();
            }
            for i in 0..ffi::PyTuple_Size(kwnames) {
                if ffi::PyDict_SetItem(kwargs, ffi::PyTuple_GetItem(kwnames, i), *args.offset(positional + i)) != 0 {
                    ffi::Py_DECREF(kwargs);
                    return std::ptr::null_mut();
                }
            }
        }
        let result = match entry {
            Entry::VectorcallDict(f) => f(callable, args, nargs, kwargs),
            _ => {
                let tuple = ffi::PyTuple_New(positional);
                if tuple.is_null() {
                    std::ptr::null_mut()
                } else {
                    for i in 0..positional {
                        let arg = *args.offset(i);
                        ffi::Py_INCREF(arg);
                        ffi::PyTuple_SetItem(tuple, i, arg);
                    }
                    let result = ffi::PyObject_Call(callable, tuple, kwargs);
                    ffi::Py_DECREF(tuple);
                    result
                }
            }
        };
        if !kwargs.is_null() {
            ffi::Py_DECREF(kwargs);
        }
        result
    }
}

/// A `PyMethodDef` that CPython may point to forever.
struct MethodDef(UnsafeCell<ffi::PyMethodDef>);
// SAFETY: written once here, then only read by CPython under the GIL.
unsafe impl Sync for MethodDef {}

type FastCall =
    unsafe extern "C-unwind" fn(*mut ffi::PyObject, *const *mut ffi::PyObject, ffi::Py_ssize_t, *mut ffi::PyObject) -> *mut ffi::PyObject;

static RUN_DEF: MethodDef = MethodDef(UnsafeCell::new(ffi::PyMethodDef {
    ml_name: c"run".as_ptr(),
    ml_meth: ffi::PyMethodDefPointer {
        // SAFETY: the same ABI; only the unwind annotation differs, and
        // unwinding through `run_fastcall` is what it is defined for.
        PyCFunctionFastWithKeywords: unsafe { std::mem::transmute::<FastCall, ffi::PyCFunctionFastWithKeywords>(run_fastcall) },
    },
    ml_flags: ffi::METH_FASTCALL | ffi::METH_KEYWORDS,
    ml_doc: c"run(distributed_train_function, *args, **kwargs)\n--\n\nRuns the function with preemption and error handling; see PreemptionCheckpointHandler.run.".as_ptr(),
}));

/// The bound on one coordination-service call of the protocol, from the
/// peer timeout ([`crate::step_resolution::write_timeout`]); `announce` for the
/// announce of a notice to `PreemptionWatcher`s.
#[pyfunction]
#[pyo3(signature = (peer_timeout, announce = false))]
pub(crate) fn write_timeout(peer_timeout: f64, announce: bool) -> f64 {
    let write = if announce {
        core::WriteBound::Announce
    } else {
        core::WriteBound::Protocol
    };
    core::write_timeout(peer_timeout, write)
}

/// Puts `run` (a method descriptor over [`run_fastcall`]) on `HandlerCore`.
pub(crate) fn add_run(py: Python<'_>) -> PyResult<()> {
    let ty = py.get_type::<HandlerCore>();
    // SAFETY: a static method definition and HandlerCore's type object.
    let descr = unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyDescr_NewMethod(ty.as_type_ptr(), RUN_DEF.0.get()))? };
    ty.setattr("run", descr)
}

impl Shared {
    fn new() -> Self {
        Shared {
            attention: AtomicBool::new(false),
            pending: AtomicBool::new(false),
            run_counter: AtomicU64::new(0),
            run_thread: AtomicU64::new(0),
            state: Mutex::new(Protocol::new()),
        }
    }

    fn begin_step(&self) -> bool {
        self.step_started();
        self.attention.load(Ordering::Acquire) || self.pending.load(Ordering::Acquire)
    }

    fn set_pending(&self, pending: bool) {
        self.pending.store(pending, Ordering::Release);
    }

    fn after_check(&self) {
        let now = clock::now_secs();
        self.state.lock().checks_done(now);
    }

    fn step_failed(&self) {
        self.state.lock().step_failed();
    }

    fn step_done(&self) {
        self.run_counter.fetch_add(1, Ordering::Relaxed);
    }

    fn set_run_counter(&self, value: &Bound<'_, PyAny>) -> PyResult<()> {
        // Accepts ints and anything with __index__ (numpy integers, which
        // TensorFlow's own counter is); anything else is a TypeError, as
        // operator.index gives.
        // SAFETY: PyNumber_Index returns a new reference or NULL with an
        // exception set, which from_owned_ptr_or_err turns into PyErr.
        let index = unsafe { Bound::from_owned_ptr_or_err(value.py(), pyo3::ffi::PyNumber_Index(value.as_ptr()))? };
        let n: i128 = index.extract()?;
        let n = u64::try_from(n).map_err(|_| errors::bad_value(format!("_run_counter must be a non-negative integer, got {n}")))?;
        self.run_counter.store(n, Ordering::Relaxed);
        Ok(())
    }

    fn configure(&self, worker_id: Option<u32>, num_workers: u32, grace_period: f64, save_at_current_run: bool) -> PyResult<()> {
        let config = Config {
            worker_id,
            num_workers,
            grace_period,
            save_at_current_run,
        };
        self.with_protocol(|p| p.configure(config).map_err(refused))
    }

    fn claim(&self, won: bool) -> PyResult<()> {
        self.with_protocol(|p| p.handle_claim(won).map_err(refused))
    }

    fn step_key(&self, round_key: &str, value: &str) -> PyResult<KeyAction> {
        let round = round_from_key(round_key)?;
        let outcome = self.with_protocol(|p| Ok(p.handle_step_key(round, value).map_err(refused)??))?;
        Ok(match outcome {
            core::KeyAction::Acknowledge { ack_key, next_round } => KeyAction::Acknowledge {
                ack_key,
                next_round_key: next_round.map(|r| r.key().to_string()),
            },
            core::KeyAction::Stop => KeyAction::Stop {},
        })
    }

    fn publish_lost(&self, round_key: &str, value: &str) -> PyResult<()> {
        let round = round_from_key(round_key)?;
        self.with_protocol(|p| Ok(p.handle_publish_lost(round, value).map_err(refused)??))
    }

    fn before_step(&self, now: f64) -> PyResult<StepAction> {
        let runs = self.run_counter.load(Ordering::Relaxed);
        let decision = self.with_protocol(|p| p.before_step(runs, now).map_err(refused))?;
        Ok(match decision {
            core::StepAction::Proceed => StepAction::Proceed {},
            core::StepAction::Publish {
                round,
                step,
                ack_keys,
                own_ack_key,
            } => StepAction::Publish {
                round_key: round.key().to_string(),
                step,
                ack_keys,
                own_ack_key,
            },
            core::StepAction::Save { round, step } => StepAction::Save {
                round_key: round.key().to_string(),
                step,
            },
        })
    }

    fn saved(&self, round_key: &str, duration: f64) -> PyResult<SaveAction> {
        let round = round_from_key(round_key)?;
        let after = self.with_protocol(|p| Ok(p.handle_saved(round, duration).map_err(refused)??))?;
        Ok(match after {
            core::SaveAction::Exit => SaveAction::Exit,
            core::SaveAction::Countdown => SaveAction::Countdown,
        })
    }

    fn save_failed(&self) -> PyResult<()> {
        self.with_protocol(|p| p.handle_save_failed().map_err(refused))
    }

    fn fit(&self, now: f64) -> Option<(&'static str, f64, f64)> {
        let report = self.state.lock().fit(now)?;
        let name = match report.fit {
            Fit::Both => "both",
            Fit::OneSave => "one_save",
            Fit::Neither => "neither",
            Fit::Unknown => "unknown",
        };
        Some((name, report.left, report.needed))
    }

    fn shutdown_keys(&self) -> PyResult<Vec<&'static str>> {
        Ok(self.state.lock().shutdown_keys().map_err(refused)?.to_vec())
    }

    fn round_keys(&self) -> PyResult<Vec<&'static str>> {
        self.state.lock().round_keys().map_err(refused)
    }

    fn has_final_round(&self) -> PyResult<bool> {
        self.state.lock().has_final_round().map_err(refused)
    }

    /// A snapshot for logs and tests: read under the lock, turned into Python
    /// objects after it is released.
    fn snapshot<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let snap = self.state.lock().snapshot();
        let d = PyDict::new(py);
        d.set_item("step_samples", snap.step_samples)?;
        d.set_item("step_estimate", snap.step_estimate)?;
        d.set_item("longest_save", snap.longest_save)?;
        d.set_item("margin", snap.margin)?;
        if let Some(r) = snap.resolver {
            // This worker's own earliest deadline and the final round it plans
            // for it, leading or not: any worker with a notice of its own
            // publishes the final round when its plan is due.
            for (k, v) in [
                ("planned_deadline", r.planned_deadline),
                ("final_round_at", r.final_round_at),
                ("deadline", r.deadline),
            ] {
                if let Some(v) = v {
                    d.set_item(k, v)?;
                }
            }
            d.set_item("id", r.id)?;
            d.set_item("round", r.round)?;
            d.set_item("agreed_step", r.agreed_step)?;
            d.set_item("leading", r.leading)?;
            d.set_item("counting_down", r.counting_down)?;
            d.set_item("exited", r.exited)?;
            d.set_item("published_final", r.published_final)?;
        }
        Ok(d)
    }
}

#[pymethods]
impl HandlerCore {
    #[new]
    #[pyo3(signature = (*_args, **_kwargs))]
    fn new(_args: &Bound<'_, PyTuple>, _kwargs: Option<&Bound<'_, PyDict>>) -> Self {
        HandlerCore {
            shared: Arc::new(Shared::new()),
        }
    }

    /// The decisions of this handler, for its parts (the same resolver; holding it
    /// does not keep the handler alive).
    fn _protocol_core(&self) -> ProtocolCore {
        ProtocolCore {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Completed `run()` calls (TensorFlow's `_run_counter`).
    #[getter(_run_counter)]
    fn get_run_counter(&self) -> u64 {
        self.shared.run_counter.load(Ordering::Relaxed)
    }

    #[setter(_run_counter)]
    fn set_run_counter(&self, value: &Bound<'_, PyAny>) -> PyResult<()> {
        self.shared.set_run_counter(value)
    }

    /// Whether a step key, a leading notice or the countdown needs the
    /// training thread's attention before the next step.
    #[getter(_attention)]
    fn attention(&self) -> bool {
        self.shared.attention.load(Ordering::Acquire)
    }

    /// A snapshot for logs and tests.
    fn _core_state<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.shared.snapshot(py)
    }
}

#[pymethods]
impl ProtocolCore {
    /// A step (a `run()` or `save_checkpoint_if_preempted` call) starts now:
    /// records the step-time sample and returns whether a notice or an
    /// agreed step needs the check before the step.
    fn begin_step(&self) -> bool {
        self.shared.begin_step()
    }

    /// Whether the next step must take the slow path for something other
    /// than the resolver (a background thread's error).
    fn set_pending(&self, pending: bool) {
        self.shared.set_pending(pending)
    }

    /// The check before a step ended (a publish or a save is not step time:
    /// the interval restarts now).
    fn after_check(&self) {
        self.shared.after_check()
    }

    /// The step failed: it is not counted, and not a step duration.
    fn step_failed(&self) {
        self.shared.step_failed()
    }

    /// The step completed: one more run.
    fn step_done(&self) {
        self.shared.step_done()
    }

    /// Completed `run()` calls (TensorFlow's `_run_counter`).
    #[getter]
    fn run_counter(&self) -> u64 {
        self.shared.run_counter.load(Ordering::Relaxed)
    }

    #[setter]
    fn set_run_counter(&self, value: &Bound<'_, PyAny>) -> PyResult<()> {
        self.shared.set_run_counter(value)
    }

    /// The thread whose `run()` is calling its function now (as
    /// `threading.get_ident()`), 0 when none.
    #[getter]
    fn running_thread(&self) -> u64 {
        let word = self.shared.run_thread.load(Ordering::Relaxed);
        if word & IN_RUN == 0 {
            0
        } else {
            word & !IN_RUN
        }
    }

    /// The thread that called `run()` last (as `threading.get_ident()`), 0
    /// before the first `run()`.
    #[getter]
    fn trainer_thread(&self) -> u64 {
        self.shared.run_thread.load(Ordering::Relaxed) & !IN_RUN
    }

    /// Whether a step key, a leading notice or the countdown needs the
    /// training thread's attention before the next step.
    #[getter]
    fn attention(&self) -> bool {
        self.shared.attention.load(Ordering::Acquire)
    }

    /// Sets up the resolver: `worker_id` None for local mode.
    #[pyo3(signature = (worker_id, num_workers, grace_period, save_at_current_run=false))]
    fn configure(&self, worker_id: Option<u32>, num_workers: u32, grace_period: f64, save_at_current_run: bool) -> PyResult<()> {
        self.shared.configure(worker_id, num_workers, grace_period, save_at_current_run)
    }

    /// A termination notice at `now` (with the platform's `deadline`, if it
    /// announced one, on the same clock as `now`): what to do about it.
    #[pyo3(signature = (now, deadline=None))]
    fn notice(&self, now: f64, deadline: Option<f64>) -> PyResult<NoticeAction> {
        self.shared.notice(Notice::stated(now, deadline))
    }

    /// A notice from a source, whose deadline and kill (the moment the platform
    /// stated it ends the process; None: not stated) are Unix times read when the
    /// wall clock said `unix_now` (`Notice::from_unix`: the one conversion).
    #[pyo3(signature = (now, unix_now, unix_deadline=None, unix_kill=None))]
    fn source_notice(&self, now: f64, unix_now: f64, unix_deadline: Option<f64>, unix_kill: Option<f64>) -> PyResult<NoticeAction> {
        self.shared.notice(Notice::from_unix(now, unix_now, unix_deadline, unix_kill))
    }

    /// The platform stated after the notice that it ends this process `left` seconds
    /// after `now` (a SLURM job this handler requeued): `Protocol::handle_platform_end`.
    fn platform_end(&self, now: f64, left: f64) {
        self.shared.state.lock().handle_platform_end(now + left);
    }

    /// Whether this worker won the claim of its notice.
    fn claim(&self, won: bool) -> PyResult<()> {
        self.shared.claim(won)
    }

    /// A step key's value, as the peer watcher read it: what to do.
    ///
    /// # Errors
    ///
    /// `ValueError` for a malformed value or an unknown key.
    fn step_key(&self, round_key: &str, value: &str) -> PyResult<KeyAction> {
        self.shared.step_key(round_key, value)
    }

    /// The decision before a step at `now`.
    fn before_step(&self, now: f64) -> PyResult<StepAction> {
        self.shared.before_step(now)
    }

    /// What still fits before this worker's earliest deadline at `now`:
    /// `("both" | "one_save" | "neither" | "unknown", seconds left, seconds needed)` (the
    /// grace planner's `fit`), or None without a notice.
    fn fit(&self, now: f64) -> Option<(&'static str, f64, f64)> {
        self.shared.fit(now)
    }

    /// This worker's publish of `round_key` found it set by another worker
    /// (`value`, read back): that value is the agreed step.
    ///
    /// # Errors
    ///
    /// `ValueError` for a malformed value or an unknown key.
    fn publish_lost(&self, round_key: &str, value: &str) -> PyResult<()> {
        self.shared.publish_lost(round_key, value)
    }

    /// The save of `round_key` finished after `duration` seconds: what next.
    fn saved(&self, round_key: &str, duration: f64) -> PyResult<SaveAction> {
        self.shared.saved(round_key, duration)
    }

    fn save_failed(&self) -> PyResult<()> {
        self.shared.save_failed()
    }

    /// A publish waited `duration` seconds for every acknowledgement.
    fn agreement(&self, duration: f64) -> PyResult<()> {
        self.shared.state.lock().handle_agreement(duration);
        Ok(())
    }

    /// How long a failing coordination-service call is retried from `now`
    /// (`crate::retry::bound`): the leading notice's deadline, if any, may
    /// shorten it.
    fn retry_bound(&self, now: f64, peer_timeout: f64) -> f64 {
        self.shared.state.lock().retry_bound(now, peer_timeout)
    }

    /// The leader published: it waits for `ack_keys` for at most
    /// `peer_timeout` seconds from now, on the binding's clock (`crate::acks`).
    fn await_acks(&self, ack_keys: Vec<String>, peer_timeout: f64) {
        self.shared.state.lock().start_ack_wait(ack_keys, peer_timeout, clock::now_secs());
    }

    /// What the waiting leader does now: read a key for at most a slice, or
    /// the wait is done, or over (the keys still missing).
    fn ack_next(&self) -> AckStep {
        match self.shared.state.lock().ack_next(clock::now_secs()) {
            crate::acks::AckStep::Read { key, timeout } => AckStep::Read { key, timeout },
            crate::acks::AckStep::Done => AckStep::Done {},
            crate::acks::AckStep::Over { missing } => AckStep::Over { missing },
        }
    }

    /// The read `ack_next` asked for answered: `found` when the key was written.
    fn ack_answered(&self, found: bool) {
        self.shared.state.lock().handle_ack_read(found);
    }

    /// The read failed now: when to read again (`pause`, never past the wait's
    /// end) or give up; a run of failures starting now is retried for the core's
    /// retry bound at `now` (the handler's clock). None with no wait started.
    #[pyo3(signature = (now, peer_timeout, closing = false))]
    fn ack_failed(&self, now: f64, peer_timeout: f64, closing: bool) -> Option<RetryVerdict> {
        let at = clock::now_secs();
        let verdict = self.shared.state.lock().handle_ack_read_failed(now, peer_timeout, at, closing)?;
        Some(RetryVerdict::at(verdict, at))
    }

    /// The run of failed reads still open: `(failed reads, seconds)`, or None
    /// when the last read answered.
    fn ack_failing(&self) -> Option<(u32, f64)> {
        self.shared.state.lock().ack_failing(clock::now_secs())
    }

    /// A run of failures of one blocking protocol call, starting now: retried
    /// for the core's retry bound at `now` (the handler's clock), its pauses on
    /// the binding's clock, as a write's (`push_write`).
    fn retry(&self, now: f64, peer_timeout: f64) -> Retry {
        Retry::starting_now(self.shared.state.lock().retry_bound(now, peer_timeout))
    }

    /// Queues one of the driver's writes: due at once, retried for the core's
    /// retry bound at `now` (the handler's clock), its schedule on the
    /// binding's clock (`Protocol::push_write`); its handle. `RuntimeError`
    /// for a claim or announce while `writes_busy`. `bound` replaces the
    /// core's retry bound: for a test that holds a write's failures open longer
    /// than the rule would (the package never passes it).
    ///
    /// The write sets `key` to `value`, bounded as its kind is (`WriteCall`).
    /// A claim may name the message its announce writes once it is won
    /// (`announce`: `claim_done` queues it); `ValueError` for another kind.
    #[pyo3(signature = (kind, key, value, now, peer_timeout, bound = None, announce = None))]
    #[allow(clippy::too_many_arguments)] // the call, its clocks, and the test's override
    fn push_write(
        &self,
        kind: WriteKind,
        key: &str,
        value: &str,
        now: f64,
        peer_timeout: f64,
        bound: Option<f64>,
        announce: Option<&str>,
    ) -> PyResult<u64> {
        let at = clock::now_secs();
        let call = match (kind, announce) {
            (WriteKind::Claim, Some(message)) => SetCall::claim(key, value, message, peer_timeout),
            (_, None) => SetCall::new(kind.into(), key, value, peer_timeout),
            (_, Some(_)) => return Err(errors::bad_value("only a claim is followed by an announce")),
        };
        let mut protocol = self.shared.state.lock();
        Ok(match bound {
            None => protocol.push_write(call, now, peer_timeout, at)?,
            Some(bound) => protocol.push_write_bounded(call, bound, at)?,
        })
    }

    /// The write to attempt now (acknowledgements first), as the call to
    /// make, or None.
    fn poll_write(&self) -> Option<WriteCall> {
        let at = clock::now_secs();
        let protocol = self.shared.state.lock();
        let id = protocol.poll_write(at)?;
        protocol.write_call(id).map(|call| WriteCall::of(id, call))
    }

    /// The call the pending write `id` makes, or None for a stale handle.
    fn write_call(&self, id: u64) -> Option<WriteCall> {
        self.shared.state.lock().write_call(id).map(|call| WriteCall::of(id, call))
    }

    /// Seconds until the next write is due (0: one is), or None with none
    /// pending: how long the driver's receive waits for an input.
    fn write_wait(&self) -> Option<f64> {
        let due = self.shared.state.lock().poll_timeout()?;
        Some((due - clock::now_secs()).max(0.0))
    }

    /// The attempt of `id` succeeded: forgotten. False for a stale handle.
    fn write_done(&self, id: u64) -> bool {
        self.shared.state.lock().handle_write_done(id).is_some()
    }

    /// The claim `id` was written (`won`: this worker wrote the key first): the
    /// resolver learns it, and a won claim pushed with an `announce` queues that
    /// write, retried for the core's bound at `now` (the handler's clock): its
    /// handle, or None when nothing follows (`Protocol::handle_claim_done`).
    fn claim_done(&self, id: u64, won: bool, now: f64, peer_timeout: f64) -> PyResult<Option<u64>> {
        let at = clock::now_secs();
        self.shared
            .with_protocol(|p| p.handle_claim_done(id, won, now, peer_timeout, at).map_err(refused))
    }

    /// The attempt of `id` raised something that is not a coordination-service
    /// error: forgotten, and a claim leaves this worker not leading. False for a
    /// stale handle.
    fn write_abandoned(&self, id: u64) -> bool {
        // A claim given up changes what the next step must look at.
        self.shared
            .with_protocol(|p| Ok(p.handle_write_abandoned(id).is_some()))
            .unwrap_or(false)
    }

    /// The attempt of `id` failed now: when to try again (`pause`), or give
    /// up (the write is then forgotten); None for a stale handle. Nothing is
    /// retried when `closing`.
    #[pyo3(signature = (id, closing = false))]
    fn write_failed(&self, id: u64, closing: bool) -> Option<RetryVerdict> {
        let at = clock::now_secs();
        // A claim given up changes what the next step must look at.
        let verdict = self.shared.with_protocol(|p| Ok(p.handle_write_failed(id, at, closing))).ok()??;
        Some(RetryVerdict::at(verdict, at))
    }

    /// Failed attempts of the write `id` so far.
    fn write_attempts(&self, id: u64) -> u32 {
        self.shared.state.lock().writes().attempts(id)
    }

    /// A notice's write (claim or announce) is pending: the next notice waits.
    #[getter]
    fn writes_busy(&self) -> bool {
        self.shared.state.lock().writes().busy()
    }

    /// The handler closes: `(last attempts, dropped claim or None)`.
    fn close_writes(&self) -> (Vec<u64>, Option<u64>) {
        let closing = self.shared.state.lock().close_writes(clock::now_secs());
        (closing.last_attempts, closing.dropped)
    }

    /// How long the coordinator of a parameter-server cluster lets the
    /// closures in flight finish before its save, from `now`
    /// (`GracePlanner::drain_bound`); `peer_timeout` when the notice set no
    /// deadline or this worker does not lead.
    fn drain_bound(&self, now: f64, peer_timeout: f64) -> f64 {
        self.shared.state.lock().drain_bound(now, peer_timeout)
    }

    /// When the platform ends this process, as it stated it (`Protocol::kill_deadline`),
    /// on the handler's clock; None when it stated none (a grace period alone, an
    /// assumed deadline).
    fn kill_deadline(&self) -> Option<f64> {
        self.shared.state.lock().kill_deadline()
    }

    /// When this worker's notice says the machine goes, on the handler's clock
    /// (`GracePlanner::deadline` with a grace period, else the platform's deadline),
    /// or None: no notice, or one that names no time (no platform deadline and no
    /// grace period).
    fn notice_deadline(&self) -> Option<f64> {
        self.shared.state.lock().notice_deadline()
    }

    /// Seconds a worker that writes a share of the save waits from `now`, after its own
    /// part took `own` seconds: the chief for the other parts, a non-chief for the
    /// chief's report of the merge (`shares::wait_bound_at`, with this worker's notice's
    /// deadline and the exit's reserve).
    #[pyo3(signature = (own, now, min_wait, chief))]
    fn shares_wait_bound(&self, own: f64, now: f64, min_wait: f64, chief: bool) -> f64 {
        let waiter = if chief { Waiter::Chief } else { Waiter::NonChief };
        self.shared.state.lock().shares_wait_bound(own, now, min_wait, waiter)
    }

    /// Whether the chief starts the merge of the shares at `now`, after its own part
    /// took `own` seconds (`Protocol::shares_merge_start`: the longest merge measured,
    /// else `own`, against the notice's deadline less the exit's reserve).
    #[pyo3(signature = (own, now, min_wait))]
    fn shares_merge_start(&self, own: f64, now: f64, min_wait: f64) -> super::shares::PyMergeStart {
        self.shared.state.lock().shares_merge_start(own, now, min_wait).into()
    }

    /// A merge of the shares took `secs` seconds, from its start to the state file
    /// naming the checkpoint (`Protocol::handle_shares_merged`).
    fn shares_merged(&self, secs: f64) {
        self.shared.state.lock().handle_shares_merged(secs);
    }

    /// True once this worker won the claim (or leads in local mode).
    /// The checkpoint read at start took `duration` seconds: the save estimate
    /// until a save is measured (`GracePlanner::record_restore`).
    fn restored(&self, duration: f64) {
        self.shared.state.lock().handle_restored(duration);
    }

    /// Seconds kept between the last save and the deadline for the process's exit
    /// (`GracePlanner::set_exit_reserve`; `EXIT_RESERVE` unless configured).
    #[getter]
    fn get_exit_reserve(&self) -> f64 {
        self.shared.state.lock().exit_reserve()
    }

    #[setter]
    fn set_exit_reserve(&self, secs: f64) -> PyResult<()> {
        self.shared.state.lock().set_exit_reserve(secs).map_err(refused)
    }

    /// Seconds before the deadline the final round starts (save, steps and
    /// acknowledgements as measured): for the log of a countdown.
    #[getter]
    fn margin(&self) -> f64 {
        self.shared.state.lock().margin()
    }

    #[getter]
    fn leading(&self) -> bool {
        self.shared.state.lock().leading()
    }

    /// The step keys every worker writes `STOP_WATCHER` to at shutdown.
    fn shutdown_keys(&self) -> PyResult<Vec<&'static str>> {
        self.shared.shutdown_keys()
    }

    /// The rounds' keys in order, the final round's only with a grace period:
    /// what a follower's reader watches.
    fn round_keys(&self) -> PyResult<Vec<&'static str>> {
        self.shared.round_keys()
    }

    /// A preemption has a final round (there is a grace period): decided once,
    /// at configuration.
    #[getter]
    fn has_final_round(&self) -> PyResult<bool> {
        self.shared.has_final_round()
    }

    /// A snapshot for logs and tests.
    fn state<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.shared.snapshot(py)
    }
}
