//! The package's logger: every `log` record goes to Python's `logging` through
//! pyo3-log, behind a gate for the threads that are not attached.
//!
//! A thread that logs without the GIL (a metadata poller, the signal dispatcher, a
//! Python thread inside a detached wait) attaches for the time of the record, and runs
//! the `logging` handlers, which may release the GIL (a handler that writes to the
//! network, or sleeps). A Rust thread left running by `close()` while it is inside
//! such a handler re-attaches after the interpreter started to finalize, and CPython
//! (before 3.14) ends it with `pthread_exit`, whose forced unwind through Rust frames
//! aborts the process. So such a record passes only while the gate is open and the
//! interpreter is not finalizing, and is counted while inside; `close()` [`shut`]s the
//! gate for good before it leaves threads running, and waits, bounded, for the records
//! inside to end ([`wait_outside`]). Records of
//! attached threads are not gated (they hold the GIL already and never re-attach).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use log::{LevelFilter, Log, Metadata, Record};
use pyo3::prelude::*;

use super::blocking::interpreter_finalizing;
use super::clock::At;

/// Records of unattached threads inside the interpreter now.
static INSIDE: AtomicUsize = AtomicUsize::new(0);
/// Whether the gate is shut (for the rest of the process).
static SHUT: AtomicBool = AtomicBool::new(false);

struct Gate(pyo3_log::Logger);

impl Log for Gate {
    fn enabled(&self, metadata: &Metadata) -> bool {
        self.0.enabled(metadata)
    }

    fn log(&self, record: &Record) {
        if holds_gil() {
            return self.0.log(record);
        }
        // Counted before the gate is looked at: `shut_and_wait` shuts, then counts.
        INSIDE.fetch_add(1, Ordering::SeqCst);
        if !SHUT.load(Ordering::SeqCst) && !interpreter_finalizing() {
            self.0.log(record);
        }
        INSIDE.fetch_sub(1, Ordering::SeqCst);
    }

    fn flush(&self) {}
}

/// Installs the gate over pyo3-log as the global logger (once; a second call, as on a
/// re-import, leaves the first in place).
pub(crate) fn install(py: Python<'_>) -> PyResult<()> {
    let logger = pyo3_log::Logger::new(py, pyo3_log::Caching::LoggersAndLevels)?;
    if log::set_boxed_logger(Box::new(Gate(logger))).is_ok() {
        log::set_max_level(LevelFilter::Debug);
    }
    Ok(())
}

/// Shuts the gate: no unattached thread enters the interpreter to log from now on.
/// True the first time.
pub(crate) fn shut() -> bool {
    !SHUT.swap(true, Ordering::SeqCst)
}

/// Waits up to `slice` for the records of unattached threads inside the interpreter to
/// end; true when none is. Call it detached.
pub(crate) fn wait_outside(slice: Duration) -> bool {
    let deadline = At::after(slice);
    loop {
        if INSIDE.load(Ordering::SeqCst) == 0 {
            return true;
        }
        if deadline.passed() {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// `PyGILState_Check()`: whether this thread holds the GIL. Not in the stable ABI's
/// headers PyO3 binds, but exported by every CPython 3; looked up once. Without it,
/// every thread counts as unattached (gated: safe, only stricter).
fn holds_gil() -> bool {
    type Check = unsafe extern "C" fn() -> libc::c_int;
    static FUNCTION: std::sync::OnceLock<Option<Check>> = std::sync::OnceLock::new();
    let function = FUNCTION.get_or_init(|| {
        // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name.
        let symbol = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"PyGILState_Check".as_ptr()) };
        // SAFETY: `int PyGILState_Check(void)` in every CPython 3.
        (!symbol.is_null()).then(|| unsafe { std::mem::transmute::<*mut libc::c_void, Check>(symbol) })
    });
    // SAFETY: callable from any thread, attached or not.
    function.is_some_and(|f| unsafe { f() } == 1)
}

/// Fills the look-up above on the importing thread (see "Locks and the GIL").
pub(crate) fn init() {
    let _ = holds_gil();
}
