//! The one retry rule of the protocol's coordination-service calls.
//!
//! Every call the protocol makes to the coordination service (claim,
//! announce, publish, acknowledge, the reads of the step keys and of the
//! acknowledgements) follows this rule when it fails: it is tried again after
//! a pause that starts at [`FIRST_PAUSE`] and doubles up to [`MAX_PAUSE`],
//! until a run of failures has lasted [`bound`] seconds and counts at least
//! [`MIN_ATTEMPTS`] failed attempts; then the caller raises the last error,
//! naming how often and how long the call failed.
//!
//! A [`Retry`] is one run of failures of one call. A write starts it before
//! its first attempt ([`Retry::started`]); a read starts one at its first
//! failure and drops it when a read answers, so only failures without a
//! break count. Like the resolver, it never reads a clock and never sleeps:
//! [`Retry::failed`] takes `now` and answers when the next attempt may start.

/// The pause before the first retry, in seconds.
pub const FIRST_PAUSE: f64 = 0.05;
/// The longest pause between two attempts, in seconds.
pub const MAX_PAUSE: f64 = 1.0;
/// Seconds of failing calls after which a failure is not transient. A
/// cluster whose service is in an error state (a peer reported an error)
/// fails every call for good: that error must reach the worker promptly,
/// with its own type, not after the peer timeout (300 s by default).
pub const TRANSIENT_FAILURE_WINDOW: f64 = 10.0;
/// The bound is never shortened below this by a deadline: a call that
/// fails once just before the machine goes away still gets a second try.
pub const MIN_BOUND_BEFORE_DEADLINE: f64 = 1.0;
/// A run with a positive bound gives up only after this many failed
/// attempts, however long they took. The bound is real time, and on a loaded
/// machine the pauses and the calls themselves can take longer than the bound
/// (three failures in a row took 1.4 s against a bound of 1 s under
/// `make test`'s load): a burst of fewer failures is then survived whatever
/// the load, as on an idle machine, where the bound alone allows five or
/// more. Each attempt is bounded by its call's own timeout, so the run is
/// bounded too. That minimum is for quick failures: an attempt that took the
/// whole bound by itself (its call's own timeout, a service that did not
/// answer; see [`Retry::attempt`]) ends a run whose bound has passed. More
/// such attempts would only delay the error: four writes to a coordination
/// leader that is cut off took four timeouts (16 s against a bound of 4 s).
pub const MIN_ATTEMPTS: u32 = 4;

/// How long a run of failures is retried: [`TRANSIENT_FAILURE_WINDOW`], or
/// `peer_timeout`, or the time left before `deadline` (at least
/// [`MIN_BOUND_BEFORE_DEADLINE`]) when shorter: a machine that is gone
/// cannot be waited for.
#[must_use]
pub fn bound(peer_timeout: f64, deadline: Option<f64>, now: f64) -> f64 {
    let bound = peer_timeout.min(TRANSIENT_FAILURE_WINDOW);
    match deadline {
        Some(d) => bound.min((d - now).max(MIN_BOUND_BEFORE_DEADLINE)),
        None => bound,
    }
}

/// What follows a failed attempt.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Verdict {
    /// Try again at `at` (seconds, the caller's clock); `left` seconds of the
    /// bound remained when the attempt failed.
    Again {
        /// When the next attempt may start.
        at: f64,
        /// What was left of the bound.
        left: f64,
    },
    /// Give up: raise the last error, after `attempts` failed attempts over
    /// `seconds`.
    GiveUp {
        /// Failed attempts in this run of failures.
        attempts: u32,
        /// Seconds from the run's start to the last failure.
        seconds: f64,
    },
}

/// One run of failures of one call; see the module documentation.
#[derive(Clone, Debug, PartialEq)]
pub struct Retry {
    bound: f64,
    since: Option<f64>,
    pause: f64,
    attempts: u32,
    attempt_start: Option<f64>,
}

impl Retry {
    /// A run of failures retried for `bound` seconds from its start.
    #[must_use]
    pub fn new(bound: f64) -> Self {
        Retry {
            bound,
            since: None,
            pause: FIRST_PAUSE,
            attempts: 0,
            attempt_start: None,
        }
    }

    /// An attempt starts at `now`. A caller that knows when each attempt
    /// starts (a blocking one) says so: a failure of an attempt that lasted
    /// the whole bound by itself then ends a run whose bound has passed,
    /// however few its attempts (see [`MIN_ATTEMPTS`]).
    pub fn attempt(&mut self, now: f64) {
        self.attempt_start = Some(now);
    }

    /// The run starts at `now` (a write: before its first attempt), rather
    /// than at its first failure.
    #[must_use]
    pub fn started(mut self, now: f64) -> Self {
        self.since = Some(now);
        self
    }

    /// The bound, in seconds.
    #[must_use]
    pub fn bound(&self) -> f64 {
        self.bound
    }

    /// Failed attempts so far.
    #[must_use]
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// When the run started (None for a read that has not failed yet).
    #[must_use]
    pub fn since(&self) -> Option<f64> {
        self.since
    }

    /// No more retries: the next failure gives up (the handler is closing;
    /// a last attempt is made, not a series).
    pub fn last_attempt(&mut self) {
        self.bound = 0.0;
    }

    /// An attempt failed at `now`; `closing` when the handler is closing
    /// (nothing is retried then).
    pub fn failed(&mut self, now: f64, closing: bool) -> Verdict {
        self.attempts += 1;
        let since = *self.since.get_or_insert(now);
        let left = since + self.bound - now;
        // A bound that is not positive or NaN (a last attempt, a caller that
        // allows none) gives up at the first failure; a positive one once it
        // has passed and the run has its minimum of attempts.
        let no_bound = self.bound.is_nan() || self.bound <= 0.0;
        let spent = left.is_nan() || left <= 0.0;
        // An attempt that took the bound by itself was not a quick failure.
        let stalled = self.attempt_start.take().is_some_and(|start| now - start >= self.bound);
        if closing || no_bound || (spent && (self.attempts >= MIN_ATTEMPTS || stalled)) {
            return Verdict::GiveUp {
                attempts: self.attempts,
                seconds: now - since,
            };
        }
        // Past the bound (an attempt short of the minimum): the next one
        // follows the rule's pause, not the bound's remainder.
        let at = now + if spent { self.pause } else { self.pause.min(left) };
        let left = left.max(0.0);
        self.pause = (self.pause * 2.0).min(MAX_PAUSE);
        Verdict::Again { at, left }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn again(v: Verdict) -> (f64, f64) {
        match v {
            Verdict::Again { at, left } => (at, left),
            Verdict::GiveUp { .. } => panic!("gave up: {v:?}"),
        }
    }

    // The bound, row by row.
    #[test]
    fn bound_is_the_window_without_a_deadline() {
        assert_eq!(bound(300.0, None, 0.0), TRANSIENT_FAILURE_WINDOW);
    }

    #[test]
    fn bound_is_the_peer_timeout_when_shorter() {
        assert_eq!(bound(3.0, None, 0.0), 3.0);
    }

    #[test]
    fn bound_is_the_time_left_before_the_deadline_when_shorter() {
        assert_eq!(bound(300.0, Some(104.0), 100.0), 4.0);
    }

    #[test]
    fn bound_is_at_least_a_second_before_a_deadline() {
        assert_eq!(bound(300.0, Some(100.2), 100.0), MIN_BOUND_BEFORE_DEADLINE);
        assert_eq!(bound(300.0, Some(90.0), 100.0), MIN_BOUND_BEFORE_DEADLINE);
    }

    #[test]
    fn a_deadline_never_lengthens_the_bound() {
        assert_eq!(bound(2.0, Some(1000.0), 0.0), 2.0);
        assert_eq!(bound(0.5, Some(90.0), 100.0), 0.5);
    }

    // Pauses.
    #[test]
    fn pauses_double_from_the_first_to_the_longest() {
        let mut r = Retry::new(100.0).started(0.0);
        let mut now = 0.0;
        let mut pauses = Vec::new();
        for _ in 0..8 {
            let (at, _) = again(r.failed(now, false));
            pauses.push(at - now);
            now = at;
        }
        let expected = [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0];
        for (pause, want) in pauses.iter().zip(expected) {
            assert!((pause - want).abs() < 1e-9, "{pauses:?}");
        }
    }

    #[test]
    fn a_pause_never_runs_past_the_bound() {
        let mut r = Retry::new(1.0).started(0.0);
        let (at, left) = again(r.failed(0.97, false));
        assert!((left - 0.03).abs() < 1e-12);
        assert!((at - 1.0).abs() < 1e-12);
    }

    // A write: the run starts before the first attempt.
    #[test]
    fn a_write_gives_up_once_the_bound_has_passed_since_its_start() {
        let mut r = Retry::new(10.0).started(5.0);
        again(r.failed(6.0, false));
        again(r.failed(7.0, false));
        again(r.failed(14.9, false));
        assert_eq!(
            r.failed(15.0, false),
            Verdict::GiveUp {
                attempts: 4,
                seconds: 10.0
            }
        );
    }

    // The minimum of attempts: a burst shorter than it survives any load.
    #[test]
    fn a_run_past_its_bound_still_gets_its_minimum_of_attempts() {
        // Each attempt took far longer than the pause (a loaded machine): the
        // bound of 1 s has passed at the second failure.
        let mut r = Retry::new(1.0).started(0.0);
        let mut now = 0.0;
        for attempt in 1..MIN_ATTEMPTS {
            let (at, left) = again(r.failed(now, false));
            assert!(at > now, "attempt {attempt} retried in the past");
            if now >= 1.0 {
                assert_eq!(left, 0.0);
            }
            now += 0.7;
        }
        assert_eq!(
            r.failed(now, false),
            Verdict::GiveUp {
                attempts: MIN_ATTEMPTS,
                seconds: now
            }
        );
    }

    #[test]
    fn an_attempt_that_took_the_bound_by_itself_ends_the_run() {
        // A write to a leader that does not answer: the call's own timeout
        // (4 s) is the bound. One attempt, not four timeouts.
        let mut r = Retry::new(4.0).started(0.0);
        r.attempt(0.0);
        assert_eq!(r.failed(4.0, false), Verdict::GiveUp { attempts: 1, seconds: 4.0 });
        // Within the bound a slow attempt is tried again, as any failure.
        let mut r = Retry::new(10.0).started(0.0);
        r.attempt(0.0);
        again(r.failed(4.0, false));
        // Past the bound, a quick attempt still counts toward the minimum...
        let mut r = Retry::new(1.0).started(0.0);
        r.attempt(0.0);
        again(r.failed(0.7, false));
        r.attempt(0.75);
        again(r.failed(1.45, false));
        // ...and so does one whose start was not given, however long ago.
        again(r.failed(9.0, false));
    }

    #[test]
    fn past_the_bound_the_pauses_are_the_rules() {
        let mut r = Retry::new(1.0).started(0.0);
        let (at, _) = again(r.failed(5.0, false));
        assert!((at - 5.0 - FIRST_PAUSE).abs() < 1e-12);
        let (at, _) = again(r.failed(6.0, false));
        assert!((at - 6.0 - 2.0 * FIRST_PAUSE).abs() < 1e-12);
    }

    #[test]
    fn a_write_whose_first_attempt_outlasted_the_bound_is_tried_again() {
        let mut r = Retry::new(10.0).started(0.0);
        let (at, left) = again(r.failed(12.0, false));
        assert_eq!(left, 0.0);
        assert!((at - 12.0 - FIRST_PAUSE).abs() < 1e-12);
    }

    #[test]
    fn within_the_bound_the_minimum_changes_nothing() {
        // Failures that come quickly: the bound, not the count, ends the run,
        // after more than the minimum of attempts.
        let mut r = Retry::new(1.0).started(0.0);
        let mut now = 0.0;
        let gave_up = loop {
            match r.failed(now, false) {
                Verdict::Again { at, .. } => now = at,
                v @ Verdict::GiveUp { .. } => break v,
            }
        };
        match gave_up {
            Verdict::GiveUp { attempts, seconds } => {
                assert!(attempts > MIN_ATTEMPTS, "{attempts}");
                assert!((seconds - 1.0).abs() < 1e-9, "{seconds}");
            }
            Verdict::Again { .. } => unreachable!(),
        }
    }

    // A read: the run starts at its first failure.
    #[test]
    fn a_read_counts_from_its_first_failure() {
        let mut r = Retry::new(10.0);
        let (_, left) = again(r.failed(50.0, false));
        assert_eq!(left, 10.0);
        again(r.failed(51.0, false));
        again(r.failed(59.0, false));
        assert_eq!(
            r.failed(60.0, false),
            Verdict::GiveUp {
                attempts: 4,
                seconds: 10.0
            }
        );
    }

    // Ported from tests/unit/test_core_decisions.py (the rule through the binding's
    // `Retry`, which served only that test): a run of failures pauses doubling and gives
    // up at its bound, with its attempts and seconds.
    #[test]
    fn a_run_of_failures_pauses_doubling_and_gives_up_at_its_bound() {
        let mut r = Retry::new(2.0).started(100.0);
        let (mut now, mut pauses) = (100.0, Vec::new());
        let verdict = loop {
            match r.failed(now, false) {
                Verdict::Again { at, .. } => {
                    pauses.push(at - now);
                    now = at;
                }
                end @ Verdict::GiveUp { .. } => break end,
            }
        };
        for (pause, want) in pauses.iter().zip([0.05, 0.1, 0.2, 0.4, 0.8]) {
            assert!((pause - want).abs() < 1e-9, "{pauses:?}");
        }
        assert!((now - 102.0).abs() < 1e-9);
        let Verdict::GiveUp { attempts, seconds } = verdict else {
            unreachable!()
        };
        assert_eq!(attempts as usize, pauses.len() + 1);
        assert!((seconds - 2.0).abs() < 1e-9);
    }

    #[test]
    fn a_run_past_its_bound_makes_exactly_its_minimum_of_attempts() {
        // Attempts slower than the bound (a loaded machine): 0.7 s each against 1 s.
        let mut r = Retry::new(1.0).started(0.0);
        let mut now = 0.0;
        for _ in 1..MIN_ATTEMPTS {
            again(r.failed(now, false));
            now += 0.7;
        }
        assert!(matches!(r.failed(now, false), Verdict::GiveUp { attempts, .. } if attempts == MIN_ATTEMPTS));
    }

    // Closing, and bounds that are not positive.
    #[test]
    fn nothing_is_retried_while_closing() {
        let mut r = Retry::new(10.0).started(0.0);
        assert_eq!(r.failed(0.1, true), Verdict::GiveUp { attempts: 1, seconds: 0.1 });
    }

    #[test]
    fn closing_or_a_last_attempt_gives_up_at_the_first_failure() {
        let mut r = Retry::new(10.0).started(0.0);
        r.last_attempt();
        assert!(matches!(r.failed(0.1, false), Verdict::GiveUp { attempts: 1, .. }));
    }

    #[test]
    fn a_last_attempt_is_not_retried() {
        let mut r = Retry::new(10.0).started(0.0);
        again(r.failed(0.1, false));
        r.last_attempt();
        assert!(matches!(r.failed(0.2, false), Verdict::GiveUp { attempts: 2, .. }));
    }

    #[test]
    fn a_zero_or_nan_bound_gives_up_at_the_first_failure() {
        assert!(matches!(Retry::new(0.0).failed(1.0, false), Verdict::GiveUp { attempts: 1, .. }));
        assert!(matches!(
            Retry::new(f64::NAN).failed(1.0, false),
            Verdict::GiveUp { attempts: 1, .. }
        ));
    }
}
