//! Blocking waits and the GIL: the helpers every blocking call of the
//! binding goes through, below all of its modules (they import it; it
//! imports none of them).
//!
//! Blocking calls go through [`wait_sliced`]: on the main thread they release
//! the GIL for at most [`SLICE`], re-attach, run pending signal handlers (so
//! Ctrl-C works), check the deadline, repeat; on any other thread (where
//! Python runs no signal handlers) the whole wait stays detached, so a daemon
//! thread does not re-attach every slice and cannot be caught re-attaching
//! while the interpreter finalizes (see [`detach`]). No Rust lock is held
//! while Python runs.
//!
//! # Locks and the GIL
//!
//! The rule: **a thread attached to the interpreter never waits for a thread
//! that runs Python or needs the GIL.** Anything a thread can block on counts
//! as a lock here: a `Mutex`, `RwLock` or `Condvar` (std or `parking_lot`), a
//! channel, and also a `std::sync::Once`, `OnceLock` or `LazyLock`, whose
//! `get_or_init` blocks every other caller while the first one runs the
//! initializer. Logging counts as running Python (pyo3-log attaches to hand
//! the record to `logging`).
//!
//! The example that broke it (issue 26): the type-layout check of
//! `layout.rs` sat in a std `OnceLock` whose initializer ran `py.import` and
//! `py.run`. Eight coordinator worker threads classified their first failed
//! closures at once: the first ran the initializer, Python switched threads
//! inside it, a second thread (holding the GIL) blocked in
//! `OnceLock::initialize`, and the first never got the GIL back. `join()` hung.
//!
//! So, in this binding:
//!
//! * a once-cell whose initializer touches Python is a `PyOnceLock` (it
//!   detaches while it waits), and is filled in the module's init where
//!   possible, on the importing thread alone (`layout.rs`);
//! * a std `OnceLock` is used only when its initializer neither attaches nor
//!   waits for anything that does (the `dlsym` look-ups below and in
//!   `handler.rs`, also filled in the module's init);
//! * a Rust lock is taken attached only when none of its holders ever runs
//!   Python, logs, drops a Python object or waits for the GIL while holding
//!   it (the closure queue's core, the handler's state); a wait
//!   that can last (a condvar, a channel, a full queue) is detached
//!   ([`detach`], [`wait_sliced`]);
//! * log records are emitted after every Rust lock is released.
//!
//! `tests/unit/test_first_calls.py` makes the first call of every native
//! entry point from eight threads at once in fresh processes, with a tiny
//! switch interval.

use std::time::Duration;

use pyo3::prelude::*;

use super::clock::At;

/// Longest time a blocking call stays detached before it checks signals.
pub(crate) const SLICE: Duration = Duration::from_millis(100);

/// Converts a timeout in seconds (None = forever) to a deadline (None when
/// too long for a `Duration`).
pub(crate) fn deadline_after(timeout: Option<f64>) -> PyResult<Option<At>> {
    match timeout {
        None => Ok(None),
        // A timeout too long to represent (say 1e30 s) means "forever".
        Some(t) if t.is_finite() && t >= 0.0 => Ok(Duration::try_from_secs_f64(t).ok().map(At::after)),
        Some(t) => Err(super::errors::bad_timeout(t)),
    }
}

/// Timeouts beyond this many seconds (about 31 years) mean "no limit".
const FOREVER_SECONDS: f64 = 1e9;

/// A deadline from a `threading`-style timeout, as TensorFlow's closure queue and
/// `RemoteValue` take them: `None` waits forever, a timeout ≤ 0 (or NaN) does not
/// wait (`threading.Condition.wait`'s rule), and one beyond [`FOREVER_SECONDS`]
/// has no limit.
pub(crate) fn threading_deadline(timeout: Option<f64>) -> Option<At> {
    let t = timeout?;
    if t >= FOREVER_SECONDS {
        return None;
    }
    if t > 0.0 {
        Some(At::after(Duration::from_secs_f64(t)))
    } else {
        Some(At::now())
    }
}

/// Runs `f` with the GIL released, like `py.detach`, but never re-attaches
/// while the interpreter is finalizing.
///
/// CPython before 3.14 ends a daemon thread that re-attaches during
/// finalization with `pthread_exit`, whose forced unwind through Rust frames
/// aborts the process ("FATAL: exception not rethrown"). A daemon thread blocked
/// in one of our waits when the program ends (a watcher, a coordinator worker
/// thread) therefore parks here instead, as CPython 3.14 itself does, and dies
/// with the process. The thread that runs the finalization (a `__del__` or
/// `atexit`-time close) was attached when it came in and re-attaches as
/// usual: parking it would hang the exit.
pub(crate) fn detach<T, F>(py: Python<'_>, f: F) -> T
where
    F: Send + FnOnce() -> T,
    T: Send,
{
    let finalizing_thread = interpreter_finalizing();
    py.detach(|| {
        let out = f();
        while !finalizing_thread && interpreter_finalizing() {
            std::thread::sleep(Duration::from_secs(1));
        }
        out
    })
}

/// Whether the interpreter is finalizing; callable without the GIL (it reads
/// one atomic). `Py_IsFinalizing` is public from 3.13, `_Py_IsFinalizing`
/// before; the symbol is looked up once in the running interpreter.
pub(crate) fn interpreter_finalizing() -> bool {
    type IsFinalizing = unsafe extern "C" fn() -> libc::c_int;
    static FUNCTION: std::sync::OnceLock<Option<IsFinalizing>> = std::sync::OnceLock::new();
    let function = FUNCTION.get_or_init(|| {
        for name in [c"Py_IsFinalizing", c"_Py_IsFinalizing"] {
            // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name.
            let symbol = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
            if !symbol.is_null() {
                // SAFETY: both symbols are `int f(void)` in every CPython that has them.
                return Some(unsafe { std::mem::transmute::<*mut libc::c_void, IsFinalizing>(symbol) });
            }
        }
        None
    });
    // SAFETY: the function only reads the runtime's finalizing flag atomically.
    function.is_some_and(|f| unsafe { f() } != 0)
}

/// `threading.main_thread().ident`, read when the module is initialised.
pub(crate) static MAIN_THREAD: std::sync::OnceLock<u64> = std::sync::OnceLock::new();

/// Whether the calling thread is the interpreter's main thread, the only one
/// that runs Python signal handlers (Python's thread ident is `pthread_self`).
pub(crate) fn on_main_thread() -> bool {
    // SAFETY: pthread_self has no preconditions.
    #[allow(clippy::useless_conversion)]
    let me = u64::from(unsafe { libc::pthread_self() });
    MAIN_THREAD.get().map_or(true, |&main| main == me)
}

/// Waits in slices until `step(slice)` returns `Some` (its value) or
/// `deadline` passes (`Ok(None)`).
///
/// # Errors
///
/// What a Python signal handler raised (on the main thread only), such as
/// `KeyboardInterrupt`.
pub(crate) fn wait_sliced<T, F>(py: Python<'_>, deadline: Option<At>, mut step: F) -> PyResult<Option<T>>
where
    F: Send + FnMut(Duration) -> Option<T>,
    T: Send,
{
    if on_main_thread() {
        loop {
            let Some(slice) = next_slice(deadline) else { return Ok(None) };
            if let Some(value) = detach(py, || step(slice)) {
                return Ok(Some(value));
            }
            py.check_signals()?;
        }
    }
    Ok(detach(py, move || loop {
        let slice = next_slice(deadline)?;
        if let Some(value) = step(slice) {
            return Some(value);
        }
    }))
}

/// The slice to detach for: [`SLICE`], or less when the deadline is nearer.
/// None once the deadline has passed.
pub(crate) fn next_slice(deadline: Option<At>) -> Option<Duration> {
    match deadline {
        None => Some(SLICE),
        Some(d) => {
            let left = d.left();
            (!left.is_zero()).then(|| left.min(SLICE))
        }
    }
}

pub(crate) fn py_main_thread_ident(py: Python<'_>) -> PyResult<u64> {
    py.import("threading")?.call_method0("main_thread")?.getattr("ident")?.extract()
}
