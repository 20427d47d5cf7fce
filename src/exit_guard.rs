//! The exit guard's thread: after the last save, a process still in its exit shortly
//! before the deadline ends with the exit code its records already hold, not with the
//! platform's SIGKILL. The moment is [`crate::grace::exit_guard_delay`]'s; whether the
//! process is in its exit is the caller's question (`in_exit`: the binding asks
//! Python's shutdown hook and the interpreter).
//!
//! A guard waits on its own thread (named `tfh-exit-guard`), which never needs the
//! GIL: the slow part of an exit is often TensorFlow's teardown while the interpreter
//! finalizes, when no Python thread runs. [`disarm`] stands every waiting guard down
//! at once (the process trains on); [`training_goes_on`] does so when one waits. It
//! says what it does on standard error with `write(2)`: at that moment Python's
//! logging cannot run.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Set once the process's exit has begun ([`set_exiting`]); cleared by [`disarm`].
static EXITING: AtomicBool = AtomicBool::new(false);
/// Bumped by [`disarm`]: a guard armed under an older value stands down.
static GENERATION: AtomicU64 = AtomicU64::new(0);
/// Guards still waiting for their moment.
static WAITING: AtomicU64 = AtomicU64::new(0);
/// Held while [`GENERATION`] is bumped and while a guard checks it before it waits:
/// a stand-down is never missed.
static LOCK: Mutex<()> = Mutex::new(());
/// Wakes the waiting guards when they are stood down.
static STOOD_DOWN: Condvar = Condvar::new();

/// The process's exit has begun (Python's threading shutdown, or `atexit`).
pub fn set_exiting() {
    EXITING.store(true, Ordering::SeqCst);
}

/// Whether [`set_exiting`] was told since the last [`disarm`].
pub fn exiting() -> bool {
    EXITING.load(Ordering::SeqCst)
}

/// Arms a guard: `delay` seconds from now, a process in its exit (`in_exit()`, or
/// [`set_exiting`] told) ends with `code`, saying so on standard error. Returns once
/// the guard's thread runs.
///
/// # Errors
///
/// The thread could not start.
pub fn arm(delay: f64, code: i32, in_exit: fn() -> bool) -> std::io::Result<()> {
    arm_with(delay, in_exit, move || {
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
    })
}

/// [`arm`] with what the guard does at its moment (`end`; a test's instead of `_exit`).
fn arm_with(delay: f64, in_exit: fn() -> bool, end: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
    let generation = GENERATION.load(Ordering::SeqCst);
    let wake = Duration::try_from_secs_f64(delay.max(0.0))
        .ok()
        .and_then(|d| Instant::now().checked_add(d));
    WAITING.fetch_add(1, Ordering::SeqCst);
    let (started, running) = std::sync::mpsc::channel::<()>();
    let spawned = std::thread::Builder::new().name("tfh-exit-guard".into()).spawn(move || {
        drop(started);
        let mut held = LOCK.lock().unwrap_or_else(PoisonError::into_inner);
        while GENERATION.load(Ordering::SeqCst) == generation {
            let left = wake.map_or(Duration::MAX, |w| w.saturating_duration_since(Instant::now()));
            if left.is_zero() {
                break;
            }
            held = STOOD_DOWN.wait_timeout(held, left).unwrap_or_else(PoisonError::into_inner).0;
        }
        drop(held);
        let current = GENERATION.load(Ordering::SeqCst) == generation;
        if current && (exiting() || in_exit()) {
            end();
        }
        WAITING.fetch_sub(1, Ordering::SeqCst);
    });
    if let Err(e) = spawned {
        WAITING.fetch_sub(1, Ordering::SeqCst);
        return Err(e);
    }
    let _ = running.recv();
    Ok(())
}

/// Stands every waiting guard down, at once (a new handler: the process trains on).
pub fn disarm() {
    let held = LOCK.lock().unwrap_or_else(PoisonError::into_inner);
    GENERATION.fetch_add(1, Ordering::SeqCst);
    EXITING.store(false, Ordering::SeqCst);
    drop(held);
    STOOD_DOWN.notify_all();
}

/// A step began: a guard armed before it was armed for a `SystemExit` that was
/// caught, and the process trains on, so every waiting guard stands down. One atomic
/// read when none waits.
pub fn training_goes_on() {
    if WAITING.load(Ordering::SeqCst) > 0 {
        disarm();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::{arm_with, disarm, exiting, set_exiting, training_goes_on, WAITING};

    fn no() -> bool {
        false
    }

    fn yes() -> bool {
        true
    }

    fn wait_until_none_waits() {
        let until = Instant::now() + Duration::from_secs(10);
        while WAITING.load(Ordering::SeqCst) > 0 {
            assert!(Instant::now() < until, "a guard still waits");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// One test: the guards share the process's statics.
    #[test]
    fn a_guard_ends_an_exit_only_at_its_moment_and_unless_stood_down() {
        let ended = Arc::new(AtomicU32::new(0));
        let end = |ended: &Arc<AtomicU32>| {
            let ended = Arc::clone(ended);
            move || {
                ended.fetch_add(1, Ordering::SeqCst);
            }
        };
        // Not in its exit at the moment: the guard leaves the process alone.
        arm_with(0.01, no, end(&ended)).unwrap();
        wait_until_none_waits();
        assert_eq!(ended.load(Ordering::SeqCst), 0);
        // In its exit (the interpreter says so): ended.
        arm_with(0.01, yes, end(&ended)).unwrap();
        wait_until_none_waits();
        assert_eq!(ended.load(Ordering::SeqCst), 1);
        // Told of the exit: ended too.
        set_exiting();
        arm_with(0.0, no, end(&ended)).unwrap();
        wait_until_none_waits();
        assert_eq!(ended.load(Ordering::SeqCst), 2);
        // Training goes on: a far guard stands down at once, and the exit is forgotten.
        arm_with(3600.0, yes, end(&ended)).unwrap();
        assert_eq!(WAITING.load(Ordering::SeqCst), 1);
        training_goes_on();
        wait_until_none_waits();
        assert_eq!(ended.load(Ordering::SeqCst), 2);
        assert!(!exiting());
        // An unbounded delay waits until stood down.
        arm_with(f64::INFINITY, yes, end(&ended)).unwrap();
        disarm();
        wait_until_none_waits();
        assert_eq!(ended.load(Ordering::SeqCst), 2);
    }
}
