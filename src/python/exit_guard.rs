//! The exit guard: after the last save, a process still in its exit shortly before the
//! deadline ends with the exit code its records already hold, not with the platform's
//! SIGKILL (137 on Kubernetes, where a Job's `podFailurePolicy` matches the code).
//!
//! The guard's thread and its stand-down are the core's ([`crate::exit_guard`]);
//! this module tells it when Python's exit begins and whether the interpreter
//! finalizes. The guard is a Rust thread, not a Python one: the slow part of an exit is often
//! TensorFlow's teardown while the interpreter finalizes, when no Python thread runs.
//! It acts only when the process is in its exit: Python's threading shutdown has begun
//! (a hook the first arming registers, [`register_exiting`]) or the interpreter is
//! finalizing. A process that caught the `SystemExit` and trains on is left alone:
//! its next step through any handler ([`training_goes_on`], from the binding's step
//! start) or a new handler ([`exit_guard`] without a code) stands every waiting guard down at
//! once, so an exit that comes later, when training has ended by itself, keeps its own
//! code. The moment is the core's decision (`crate::grace::exit_guard_delay`): only a
//! deadline the platform stated arms it.
//!
//! It says what it does on standard error with `write(2)`: at that moment Python's
//! logging cannot run.

use std::sync::atomic::{AtomicBool, Ordering};

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyCFunction;

use super::{blocking, errors};
pub(crate) use crate::exit_guard::training_goes_on;

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
        crate::exit_guard::set_exiting();
        Ok(())
    })?;
    match py.import("threading")?.getattr("_register_atexit") {
        Ok(register) => match register.call1((hook,)) {
            Err(e) if e.is_instance_of::<PyRuntimeError>(py) => crate::exit_guard::set_exiting(),
            done => drop(done?),
        },
        Err(_) => drop(py.import("atexit")?.call_method1("register", (hook,))?),
    }
    Ok(())
}

/// With a `code`, arms the guard for a deadline on the handler's clock (`deadline`,
/// with `now` read from the same clock): at [`crate::grace::EXIT_GUARD_LEAD`] before
/// it, a process in its exit ends with `code`. Returns the seconds the guard waits, or
/// None when it is not armed (no deadline, or too late to tell an exit from training
/// that goes on). Without a `code`, stands every waiting guard down, at once (a new
/// handler: the process trains on).
///
/// # Errors
///
/// The hook that tells the guard of the exit could not be registered, or its thread
/// could not start.
#[pyfunction]
#[pyo3(signature = (deadline = None, now = 0.0, code = None))]
fn exit_guard(py: Python<'_>, deadline: Option<f64>, now: f64, code: Option<i32>) -> PyResult<Option<f64>> {
    let Some(code) = code else {
        crate::exit_guard::disarm();
        return Ok(None);
    };
    register_exiting(py)?;
    let Some(delay) = crate::grace::exit_guard_delay(deadline, now) else {
        return Ok(None);
    };
    crate::exit_guard::arm(delay, code, blocking::interpreter_finalizing)
        .map_err(|e| errors::misuse(format!("could not start the exit guard's thread: {e}")))?;
    Ok(Some(delay))
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(exit_guard, m)?)?;
    m.add("EXIT_GUARD_LEAD", crate::grace::EXIT_GUARD_LEAD)?;
    Ok(())
}
