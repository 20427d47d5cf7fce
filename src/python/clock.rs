//! Where the binding reads time: every deadline, wait slice and step time it works
//! out reads [`now`], and the wall-clock time a notice is stamped with is
//! [`unix_now`]. Nothing else in `src/python` reads a clock.
//!
//! [`now`] is the monotonic clock (`CLOCK_MONOTONIC` on Linux, the clock Python's
//! `time.monotonic` reads). [`unix_now`] is read afresh each time rather than moved
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

/// Seconds since the Unix epoch (0 if the wall clock is before it).
pub(crate) fn unix_now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}
