//! A leader's wait for the acknowledgements of the step it published.
//!
//! After it publishes a round's step, the leader waits until every other
//! worker wrote `RECEIVED_SIGNAL_<round>_<id>`, bounded by its peer timeout
//! (TensorFlow waits forever). It reads one key at a time, the first still
//! missing, in slices of [`ACK_READ_SLICE`]: a read that answers with nothing
//! is "not yet". A read that fails counts as "not yet" too, under the retry
//! rule ([`crate::retry`]): a run of failures starts at the first one and ends
//! at the next read that answers; one that lasts longer than its bound is the
//! service's error (a peer reported one), which the leader raises rather than
//! wait out the peer timeout. A pause between two failed reads never goes past
//! the wait's own end.
//!
//! | state | event | next |
//! | --- | --- | --- |
//! | keys missing, time left | [`AckWait::next`] | read the first missing key for at most a slice |
//! | reading | [`AckWait::answered`] with a value | that key is acknowledged; the run of failures ends |
//! | reading | [`AckWait::answered`] with nothing | still missing; the run of failures ends |
//! | reading | [`AckWait::failed`] | read again after the rule's pause (at most until the end), or give up |
//! | no key missing | [`AckWait::next`] | done |
//! | keys missing, the end passed | [`AckWait::next`] | over: the keys still missing, and a run of failures still open |
//!
//! Sans-IO: every method takes `at`, seconds on the clock the wait counts on
//! (the binding's), and the wait never reads a clock.

use std::collections::VecDeque;

use crate::deadline::Deadline;
use crate::retry::{Retry, Verdict};
pub use crate::step_resolution::ACK_READ_SLICE;

/// What the leader does next ([`AckWait::next`]).
#[derive(Clone, Debug, PartialEq)]
pub enum AckStep {
    /// Read `key` for at most `timeout` seconds.
    Read { key: String, timeout: f64 },
    /// Every worker acknowledged.
    Done,
    /// The wait's end passed with `missing` keys still unwritten (in the
    /// order of the wait).
    Over { missing: Vec<String> },
}

/// One leader's wait for one round's acknowledgements.
#[derive(Debug)]
pub struct AckWait {
    pending: VecDeque<String>,
    end: Deadline,
    failing: Option<Retry>,
}

impl AckWait {
    /// A wait for `keys`, from `at`, for at most `peer_timeout` seconds.
    #[must_use]
    pub fn new(keys: Vec<String>, peer_timeout: f64, at: f64) -> Self {
        AckWait {
            pending: keys.into(),
            end: Deadline::new(at, Some(peer_timeout)),
            failing: None,
        }
    }

    /// What to do at `at`.
    #[must_use]
    pub fn next(&self, at: f64) -> AckStep {
        match self.pending.front() {
            None => AckStep::Done,
            Some(_) if self.end.passed(at) => AckStep::Over {
                missing: self.pending.iter().cloned().collect(),
            },
            Some(key) => AckStep::Read {
                key: key.clone(),
                timeout: self.end.slice(at, ACK_READ_SLICE),
            },
        }
    }

    /// The read of the first missing key answered: `found` when the key was
    /// written. Either way a run of failures ends.
    pub fn answered(&mut self, found: bool) {
        self.failing = None;
        if found {
            self.pending.pop_front();
        }
    }

    /// The read failed at `at`: a run of failures starts (retried for `bound`
    /// seconds, the protocol's retry bound now) or goes on. `Again` says when to
    /// read again, never past the wait's end; `GiveUp` ends the wait with the
    /// service's error. Nothing is retried while `closing`.
    pub fn failed(&mut self, bound: f64, at: f64, closing: bool) -> Verdict {
        let run = self.failing.get_or_insert_with(|| Retry::new(bound));
        match run.failed(at, closing) {
            Verdict::Again { at: again, left } => Verdict::Again {
                at: self.end.end().map_or(again, |end| again.min(end.max(at))),
                left,
            },
            give_up => give_up,
        }
    }

    /// The run of failures still open at `at`: `(failed reads, seconds since
    /// the first)`; None when the last read answered.
    #[must_use]
    pub fn failing(&self, at: f64) -> Option<(u32, f64)> {
        let run = self.failing.as_ref()?;
        Some((run.attempts(), run.since().map_or(0.0, |since| (at - since).max(0.0))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::retry::{FIRST_PAUSE, MIN_ATTEMPTS};

    fn keys(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| (*s).to_owned()).collect()
    }

    fn read(key: &str, timeout: f64) -> AckStep {
        AckStep::Read {
            key: key.to_owned(),
            timeout,
        }
    }

    #[test]
    fn the_first_missing_key_is_read_in_slices_until_every_one_answered() {
        let mut w = AckWait::new(keys(&["A_1", "A_2"]), 30.0, 100.0);
        assert_eq!(w.next(100.0), read("A_1", ACK_READ_SLICE));
        w.answered(false);
        assert_eq!(w.next(101.0), read("A_1", ACK_READ_SLICE), "nothing yet: the same key");
        w.answered(true);
        assert_eq!(w.next(101.5), read("A_2", ACK_READ_SLICE));
        // The last slice is what is left of the wait.
        assert_eq!(w.next(129.75), read("A_2", 0.25));
        w.answered(true);
        assert_eq!(w.next(129.8), AckStep::Done);
        assert_eq!(w.next(500.0), AckStep::Done, "done stays done past the end");
    }

    #[test]
    fn the_end_names_every_key_still_missing() {
        let mut w = AckWait::new(keys(&["A_1", "A_2", "A_3"]), 30.0, 0.0);
        w.answered(true);
        assert_eq!(
            w.next(30.0),
            AckStep::Over {
                missing: keys(&["A_2", "A_3"])
            }
        );
        assert_eq!(AckWait::new(keys(&[]), 30.0, 0.0).next(0.0), AckStep::Done);
        assert_eq!(
            AckWait::new(keys(&["A_1"]), 0.0, 0.0).next(0.0),
            AckStep::Over { missing: keys(&["A_1"]) }
        );
    }

    #[test]
    fn failed_reads_are_a_run_that_an_answer_ends_and_that_gives_up_past_its_bound() {
        let bound = 2.0;
        let mut w = AckWait::new(keys(&["A_1"]), 30.0, 0.0);
        let Verdict::Again { at, .. } = w.failed(bound, 1.0, false) else {
            panic!("first failure")
        };
        assert!((at - (1.0 + FIRST_PAUSE)).abs() < 1e-9);
        assert_eq!(w.failing(1.5), Some((1, 0.5)));
        // An answer ends the run: the next failure starts a new one.
        w.answered(false);
        assert_eq!(w.failing(2.0), None);
        let mut t = 10.0;
        let mut failures = 0;
        loop {
            failures += 1;
            match w.failed(bound, t, false) {
                Verdict::Again { at, .. } => t = at,
                Verdict::GiveUp { attempts, seconds } => {
                    assert_eq!(attempts, failures);
                    assert!(attempts >= MIN_ATTEMPTS && seconds >= bound, "{attempts} {seconds}");
                    break;
                }
            }
        }
        assert!(
            matches!(w.failed(bound, t, true), Verdict::GiveUp { .. }),
            "closing retries nothing"
        );
    }

    #[test]
    fn a_pause_never_goes_past_the_wait_s_end() {
        let mut w = AckWait::new(keys(&["A_1"]), 5.0, 0.0);
        let Verdict::Again { at, .. } = w.failed(10.0, 4.99, false) else {
            panic!("first failure")
        };
        assert_eq!(at, 5.0);
        assert_eq!(w.next(at), AckStep::Over { missing: keys(&["A_1"]) });
        let mut late = AckWait::new(keys(&["A_1"]), 5.0, 0.0);
        let Verdict::Again { at, .. } = late.failed(10.0, 6.0, false) else {
            panic!("first failure")
        };
        assert_eq!(at, 6.0, "already past the end: no pause");
    }
}
