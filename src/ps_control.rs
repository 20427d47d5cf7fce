//! The decisions of the parameter-server task control: which release a task
//! accepts, which call to a task may start, what the coordinator's poll makes
//! of an answer, how long a worker's drain may take.
//!
//! The actors. A served PS or worker process answers two requests of the
//! coordinator (`_coordinator/ps_control.py`, over TensorFlow's own `PyFunc`
//! RPCs): a poll (its incarnation and notice) and a release (the coordinator
//! is done with it: it exits). The coordinator polls every task every round
//! from one thread, releases tasks from the save and drain threads, and runs
//! each call on a thread of its own so that one task that does not answer
//! holds up no other.
//!
//! The parts, each sans-IO (no clock read, no sleep, no thread, no log; the
//! caller passes `now` and performs what it is told):
//!
//! * [`release_refused`]: a release counts only for the incarnation and the
//!   notice the task has now (it cannot be sent ahead of the notice, nor
//!   carried over to a restarted task);
//! * [`Calls`] (`calls.rs`): at most one outstanding call per task; a call
//!   that outlives [`ABANDON_AFTER`] is abandoned, at most [`MAX_ABANDONED`]
//!   per task, so that one call that never returns cannot hide a task's
//!   notices for good;
//! * [`Watch`] (`watch.rs`): per task, the incarnation of its last answer,
//!   each incarnation's first notice handed on once, and what is worth a log
//!   line (a streak of unanswered polls once per reason, "answers again", a
//!   new incarnation) as typed [`PollLog`] events;
//! * [`worker_drain_bound`]: how long a worker's closure in flight may run before the
//!   worker is released anyway.
//!
//! Times are seconds on the caller's clock: monotonic for [`Calls`], the Unix
//! clock for [`worker_drain_bound`] (a notice's deadline is a Unix time, as the task
//! reported it; this is the one place it meets `now`).

mod calls;
mod watch;

pub use calls::{Abandoned, CallId, Calls, Refused};
pub use watch::{PollLog, Watch};

/// The key of the task control in TensorFlow's `py_func` registry of a
/// served process.
pub const TOKEN: &str = "tf_failure_handling/task_control";
/// Seconds an unreturned call may hold up the next calls to its task. Past it
/// the call is abandoned (its thread ends on its own, or with the process) and
/// the task is asked again, so that one call that never returns cannot hide
/// the task's notices for good (the likeliest reading of a restarted worker
/// whose notice was never seen).
pub const ABANDON_AFTER: f64 = 30.0;
/// Abandoned calls per task that may be outstanding at once; past them, the
/// task stays unanswered until one returns (no thread piles up behind a
/// stopped task).
pub const MAX_ABANDONED: usize = 4;
/// Seconds a worker's drain may take when its notice names no deadline.
pub const DEFAULT_DRAIN_BOUND: f64 = 300.0;
/// Seconds of a notice's deadline kept back from a drain: the release and the
/// worker's exit happen before the machine goes.
pub const DRAIN_MARGIN: f64 = 1.0;

/// Why a task refuses a release (the `why` of its answer).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The release names another incarnation (or none): a restarted task.
    #[error("not this incarnation")]
    NotThisIncarnation,
    /// The task has no notice yet: a release cannot be sent ahead of it.
    #[error("no notice to release")]
    NoNotice,
    /// The release names another notice than the task's.
    #[error("not this notice")]
    NotThisNotice,
}

/// Whether a task of incarnation `incarnation`, whose notice was taken at
/// `notice_at` (None: no notice yet), refuses a release naming
/// `asked_incarnation` and `asked_notice_at`; None when it accepts it.
#[must_use]
pub fn release_refused(
    incarnation: &str,
    notice_at: Option<f64>,
    asked_incarnation: Option<&str>,
    asked_notice_at: Option<f64>,
) -> Option<Refusal> {
    if asked_incarnation != Some(incarnation) {
        return Some(Refusal::NotThisIncarnation);
    }
    let Some(at) = notice_at else {
        return Some(Refusal::NoNotice);
    };
    if asked_notice_at != Some(at) {
        return Some(Refusal::NotThisNotice);
    }
    None
}

/// Seconds a worker's closure in flight may run before the worker is
/// released anyway: up to [`DRAIN_MARGIN`] before the notice's `deadline`
/// (Unix seconds), never negative, or [`DEFAULT_DRAIN_BOUND`] without one.
/// `now` is the Unix time.
#[must_use]
pub fn worker_drain_bound(deadline: Option<f64>, now: f64) -> f64 {
    match deadline {
        None => DEFAULT_DRAIN_BOUND,
        Some(d) => (d - now - DRAIN_MARGIN).max(0.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_release_is_accepted_only_for_this_incarnation_and_notice() {
        use Refusal::*;
        // (task's notice, asked incarnation, asked notice, verdict)
        type Row<'a> = (Option<f64>, Option<&'a str>, Option<f64>, Option<Refusal>);
        let rows: &[Row] = &[
            (Some(5.0), Some("inc"), Some(5.0), None),
            (Some(5.0), None, Some(5.0), Some(NotThisIncarnation)),
            (Some(5.0), Some("1-2"), Some(5.0), Some(NotThisIncarnation)),
            (None, Some("other"), None, Some(NotThisIncarnation)),
            (None, Some("inc"), None, Some(NoNotice)),
            (None, Some("inc"), Some(5.0), Some(NoNotice)),
            (Some(5.0), Some("inc"), Some(4.0), Some(NotThisNotice)),
            (Some(5.0), Some("inc"), None, Some(NotThisNotice)),
        ];
        for &(notice, asked, asked_at, want) in rows {
            assert_eq!(
                release_refused("inc", notice, asked, asked_at),
                want,
                "{notice:?} {asked:?} {asked_at:?}"
            );
        }
    }

    #[test]
    fn refusals_read_as_the_tasks_answer() {
        assert_eq!(Refusal::NotThisIncarnation.to_string(), "not this incarnation");
        assert_eq!(Refusal::NoNotice.to_string(), "no notice to release");
        assert_eq!(Refusal::NotThisNotice.to_string(), "not this notice");
    }

    #[test]
    fn the_drain_ends_a_margin_before_the_deadline_or_after_the_default() {
        // (deadline, now, bound)
        let rows: &[(Option<f64>, f64, f64)] = &[
            (None, 10.0, DEFAULT_DRAIN_BOUND),
            (Some(100.0), 98.9, 0.1),
            (Some(100.0), 50.0, 49.0),
            (Some(5.0), 10.0, 0.0),
            (Some(100.0), 99.5, 0.0),
        ];
        for &(deadline, now, want) in rows {
            let got = worker_drain_bound(deadline, now);
            assert!((got - want).abs() < 1e-9, "{deadline:?} {now}: {got}");
        }
    }
}
