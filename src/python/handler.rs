//! `HandlerCore`: the native base of `PreemptionCheckpointHandler`.
//!
//! It holds the hot path, `run()`, and the [`Resolver`]. With nothing going
//! on, `run()` reads the clock once and takes one mutex for the step-time
//! sample, loads two atomics (a notice or an agreed step needs attention; a
//! background thread left an error), calls the user's function and counts
//! the run; in a multi-worker cluster it then calls the shim's `_hold_step`
//! (the last whole step, held for the survivors of a lost worker). Anything
//! else goes to Python methods of the shim (`_run_check`, `_run_failed`),
//! which ask the [`Resolver`] through the
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
use super::wire::py_enum;
use crate::grace::Fit;
use crate::protocol::{ConfigError, Protocol};
use crate::shares::Waiter;
use crate::step_resolution::{self as core, Notice, Round};

crate::protocol::event!(py_enum[crate::protocol]);
crate::protocol::action!(py_enum[crate::protocol]);

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
    /// Mirrors [`Protocol::holds_steps`]: after each step that returned, `run()`
    /// calls the shim's `_hold_step` (the last whole step, for the survivors of a
    /// lost worker).
    hold: AtomicBool,
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
    /// Open `watch_preemption_scope` blocks (`Event.Scope`): while there is one,
    /// the step watch counts a step in progress as if a `run()` were calling its
    /// function.
    scopes: AtomicU64,
    /// The protocol: resolver, planner, step timing and every bound from them.
    state: Mutex<Protocol>,
    /// The clock the protocol's events are taken on (`configure(clock=...)`): None
    /// for the binding's monotonic clock ([`clock::now_secs`]), or a simulation's
    /// callable returning seconds. The hot path's step timing and the driver's write
    /// retries stay on the monotonic clock (waits for peers are real).
    clock: Mutex<Option<Py<PyAny>>>,
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

    /// Runs `f` on the protocol and mirrors whether the next step needs
    /// attention into the flag `run()` reads.
    fn with_protocol<T>(&self, f: impl FnOnce(&mut Protocol) -> PyResult<T>) -> PyResult<T> {
        let mut protocol = self.state.lock();
        let out = f(&mut protocol);
        self.attention.store(protocol.needs_attention(), Ordering::Release);
        self.hold.store(protocol.holds_steps(), Ordering::Release);
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
    if core.hold.load(Ordering::Acquire) {
        let name = intern!(py, "_hold_step").as_ptr();
        // SAFETY: a new reference to the bound method, or NULL with an error set.
        let method = unsafe { ffi::PyObject_GetAttr(slf, name) };
        if method.is_null() {
            // A bare HandlerCore (no shim) holds nothing.
            // SAFETY: an error is set; clearing it is always allowed.
            unsafe { ffi::PyErr_Clear() };
            return result;
        }
        // SAFETY: a call with no arguments; we own `method` and release it after. The
        // shim's `_hold_step` never raises; if it did, the step's result is dropped and
        // its error raised.
        let held = unsafe {
            let held = ffi::PyObject_CallNoArgs(method);
            ffi::Py_DECREF(method);
            held
        };
        if held.is_null() {
            // SAFETY: we own `result`.
            unsafe { ffi::Py_DECREF(result) };
            return std::ptr::null_mut();
        }
        // SAFETY: we own `held`.
        unsafe { ffi::Py_DECREF(held) };
    }
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

/// Puts `run` (a method descriptor over [`run_fastcall`]) on `HandlerCore`, and
/// [`unix_time_of`] on `ProtocolCore`.
pub(crate) fn add_run(py: Python<'_>) -> PyResult<()> {
    let ty = py.get_type::<HandlerCore>();
    // SAFETY: a static method definition and HandlerCore's type object.
    let descr = unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyDescr_NewMethod(ty.as_type_ptr(), RUN_DEF.0.get()))? };
    ty.setattr("run", descr)?;
    // The clock conversion a notice from `testing` needs is the core's: a plain
    // function of `ProtocolCore` (`ProtocolCore.unix_time_of(moment, core)`).
    py.get_type::<ProtocolCore>()
        .setattr("unix_time_of", wrap_pyfunction!(unix_time_of, py)?)
}

impl Shared {
    fn new() -> Self {
        Shared {
            attention: AtomicBool::new(false),
            pending: AtomicBool::new(false),
            hold: AtomicBool::new(false),
            run_counter: AtomicU64::new(0),
            run_thread: AtomicU64::new(0),
            scopes: AtomicU64::new(0),
            state: Mutex::new(Protocol::new()),
            clock: Mutex::new(None),
        }
    }

    fn begin_step(&self) -> bool {
        self.step_started();
        self.attention.load(Ordering::Acquire) || self.pending.load(Ordering::Acquire)
    }

    fn after_check(&self) {
        let now = clock::now_secs();
        self.state.lock().checks_done(now);
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

    /// `ProtocolCore.configure`: each option given is set; an unknown option or a value
    /// the protocol refuses raises.
    fn configure(&self, options: Option<&Bound<'_, PyDict>>) -> PyResult<()> {
        let mut clock = None;
        let mut exit_reserve = None;
        let mut lost_worker_saves = None;
        let mut resolver = false;
        let mut config = self.state.lock().config();
        for (key, value) in options.into_iter().flat_map(|o| o.iter()) {
            let key: String = key.extract()?;
            match key.as_str() {
                "worker_id" => config.worker_id = value.extract()?,
                "num_workers" => config.num_workers = value.extract()?,
                "grace_period" => config.grace_period = value.extract()?,
                "save_at_current_run" => config.save_at_current_run = value.extract()?,
                "peer_timeout" => config.peer_timeout = value.extract()?,
                "exit_reserve" => exit_reserve = Some(value.extract::<f64>()?),
                "lost_worker_saves" => lost_worker_saves = Some(value.extract::<bool>()?),
                "clock" => clock = Some((!value.is_none()).then(|| value.clone().unbind())),
                other => {
                    return Err(pyo3::exceptions::PyTypeError::new_err(format!(
                        "configure() got an unexpected option {other:?}"
                    )))
                }
            }
            resolver |= matches!(key.as_str(), "worker_id" | "num_workers" | "grace_period" | "save_at_current_run");
        }
        self.with_protocol(|p| {
            if resolver {
                p.configure(config).map_err(refused)?;
            } else {
                p.set_peer_timeout(config.peer_timeout).map_err(refused)?;
            }
            if let Some(secs) = exit_reserve {
                p.set_exit_reserve(secs).map_err(refused)?;
            }
            if let Some(saves) = lost_worker_saves {
                p.set_lost_worker_saves(saves);
            }
            Ok(())
        })?;
        if let Some(clock) = clock {
            *self.clock.lock() = clock;
        }
        Ok(())
    }

    /// Seconds on the protocol's clock now: the simulation's, when one was
    /// configured (called without the lock held), else the monotonic clock.
    fn now(&self, py: Python<'_>) -> PyResult<f64> {
        let substitute = self.clock.lock().as_ref().map(|c| c.clone_ref(py));
        match substitute {
            None => Ok(clock::now_secs()),
            Some(c) => c.call0(py)?.extract(py),
        }
    }

    /// An input of the protocol (`ProtocolCore.handle`), taken now on its clock:
    /// the protocol's answer, None for the events that have none.
    fn handle(&self, py: Python<'_>, event: &Event) -> PyResult<Option<Py<PyAny>>> {
        use crate::protocol::Event as E;
        let now = self.now(py)?;
        let at = clock::now_secs();
        let answer = |value: Bound<'_, PyAny>| Ok(Some(value.unbind()));
        match E::from(event) {
            E::Notice {
                source,
                message,
                unix_deadline,
                unix_kill,
            } => {
                let notice = Notice::from_unix(now, clock::unix_now(), unix_deadline, unix_kill);
                let action = self.with_protocol(|p| p.take_notice(notice, &source, &message, now, at).map_err(refused))?;
                answer(Action::from(action).into_pyobject(py)?.into_any())
            }
            E::StepKey { round, value, superseded } => {
                let outcome = self.with_protocol(|p| Ok(p.step_key(round, &value, superseded, now, at).map_err(refused)??))?;
                answer(Action::from(crate::protocol::Action::from(outcome)).into_pyobject(py)?.into_any())
            }
            // A claim's outcome changes what the next step must look at.
            E::Written { id, won } => self.with_protocol(|p| {
                p.written(id, won, now, at);
                Ok(None)
            }),
            E::Failed { id, closing } => self.with_protocol(|p| {
                p.write_failed(id, at, closing);
                Ok(None)
            }),
            E::Raised { id } => self.with_protocol(|p| {
                p.write_raised(id);
                Ok(None)
            }),
            E::Close {} => {
                self.state.lock().close(at);
                Ok(None)
            }
            E::Resume {} => self.leader(py, |p| Ok(p.leader_next(now, at))),
            E::Set { written } => {
                let value = written.then_some(core::ACK_VALUE);
                self.leader(py, |p| p.leader_called(value, now, at).map_err(refused))
            }
            E::Got { value } => self.leader(py, |p| p.leader_called(value.as_deref(), now, at).map_err(refused)),
            E::CallFailed { closing } => self.leader(py, |p| Ok(p.leader_call_failed(now, at, closing))),
            E::Reading {} => self.reader(py, Protocol::reader_next),
            E::Read { value } => self.reader(py, |p| p.reader_read(value.as_deref())),
            E::ReadFailed { closing } => self.reader(py, |p| p.reader_failed(now, at, closing)),
            E::Timing {} => {
                self.state.lock().handle_timing(now);
                Ok(None)
            }
            E::Timed {} => answer(self.state.lock().handle_timed(now).into_pyobject(py)?.into_any()),
            E::Restored {} => {
                self.state.lock().handle_restored_timed();
                Ok(None)
            }
            E::Saved { round } => {
                let after = self.with_protocol(|p| Ok(p.saved(round).map_err(refused)??))?;
                answer(Action::from(after).into_pyobject(py)?.into_any())
            }
            E::SaveFailed { shares } => {
                let after = self.with_protocol(|p| p.handle_save_failed(shares).map_err(refused))?;
                answer(Action::from(crate::protocol::Action::from(after)).into_pyobject(py)?.into_any())
            }
            E::BeforeStep {} => {
                let runs = self.run_counter.load(Ordering::Relaxed);
                let action = self.with_protocol(|p| p.step_check(runs, now).map_err(refused))?;
                answer(Action::from(action).into_pyobject(py)?.into_any())
            }
            E::ChecksDone {} => {
                self.after_check();
                Ok(None)
            }
            E::StepFailed { code, message } => {
                let action = self.state.lock().handle_step_failed(code, message.as_deref().unwrap_or(""));
                answer(Action::from(action).into_pyobject(py)?.into_any())
            }
            E::Probed { unreachable } => {
                let action = self.state.lock().handle_probed(&unreachable);
                answer(Action::from(action).into_pyobject(py)?.into_any())
            }
            E::Confirm { seen, unreachable } => {
                let action = self.state.lock().handle_confirm(seen, unreachable.as_deref(), now);
                answer(Action::from(action).into_pyobject(py)?.into_any())
            }
            E::Watch {} => {
                let in_run = self.run_thread.load(Ordering::Relaxed) & IN_RUN != 0 || self.scopes.load(Ordering::Relaxed) > 0;
                let runs = self.run_counter.load(Ordering::Relaxed);
                let action = self.state.lock().handle_watch(in_run, runs, now);
                answer(Action::from(action).into_pyobject(py)?.into_any())
            }
            E::WatchProbed { unreachable } => {
                let action = self.state.lock().handle_watch_probed(&unreachable, now);
                answer(Action::from(action).into_pyobject(py)?.into_any())
            }
            E::Job {} => answer(Action::from(self.state.lock().handle_job()).into_pyobject(py)?.into_any()),
            E::Claims { current, claims } => {
                let action = self.state.lock().handle_claims(current, &claims, clock::unix_now());
                answer(Action::from(action).into_pyobject(py)?.into_any())
            }
            E::Pending { pending } => {
                self.pending.store(pending, Ordering::Release);
                Ok(None)
            }
            E::Scope { entered } => {
                if entered {
                    self.scopes.fetch_add(1, Ordering::Relaxed);
                } else {
                    // Never below 0: a block left twice (a bug) leaves nothing watched.
                    let _ = self.scopes.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
                }
                Ok(None)
            }
            E::Fit {} => answer(self.fit(now)?.into_pyobject(py)?.into_any()),
            E::Exiting { ends_in } => answer(self.state.lock().handle_exiting(now, ends_in).into_pyobject(py)?.into_any()),
            E::Shutdown {} => {
                let writes = self.state.lock().shutdown_writes().map_err(refused)?;
                let writes: Vec<Action> = writes.into_iter().map(Action::from).collect();
                answer((writes, core::THREAD_JOIN_TIMEOUT).into_pyobject(py)?.into_any())
            }
            E::ErrorReport {} => answer(core::SHUTDOWN_WRITE_TIMEOUT.into_pyobject(py)?.into_any()),
            E::TakeOver {} => {
                self.state.lock().handle_take_over(clock::unix_now());
                Ok(None)
            }
            E::Arrived { at } => answer(self.state.lock().came_after(at).into_pyobject(py)?.to_owned().into_any()),
        }
    }

    /// The reader's next action, as Python's.
    fn reader(&self, py: Python<'_>, f: impl FnOnce(&mut Protocol) -> crate::protocol::Action) -> PyResult<Option<Py<PyAny>>> {
        let action = Action::from(f(&mut self.state.lock()));
        Ok(Some(action.into_pyobject(py)?.into_any().unbind()))
    }

    /// The leader's next action, as Python's.
    fn leader(&self, py: Python<'_>, f: impl FnOnce(&mut Protocol) -> PyResult<crate::protocol::Action>) -> PyResult<Option<Py<PyAny>>> {
        let action = Action::from(self.with_protocol(f)?);
        Ok(Some(action.into_pyobject(py)?.into_any().unbind()))
    }

    fn fit(&self, now: f64) -> PyResult<Option<(&'static str, f64, f64, bool)>> {
        let protocol = self.state.lock();
        let Some(report) = protocol.fit(now) else {
            return Ok(None);
        };
        let name = match report.fit {
            Fit::Both => "both",
            Fit::OneSave => "one_save",
            Fit::Neither => "neither",
            Fit::Unknown => "unknown",
        };
        let final_round = protocol.has_final_round().map_err(refused)?;
        Ok(Some((name, report.left, report.needed, final_round)))
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
        d.set_item("peer_timeout", snap.peer_timeout)?;
        d.set_item("exit_reserve", snap.exit_reserve)?;
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
}

#[pymethods]
impl ProtocolCore {
    /// A step (a `run()` or `save_checkpoint_if_preempted` call) starts now:
    /// records the step-time sample and returns whether a notice or an
    /// agreed step needs the check before the step.
    fn begin_step(&self) -> bool {
        self.shared.begin_step()
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

    /// `(running, trainer)`: the thread whose `run()` is calling its function now
    /// (as `threading.get_ident()`, 0 when none), and the thread that called `run()`
    /// last (0 before the first `run()`).
    #[getter]
    fn threads(&self) -> (u64, u64) {
        let word = self.shared.run_thread.load(Ordering::Relaxed);
        let running = if word & IN_RUN == 0 { 0 } else { word & !IN_RUN };
        (running, word & !IN_RUN)
    }

    /// Whether a step key, a leading notice or the countdown needs the
    /// training thread's attention before the next step.
    #[getter]
    fn attention(&self) -> bool {
        self.shared.attention.load(Ordering::Acquire)
    }

    /// Sets up the protocol, or changes part of its configuration (the handler's
    /// views): each option given is set, the others stay. `worker_id` (None: local
    /// mode), `num_workers`, `grace_period` and `save_at_current_run` start a new
    /// resolver; `peer_timeout` bounds the wait for the acknowledgements and the
    /// retries; `exit_reserve` is kept between the last save and the deadline;
    /// `lost_worker_saves` (default True): the survivors of a worker lost without
    /// notice save the last whole step, held after each step; `clock` (a callable returning seconds, None: the monotonic clock) is the
    /// clock the protocol's events are taken on, a simulation's own. Returns the
    /// bound on one coordination-service write of the protocol under the peer
    /// timeout now in force (`write_timeout`): the coordination client's default.
    #[pyo3(signature = (**options))]
    fn configure(&self, options: Option<&Bound<'_, PyDict>>) -> PyResult<f64> {
        self.shared.configure(options)?;
        let peer_timeout = self.shared.state.lock().peer_timeout();
        Ok(core::write_timeout(peer_timeout, core::WriteBound::Protocol))
    }

    /// An input of the protocol, taken now on its clock; its answer, when it has
    /// one, is an `Action`. The driver's: a notice (`Action.Lead`, `Claim`, ...), a
    /// step key read (`Acknowledge`, `Stop`), a write's outcome, the close; what
    /// they start comes out of `poll`. The leader's round and the step-key
    /// reader's calls (the next call, pause or end). The training thread's: the
    /// check before a step (`Proceed`, `Publish`, `Save`), a timed save or
    /// restore, a save's end (`Exit`, `Countdown`), a failed save (`Raise`,
    /// `ExitUnmerged`), the exit. `Event` says what each returns.
    fn handle(&self, py: Python<'_>, event: &Bound<'_, Event>) -> PyResult<Option<Py<PyAny>>> {
        self.shared.handle(py, event.get())
    }

    /// What the driver does now: an `Action` (a write to attempt, or what one came
    /// to), or None.
    fn poll(&self) -> Option<Action> {
        let at = clock::now_secs();
        self.shared
            .state
            .lock()
            .poll(at)
            .map(|a| Action::from(crate::protocol::Action::from(a)))
    }

    /// Seconds until `poll` has something (0: now), or None until an input: how
    /// long the driver's receive waits. 0 as well while a notice waits for the
    /// writes of the one before it to end (`waiting`) and they have.
    #[pyo3(signature = (waiting = false))]
    fn poll_timeout(&self, waiting: bool) -> Option<f64> {
        let protocol = self.shared.state.lock();
        if waiting && !protocol.writes_busy() {
            return Some(0.0);
        }
        let due = protocol.poll_timeout()?;
        Some((due - clock::now_secs()).max(0.0))
    }

    /// A snapshot for logs and tests.
    fn state<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.shared.snapshot(py)
    }
}

/// What `SharesWaits(core)` asks of the protocol (`src/python/shares.rs`): each wait
/// of a save in shares bounded by the shares' rule, this worker's notice's deadline
/// less the exit's reserve, and the merges this handler measured.
impl ProtocolCore {
    /// Seconds on the protocol's clock now (`configure(clock=...)`).
    pub(crate) fn now(&self, py: Python<'_>) -> PyResult<f64> {
        self.shared.now(py)
    }

    /// Seconds `waiter` waits from `now` after its own part took `own` seconds.
    pub(crate) fn shares_bound(&self, own: f64, now: f64, waiter: Waiter) -> f64 {
        self.shared
            .state
            .lock()
            .shares_wait_bound(own, now, crate::shares::MIN_WAIT, waiter)
    }

    /// Whether the chief starts the merge at `now`, its own part having taken `own`.
    pub(crate) fn shares_merge_decision(&self, own: f64, now: f64) -> crate::shares::MergeStart {
        self.shared.state.lock().shares_merge_start(own, now, crate::shares::MIN_WAIT)
    }

    /// A merge took `secs` seconds, from its start to the state file naming it.
    pub(crate) fn shares_took(&self, secs: f64) {
        self.shared.state.lock().handle_shares_merged(secs);
    }
}

/// The wall-clock time of `moment`, a time on `core`'s clock (the handler's: a
/// simulation's own), read now: the clock conversion of a deadline handed to the
/// termination sources, which take wall-clock ones.
#[pyfunction]
pub(crate) fn unix_time_of(py: Python<'_>, moment: f64, core: &Bound<'_, ProtocolCore>) -> PyResult<f64> {
    let now = core.get().now(py)?;
    Ok(clock::unix_now() + (moment - now))
}
