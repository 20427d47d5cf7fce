//! The decisions of the parameter-server task control: which release a task
//! accepts, which call to a task may start, what the coordinator's poll makes
//! of an answer, how long a worker's drain may take.
//!
//! The actors. A served PS or worker process answers two requests of the
//! coordinator (`_coordinator/task_calls.py` and `cluster_poller.py`, over
//! TensorFlow's own `PyFunc` RPCs): a poll (its incarnation and notice) and a release (the coordinator
//! is done with it: it exits). The coordinator polls every task every round
//! (every [`POLL_INTERVAL`]) from one thread, releases tasks from the save and
//! drain threads, and runs each call on a thread of its own, bounded by
//! [`CALL_TIMEOUT`], so that one task that does not answer holds up no other.
//!
//! Each role has one protocol object, which Python only performs (events in with
//! `now`, actions out, each with its timeout; the binding's object reads its clock):
//!
//! * [`coordinator::Coordinator`] (`coordinator.rs`): the coordinator's. Its lanes,
//!   one per thread that performs them: the poll rounds, a release and its retries,
//!   the wait for a released task to be gone, a worker's drain, the handler's save
//!   (the wait for the closures, the run count saved, the PS releases after it), a
//!   worker thread's response to its closure's error (TF's order,
//!   [`crate::failure::response`]) and the stop of that failure handling;
//! * [`task::Task`] (`task.rs`): a served PS or worker task's: its answers to the
//!   coordinator and how long it serves after its notice.
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
//!   worker is released anyway;
//! * [`serving`]: how long a served task with a notice waits for its release
//!   (until the coordinator is done with it, within a bound a coordinator that
//!   died cannot stretch);
//! * [`unreleased_hold_bound`]: how long the coordinator keeps a worker whose
//!   release failed out of the rotation;
//! * [`drain::WorkerDrain`] (`drain.rs`): a worker's drain as a state machine (hold
//!   its thread, wait for its closure in flight, release it, wait until it is gone or
//!   keep it held when the release failed, resume);
//! * [`gap_runs`] and [`runs_at_save`]: which of the handler's runs the
//!   coordinator's save lets finish first, and the run count it saves;
//! * [`save_drain::SaveDrain`] (`save_drain.rs`): the save's wait for the closures
//!   as a state machine (wait within the bound, run the gaps first, within the same
//!   bound).
//!
//! Times are seconds on the caller's clock: monotonic for [`Calls`] and the
//! coordinator (a notice's deadline, a Unix time as the task reported it, is placed on
//! the coordinator's clock when the poll's answer arrives: [`crate::notice::monotonic`]),
//! the Unix clock for a served task (its notice's time and deadline are what it
//! reports to the coordinator).
//!
//! The gRPC keepalive the package adds to TensorFlow's channels, so that a call
//! to a stopped task fails instead of stalling, is in `keepalive.rs`.

mod calls;
pub mod coordinator;
pub mod drain;
mod keepalive;
pub mod save_drain;
pub mod task;
mod watch;

pub use calls::{Abandoned, CallId, Calls, Refused};
pub use keepalive::{grpc_keepalive_options, with_keepalive, GRPC_CONNECT_TIMEOUT, GRPC_PING_EVERY, GRPC_PING_TIMEOUT};
pub use watch::{reconnect, PollLog, Watch, STALE_CONTEXT};

/// The key of the task control in TensorFlow's `py_func` registry of a
/// served process.
pub const TOKEN: &str = "tf_failure_handling/task_control";
/// Seconds one call to a task (a poll, a release) may take: past it the caller
/// goes on and the task counts as unanswered. A call on 127.0.0.1 takes
/// milliseconds.
pub const CALL_TIMEOUT: f64 = 5.0;
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
/// Seconds the coordinator's save waits in the closure queue's `wait` when the
/// closures it waited for are done and one of them failed: none. The call is
/// there only to raise that closure's error, as `join()` would, and must not
/// block (the error may have been taken meanwhile, and a closure queued).
pub const DRAIN_ERROR_WAIT: f64 = 0.0;
/// Seconds the coordinator waits for a released worker process to be gone
/// before it gives the worker thread new closures again.
pub const EXIT_WAIT: f64 = 30.0;
/// Seconds a TCP connection to a released task's gRPC port may take while the
/// coordinator waits for its process to be gone: a refused connection means
/// gone; a timeout does not (the process may still be there).
pub const PORT_PROBE_TIMEOUT: f64 = 1.0;
/// Seconds of a notice's deadline kept back from a drain: the release and the
/// worker's exit happen before the machine goes.
pub const DRAIN_MARGIN: f64 = 1.0;

/// Seconds each step of a reconnect to a restarted worker may take: holding the
/// worker's closures back, then TensorFlow's rebuild of the cluster
/// (`update_server_def`, well under a second on an idle machine). A closure must not go
/// to the worker while the rebuild runs: TensorFlow then fails it with "Op type not
/// registered" (its functions are registered on the new process halfway), an error
/// that is no worker failure and ends the training.
pub const RECONNECT_BOUND: f64 = 60.0;

/// Seconds between two polls of the cluster by the coordinator.
pub const POLL_INTERVAL: f64 = 0.5;
/// Seconds without a call from the coordinator (a poll or a release) after
/// which a served task past its own bound takes the coordinator for gone. The
/// coordinator asks every task every round (every [`POLL_INTERVAL`]; a call
/// that does not return is bounded by [`CALL_TIMEOUT`]).
pub const COORDINATOR_SILENCE: f64 = 15.0;
/// A served task with a notice and no deadline serves at most this many times
/// its own bound (grace period or `peer_timeout`) from its notice while the
/// coordinator still asks it: the coordinator's wait for its closures (up to
/// its own `peer_timeout`) and its save come after its poll saw the notice.
pub const SERVE_CAP_FACTOR: f64 = 3.0;
/// Seconds between two checks of a served task's wait loops (they answer
/// Ctrl-C between).
pub const SERVE_SLICE: f64 = 1.0;
/// Seconds `ClusterCoordinator.join()` waits between two looks at the handler.
pub const JOIN_SLICE: f64 = 0.2;
/// Seconds of one look at a worker settling between two closures when the
/// drain's bound passed (its queue `get` ends within a slice).
pub const DRAIN_SETTLE_LOOK: f64 = 0.05;
/// Seconds a coordinator's worker thread waits for a closure before it looks
/// at its holds again.
pub const WORKER_GET_SLICE: f64 = 0.5;
/// Seconds between two looks of a worker thread at the queue while only
/// non-strict holds are set.
pub const WORKER_SOFT_SLICE: f64 = 0.05;

/// Why a served task with a notice leaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Leave {
    /// The coordinator released it.
    Released,
    /// The notice's deadline came (the machine goes).
    Deadline,
    /// Its own bound passed and the coordinator has not asked it for
    /// [`COORDINATOR_SILENCE`] seconds (gone, or never there).
    CoordinatorSilent,
    /// [`SERVE_CAP_FACTOR`] times its own bound passed.
    Cap,
}

// The words of the log lines and records (the binding's `str`s).
crate::words!(Leave {
    Leave::Released => "released",
    Leave::Deadline => "deadline",
    Leave::CoordinatorSilent => "coordinator silent",
    Leave::Cap => "cap",
});

/// What a served task with a notice does now.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Serving {
    /// Serve on, and ask again at `until` at the latest (a release or a call
    /// may come before).
    Until(f64),
    /// Leave now.
    Leave(Leave),
}

/// Where a served task's own bound comes from (`serve_bound`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServeBound {
    /// The notice names when the machine goes: until then.
    Deadline,
    /// The task's grace period.
    GracePeriod,
    /// Neither: the coordinator's `peer_timeout`.
    PeerTimeout,
}

// The words of the log lines and records (the binding's `str`s).
crate::words!(ServeBound {
    ServeBound::Deadline => "the notice's deadline",
    ServeBound::GracePeriod => "the grace period",
    ServeBound::PeerTimeout => "peer_timeout",
});

/// A served task's own bound from its notice at `notice_at` (Unix seconds):
/// until the notice's `deadline` when it names one, else its grace period
/// when it has one, else `peer_timeout`; and where it came from.
#[must_use]
pub fn serve_bound(notice_at: f64, deadline: Option<f64>, grace_period: f64, peer_timeout: f64) -> (f64, ServeBound) {
    match deadline {
        Some(d) => ((d - notice_at).max(0.0), ServeBound::Deadline),
        None if grace_period > 0.0 => (grace_period, ServeBound::GracePeriod),
        None => (peer_timeout, ServeBound::PeerTimeout),
    }
}

/// What a served task whose notice came at `notice_at` does at `now`: its
/// notice's `deadline` (if it names one), its `own_bound` (seconds: grace
/// period or `peer_timeout`), when the coordinator last asked it
/// (`last_asked`, None: never) and whether it was `released`. All times are
/// Unix seconds.
///
/// With a deadline the task serves until it: the machine goes then. Without
/// one it serves its own bound, and past it as long as the coordinator keeps
/// asking (its save may still be under way: the task must not leave before
/// the checkpoint it waits for), up to [`SERVE_CAP_FACTOR`] times its bound.
#[must_use]
pub fn serving(notice_at: f64, deadline: Option<f64>, own_bound: f64, last_asked: Option<f64>, released: bool, now: f64) -> Serving {
    if released {
        return Serving::Leave(Leave::Released);
    }
    if let Some(d) = deadline {
        return if now >= d {
            Serving::Leave(Leave::Deadline)
        } else {
            Serving::Until(d)
        };
    }
    let own_end = notice_at + own_bound.max(0.0);
    if now < own_end {
        return Serving::Until(own_end);
    }
    let cap = notice_at + SERVE_CAP_FACTOR * own_bound.max(0.0);
    if now >= cap {
        return Serving::Leave(Leave::Cap);
    }
    match last_asked {
        Some(at) if now - at < COORDINATOR_SILENCE => Serving::Until((at + COORDINATOR_SILENCE).min(cap)),
        _ => Serving::Leave(Leave::CoordinatorSilent),
    }
}

/// Seconds the coordinator keeps a worker whose release failed out of the
/// rotation, waiting for it to go (or to answer as a new incarnation): the
/// longest the worker serves after its notice ([`serving`], with the
/// coordinator's `peer_timeout` for its bound) and `exit_wait` for its exit.
/// A worker still there after it takes closures again.
#[must_use]
pub fn unreleased_hold_bound(deadline: Option<f64>, peer_timeout: f64, exit_wait: f64, now: f64) -> f64 {
    let serves = match deadline {
        Some(d) => (d - now).max(0.0),
        None => SERVE_CAP_FACTOR * peer_timeout.max(0.0),
    };
    serves + exit_wait.max(0.0)
}

/// The queued runs (indices of the handler's `run()` calls) that the
/// coordinator's save lets a worker run before it saves: those below a run
/// that finished. A run that a lost worker put back in the queue (at its
/// tail) is one: without it the finished runs are no prefix of the runs, and
/// no run count says which ran. `scheduled` is the run count (runs `0..scheduled`
/// were scheduled); `queued` and `in_flight` the unfinished runs. Sorted.
#[must_use]
pub fn gap_runs(scheduled: u64, queued: &[u64], in_flight: &[u64]) -> Vec<u64> {
    let Some(last_finished) = last_finished(scheduled, queued, in_flight) else {
        return Vec::new();
    };
    let mut gaps: Vec<u64> = queued.iter().copied().filter(|&q| q < last_finished).collect();
    gaps.sort_unstable();
    gaps
}

/// The highest finished run: below `scheduled`, neither queued nor in flight.
fn last_finished(scheduled: u64, queued: &[u64], in_flight: &[u64]) -> Option<u64> {
    let unfinished: std::collections::HashSet<u64> = queued.iter().chain(in_flight).copied().collect();
    (0..scheduled).rev().find(|r| !unfinished.contains(r))
}

/// The run count a coordinator's save records, and what runs again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SavedRuns {
    /// Runs `0..runs` are in the checkpoint: the first unfinished run (the
    /// restart schedules from it).
    pub runs: u64,
    /// Runs above it that had finished, by index, sorted: they run again after
    /// the restart (their effect is in the checkpoint too), named in the log and
    /// the record (`finished_after_first_unfinished`).
    pub finished_after: Vec<u64>,
}

/// The run count of a save with the runs `queued` and `in_flight` unfinished
/// of `scheduled`: the longest finished prefix, since a restart schedules the
/// runs from its count on. Finished runs after the first unfinished one run
/// again ([`SavedRuns::finished_after`]); [`gap_runs`] makes that rare.
#[must_use]
pub fn runs_at_save(scheduled: u64, queued: &[u64], in_flight: &[u64]) -> SavedRuns {
    let unfinished: std::collections::HashSet<u64> = queued.iter().chain(in_flight).copied().filter(|&r| r < scheduled).collect();
    let runs = unfinished.iter().copied().min().unwrap_or(scheduled);
    SavedRuns {
        runs,
        finished_after: (runs..scheduled).filter(|r| !unfinished.contains(r)).collect(),
    }
}

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
/// released anyway: up to [`DRAIN_MARGIN`] before the notice's `deadline`, never
/// negative, or [`DEFAULT_DRAIN_BOUND`] without one (`deadline` and `now` on one
/// clock).
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
    fn serve_bound_table() {
        // (deadline, grace period, own bound, from)
        let rows: &[(Option<f64>, f64, f64, ServeBound)] = &[
            (Some(130.0), 0.0, 30.0, ServeBound::Deadline),
            (Some(130.0), 600.0, 30.0, ServeBound::Deadline),
            (Some(90.0), 0.0, 0.0, ServeBound::Deadline),
            (None, 25.0, 25.0, ServeBound::GracePeriod),
            (None, 0.0, 60.0, ServeBound::PeerTimeout),
            (None, -1.0, 60.0, ServeBound::PeerTimeout),
        ];
        for &(deadline, grace, own, from) in rows {
            assert_eq!(serve_bound(100.0, deadline, grace, 60.0), (own, from), "{deadline:?} {grace}");
        }
    }

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
    fn a_served_task_waits_for_a_coordinator_that_asks_and_not_for_one_that_is_gone() {
        use Leave::{Cap, CoordinatorSilent, Deadline, Released};
        use Serving::Until;
        let s = COORDINATOR_SILENCE;
        // (deadline, own bound, last asked, released, now, decision); notice at 100.
        type Row = (Option<f64>, f64, Option<f64>, bool, f64, Serving);
        let rows: &[Row] = &[
            // Released: gone at once, whatever else holds.
            (None, 30.0, Some(100.0), true, 101.0, Serving::Leave(Released)),
            (Some(200.0), 30.0, None, true, 101.0, Serving::Leave(Released)),
            // A deadline: serve until it, asked or not.
            (Some(200.0), 30.0, None, false, 150.0, Until(200.0)),
            (Some(200.0), 30.0, Some(199.0), false, 200.0, Serving::Leave(Deadline)),
            // Within its own bound: serve on, asked or not.
            (None, 30.0, None, false, 110.0, Until(130.0)),
            // Past it: on while the coordinator asks (its save may be under way) ...
            (None, 30.0, Some(129.0), false, 131.0, Until(129.0 + s)),
            (None, 30.0, Some(185.0), false, 186.0, Until(190.0)),
            // ... not once it has been silent that long (a coordinator that died) ...
            (None, 30.0, Some(131.0 - s), false, 131.0, Serving::Leave(CoordinatorSilent)),
            (None, 30.0, None, false, 131.0, Serving::Leave(CoordinatorSilent)),
            // ... and never past the cap, however often it asks.
            (None, 30.0, Some(189.9), false, 190.0, Serving::Leave(Cap)),
            // No bound: the coordinator's asks alone hold it, up to the cap (itself).
            (None, 0.0, Some(100.0), false, 100.0, Serving::Leave(Cap)),
        ];
        for &(deadline, bound, asked, released, now, want) in rows {
            assert_eq!(
                serving(100.0, deadline, bound, asked, released, now),
                want,
                "{deadline:?} {bound} {asked:?} {released} {now}"
            );
        }
    }

    #[test]
    fn the_save_lets_the_queued_runs_below_a_finished_one_run_first() {
        // (scheduled, queued, in flight, gap runs)
        type Row<'a> = (u64, &'a [u64], &'a [u64], &'a [u64]);
        let rows: &[Row] = &[
            (46, &[36, 37, 38, 39, 40, 41, 42, 43, 44, 45], &[], &[]),
            // A lost worker put run 30 back at the queue's tail; 31..35 finished.
            (46, &[36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 30], &[], &[30]),
            (46, &[36, 30, 45, 29], &[40], &[29, 30, 36]),
            // Nothing finished above them: no gap.
            (10, &[8, 9], &[7], &[]),
            (0, &[], &[], &[]),
            (3, &[0, 1, 2], &[], &[]),
        ];
        for &(scheduled, queued, in_flight, want) in rows {
            assert_eq!(gap_runs(scheduled, queued, in_flight), want, "{scheduled} {queued:?} {in_flight:?}");
        }
    }

    #[test]
    fn the_saved_run_count_is_the_first_unfinished_run() {
        // (scheduled, queued, in flight, runs, finished after)
        type Row<'a> = (u64, &'a [u64], &'a [u64], u64, &'a [u64]);
        let rows: &[Row] = &[
            (46, &[], &[], 46, &[]),
            (46, &[42, 43, 44, 45], &[], 42, &[]),
            (46, &[44, 45], &[42, 43], 42, &[]),
            // Run 30 in flight at the bound, 31..35 finished, 36..45 queued.
            (46, &[36, 37, 38, 39, 40, 41, 42, 43, 44, 45], &[30], 30, &[31, 32, 33, 34, 35]),
            (10, &[9], &[3, 7], 3, &[4, 5, 6, 8]),
            // Indices past the count (a run that scheduled two closures) are not runs.
            (5, &[5, 6], &[], 5, &[]),
        ];
        for &(scheduled, queued, in_flight, runs, after) in rows {
            assert_eq!(
                runs_at_save(scheduled, queued, in_flight),
                SavedRuns {
                    runs,
                    finished_after: after.to_vec()
                },
                "{scheduled} {queued:?} {in_flight:?}"
            );
        }
    }

    #[test]
    fn an_unreleased_worker_is_held_as_long_as_it_may_serve() {
        assert!((unreleased_hold_bound(None, 30.0, 30.0, 0.0) - (SERVE_CAP_FACTOR * 30.0 + 30.0)).abs() < 1e-9);
        assert!((unreleased_hold_bound(Some(50.0), 30.0, 30.0, 10.0) - 70.0).abs() < 1e-9);
        assert!((unreleased_hold_bound(Some(5.0), 30.0, 30.0, 10.0) - 30.0).abs() < 1e-9);
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
