//! The watch of one coordination-service key by `PreemptionWatcher`
//! (`watcher.py`): its daemon thread watching the notice key, and
//! `block_until_worker_exit`'s wait for the service to go away. The caller
//! loops on [`KeyWatch::next`], making each blocking get for as long as it
//! says, until it answers None (the watch's bound passed, or it was closed);
//! [`KeyWatch::close`] says how long the watching thread may still take. The
//! watch reads no clock: each call is given `now`.

use crate::deadline::Deadline;
use crate::step_resolution::WATCHER_KEY_SLICE;

/// Seconds a join of a thread that waits in a blocking call may last beyond that
/// call's own bound: the call returns at its bound, the thread then ends.
pub const JOIN_MARGIN: f64 = 1.0;

/// A key watched for at most a bound (or until closed).
#[derive(Clone, Debug)]
pub struct KeyWatch {
    deadline: Deadline,
    closed: bool,
}

impl KeyWatch {
    /// A watch from `now` for at most `timeout` seconds (None: until closed).
    #[must_use]
    pub fn new(now: f64, timeout: Option<f64>) -> Self {
        KeyWatch {
            deadline: Deadline::new(now, timeout),
            closed: false,
        }
    }

    /// The next get's timeout in seconds ([`WATCHER_KEY_SLICE`]: a close is
    /// seen between two gets), or None: the watch is over (its bound passed
    /// at `now`, or it was closed).
    #[must_use]
    pub fn next(&self, now: f64) -> Option<f64> {
        (!self.closed && !self.deadline.passed(now)).then_some(WATCHER_KEY_SLICE)
    }

    /// Ends the watch: the next [`KeyWatch::next`] answers None. Returns the
    /// seconds the thread that watches may still take: the get under way, and
    /// the margin to end (the bound on joining it).
    pub fn close(&mut self) -> f64 {
        self.closed = true;
        WATCHER_KEY_SLICE + JOIN_MARGIN
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gets_are_sliced_until_the_bound_passes() {
        let watch = KeyWatch::new(10.0, Some(2.5));
        assert_eq!(watch.next(10.0), Some(WATCHER_KEY_SLICE));
        assert_eq!(watch.next(12.4), Some(WATCHER_KEY_SLICE));
        assert_eq!(watch.next(12.5), None);
        assert_eq!(KeyWatch::new(0.0, Some(0.0)).next(0.0), None, "no time: no get");
    }

    #[test]
    fn an_unbounded_watch_ends_when_closed() {
        let mut watch = KeyWatch::new(0.0, None);
        assert_eq!(watch.next(1e9), Some(WATCHER_KEY_SLICE));
        assert_eq!(watch.close(), WATCHER_KEY_SLICE + JOIN_MARGIN);
        assert_eq!(watch.next(0.0), None);
        assert_eq!(watch.close(), WATCHER_KEY_SLICE + JOIN_MARGIN, "idempotent");
    }
}
