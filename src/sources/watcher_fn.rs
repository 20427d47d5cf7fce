//! A user's `termination_watcher_fn` (TensorFlow's `TerminationConfig`): a Python
//! callable, so a Python thread calls it (`_platforms/notice_sources.py`). That
//! thread only performs: it reports each call's result to a [`WatcherFnPoll`],
//! which decides when the next call is due, reports a slow call (once), and
//! says when the poll is over; how long a close waits for a call under way is
//! decided here too.

use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::shared::{WatchError, LOG_TARGET};

/// Seconds between the starts of two calls of `termination_watcher_fn`
/// (TensorFlow: once a second).
pub const WATCHER_FN_INTERVAL: f64 = 1.0;
/// A call of `termination_watcher_fn` longer than this many seconds is logged
/// (once): it delays only its own polls.
pub const SLOW_WATCHER_FN: f64 = 5.0;
/// Bound, in seconds, on a close's wait for a call under way to return: a call
/// that blocks is not waited out.
pub const WATCHER_FN_JOIN_TIMEOUT: f64 = 1.0;
/// Logged when a call that was under way when the poll stopped fired: the
/// notice is an earlier handler's, and a newer one took over.
pub const WATCHER_FN_AFTER_TAKE_OVER: &str =
    "The termination_watcher_fn of an earlier handler fired after a newer one took over; not acted on (the newer handler polls its own).";

/// What the polling thread does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Call the watcher fn now.
    Call,
    /// It fired: post its notice; the poll is over.
    Post,
    /// The poll is over (stopped).
    End,
}

/// What [`WatcherFnPoll::returned`] found.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Returned {
    /// `Some` when the poll is over ([`Next::Post`] or [`Next::End`]); `None`:
    /// wait for the next call ([`WatcherFnPoll::wait_due`]).
    pub over: Option<Next>,
    /// The call's seconds, the first time one was slow (logged).
    pub slow: Option<f64>,
}

#[derive(Debug, Default)]
struct State {
    stopped: bool,
    /// When the call under way started; None between calls.
    calling: Option<Instant>,
    /// When the next call is due; None before the first.
    due: Option<Instant>,
    slow_reported: bool,
}

/// The schedule of one `termination_watcher_fn` poll: the polling thread
/// reports each call ([`returned`](Self::returned)), then waits for the next
/// ([`wait_due`](Self::wait_due)); [`stop`](Self::stop) ends it.
#[derive(Debug)]
pub struct WatcherFnPoll {
    interval: Duration,
    slow: Duration,
    state: Mutex<State>,
    changed: Condvar,
}

fn seconds(what: &'static str, value: f64) -> Result<Duration, WatchError> {
    if value.is_finite() && value > 0.0 {
        Ok(Duration::from_secs_f64(value))
    } else {
        Err(WatchError::BadDuration { what, value })
    }
}

impl WatcherFnPoll {
    /// A poll calling every `interval` seconds, reporting a call longer than
    /// `slow` seconds.
    ///
    /// # Errors
    ///
    /// [`WatchError::BadDuration`] for a number that is not positive and finite.
    pub fn new(interval: f64, slow: f64) -> Result<Self, WatchError> {
        Ok(WatcherFnPoll {
            interval: seconds("interval", interval)?,
            slow: seconds("slow", slow)?,
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
        })
    }

    /// The polling thread's report of its last call (`fired`: it said the
    /// machine goes; false before the first call). Once stopped, the poll is
    /// over at once: the thread need not wait (at interpreter exit, it must
    /// not).
    #[must_use]
    pub fn returned(&self, fired: bool) -> Returned {
        let now = Instant::now();
        let (slow, over) = {
            let mut s = self.state.lock();
            let mut slow = None;
            match s.calling.take() {
                Some(started) => {
                    let took = now.saturating_duration_since(started);
                    if took > self.slow && !s.slow_reported {
                        s.slow_reported = true;
                        slow = Some(took.as_secs_f64());
                    }
                    s.due = Some(started + self.interval);
                }
                None => s.due = Some(now),
            }
            self.changed.notify_all();
            let over = match (fired, s.stopped) {
                (_, true) => Some(Next::End),
                (true, false) => Some(Next::Post),
                (false, false) => None,
            };
            (slow, over)
        };
        // Logged with no lock held: a record may wait for the GIL.
        if let Some(took) = slow {
            log::warn!(target: LOG_TARGET, "termination_watcher_fn took {took:.1}s; other termination sources are still watched meanwhile.");
        }
        if fired && over == Some(Next::End) {
            log::info!(target: LOG_TARGET, "{WATCHER_FN_AFTER_TAKE_OVER}");
        }
        Returned { over, slow }
    }

    /// Waits at most `slice` for the next call: [`Next::Call`] when it is due
    /// (it starts now), [`Next::End`] once stopped, None when `slice` passed.
    #[must_use]
    pub fn wait_due(&self, slice: Duration) -> Option<Next> {
        let start = Instant::now();
        let until = start.checked_add(slice);
        let mut s = self.state.lock();
        loop {
            if s.stopped {
                return Some(Next::End);
            }
            let now = Instant::now();
            let due = s.due.unwrap_or(now);
            if now >= due {
                s.calling = Some(now);
                return Some(Next::Call);
            }
            if until.is_some_and(|u| now >= u) {
                return None;
            }
            let wake = until.map_or(due, |u| due.min(u));
            self.changed.wait_until(&mut s, wake);
        }
    }

    /// Ends the poll: no call starts from now on, and a call under way that
    /// fires posts nothing.
    pub fn stop(&self) {
        self.state.lock().stopped = true;
        self.changed.notify_all();
    }

    /// Waits at most `slice` for no call to be under way; whether none is.
    #[must_use]
    pub fn idle(&self, slice: Duration) -> bool {
        let until = Instant::now().checked_add(slice);
        let mut s = self.state.lock();
        while s.calling.is_some() {
            match until {
                Some(u) if self.changed.wait_until(&mut s, u).timed_out() => return s.calling.is_none(),
                Some(_) => {}
                None => self.changed.wait(&mut s),
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::{Next, Returned, WatcherFnPoll};
    use std::time::{Duration, Instant};

    const LONG: Duration = Duration::from_secs(30);

    #[test]
    fn calls_at_once_then_every_interval_from_each_start() {
        let poll = WatcherFnPoll::new(0.2, 5.0).unwrap();
        assert_eq!(poll.returned(false), Returned { over: None, slow: None });
        let first = Instant::now();
        assert_eq!(poll.wait_due(LONG), Some(Next::Call));
        assert!(first.elapsed() < Duration::from_millis(150), "the first call is due at once");
        assert_eq!(poll.returned(false).over, None);
        // Not yet due: a short slice passes.
        assert_eq!(poll.wait_due(Duration::from_millis(10)), None);
        assert_eq!(poll.wait_due(LONG), Some(Next::Call));
        assert!(first.elapsed() >= Duration::from_millis(200), "{:?}", first.elapsed());
    }

    #[test]
    fn a_slow_call_is_reported_once_and_the_next_is_due_at_once() {
        let poll = WatcherFnPoll::new(0.01, 0.02).unwrap();
        let _ = poll.returned(false);
        for round in 0..3 {
            assert_eq!(poll.wait_due(LONG), Some(Next::Call));
            std::thread::sleep(Duration::from_millis(40));
            let r = poll.returned(false);
            assert_eq!(r.slow.is_some(), round == 0, "round {round}: {r:?}");
        }
    }

    #[test]
    fn fired_posts_unless_stopped_and_stop_ends_the_wait() {
        let poll = WatcherFnPoll::new(60.0, 5.0).unwrap();
        let _ = poll.returned(false);
        assert_eq!(poll.wait_due(LONG), Some(Next::Call));
        assert_eq!(poll.returned(true).over, Some(Next::Post));

        let poll = WatcherFnPoll::new(60.0, 5.0).unwrap();
        let _ = poll.returned(false);
        assert_eq!(poll.wait_due(LONG), Some(Next::Call));
        assert!(!poll.idle(Duration::from_millis(10)), "a call is under way");
        poll.stop();
        assert_eq!(poll.returned(true).over, Some(Next::End), "fired after the stop: dropped");
        assert!(poll.idle(Duration::ZERO));
        assert_eq!(poll.wait_due(LONG), Some(Next::End));
        assert_eq!(poll.returned(false).over, Some(Next::End), "stopped: over, no wait");

        // A stop wakes a thread waiting for its next call (60 s away).
        let poll = std::sync::Arc::new(WatcherFnPoll::new(60.0, 5.0).unwrap());
        let _ = poll.returned(false);
        assert_eq!(poll.wait_due(LONG), Some(Next::Call));
        let _ = poll.returned(false);
        let waiting = std::sync::Arc::clone(&poll);
        let t = std::thread::spawn(move || waiting.wait_due(LONG));
        std::thread::sleep(Duration::from_millis(20));
        poll.stop();
        assert_eq!(t.join().unwrap(), Some(Next::End));
        assert!(WatcherFnPoll::new(-1.0, 5.0).is_err() && WatcherFnPoll::new(1.0, f64::NAN).is_err());
    }
}
