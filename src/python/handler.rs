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
use super::retry::WriteKind;
use super::wire::py_enum;
use crate::grace::Fit;
use crate::protocol::{Config, ConfigError, DriverAction, Protocol, SaveFailed, WriteEnd};
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

/// What follows a save (`ProtocolCore.saved`).
#[pyclass(frozen, eq, eq_int, module = "tf_failure_handling._native")]
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum SaveAction {
    /// Clean up and call `exit_fn`.
    Exit,
    /// Keep training until the final round of the grace period.
    Countdown,
    /// A failed save: raise its error (`ProtocolCore.save_failed`).
    Raise,
    /// A failed save in shares: exit with the unmerged code.
    ExitUnmerged,
}

/// An input of the protocol driver (`ProtocolCore.handle`).
#[pyclass(frozen, module = "tf_failure_handling._native")]
pub enum Event {
    /// A termination notice from `source`, whose deadline and kill (the moment
    /// the platform stated it ends the process; None: not stated) are Unix
    /// times read when the wall clock said `unix_now` (`Notice::from_unix`: the
    /// one conversion). `message` is what its announce tells the
    /// `PreemptionWatcher`s. `handle` returns the `NoticeAction`, and queues the
    /// write it starts (a claim; a cluster's announce).
    #[pyo3(constructor = (source, message, unix_now, unix_deadline = None, unix_kill = None))]
    Notice {
        source: String,
        message: String,
        unix_now: f64,
        unix_deadline: Option<f64>,
        unix_kill: Option<f64>,
    },
    /// A step key a leader published, read (`superseded`: a newer handler of
    /// this worker acknowledges). `handle` returns the `KeyAction`, and queues
    /// the acknowledgement.
    #[pyo3(constructor = (round_key, value, superseded = false))]
    StepKey {
        round_key: String,
        value: String,
        superseded: bool,
    },
    /// The attempt of the write `id` succeeded (`won`: a claim written first).
    #[pyo3(constructor = (id, won = true))]
    Written { id: u64, won: bool },
    /// The attempt of `id` failed with a coordination-service error
    /// (`closing`: the handler is closing, nothing is retried).
    #[pyo3(constructor = (id, closing = false))]
    Failed { id: u64, closing: bool },
    /// The attempt of `id` raised something else (a bug).
    Raised { id: u64 },
    /// The handler closes: last attempts, and a claim dropped.
    Close {},
    /// The leader's training thread goes on: the first call of the round
    /// `before_step` published, or the next after a pause or a record.
    /// `handle` returns the `LeaderAction`, as for the three below.
    Resume {},
    /// The leader's `LeaderAction.Set` answered (`written`: False when the key
    /// existed already).
    Set { written: bool },
    /// The leader's `LeaderAction.Get` answered with `value` (None: not set).
    #[pyo3(constructor = (value = None))]
    Got { value: Option<String> },
    /// The leader's call failed with a coordination-service error (`closing`:
    /// nothing is retried).
    #[pyo3(constructor = (closing = false))]
    CallFailed { closing: bool },
    /// The step-key reader goes on: its first read, or the next after a pause
    /// or a post. `handle` returns the `ReaderAction`, as for the two below.
    Reading {},
    /// The reader's `ReaderAction.Get` answered with `value` (None: not set yet).
    #[pyo3(constructor = (value = None))]
    Read { value: Option<String> },
    /// The reader's read failed with a coordination-service error (`closing`:
    /// the reader stops).
    #[pyo3(constructor = (closing = false))]
    ReadFailed { closing: bool },
    /// The checkpoint read at start took `duration` seconds: the save estimate
    /// until a save is measured (`GracePlanner::record_restore`).
    Restored { duration: f64 },
    /// The save of `round_key` finished after `duration` seconds: `handle`
    /// returns the `SaveAction` (exit, or count down to the final round).
    Saved { round_key: String, duration: f64 },
    /// A save failed (`shares`: written in shares by several workers): `handle`
    /// returns the `SaveAction` (raise its error, or exit unmerged).
    SaveFailed { shares: bool },
}

crate::protocol::reader_action!(py_enum[crate::protocol]);
crate::protocol::leader_action!(py_enum[crate::protocol]);

/// What the protocol driver does next (`ProtocolCore.poll`).
#[pyclass(frozen, module = "tf_failure_handling._native")]
pub enum Action {
    /// Set `key` to `value` within `timeout` seconds (the coordination client's
    /// `set`, whose False is a lost claim); report the outcome as an `Event`
    /// with the handle `id`. `what` names the write in logs and errors.
    Write {
        id: u64,
        kind: WriteKind,
        key: String,
        value: String,
        timeout: f64,
        what: String,
        subject: String,
    },
    /// The write `id` failed and is attempted again in `pause` seconds
    /// (`left` of its bound remained, `attempts` failed so far): for the log.
    Retrying {
        id: u64,
        what: String,
        attempts: u32,
        pause: f64,
        left: f64,
    },
    /// The write ended, written (`won`: a claim written first; True for the
    /// other kinds). `ends_notice`: the notice it was for is done with.
    Written {
        kind: WriteKind,
        key: String,
        value: String,
        what: String,
        subject: String,
        won: bool,
        ends_notice: bool,
    },
    /// The retry rule gave up on the write after `attempts` failed attempts over
    /// `seconds`: raise the last error, named.
    GaveUp {
        kind: WriteKind,
        key: String,
        value: String,
        what: String,
        subject: String,
        attempts: u32,
        seconds: f64,
        ends_notice: bool,
    },
    /// The write's attempt raised a bug: hand it on as it is.
    Raised {
        kind: WriteKind,
        key: String,
        value: String,
        what: String,
        subject: String,
        ends_notice: bool,
    },
    /// A claim dropped at close (logged).
    Dropped { what: String },
}

impl From<DriverAction> for Action {
    fn from(a: DriverAction) -> Self {
        match a {
            DriverAction::Write { id, call } => Action::Write {
                id,
                kind: call.kind.into(),
                what: call.what(),
                key: call.key,
                value: call.value,
                timeout: call.timeout,
                subject: call.subject,
            },
            DriverAction::Retrying {
                id,
                call,
                attempts,
                pause,
                left,
            } => Action::Retrying {
                id,
                what: call.what(),
                attempts,
                pause,
                left,
            },
            DriverAction::Finished { call, end, ends_notice } => {
                let (kind, what) = (call.kind.into(), call.what());
                let (key, value, subject) = (call.key, call.value, call.subject);
                match end {
                    WriteEnd::Written { won } => Action::Written {
                        kind,
                        key,
                        value,
                        what,
                        subject,
                        won,
                        ends_notice,
                    },
                    WriteEnd::GaveUp { attempts, seconds } => Action::GaveUp {
                        kind,
                        key,
                        value,
                        what,
                        subject,
                        attempts,
                        seconds,
                        ends_notice,
                    },
                    WriteEnd::Raised => Action::Raised {
                        kind,
                        key,
                        value,
                        what,
                        subject,
                        ends_notice,
                    },
                }
            }
            DriverAction::Dropped { call } => Action::Dropped { what: call.what() },
        }
    }
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

    /// The resolver's answer to a notice, in the binding's words.
    fn notice_action(outcome: core::NoticeAction) -> NoticeAction {
        match outcome {
            core::NoticeAction::Lead => NoticeAction::Lead {},
            core::NoticeAction::Claim { key, value } => NoticeAction::Claim {
                key: key.to_string(),
                value,
            },
            core::NoticeAction::Replan => NoticeAction::Replan {},
            core::NoticeAction::Absorb => NoticeAction::Absorb {},
        }
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

    fn configure(&self, config: Config) -> PyResult<()> {
        self.with_protocol(|p| p.configure(config).map_err(refused))
    }

    /// An input of the driver (`ProtocolCore.handle`): the protocol's answer to
    /// a notice or a step key, None for the others.
    fn handle(&self, py: Python<'_>, event: &Event, now: f64) -> PyResult<Option<Py<PyAny>>> {
        let at = clock::now_secs();
        match event {
            Event::Notice {
                source,
                message,
                unix_now,
                unix_deadline,
                unix_kill,
            } => {
                let notice = Notice::from_unix(now, *unix_now, *unix_deadline, *unix_kill);
                let outcome = self.with_protocol(|p| p.notice(notice, source, message, now, at).map_err(refused))?;
                Ok(Some(Self::notice_action(outcome).into_pyobject(py)?.into_any().unbind()))
            }
            Event::StepKey {
                round_key,
                value,
                superseded,
            } => {
                let round = round_from_key(round_key)?;
                let outcome = self.with_protocol(|p| Ok(p.step_key(round, value, *superseded, now, at).map_err(refused)??))?;
                let action = match outcome {
                    core::KeyAction::Acknowledge { ack_key, next_round } => KeyAction::Acknowledge {
                        ack_key,
                        next_round_key: next_round.map(|r| r.key().to_string()),
                    },
                    core::KeyAction::Stop => KeyAction::Stop {},
                };
                Ok(Some(action.into_pyobject(py)?.into_any().unbind()))
            }
            // A claim's outcome changes what the next step must look at.
            Event::Written { id, won } => self.with_protocol(|p| {
                p.written(*id, *won, now, at);
                Ok(None)
            }),
            Event::Failed { id, closing } => self.with_protocol(|p| {
                p.write_failed(*id, at, *closing);
                Ok(None)
            }),
            Event::Raised { id } => self.with_protocol(|p| {
                p.write_raised(*id);
                Ok(None)
            }),
            Event::Close {} => {
                self.state.lock().close(at);
                Ok(None)
            }
            Event::Resume {} => self.leader(py, |p| Ok(p.leader_next(now, at))),
            Event::Set { written } => {
                let value = written.then_some(core::ACK_VALUE);
                self.leader(py, |p| p.leader_called(value, now, at).map_err(refused))
            }
            Event::Got { value } => self.leader(py, |p| p.leader_called(value.as_deref(), now, at).map_err(refused)),
            Event::CallFailed { closing } => self.leader(py, |p| Ok(p.leader_call_failed(now, at, *closing))),
            Event::Restored { duration } => {
                self.state.lock().handle_restored(*duration);
                Ok(None)
            }
            Event::Saved { round_key, duration } => {
                let action = self.saved(round_key, *duration)?;
                Ok(Some(action.into_pyobject(py)?.into_any().unbind()))
            }
            Event::SaveFailed { shares } => {
                let action = self.save_failed(*shares)?;
                Ok(Some(action.into_pyobject(py)?.into_any().unbind()))
            }
            Event::Reading {} => self.reader(py, Protocol::reader_next),
            Event::Read { value } => self.reader(py, |p| p.reader_read(value.as_deref())),
            Event::ReadFailed { closing } => self.reader(py, |p| p.reader_failed(now, at, *closing)),
        }
    }

    /// The reader's next action, as Python's.
    fn reader(&self, py: Python<'_>, f: impl FnOnce(&mut Protocol) -> crate::protocol::ReaderAction) -> PyResult<Option<Py<PyAny>>> {
        let action = ReaderAction::from(f(&mut self.state.lock()));
        Ok(Some(action.into_pyobject(py)?.into_any().unbind()))
    }

    /// The leader's next action, as Python's.
    fn leader(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut Protocol) -> PyResult<crate::protocol::LeaderAction>,
    ) -> PyResult<Option<Py<PyAny>>> {
        let action = LeaderAction::from(self.with_protocol(f)?);
        Ok(Some(action.into_pyobject(py)?.into_any().unbind()))
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

    fn save_failed(&self, shares: bool) -> PyResult<SaveAction> {
        let after = self.with_protocol(|p| p.handle_save_failed(shares).map_err(refused))?;
        Ok(match after {
            SaveFailed::Raise => SaveAction::Raise,
            SaveFailed::ExitUnmerged => SaveAction::ExitUnmerged,
        })
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

    /// Sets up the protocol: `worker_id` None for local mode; `peer_timeout`
    /// bounds the wait for the acknowledgements and the retries.
    #[pyo3(signature = (worker_id, num_workers, grace_period, peer_timeout=core::DEFAULT_PEER_TIMEOUT, save_at_current_run=false))]
    fn configure(
        &self,
        worker_id: Option<u32>,
        num_workers: u32,
        grace_period: f64,
        peer_timeout: f64,
        save_at_current_run: bool,
    ) -> PyResult<()> {
        self.shared.configure(Config {
            worker_id,
            num_workers,
            grace_period,
            save_at_current_run,
            peer_timeout,
        })
    }

    /// The peer timeout (`TerminationConfig.peer_timeout`), set at `configure`;
    /// settable as the handler's `_peer_timeout` view.
    #[getter]
    fn get_peer_timeout(&self) -> f64 {
        self.shared.state.lock().peer_timeout()
    }

    #[setter]
    fn set_peer_timeout(&self, secs: f64) -> PyResult<()> {
        self.shared.state.lock().set_peer_timeout(secs).map_err(refused)
    }

    /// An input of the protocol at `now` (the handler's clock). The driver's: a
    /// notice (returns the `NoticeAction`), a step key read (the `KeyAction`), a
    /// write's outcome, the close; what they start comes out of `poll`. The
    /// leader's round and the step-key reader's calls (return the next
    /// `LeaderAction` / `ReaderAction`). A restore, a save (returns the
    /// `SaveAction`), a failed save (the `SaveAction`: raise or exit unmerged).
    ///
    /// `now` may be left out for an event that is not timed on the handler's
    /// clock (`Close`, `Restored`, `SaveFailed`): the binding's clock then
    /// stands for it.
    #[pyo3(signature = (event, now = None))]
    fn handle(&self, py: Python<'_>, event: &Bound<'_, Event>, now: Option<f64>) -> PyResult<Option<Py<PyAny>>> {
        self.shared.handle(py, event.get(), now.unwrap_or_else(clock::now_secs))
    }

    /// What the driver does now: an `Action` (a write to attempt, or what one came
    /// to), or None.
    fn poll(&self) -> Option<Action> {
        let at = clock::now_secs();
        self.shared.state.lock().poll(at).map(Action::from)
    }

    /// Seconds until `poll` has something (0: now), or None until an input: how
    /// long the driver's receive waits.
    fn poll_timeout(&self) -> Option<f64> {
        let due = self.shared.state.lock().poll_timeout()?;
        Some((due - clock::now_secs()).max(0.0))
    }

    /// A notice's write (claim or announce) is pending: the next notice waits.
    #[getter]
    fn writes_busy(&self) -> bool {
        self.shared.state.lock().writes_busy()
    }

    /// The platform stated after the notice that it ends this process `left` seconds
    /// after `now` (a SLURM job this handler requeued): `Protocol::handle_platform_end`.
    fn platform_end(&self, now: f64, left: f64) {
        self.shared.state.lock().handle_platform_end(now + left);
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

    /// How long a failing coordination-service call is retried from `now`
    /// (`crate::retry::bound`): the leading notice's deadline, if any, may
    /// shorten it.
    fn retry_bound(&self, now: f64) -> f64 {
        self.shared.state.lock().retry_bound(now)
    }

    /// How long the coordinator of a parameter-server cluster lets the
    /// closures in flight finish before its save, from `now`
    /// (`GracePlanner::drain_bound`); the peer timeout when the notice set no
    /// deadline or this worker does not lead.
    fn drain_bound(&self, now: f64) -> f64 {
        self.shared.state.lock().drain_bound(now)
    }

    /// When the platform ends this process, as it stated it (`Protocol::kill_deadline`),
    /// on the handler's clock; None when it stated none (a grace period alone, an
    /// assumed deadline).
    fn kill_deadline(&self) -> Option<f64> {
        self.shared.state.lock().kill_deadline()
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

    /// The writes of `STOP_WATCHER` every worker makes at shutdown (releasing
    /// the readers still blocked on the step keys), as `LeaderAction.Set`s.
    fn shutdown_writes(&self) -> PyResult<Vec<LeaderAction>> {
        let writes = self.shared.state.lock().shutdown_writes().map_err(refused)?;
        Ok(writes.into_iter().map(LeaderAction::from).collect())
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

/// What `SharesWaits(core)` asks of the protocol (`src/python/shares.rs`): each wait
/// of a save in shares bounded by the shares' rule, this worker's notice's deadline
/// less the exit's reserve, and the merges this handler measured.
impl ProtocolCore {
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
