//! Where the binding reads time: every deadline, wait slice and step time it works
//! out reads [`now`], and the wall-clock time a notice is stamped with is
//! [`unix_now`]. Nothing else in `src/python` reads a clock.
//!
//! [`now`] is the monotonic clock (`CLOCK_MONOTONIC` on Linux, the clock Python's
//! `time.monotonic` reads); [`now_secs`] is the same clock in seconds, the `now`
//! the core's [`crate::protocol::Protocol`] takes, on the scale of the times
//! Python passes it. [`unix_now`] is read afresh each time rather than moved
//! on from one reading by [`now`]: a platform's deadline is a wall-clock time, and a
//! VM's wall clock is corrected (by NTP, after a live migration) while the
//! monotonic clock is not; `crate::notice::Notice::from_unix` converts the deadline
//! at the moment of the notice, on the wall clock's own scale.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use pyo3::prelude::*;

use crate::deadline;

/// The monotonic clock's reading now.
#[inline]
pub(crate) fn now() -> Instant {
    Instant::now()
}

/// The monotonic clock's reading now in seconds: `CLOCK_MONOTONIC`, as
/// `time.monotonic()` reads it on Linux (the clock [`now`]'s `Instant` reads too).
pub(crate) fn now_secs() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists
    // on the Unix systems the crate builds for (it uses sigaction too).
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    if rc != 0 {
        return 0.0;
    }
    #[allow(clippy::cast_precision_loss)]
    let secs = ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9;
    secs
}

/// Seconds since the Unix epoch (0 if the wall clock is before it).
pub(crate) fn unix_now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// The package's one monotonic clock, for the reading a simulation may
/// substitute (`HandlerState.clock`): seconds on [`now_secs`]'s scale.
#[pyfunction(name = "now")]
fn py_now() -> f64 {
    now_secs()
}

/// The wall clock, for a stamp another process or a record reads (a
/// notice's moment, a task's last call): seconds since the Unix epoch.
#[pyfunction(name = "unix_now")]
fn py_unix_now() -> f64 {
    unix_now()
}

/// The wall-clock time of `moment`, a time on the clock `now` was read
/// from (the handler's: a simulation's own): the clock conversion of a
/// deadline handed to the termination sources, which take wall-clock ones.
#[pyfunction]
fn unix_time_of(moment: f64, now: f64) -> f64 {
    unix_now() + (moment - now)
}

/// A wait of at most `seconds` from now (None: unbounded), on [`now_secs`]:
/// the package's waits ask it what is left rather than subtract clock
/// readings ([`crate::deadline`]).
#[pyclass(frozen, module = "tf_failure_handling._native")]
pub struct Deadline(deadline::Deadline);

#[pymethods]
impl Deadline {
    #[new]
    fn new(seconds: Option<f64>) -> Self {
        Deadline(deadline::Deadline::new(now_secs(), seconds))
    }

    /// Seconds left (never below 0), or None for an unbounded wait.
    fn left(&self) -> Option<f64> {
        self.0.left(now_secs())
    }

    /// The bound has passed (never, unbounded).
    fn passed(&self) -> bool {
        self.0.passed(now_secs())
    }

    /// The next slice of the wait: at most `longest` seconds and what is left.
    fn slice(&self, longest: f64) -> f64 {
        self.0.slice(now_secs(), longest)
    }

    /// Seconds since it started.
    fn elapsed(&self) -> f64 {
        self.0.elapsed(now_secs())
    }

    fn __repr__(&self) -> String {
        match self.0.left(now_secs()) {
            Some(left) => format!("Deadline({left:.3}s left)"),
            None => "Deadline(unbounded)".to_owned(),
        }
    }
}

/// How long something took: seconds since it was made, on [`now_secs`].
#[pyclass(frozen, module = "tf_failure_handling._native")]
pub struct Stopwatch(deadline::Deadline);

#[pymethods]
impl Stopwatch {
    #[new]
    fn new() -> Self {
        Stopwatch(deadline::Deadline::new(now_secs(), None))
    }

    /// Seconds since it was made.
    fn seconds(&self) -> f64 {
        self.0.elapsed(now_secs())
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(py_now, m)?)?;
    m.add_function(wrap_pyfunction!(py_unix_now, m)?)?;
    m.add_function(wrap_pyfunction!(unix_time_of, m)?)?;
    m.add_class::<Deadline>()?;
    m.add_class::<Stopwatch>()?;
    Ok(())
}
