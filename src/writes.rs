//! The driver's writes: which one to attempt, when, and what follows a
//! failure.
//!
//! The protocol driver (`_protocol/driver.py`) is one thread that takes every
//! input from the inbox and performs the coordination-service writes the
//! resolver asks for: the acknowledgement of a step key, and the claim and
//! announce of a notice. It never sleeps between the attempts of a failing
//! write, so that an input that arrives meanwhile is taken at once. This
//! module decides, sans-IO in the quinn-proto way, everything about those
//! writes except performing them:
//!
//! * [`Writes::poll_action`]: the one write to attempt now, if any is due.
//!   **Acknowledgements go first**, oldest first: a leader waits for them,
//!   bounded by its peer timeout, so one never waits behind the retries of a
//!   claim, only behind the one call already in flight. Then the write of the
//!   notice in hand.
//! * [`Writes::poll_timeout`]: when the driver must be woken for the next
//!   attempt (the deadline of its next receive), or `None` with nothing
//!   pending.
//! * [`Writes::failed`]: an attempt failed; the retry rule ([`crate::retry`])
//!   says when the next one is due, or gives up and forgets the write.
//! * [`Writes::close`]: the handler closes. Every acknowledgement gets one
//!   last attempt (a leader may be waiting for it, and without it would wait
//!   out its peer timeout), and so does the notice's write when it must be
//!   finished (an announce: the claim was won, and peers learn of the notice
//!   only from it); any other notice write is dropped (a claim now would make
//!   the other workers stand down for a leader that will never publish).
//!
//! At most one notice is handled at a time: while [`Writes::busy`], the
//! driver keeps later notices waiting. Every method takes `now` (seconds on
//! the caller's monotonic clock) and none reads a clock.
//!
//! | event | state | decision |
//! | --- | --- | --- |
//! | a step key to acknowledge | any | queued behind earlier acknowledgements, due now |
//! | a claim or announce | no notice write | the notice's write, due now |
//! | `poll_action` | an acknowledgement due | the oldest due acknowledgement |
//! | `poll_action` | no acknowledgement due, the notice's write due | the notice's write |
//! | `poll_action` | nothing due | nothing; `poll_timeout` is the earliest due time |
//! | attempt succeeded | | the write is forgotten |
//! | attempt failed | the rule retries | due again after the rule's pause |
//! | attempt failed | the rule gives up | forgotten; the caller raises the named error |
//! | `close` | | every acknowledgement, then an announce, gets one last attempt; a claim is dropped |

use std::collections::VecDeque;

use crate::retry::{Retry, Verdict};

/// A write's handle, given when it is queued and used to report each attempt.
pub type WriteId = u64;

crate::wire! {
    /// What a write is to the driver (`Action.kind` in Python).
    pub enum WriteKind via write_kind {
        /// The acknowledgement of a step key: a leader waits for it.
        Acknowledge {},
        /// The write of the notice in hand: a claim (dropped at close).
        Claim {},
        /// The write of the notice in hand that must be finished: an announce
        /// (one last attempt at close).
        Announce {},
    }
}

/// The core's name for a write's kind.
pub type Kind = WriteKind;

#[derive(Debug)]
struct Pending {
    id: WriteId,
    retry: Retry,
    due: f64,
}

/// What `close` leaves to do.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Closing {
    /// Writes to attempt once more, in this order; a failure is not retried
    /// (each one's next failure gives up).
    pub last_attempts: Vec<WriteId>,
    /// The notice's write that is dropped, if any.
    pub dropped: Option<WriteId>,
}

/// The driver's pending writes; see the module documentation.
#[derive(Debug, Default)]
pub struct Writes {
    acks: VecDeque<Pending>,
    notice: Option<(Kind, Pending)>,
    next_id: WriteId,
}

impl Writes {
    /// No write pending.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Queues a write of `kind`, retried for `bound` seconds from `now` and
    /// due at once. An acknowledgement joins the queue of acknowledgements; a
    /// claim or announce becomes the notice's write.
    ///
    /// # Errors
    ///
    /// [`Busy`] for a claim or announce while another notice's write is
    /// pending: the driver keeps later notices waiting until [`Writes::busy`]
    /// is false.
    pub fn push(&mut self, kind: Kind, bound: f64, now: f64) -> Result<WriteId, Busy> {
        if !matches!(kind, Kind::Acknowledge {}) && self.notice.is_some() {
            return Err(Busy);
        }
        let id = self.next_id;
        self.next_id += 1;
        let pending = Pending {
            id,
            retry: Retry::new(bound).started(now),
            due: now,
        };
        if matches!(kind, Kind::Acknowledge {}) {
            self.acks.push_back(pending);
        } else {
            self.notice = Some((kind, pending));
        }
        Ok(id)
    }

    /// A notice's write (claim or announce) is pending: later notices wait.
    #[must_use]
    pub fn busy(&self) -> bool {
        self.notice.is_some()
    }

    /// Writes pending.
    #[must_use]
    pub fn len(&self) -> usize {
        self.acks.len() + usize::from(self.notice.is_some())
    }

    /// No write pending.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The write to attempt at `now`: the oldest due acknowledgement, else the
    /// notice's write if it is due.
    #[must_use]
    pub fn poll_action(&self, now: f64) -> Option<WriteId> {
        self.acks
            .iter()
            .chain(self.notice.iter().map(|(_, p)| p))
            .find(|p| p.due <= now)
            .map(|p| p.id)
    }

    /// When the next write is due (at or before `now`: one is due now), or
    /// `None` with no write pending.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<f64> {
        self.acks
            .iter()
            .chain(self.notice.iter().map(|(_, p)| p))
            .map(|p| p.due)
            .reduce(f64::min)
    }

    /// The attempt of `id` succeeded: the write is forgotten. Returns its
    /// kind, or `None` for an unknown handle.
    pub fn done(&mut self, id: WriteId) -> Option<Kind> {
        self.take(id).map(|(kind, _)| kind)
    }

    /// The attempt of `id` failed at `now` (`closing`: the handler is
    /// closing, nothing is retried). `Again`: it is due at `at`. `GiveUp`:
    /// it is forgotten, and the caller raises the named error. `None` for an
    /// unknown handle.
    pub fn failed(&mut self, id: WriteId, now: f64, closing: bool) -> Option<Verdict> {
        let pending = self.get_mut(id)?;
        let verdict = pending.retry.failed(now, closing);
        match verdict {
            Verdict::Again { at, .. } => pending.due = at,
            Verdict::GiveUp { .. } => {
                self.take(id);
            }
        }
        Some(verdict)
    }

    /// Failed attempts of `id` so far (0 for an unknown handle).
    #[must_use]
    pub fn attempts(&self, id: WriteId) -> u32 {
        self.iter().find(|p| p.id == id).map_or(0, |p| p.retry.attempts())
    }

    /// The handler closes: every acknowledgement, oldest first, then an
    /// announce, gets one last attempt, due at once; a claim is dropped
    /// (forgotten). See the module documentation for why.
    pub fn close(&mut self, now: f64) -> Closing {
        let mut closing = Closing::default();
        if let Some((Kind::Claim {}, _)) = &self.notice {
            closing.dropped = self.notice.take().map(|(_, p)| p.id);
        }
        for pending in self.acks.iter_mut().chain(self.notice.iter_mut().map(|(_, p)| p)) {
            pending.retry.last_attempt();
            pending.due = now;
            closing.last_attempts.push(pending.id);
        }
        closing
    }

    fn iter(&self) -> impl Iterator<Item = &Pending> {
        self.acks.iter().chain(self.notice.iter().map(|(_, p)| p))
    }

    fn get_mut(&mut self, id: WriteId) -> Option<&mut Pending> {
        self.acks
            .iter_mut()
            .chain(self.notice.iter_mut().map(|(_, p)| p))
            .find(|p| p.id == id)
    }

    fn take(&mut self, id: WriteId) -> Option<(Kind, Pending)> {
        if let Some(i) = self.acks.iter().position(|p| p.id == id) {
            return self.acks.remove(i).map(|p| (Kind::Acknowledge {}, p));
        }
        if self.notice.as_ref().is_some_and(|(_, p)| p.id == id) {
            return self.notice.take();
        }
        None
    }
}

/// A claim or announce was queued while another notice's write is pending.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a notice's write is already pending: the next notice waits for it")]
pub struct Busy;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::retry::{FIRST_PAUSE, MIN_ATTEMPTS};

    const BOUND: f64 = 10.0;

    fn again_at(v: Option<Verdict>) -> f64 {
        match v {
            Some(Verdict::Again { at, .. }) => at,
            other => panic!("expected a retry: {other:?}"),
        }
    }

    #[test]
    fn nothing_pending_nothing_to_do_and_no_wake_up() {
        let w = Writes::new();
        assert_eq!(w.poll_action(0.0), None);
        assert_eq!(w.poll_timeout(), None);
        assert!(!w.busy());
        assert!(w.is_empty());
    }

    #[test]
    fn a_queued_write_is_due_at_once() {
        let mut w = Writes::new();
        let claim = w.push(Kind::Claim {}, BOUND, 5.0).unwrap();
        assert_eq!(w.poll_timeout(), Some(5.0));
        assert_eq!(w.poll_action(5.0), Some(claim));
        assert!(w.busy());
    }

    #[test]
    fn an_acknowledgement_goes_before_the_notices_write() {
        let mut w = Writes::new();
        let claim = w.push(Kind::Claim {}, BOUND, 0.0).unwrap();
        let ack = w.push(Kind::Acknowledge {}, BOUND, 0.1).unwrap();
        assert_eq!(w.poll_action(0.1), Some(ack));
        assert_eq!(w.done(ack), Some(Kind::Acknowledge {}));
        assert_eq!(w.poll_action(0.1), Some(claim));
    }

    #[test]
    fn acknowledgements_go_oldest_first() {
        let mut w = Writes::new();
        let first = w.push(Kind::Acknowledge {}, BOUND, 0.0).unwrap();
        let second = w.push(Kind::Acknowledge {}, BOUND, 0.0).unwrap();
        assert_eq!(w.poll_action(0.0), Some(first));
        w.done(first);
        assert_eq!(w.poll_action(0.0), Some(second));
    }

    #[test]
    fn an_acknowledgement_never_waits_behind_a_failing_claim() {
        let mut w = Writes::new();
        let claim = w.push(Kind::Claim {}, BOUND, 0.0).unwrap();
        let at = again_at(w.failed(claim, 0.0, false));
        assert!((at - FIRST_PAUSE).abs() < 1e-12);
        // The claim is not due; an acknowledgement that arrives is.
        assert_eq!(w.poll_action(0.01), None);
        assert_eq!(w.poll_timeout(), Some(at));
        let ack = w.push(Kind::Acknowledge {}, BOUND, 0.01).unwrap();
        assert_eq!(w.poll_action(0.01), Some(ack));
        assert_eq!(w.poll_timeout(), Some(0.01));
    }

    #[test]
    fn a_failing_acknowledgement_lets_a_due_one_after_it_go() {
        let mut w = Writes::new();
        let first = w.push(Kind::Acknowledge {}, BOUND, 0.0).unwrap();
        let second = w.push(Kind::Acknowledge {}, BOUND, 0.0).unwrap();
        again_at(w.failed(first, 0.0, false));
        assert_eq!(w.poll_action(0.0), Some(second));
    }

    #[test]
    fn a_failed_attempt_is_due_after_the_rules_pause_and_never_before() {
        let mut w = Writes::new();
        let ack = w.push(Kind::Acknowledge {}, BOUND, 0.0).unwrap();
        let at = again_at(w.failed(ack, 1.0, false));
        assert_eq!(w.poll_action(at - 1e-9), None);
        assert_eq!(w.poll_action(at), Some(ack));
        assert_eq!(w.attempts(ack), 1);
    }

    #[test]
    fn a_write_is_given_up_by_the_rule_and_forgotten() {
        let mut w = Writes::new();
        let claim = w.push(Kind::Claim {}, 1.0, 0.0).unwrap();
        let mut now = 0.0;
        let verdict = loop {
            match w.failed(claim, now, false) {
                Some(Verdict::Again { at, .. }) => now = at,
                other => break other,
            }
        };
        assert!(
            matches!(verdict, Some(Verdict::GiveUp { attempts, .. }) if attempts >= MIN_ATTEMPTS),
            "{verdict:?}"
        );
        assert!(!w.busy());
        assert_eq!(w.poll_action(now), None);
        assert_eq!(w.failed(claim, now, false), None);
    }

    #[test]
    fn a_burst_shorter_than_the_minimum_survives_attempts_slower_than_the_bound() {
        // A loaded machine: each attempt ends 0.7 s after the last, against 1 s.
        let mut w = Writes::new();
        let claim = w.push(Kind::Claim {}, 1.0, 0.0).unwrap();
        for i in 1..MIN_ATTEMPTS {
            again_at(w.failed(claim, 0.7 * f64::from(i), false));
        }
        assert_eq!(w.done(claim), Some(Kind::Claim {}));
    }

    #[test]
    fn the_next_notice_waits_for_the_notices_write() {
        let mut w = Writes::new();
        let claim = w.push(Kind::Claim {}, BOUND, 0.0).unwrap();
        assert_eq!(w.push(Kind::Claim {}, BOUND, 0.0), Err(Busy));
        assert_eq!(w.push(Kind::Announce {}, BOUND, 0.0), Err(Busy));
        w.done(claim);
        assert!(!w.busy());
        assert!(w.push(Kind::Announce {}, BOUND, 0.0).is_ok());
    }

    #[test]
    fn nothing_is_retried_while_closing() {
        let mut w = Writes::new();
        let ack = w.push(Kind::Acknowledge {}, BOUND, 0.0).unwrap();
        assert!(matches!(w.failed(ack, 0.1, true), Some(Verdict::GiveUp { attempts: 1, .. })));
        assert!(w.is_empty());
    }

    #[test]
    fn close_gives_acknowledgements_and_an_announce_one_last_attempt() {
        let mut w = Writes::new();
        let first = w.push(Kind::Acknowledge {}, BOUND, 0.0).unwrap();
        let announce = w.push(Kind::Announce {}, BOUND, 0.0).unwrap();
        let second = w.push(Kind::Acknowledge {}, BOUND, 0.0).unwrap();
        // Not due before the close (a failure's pause): due at once after it.
        again_at(w.failed(second, 0.0, false));
        let closing = w.close(0.01);
        assert_eq!(closing.last_attempts, vec![first, second, announce]);
        assert_eq!(closing.dropped, None);
        assert_eq!(w.poll_action(0.01), Some(first));
        for id in closing.last_attempts {
            assert!(matches!(w.failed(id, 0.02, false), Some(Verdict::GiveUp { .. })));
        }
        assert!(w.is_empty());
    }

    #[test]
    fn close_drops_a_claim() {
        let mut w = Writes::new();
        let ack = w.push(Kind::Acknowledge {}, BOUND, 0.0).unwrap();
        let claim = w.push(Kind::Claim {}, BOUND, 0.0).unwrap();
        let closing = w.close(0.0);
        assert_eq!(closing.last_attempts, vec![ack]);
        assert_eq!(closing.dropped, Some(claim));
        assert!(!w.busy());
    }

    #[test]
    fn a_stale_handle_changes_nothing() {
        let mut w = Writes::new();
        let ack = w.push(Kind::Acknowledge {}, BOUND, 0.0).unwrap();
        assert_eq!(w.done(ack), Some(Kind::Acknowledge {}));
        assert_eq!(w.done(ack), None);
        assert_eq!(w.failed(ack, 0.0, false), None);
        assert_eq!(w.attempts(ack), 0);
    }
}
