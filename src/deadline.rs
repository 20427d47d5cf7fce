//! A bounded wait's arithmetic: when it started, how long is left, whether it
//! is over. Sans-IO like the rest of the core: every method takes `now`, in
//! seconds on the one clock the caller reads (the binding's `clock::now_secs`,
//! `CLOCK_MONOTONIC`).
//!
//! The Python package never works out `end - now` itself, nor reads the time:
//! the protocol objects hold their waits' [`Deadline`]s (an acknowledgement
//! wait, a key watch) and hand Python each wait's timeout.

/// Milliseconds TensorFlow's `get_config_key_value(key, timeout_in_ms)` takes to
/// mean "wait forever": its default, kept by the testing service's signature, and
/// never passed by the package's own reads (each has a bound of at least 1 ms).
pub const TF_WAIT_FOREVER_MS: u64 = 0;
/// Seconds a simulated cluster (`testing.SimulatedCluster`) waits for its workers
/// by default before it names those still running: a bound that turns a hang into
/// a failure, never a verdict.
pub const SIMULATED_CLUSTER_BOUND: f64 = 60.0;

/// A wait of at most `bound` seconds from `start`, or an unbounded one.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Deadline {
    start: f64,
    end: Option<f64>,
}

impl Deadline {
    /// A wait starting at `now` for at most `bound` seconds (`None`: no bound).
    /// A negative or NaN bound is over at once; an infinite one never ends.
    pub fn new(now: f64, bound: Option<f64>) -> Self {
        let end = bound.and_then(|b| {
            if b.is_nan() {
                Some(now)
            } else if b == f64::INFINITY {
                None
            } else {
                Some(now + b.max(0.0))
            }
        });
        Deadline { start: now, end }
    }

    /// Seconds left at `now`, never below 0; `None` for an unbounded wait.
    pub fn left(&self, now: f64) -> Option<f64> {
        self.end.map(|end| (end - now).max(0.0))
    }

    /// The bound has passed at `now` (an unbounded wait never passes).
    pub fn passed(&self, now: f64) -> bool {
        self.end.is_some_and(|end| now >= end)
    }

    /// The next slice of the wait at `now`: at most `longest` seconds and at
    /// most what is left.
    pub fn slice(&self, now: f64, longest: f64) -> f64 {
        let longest = longest.max(0.0);
        self.left(now).map_or(longest, |left| left.min(longest))
    }

    /// Seconds since the start at `now` (0 if `now` is before it).
    pub fn elapsed(&self, now: f64) -> f64 {
        (now - self.start).max(0.0)
    }

    /// The end, on the caller's clock (`None`: unbounded).
    pub fn end(&self) -> Option<f64> {
        self.end
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (bound, now, left, passed, slice of at most 0.5 s, elapsed), each
    /// wait started at 10.0.
    #[test]
    fn deadline_table() {
        type Row = (Option<f64>, f64, Option<f64>, bool, f64, f64);
        let rows: &[Row] = &[
            (Some(2.0), 10.0, Some(2.0), false, 0.5, 0.0),
            (Some(2.0), 11.8, Some(0.2), false, 0.2, 1.8),
            (Some(2.0), 12.0, Some(0.0), true, 0.0, 2.0),
            (Some(2.0), 15.0, Some(0.0), true, 0.0, 5.0),
            (Some(0.0), 10.0, Some(0.0), true, 0.0, 0.0),
            (Some(-3.0), 10.0, Some(0.0), true, 0.0, 0.0),
            (Some(f64::NAN), 10.0, Some(0.0), true, 0.0, 0.0),
            (Some(f64::INFINITY), 1e9, None, false, 0.5, 1e9 - 10.0),
            (None, 50.0, None, false, 0.5, 40.0),
            (None, 9.0, None, false, 0.5, 0.0),
        ];
        for &(bound, now, left, passed, slice, elapsed) in rows {
            let d = Deadline::new(10.0, bound);
            let row = format!("bound {bound:?} at {now}");
            match (d.left(now), left) {
                (Some(a), Some(b)) => assert!((a - b).abs() < 1e-9, "{row}: left {a} != {b}"),
                (a, b) => assert_eq!(a, b, "{row}: left"),
            }
            assert_eq!(d.passed(now), passed, "{row}: passed");
            assert!((d.slice(now, 0.5) - slice).abs() < 1e-9, "{row}: slice");
            assert!((d.elapsed(now) - elapsed).abs() < 1e-6, "{row}: elapsed");
        }
    }

    #[test]
    fn a_negative_slice_is_no_wait() {
        assert_eq!(Deadline::new(0.0, None).slice(1.0, -1.0), 0.0);
        assert_eq!(Deadline::new(0.0, Some(5.0)).slice(1.0, -1.0), 0.0);
    }
}
