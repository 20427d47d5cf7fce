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
