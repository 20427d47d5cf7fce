//! The exit guard: after the last save, a process still in its exit shortly before the
//! deadline ends with the exit code its records already hold, not with the platform's
//! SIGKILL (137 on Kubernetes, where a Job's `podFailurePolicy` matches the code).
//!
//! The guard is a Rust thread, not a Python one: the slow part of an exit is often
//! TensorFlow's teardown while the interpreter finalizes, when no Python thread runs.
//! It acts only when the process is in its exit: Python's threading shutdown has begun
//! (a hook the first arming registers, [`register_exiting`]) or the interpreter is
//! finalizing. A process that caught the `SystemExit` and trains on is left alone:
//! its next step through any handler ([`training_goes_on`], from the binding's step
//! start) or a new handler ([`disarm_exit_guard`]) stands every waiting guard down at
//! once, so an exit that comes later, when training has ended by itself, keeps its own
//! code. The moment is the core's decision (`crate::grace::exit_guard_delay`): only a
//! deadline the platform stated arms it.
//!
//! It says what it does on standard error with `write(2)`: at that moment Python's
//! logging cannot run.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::Duration;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyCFunction;

use super::clock::At;
use super::{blocking, errors};

/// Set once Python's threading shutdown has begun (the main thread has ended).
static EXITING: AtomicBool = AtomicBool::new(false);
/// Bumped by [`disarm_exit_guard`]: a guard armed under an older value stands down.
static GENERATION: AtomicU64 = AtomicU64::new(0);
/// Guards still waiting for their moment.
static WAITING: AtomicU64 = AtomicU64::new(0);
/// Held while [`GENERATION`] is bumped and while a guard checks it before it waits:
/// a stand-down is never missed.
static LOCK: Mutex<()> = Mutex::new(());
/// Wakes the waiting guards when they are stood down.
static STOOD_DOWN: Condvar = Condvar::new();

/// Tells the guard, once registered, when the process's exit begins: Python's threading
/// shutdown (the main thread has ended, before non-daemon threads are joined and `atexit`
/// runs: `threading._register_atexit`), or `atexit` where that private hook is missing.
/// Registered by the first arming; a shutdown already under way counts as the exit.
fn register_exiting(py: Python<'_>) -> PyResult<()> {
    static REGISTERED: AtomicBool = AtomicBool::new(false);
    if REGISTERED.swap(true, Ordering::SeqCst) {
        return Ok(());
    }
    let hook = PyCFunction::new_closure(py, Some(c"exit_guard_exiting"), None, |_, _| -> PyResult<()> {
        EXITING.store(true, Ordering::SeqCst);
        Ok(())
    })?;
    match py.import("threading")?.getattr("_register_atexit") {
        Ok(register) => match register.call1((hook,)) {
            Err(e) if e.is_instance_of::<PyRuntimeError>(py) => EXITING.store(true, Ordering::SeqCst),
            done => drop(done?),
        },
        Err(_) => drop(py.import("atexit")?.call_method1("register", (hook,))?),
    }
    Ok(())
}

/// Arms the guard for a deadline on the handler's clock (`deadline`, with `now` read
/// from the same clock): at [`crate::grace::EXIT_GUARD_LEAD`] before it, a process in
/// its exit ends with `code`. Returns the seconds the guard waits, or None when it is
/// not armed (no deadline, or too late to tell an exit from training that goes on).
///
/// # Errors
///
/// The hook that tells the guard of the exit could not be registered, or its thread
/// could not start.
#[pyfunction]
#[pyo3(signature = (deadline, now, code))]
fn arm_exit_guard(py: Python<'_>, deadline: Option<f64>, now: f64, code: i32) -> PyResult<Option<f64>> {
    register_exiting(py)?;
    let Some(delay) = crate::grace::exit_guard_delay(deadline, now) else {
        return Ok(None);
    };
    let generation = GENERATION.load(Ordering::SeqCst);
    let wake = At::after(Duration::from_secs_f64(delay));
    WAITING.fetch_add(1, Ordering::SeqCst);
    // Returns once the guard runs (named, as `/proc` shows it): it never needs the GIL.
    let (started, running) = std::sync::mpsc::channel::<()>();
    let spawned = std::thread::Builder::new().name("tfh-exit-guard".into()).spawn(move || {
        drop(started);
        let mut held = LOCK.lock().unwrap_or_else(PoisonError::into_inner);
        while GENERATION.load(Ordering::SeqCst) == generation {
            let left = wake.left();
            if left.is_zero() {
                break;
            }
            held = STOOD_DOWN.wait_timeout(held, left).unwrap_or_else(PoisonError::into_inner).0;
        }
        drop(held);
        let current = GENERATION.load(Ordering::SeqCst) == generation;
        if current && (EXITING.load(Ordering::SeqCst) || blocking::interpreter_finalizing()) {
            let line = format!(
                "tf_failure_handling: the process is still in its exit {lead:.1}s before the \
                 deadline, after its last save; ending it now with exit code {code} (its \
                 records already say so), before the platform kills it\n",
                lead = crate::grace::EXIT_GUARD_LEAD,
            );
            // SAFETY: write(2) of an owned buffer to fd 2, then _exit(2): neither runs
            // anything of the process's own (no atexit, no destructors, no Python).
            unsafe {
                libc::write(2, line.as_ptr().cast(), line.len());
                libc::_exit(code);
            }
        }
        WAITING.fetch_sub(1, Ordering::SeqCst);
    });
    if let Err(e) = spawned {
        WAITING.fetch_sub(1, Ordering::SeqCst);
        return Err(errors::misuse(format!("could not start the exit guard's thread: {e}")));
    }
    let _ = running.recv();
    Ok(Some(delay))
}

/// Stands every waiting guard down, at once (a new handler: the process trains on).
#[pyfunction]
fn disarm_exit_guard() {
    let held = LOCK.lock().unwrap_or_else(PoisonError::into_inner);
    GENERATION.fetch_add(1, Ordering::SeqCst);
    EXITING.store(false, Ordering::SeqCst);
    drop(held);
    STOOD_DOWN.notify_all();
}

/// A step began (any handler's `run()` or `save_checkpoint_if_preempted`): a guard
/// armed before it was armed for a `SystemExit` that was caught, and the process trains
/// on, so every waiting guard stands down. One atomic read when none waits.
pub(crate) fn training_goes_on() {
    if WAITING.load(Ordering::SeqCst) > 0 {
        disarm_exit_guard();
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(arm_exit_guard, m)?)?;
    m.add_function(wrap_pyfunction!(disarm_exit_guard, m)?)?;
    m.add("EXIT_GUARD_LEAD", crate::grace::EXIT_GUARD_LEAD)?;
    Ok(())
}
