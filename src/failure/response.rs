//! The response to a closure's error on a coordinator's worker thread: TF's order of
//! decisions (`WorkerPreemptionHandler.wait_on_failure`, steps 1–4 of the module
//! above), one question at a time.
//!
//! Two of the questions have effects (a strike counted against a PS task, a timeout
//! counted against the cluster), and TF asks the second only when the first said no,
//! so the answers cannot be gathered up front. [`respond`] takes the last question
//! and its answer and says what to ask next or what to do. The coordinator's protocol
//! object asks them, one failure lane per worker thread
//! (`crate::ps_control::coordinator`, `Lane::Failure`); the Python coordinator answers
//! each question (with TF's own `Cluster` methods, which tests and other libraries
//! patch) and carries out the outcome. After a worker failure the thread waits for the
//! worker's recovery, within the lane's bound; [`after_recovery_wait`] says what
//! follows the wait.
//!
//! ```text
//!  start ─▶ TransientPsFailure ─yes─▶ Retry(TransientPsFailure)
//!                 │no
//!                 ▼
//!           TransientTimeout ───yes─▶ Retry(TransientTimeout)
//!                 │no
//!                 ▼
//!         DerivedCancellation ──yes─▶ Retry(DerivedCancellation)
//!                 │no
//!                 ▼
//!           WorkerFailure ──────yes─▶ Recover ─▶ wait ─▶ after_recovery_wait
//!                 │no
//!                 ▼
//!               Raise
//! ```

/// A question about the error, in TF's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Question {
    /// A PS failure within its tolerance (counts a strike against each PS task the
    /// message names: `Cluster._record_and_ignore_transient_ps_failure`).
    TransientPsFailure,
    /// A `DeadlineExceededError` within the cluster's tolerance (counts it:
    /// `Cluster._record_and_ignore_transient_timeouts`).
    TransientTimeout,
    /// A `CancelledError` whose message names a `/job:`: derived from another
    /// task's failure, retried and not reported.
    DerivedCancellation,
    /// A worker failure ([`super::Verdict::Worker`]) while the queue was not
    /// cancelled (`_validate_preemption_failure`).
    WorkerFailure,
}

// The words of the log lines and records (the binding's `str`s).
crate::words!(Question {
    Question::TransientPsFailure => "transient ps failure",
    Question::TransientTimeout => "transient timeout",
    Question::DerivedCancellation => "derived cancellation",
    Question::WorkerFailure => "worker failure",
});

/// What [`respond`] says next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Response {
    /// Answer this question, then call [`respond`] with it.
    Ask(Question),
    /// Put the closure back in the queue; the question answered yes says why.
    Retry(Question),
    /// The error is the closure's: re-raise it to the user.
    Raise,
    /// A worker failed: put the closure back and wait for the worker's recovery.
    Recover,
}

/// The next step after `answered` (None: the error was just caught) was answered
/// `yes` (ignored for None).
#[must_use]
pub fn respond(answered: Option<Question>, yes: bool) -> Response {
    use Question::{DerivedCancellation, TransientPsFailure, TransientTimeout, WorkerFailure};
    match (answered, yes) {
        (None, _) => Response::Ask(TransientPsFailure),
        (Some(WorkerFailure), true) => Response::Recover,
        (Some(WorkerFailure), false) => Response::Raise,
        (Some(q), true) => Response::Retry(q),
        (Some(TransientPsFailure), false) => Response::Ask(TransientTimeout),
        (Some(TransientTimeout), false) => Response::Ask(DerivedCancellation),
        (Some(DerivedCancellation), false) => Response::Ask(WorkerFailure),
    }
}

/// What follows the wait for a failed worker's recovery.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AfterWait {
    /// The failure handler was stopped (the coordinator stops): the thread ends, its
    /// closure already back in the queue; no recovery function runs.
    Stopped,
    /// The worker is back: run the recovery function (under the same handling).
    Recovered,
    /// The wait's bound (`worker_recovery_timeout`) passed: the closure is retried on
    /// the workers that are up; the recovery function runs all the same, as in TF.
    TimedOut,
}

/// The step after the recovery wait: `running` is whether the failure handler still
/// runs, `recovered` whether the wait ended with the worker back. A stop wins.
#[must_use]
pub fn after_recovery_wait(running: bool, recovered: bool) -> AfterWait {
    match (running, recovered) {
        (false, _) => AfterWait::Stopped,
        (true, true) => AfterWait::Recovered,
        (true, false) => AfterWait::TimedOut,
    }
}

#[cfg(test)]
mod tests {
    use super::Question::{DerivedCancellation, TransientPsFailure, TransientTimeout, WorkerFailure};
    use super::*;

    /// Every path through the questions: the answers given, in order, and the outcome.
    #[test]
    fn the_questions_in_tfs_order_and_each_outcome() {
        let table: &[(&[bool], &[Question], Response)] = &[
            (&[true], &[TransientPsFailure], Response::Retry(TransientPsFailure)),
            (
                &[false, true],
                &[TransientPsFailure, TransientTimeout],
                Response::Retry(TransientTimeout),
            ),
            (
                &[false, false, true],
                &[TransientPsFailure, TransientTimeout, DerivedCancellation],
                Response::Retry(DerivedCancellation),
            ),
            (
                &[false, false, false, true],
                &[TransientPsFailure, TransientTimeout, DerivedCancellation, WorkerFailure],
                Response::Recover,
            ),
            (
                &[false, false, false, false],
                &[TransientPsFailure, TransientTimeout, DerivedCancellation, WorkerFailure],
                Response::Raise,
            ),
        ];
        for (answers, asked_expected, outcome) in table {
            let mut asked = Vec::new();
            let mut step = respond(None, false);
            let mut answers = answers.iter();
            while let Response::Ask(q) = step {
                asked.push(q);
                let yes = *answers.next().expect("asked more questions than the row answers");
                step = respond(Some(q), yes);
            }
            assert_eq!(&asked, asked_expected);
            assert_eq!(step, *outcome, "answers {asked:?}");
            assert!(answers.next().is_none(), "a question the row answers was not asked");
        }
    }

    /// The timeout counter is never asked about a PS failure that was ignored: TF's
    /// `or` short-circuits, and the counts depend on it.
    #[test]
    fn an_ignored_ps_failure_counts_no_timeout() {
        assert_eq!(respond(Some(TransientPsFailure), true), Response::Retry(TransientPsFailure));
    }

    #[test]
    fn after_the_wait_a_stop_wins() {
        let table = [
            (false, false, AfterWait::Stopped),
            (false, true, AfterWait::Stopped),
            (true, true, AfterWait::Recovered),
            (true, false, AfterWait::TimedOut),
        ];
        for (running, recovered, want) in table {
            assert_eq!(after_recovery_wait(running, recovered), want, "{running} {recovered}");
        }
    }
}
