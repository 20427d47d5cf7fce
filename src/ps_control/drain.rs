//! A worker with a notice taken out of the coordinator's rotation and let go, as a
//! state machine: [`WorkerDrain`] says each step, the coordinator's drain thread
//! (`_coordinator/worker_drain.py`) performs it and reports what happened.
//!
//! ```text
//!  start ──cannot hold──▶ Release(no hold) ──released──▶ WaitGone(EXIT_WAIT) ──▶ Done
//!    │can hold                   └──not released──────────────────────────────▶ Done
//!    ▼
//!  Hold(bound: worker_drain_bound) ──idle or not──▶ Release(drained?)
//!                                                      │
//!                        released ◀────────────────────┴──────▶ not released
//!                           │                                      │
//!                 WaitGone(EXIT_WAIT)               WaitGone(slice) … until gone, a new
//!                           │                       incarnation, the stop, or the hold's
//!                           ▼                       bound (unreleased_hold_bound)
//!                 Resume(gone | still answers)                     ▼
//!                                                   Resume(gone | new incarnation |
//!                                                          stopped | bound passed)
//! ```
//!
//! A released worker is waited for whether its thread was held or not: the
//! coordinator's poll does not ask a task it released until it is gone (or the wait
//! ends), so a drain that did not wait would leave the task unasked for good, and
//! the notice of its restarted incarnation unheard (issue 60: TensorFlow's
//! coordinator, which cannot hold a worker, released it the first time and never
//! the second).
//!
//! Times are the caller's `now`, on the clock of the notice's deadline (the
//! coordinator's monotonic clock, where the deadline was placed when the poll's
//! answer arrived).

use super::{unreleased_hold_bound, worker_drain_bound, EXIT_WAIT};

/// What the drain thread does next.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum DrainStep {
    /// Hold the worker's closure thread (it takes no new closure) and wait for its
    /// closure in flight, at most `bound` seconds; report with [`WorkerDrain::idled`].
    Hold { bound: f64 },
    /// Release the worker process; report with [`WorkerDrain::released`]. `drained`:
    /// its closure in flight finished (false: it fails with the worker and runs again
    /// elsewhere); `hold`: the thread is held (false: the coordinator cannot hold it).
    Release { drained: bool, hold: bool },
    /// Wait until the worker process is gone, at most `bound` seconds; report with
    /// [`WorkerDrain::waited`]. `holding`: the release failed and the worker is kept out
    /// of the rotation for at most this many seconds in all (Some only at the first
    /// wait of that hold, to be said once).
    WaitGone { bound: f64, holding: Option<f64> },
    /// Resume the worker's thread: the drain is over, for this reason.
    Resume(Ended),
    /// Over, with nothing held (the coordinator could not hold the thread, or, after a
    /// released worker's [`DrainStep::WaitGone`], it was not held).
    Done,
}

/// Why a drain that held the worker's thread ends.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Ended {
    /// The worker process is gone.
    Gone,
    /// Released, but still answering after [`EXIT_WAIT`].
    StillAnswers,
    /// A new incarnation of the worker answers: watched like the first.
    NewIncarnation,
    /// The coordinator's poller stopped.
    Stopped,
    /// The release failed and the worker still serves after the hold's bound
    /// (seconds): it takes closures again.
    HoldBoundPassed(f64),
}

/// What happened to the worker (the drain's record).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Released after its thread was held.
    Released,
    /// The release failed.
    NotReleased,
    /// Released without a hold (the coordinator could not hold its thread).
    NoHold,
}

// The words of the log lines and records (the binding's `str`s).
crate::words!(Outcome {
    Outcome::Released => "released",
    Outcome::NotReleased => "not released",
    Outcome::NoHold => "no hold",
});

#[derive(Clone, Copy, Debug, PartialEq)]
enum Phase {
    Start,
    Draining,
    Releasing {
        hold: bool,
    },
    WaitingGone,
    /// Released without a hold: waited for all the same (module docs), nothing to resume.
    WaitingGoneUnheld,
    HoldingUnreleased {
        until: f64,
        bound: f64,
    },
    Over,
}

/// One worker's drain (module docs).
#[derive(Clone, Debug)]
pub struct WorkerDrain {
    deadline: Option<f64>,
    peer_timeout: f64,
    phase: Phase,
    outcome: Option<Outcome>,
}

impl WorkerDrain {
    /// The drain of a worker whose notice names `deadline` (on the caller's clock, None: none);
    /// `peer_timeout` is the coordinator's, the bound of a served worker's own wait.
    #[must_use]
    pub fn new(deadline: Option<f64>, peer_timeout: f64) -> Self {
        WorkerDrain {
            deadline,
            peer_timeout,
            phase: Phase::Start,
            outcome: None,
        }
    }

    /// What happened to the worker, once known.
    #[must_use]
    pub fn outcome(&self) -> Option<Outcome> {
        self.outcome
    }

    /// The first step: hold the thread when the coordinator can (`can_hold`), else
    /// release the worker at once.
    pub fn start(&mut self, can_hold: bool, now: f64) -> DrainStep {
        if self.phase != Phase::Start {
            return self.misuse();
        }
        if can_hold {
            self.phase = Phase::Draining;
            DrainStep::Hold {
                bound: worker_drain_bound(self.deadline, now),
            }
        } else {
            self.phase = Phase::Releasing { hold: false };
            DrainStep::Release {
                drained: false,
                hold: false,
            }
        }
    }

    /// The wait for the closure in flight ended: `idle` when it finished.
    pub fn idled(&mut self, idle: bool) -> DrainStep {
        if self.phase != Phase::Draining {
            return self.misuse();
        }
        self.phase = Phase::Releasing { hold: true };
        DrainStep::Release { drained: idle, hold: true }
    }

    /// The release was made: `ok` when the worker accepted it; `stopped` when the
    /// poller has stopped.
    pub fn released(&mut self, ok: bool, stopped: bool, now: f64) -> DrainStep {
        let Phase::Releasing { hold } = self.phase else {
            return self.misuse();
        };
        if !hold {
            if !ok {
                self.outcome = Some(Outcome::NotReleased);
                self.phase = Phase::Over;
                return DrainStep::Done;
            }
            self.outcome = Some(Outcome::NoHold);
            self.phase = Phase::WaitingGoneUnheld;
            return DrainStep::WaitGone {
                bound: EXIT_WAIT,
                holding: None,
            };
        }
        if ok {
            self.outcome = Some(Outcome::Released);
            self.phase = Phase::WaitingGone;
            return DrainStep::WaitGone {
                bound: EXIT_WAIT,
                holding: None,
            };
        }
        self.outcome = Some(Outcome::NotReleased);
        let bound = unreleased_hold_bound(self.deadline, self.peer_timeout, EXIT_WAIT, now);
        self.phase = Phase::HoldingUnreleased { until: now + bound, bound };
        if stopped {
            return self.end(Ended::Stopped);
        }
        if bound <= 0.0 {
            return self.end(Ended::HoldBoundPassed(bound));
        }
        DrainStep::WaitGone {
            bound: bound.min(EXIT_WAIT),
            holding: Some(bound),
        }
    }

    /// A wait for the worker to be gone ended: `gone` when it is, `same_incarnation`
    /// when the incarnation that answers is still the drained one, `stopped` when the
    /// poller has stopped.
    pub fn waited(&mut self, gone: bool, same_incarnation: bool, stopped: bool, now: f64) -> DrainStep {
        match self.phase {
            Phase::WaitingGone => self.end(if gone { Ended::Gone } else { Ended::StillAnswers }),
            Phase::WaitingGoneUnheld => {
                self.phase = Phase::Over;
                DrainStep::Done
            }
            Phase::HoldingUnreleased { until, bound } => {
                if gone {
                    self.end(Ended::Gone)
                } else if !same_incarnation {
                    self.end(Ended::NewIncarnation)
                } else if stopped {
                    self.end(Ended::Stopped)
                } else if now >= until {
                    self.end(Ended::HoldBoundPassed(bound))
                } else {
                    DrainStep::WaitGone {
                        bound: (until - now).min(EXIT_WAIT),
                        holding: None,
                    }
                }
            }
            _ => self.misuse(),
        }
    }

    fn end(&mut self, why: Ended) -> DrainStep {
        self.phase = Phase::Over;
        DrainStep::Resume(why)
    }

    /// A report that does not fit the phase (a caller's bug): the drain ends, and a
    /// held thread is resumed rather than left held.
    fn misuse(&mut self) -> DrainStep {
        let held = matches!(
            self.phase,
            Phase::Draining | Phase::Releasing { hold: true } | Phase::WaitingGone | Phase::HoldingUnreleased { .. }
        );
        self.phase = Phase::Over;
        if held {
            DrainStep::Resume(Ended::Stopped)
        } else {
            DrainStep::Done
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: f64 = 1_000.0;

    #[test]
    fn a_drained_worker_is_released_and_waited_for() {
        let mut d = WorkerDrain::new(Some(NOW + 31.0), 60.0);
        assert_eq!(d.start(true, NOW), DrainStep::Hold { bound: 30.0 });
        assert_eq!(d.idled(true), DrainStep::Release { drained: true, hold: true });
        assert_eq!(
            d.released(true, false, NOW + 1.0),
            DrainStep::WaitGone {
                bound: EXIT_WAIT,
                holding: None
            }
        );
        assert_eq!(d.outcome(), Some(Outcome::Released));
        assert_eq!(d.waited(true, true, false, NOW + 2.0), DrainStep::Resume(Ended::Gone));
    }

    /// Each way a drain goes: the reports in order and the steps they get.
    #[test]
    fn the_drain_table() {
        // (can hold, idle, released, waits: (gone, same incarnation, stopped, now), last step, outcome)
        type Wait = (bool, bool, bool, f64);
        type Row<'a> = (bool, bool, bool, &'a [Wait], DrainStep, Outcome);
        let rows: &[Row<'_>] = &[
            // No hold: released at once and waited for (gone or not), nothing to resume.
            (
                false,
                false,
                true,
                &[(true, true, false, NOW + 2.0)],
                DrainStep::Done,
                Outcome::NoHold,
            ),
            (
                false,
                false,
                true,
                &[(false, true, false, NOW + 31.0)],
                DrainStep::Done,
                Outcome::NoHold,
            ),
            (false, false, false, &[], DrainStep::Done, Outcome::NotReleased),
            // Released but still answering after EXIT_WAIT: resumed all the same.
            (
                true,
                false,
                true,
                &[(false, true, false, NOW + 31.0)],
                DrainStep::Resume(Ended::StillAnswers),
                Outcome::Released,
            ),
            // Not released: held until gone, a new incarnation, the stop or the bound.
            (
                true,
                true,
                false,
                &[(false, true, false, NOW + 30.0), (true, true, false, NOW + 40.0)],
                DrainStep::Resume(Ended::Gone),
                Outcome::NotReleased,
            ),
            (
                true,
                true,
                false,
                &[(false, false, false, NOW + 30.0)],
                DrainStep::Resume(Ended::NewIncarnation),
                Outcome::NotReleased,
            ),
            (
                true,
                true,
                false,
                &[(false, true, true, NOW + 30.0)],
                DrainStep::Resume(Ended::Stopped),
                Outcome::NotReleased,
            ),
            // Deadline at NOW + 10: the hold lasts 10 + EXIT_WAIT = 40 s.
            (
                true,
                true,
                false,
                &[(false, true, false, NOW + 30.0), (false, true, false, NOW + 40.0)],
                DrainStep::Resume(Ended::HoldBoundPassed(40.0)),
                Outcome::NotReleased,
            ),
        ];
        for (i, (can_hold, idle, released, waits, last, outcome)) in rows.iter().enumerate() {
            let mut d = WorkerDrain::new(Some(NOW + 10.0), 60.0);
            let mut step = d.start(*can_hold, NOW);
            if *can_hold {
                assert_eq!(step, DrainStep::Hold { bound: 9.0 }, "row {i}");
                step = d.idled(*idle);
            }
            assert_eq!(
                step,
                DrainStep::Release {
                    drained: *idle && *can_hold,
                    hold: *can_hold
                },
                "row {i}"
            );
            step = d.released(*released, false, NOW);
            for &(gone, same, stopped, now) in *waits {
                assert!(matches!(step, DrainStep::WaitGone { .. }), "row {i}: {step:?}");
                step = d.waited(gone, same, stopped, now);
            }
            assert_eq!(step, *last, "row {i}");
            assert_eq!(d.outcome(), Some(*outcome), "row {i}");
        }
    }

    /// Issue 60 (`ps_preemption` seed 310): TensorFlow's coordinator cannot hold a
    /// worker; its drain released worker 1 and ended there. The poll asks a released
    /// task nothing until the drain has waited for it to be gone, so worker 1 was never
    /// asked again and its restarted incarnation's notice was never heard. A released
    /// worker is now waited for with or without a hold.
    #[test]
    fn a_worker_released_without_a_hold_is_waited_for_as_a_held_one() {
        let mut d = WorkerDrain::new(Some(NOW + 25.0), 30.0);
        assert_eq!(
            d.start(false, NOW),
            DrainStep::Release {
                drained: false,
                hold: false
            }
        );
        assert_eq!(
            d.released(true, false, NOW),
            DrainStep::WaitGone {
                bound: EXIT_WAIT,
                holding: None
            }
        );
        assert_eq!(d.outcome(), Some(Outcome::NoHold));
        // Gone or not, the drain ends; nothing was held, nothing is resumed.
        assert_eq!(d.waited(true, true, false, NOW + 1.0), DrainStep::Done);
        assert_eq!(d.waited(true, true, false, NOW + 1.0), DrainStep::Done, "over");
        // A release that failed leaves no task unasked: nothing to wait for.
        let mut d = WorkerDrain::new(None, 30.0);
        d.start(false, NOW);
        assert_eq!(d.released(false, false, NOW), DrainStep::Done);
    }

    #[test]
    fn an_unreleased_hold_is_said_once_and_waits_in_slices_of_exit_wait() {
        // No deadline: the worker serves up to SERVE_CAP_FACTOR x peer_timeout.
        let mut d = WorkerDrain::new(None, 20.0);
        d.start(true, NOW);
        d.idled(true);
        let bound = unreleased_hold_bound(None, 20.0, EXIT_WAIT, NOW);
        assert_eq!(
            d.released(false, false, NOW),
            DrainStep::WaitGone {
                bound: EXIT_WAIT,
                holding: Some(bound)
            }
        );
        assert_eq!(
            d.waited(false, true, false, NOW + 30.0),
            DrainStep::WaitGone {
                bound: EXIT_WAIT,
                holding: None
            }
        );
        // The last slice ends at the hold's bound.
        assert_eq!(
            d.waited(false, true, false, NOW + bound - 5.0),
            DrainStep::WaitGone { bound: 5.0, holding: None }
        );
        assert_eq!(
            d.waited(false, true, false, NOW + bound),
            DrainStep::Resume(Ended::HoldBoundPassed(bound))
        );
    }

    #[test]
    fn a_stop_before_the_unreleased_hold_ends_it_at_once() {
        let mut d = WorkerDrain::new(None, 20.0);
        d.start(true, NOW);
        d.idled(false);
        assert_eq!(d.released(false, true, NOW), DrainStep::Resume(Ended::Stopped));
    }

    #[test]
    fn a_deadline_already_passed_drains_for_nothing() {
        let mut d = WorkerDrain::new(Some(NOW - 5.0), 20.0);
        assert_eq!(d.start(true, NOW), DrainStep::Hold { bound: 0.0 });
    }

    /// A report out of order is a bug of the caller: the drain ends, and a held thread
    /// is resumed, never left held.
    #[test]
    fn a_report_out_of_order_resumes_a_held_thread() {
        let mut d = WorkerDrain::new(None, 20.0);
        assert_eq!(d.idled(true), DrainStep::Done);
        let mut d = WorkerDrain::new(None, 20.0);
        d.start(true, NOW);
        assert_eq!(d.waited(true, true, false, NOW), DrainStep::Resume(Ended::Stopped));
        assert_eq!(d.start(true, NOW), DrainStep::Done);
    }
}
