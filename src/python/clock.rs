//! Where the binding reads time: one function, [`read`], which calls
//! `clock_gettime`; nothing else in `src/python` reads a clock.
//!
//! [`now_secs`] reads the monotonic clock (`CLOCK_MONOTONIC`, the clock Python's
//! `time.monotonic` reads on Linux) in seconds: every deadline the binding works
//! out is a time on it ([`At`]), every wait slice is cut from what is left of
//! one, and every step time is measured on it; it is the `now` the core's
//! [`crate::protocol::Protocol`] takes (unless a simulation configured its own
//! clock: `ProtocolCore.configure(clock=...)`). The binding hands the core's
//! blocking calls durations, never instants; Python reads no clock of the
//! binding's.
//!
//! [`unix_now`] reads the wall clock (`CLOCK_REALTIME`), only for stamps another
//! process or a record reads (a notice's moment, a handler's take-over; a task's last call, which
//! `ps_control.rs`'s `serving` compares with the wall clock now) and for the
//! conversion of a platform's wall-clock deadline (`handler.rs`'s `unix_time_of`, `ProtocolCore.unix_time_of` in Python). It is read
//! afresh each time rather than moved on from a monotonic reading: a platform's
//! deadline is a wall-clock time, and a VM's wall clock is corrected (by NTP,
//! after a live migration) while the monotonic clock is not;
//! `crate::notice::Notice::from_unix` converts the deadline at the moment of the
//! notice, on the wall clock's own scale.

use std::time::Duration;
/// The one clock read of the binding: `id`'s reading now in seconds (0 if the
/// read fails).
fn read(id: libc::clockid_t) -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC and
    // CLOCK_REALTIME always exist on the Unix systems the crate builds for (it
    // uses sigaction too).
    let rc = unsafe { libc::clock_gettime(id, &mut ts) };
    if rc != 0 {
        return 0.0;
    }
    #[allow(clippy::cast_precision_loss)]
    let secs = ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9;
    secs
}

/// The monotonic clock's reading now in seconds: `CLOCK_MONOTONIC`, as
/// `time.monotonic()` reads it on Linux.
pub(crate) fn now_secs() -> f64 {
    read(libc::CLOCK_MONOTONIC)
}

/// Seconds since the Unix epoch on the wall clock (0 if the wall clock is
/// before it).
pub(crate) fn unix_now() -> f64 {
    read(libc::CLOCK_REALTIME).max(0.0)
}

/// A moment on [`now_secs`]'s clock: the end of a bounded wait or of a wait
/// slice. The binding's waits ask it what is [left](At::left) and hand that
/// duration to a blocking call.
#[derive(Clone, Copy, Debug)]
pub(crate) struct At(f64);

impl At {
    /// Now.
    pub(crate) fn now() -> Self {
        At(now_secs())
    }

    /// `wait` from now.
    pub(crate) fn after(wait: Duration) -> Self {
        At(now_secs() + wait.as_secs_f64())
    }

    /// The time left until it, never below zero ([`Duration::MAX`] when too
    /// long for a `Duration`).
    pub(crate) fn left(self) -> Duration {
        let left = self.0 - now_secs();
        if left > 0.0 {
            Duration::try_from_secs_f64(left).unwrap_or(Duration::MAX)
        } else {
            Duration::ZERO
        }
    }

    /// It has come.
    pub(crate) fn passed(self) -> bool {
        now_secs() >= self.0
    }
}
