//! The parameter-server task control's decisions ([`crate::ps_control`]) for
//! the `_coordinator` modules (`task_calls`, `cluster_poller`, `worker_drain`,
//! `closure_drain`), which perform the calls (TensorFlow's
//! `PyFunc` ops on threads of their own), the port probes and the logging.
//!
//! * `release_refused`: whether a served task refuses a release, and why;
//! * `TaskCalls`: whether a call to a task may start now, which earlier call
//!   it abandons (`CallTimeout` otherwise);
//! * `TaskWatch` and `PollLog`: what the coordinator's poll makes of each
//!   answer, and which log line it is worth;
//! * `worker_drain_bound`: how long a worker's drain may wait for its closure;
//! * `serving`: what a served task with a notice does now (serve on, leave);
//! * `unreleased_hold_bound`: how long a worker whose release failed is kept
//!   out of the rotation;
//! * `gap_runs`, `runs_at_save`: which queued runs the save lets run first, and
//!   the run count it records.
//!
//! `TaskCalls` and `TaskWatch` are shared by the poller, release and call
//! threads: each holds its core behind a lock that no holder keeps while it
//! runs Python (arguments are read before, results converted after).

use std::collections::BTreeMap;

use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::clock::unix_now;
use super::errors::CallTimeout;
use crate::ps_control::{self, CallId, Calls, Watch};

/// Why a task of `incarnation`, whose notice was taken at `notice_at` (None:
/// no notice yet), refuses a release naming `asked_incarnation` and
/// `asked_notice_at` (the request's values, any JSON); None if it accepts it.
#[pyfunction]
fn release_refused(
    incarnation: &str,
    notice_at: Option<f64>,
    asked_incarnation: &Bound<'_, PyAny>,
    asked_notice_at: &Bound<'_, PyAny>,
) -> Option<String> {
    let asked: Option<String> = asked_incarnation.extract().ok();
    let asked_at: Option<f64> = asked_notice_at.extract().ok();
    ps_control::release_refused(incarnation, notice_at, asked.as_deref(), asked_at).map(|why| why.to_string())
}

/// Seconds a worker's closure in flight may run before its release: until a
/// margin before the notice's `deadline` (Unix seconds), or the default bound
/// without one; `now` is the Unix time.
/// Whether the coordinator reconnects to `task` after its poll failed with `message`:
/// a restarted worker it has no context on (`crate::ps_control::reconnect`).
#[pyfunction]
fn reconnect(task: &str, message: &str) -> bool {
    ps_control::reconnect(task, message)
}

#[pyfunction]
fn worker_drain_bound(deadline: Option<f64>, now: f64) -> f64 {
    ps_control::worker_drain_bound(deadline, now)
}

/// What a served task with a notice does now (`serving`): serve on until
/// `until` at the latest, or leave (`leave`: why).
#[pyclass(frozen, get_all, module = "tf_failure_handling._native")]
pub struct ServeDecision {
    /// Unix time to ask again by (None: leave now).
    until: Option<f64>,
    /// Seconds from `now` to `until` (None: leave now): the wait before asking again.
    wait: Option<f64>,
    /// Why the task leaves: "released", "deadline", "coordinator silent",
    /// "cap" (None: it serves on).
    leave: Option<&'static str>,
}

/// What a served task whose notice came at `notice_at` (Unix seconds) does
/// at `now`, given its notice's `deadline`, its `own_bound`, when the
/// coordinator last asked it and whether it was released
/// ([`crate::ps_control::serving`]). Without `now`, the wall clock now.
#[pyfunction]
#[pyo3(signature = (notice_at, deadline, own_bound, last_asked, released, now = None))]
fn serving(
    notice_at: f64,
    deadline: Option<f64>,
    own_bound: f64,
    last_asked: Option<f64>,
    released: bool,
    now: Option<f64>,
) -> ServeDecision {
    use ps_control::{Leave, Serving};
    let now = now.unwrap_or_else(unix_now);
    match ps_control::serving(notice_at, deadline, own_bound, last_asked, released, now) {
        Serving::Until(t) => ServeDecision {
            until: Some(t),
            wait: Some((t - now).max(0.0)),
            leave: None,
        },
        Serving::Leave(why) => ServeDecision {
            until: None,
            wait: None,
            leave: Some(match why {
                Leave::Released => "released",
                Leave::Deadline => "deadline",
                Leave::CoordinatorSilent => "coordinator silent",
                Leave::Cap => "cap",
            }),
        },
    }
}

/// A served task's own bound and where it comes from ("the notice's
/// deadline", "the grace period", "peer_timeout"):
/// [`crate::ps_control::serve_bound`].
#[pyfunction]
fn serve_bound(notice_at: f64, deadline: Option<f64>, grace_period: f64, peer_timeout: f64) -> (f64, &'static str) {
    let (own, from) = ps_control::serve_bound(notice_at, deadline, grace_period, peer_timeout);
    let why = match from {
        ps_control::ServeBound::Deadline => "the notice's deadline",
        ps_control::ServeBound::GracePeriod => "the grace period",
        ps_control::ServeBound::PeerTimeout => "peer_timeout",
    };
    (own, why)
}

/// Seconds the coordinator keeps a worker whose release failed out of the
/// rotation ([`crate::ps_control::unreleased_hold_bound`]).
#[pyfunction]
fn unreleased_hold_bound(deadline: Option<f64>, peer_timeout: f64, exit_wait: f64, now: f64) -> f64 {
    ps_control::unreleased_hold_bound(deadline, peer_timeout, exit_wait, now)
}

/// The queued runs the coordinator's save lets a worker run first: those
/// below a finished run ([`crate::ps_control::gap_runs`]).
#[pyfunction]
fn gap_runs(scheduled: u64, queued: Vec<u64>, in_flight: Vec<u64>) -> Vec<u64> {
    ps_control::gap_runs(scheduled, &queued, &in_flight)
}

/// `(runs, finished_after)`: the run count a coordinator's save records and
/// the finished runs after it that run again, by index
/// ([`crate::ps_control::runs_at_save`]).
#[pyfunction]
fn runs_at_save(scheduled: u64, queued: Vec<u64>, in_flight: Vec<u64>) -> (u64, Vec<u64>) {
    let saved = ps_control::runs_at_save(scheduled, &queued, &in_flight);
    (saved.runs, saved.finished_after)
}

/// A call abandoned so that a new one could start (`TaskCalls.start`).
#[pyclass(frozen, get_all, module = "tf_failure_handling._native")]
pub struct Abandoned {
    /// Seconds since the abandoned call started.
    age: f64,
    /// Abandoned calls of the task now outstanding, this one included.
    count: usize,
    /// The most that may be.
    max: usize,
}

/// The outstanding and abandoned calls to the tasks
/// ([`crate::ps_control::Calls`]).
#[pyclass(frozen, module = "tf_failure_handling._native")]
pub struct TaskCalls(Mutex<Calls>);

#[pymethods]
impl TaskCalls {
    #[new]
    fn new(abandon_after: f64, max_abandoned: usize) -> Self {
        TaskCalls(Mutex::new(Calls::new(abandon_after, max_abandoned)))
    }

    /// A call to `task` starts at `now`: its handle, and the earlier call it
    /// abandons or None. `CallTimeout` while an earlier call holds the task up.
    fn start(&self, task: &str, now: f64) -> PyResult<(CallId, Option<Abandoned>)> {
        let started = self.0.lock().start(task, now);
        let (id, abandoned) = started?;
        let abandoned = abandoned.map(|a| Abandoned {
            age: a.age,
            count: a.count,
            max: a.max,
        });
        Ok((id, abandoned))
    }

    /// Call `id` to `task` returned, with an answer or an error (reported by
    /// the call's thread); False if it was reported before.
    fn returned(&self, task: &str, id: CallId) -> bool {
        self.0.lock().returned(task, id)
    }
}

/// A line of the poll's log ([`crate::ps_control::PollLog`]).
#[pyclass(eq, eq_int, frozen, from_py_object, module = "tf_failure_handling._native")]
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum PollLog {
    /// The task does not run `serve()` (yet).
    NotServed,
    /// The task does not answer (first of a streak, or a new reason).
    DoesNotAnswer,
    /// The task answers again.
    AnswersAgain,
    /// The task answers as a new incarnation.
    NewIncarnation,
}

impl From<ps_control::PollLog> for PollLog {
    fn from(l: ps_control::PollLog) -> Self {
        match l {
            ps_control::PollLog::NotServed => PollLog::NotServed,
            ps_control::PollLog::DoesNotAnswer => PollLog::DoesNotAnswer,
            ps_control::PollLog::AnswersAgain => PollLog::AnswersAgain,
            ps_control::PollLog::NewIncarnation => PollLog::NewIncarnation,
        }
    }
}

/// The poll's view of every task ([`crate::ps_control::Watch`]).
#[pyclass(frozen, module = "tf_failure_handling._native")]
pub struct TaskWatch(Mutex<Watch>);

#[pymethods]
impl TaskWatch {
    #[new]
    fn new() -> Self {
        TaskWatch(Mutex::new(Watch::new()))
    }

    /// The poll of `task` raised `error`: the log line it is worth, or None.
    fn failed(&self, task: &str, error: &Bound<'_, PyAny>) -> PyResult<Option<PollLog>> {
        let kind = error.get_type().name()?.to_string();
        let message = error.str()?.to_string();
        Ok(self.0.lock().failed(task, &kind, &message).map(PollLog::from))
    }

    /// The poll of `task` got an answer that is no task's answer.
    fn bad_answer(&self, task: &str) {
        self.0.lock().bad_answer(task);
    }

    /// `task` answered as `incarnation` with `notice` (the answer's value: a
    /// dict with its `at`, or None): the log line it is worth, or None.
    fn answered(&self, task: &str, incarnation: &str, notice: &Bound<'_, PyAny>) -> Option<PollLog> {
        let notice = match notice.cast::<PyDict>() {
            Ok(d) => Some(d.get_item("at").ok().flatten().and_then(|at| at.extract().ok())),
            Err(_) => None,
        };
        self.0.lock().answered(task, incarnation, notice).map(PollLog::from)
    }

    /// Whether the notice of `task`'s last answer is handed on now (the first
    /// of its incarnation; True once).
    fn hand_on(&self, task: &str) -> bool {
        self.0.lock().hand_on(task)
    }

    /// `(incarnation, notice's at)` of `task`'s last answer, for its release.
    fn release_names(&self, task: &str) -> (Option<String>, Option<f64>) {
        self.0.lock().release_names(task)
    }

    /// Task -> the incarnation of its last answer.
    fn incarnations(&self) -> BTreeMap<String, String> {
        let pairs = self.0.lock().incarnations();
        pairs.into_iter().collect()
    }

    /// Task -> why its last polls went unanswered.
    fn unanswered(&self) -> BTreeMap<String, String> {
        let pairs = self.0.lock().unanswered_tasks();
        pairs.into_iter().collect()
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(release_refused, m)?)?;
    m.add_function(wrap_pyfunction!(worker_drain_bound, m)?)?;
    m.add_function(wrap_pyfunction!(reconnect, m)?)?;
    m.add_function(wrap_pyfunction!(serving, m)?)?;
    m.add_function(wrap_pyfunction!(serve_bound, m)?)?;
    m.add_function(wrap_pyfunction!(gap_runs, m)?)?;
    m.add_function(wrap_pyfunction!(runs_at_save, m)?)?;
    m.add_function(wrap_pyfunction!(unreleased_hold_bound, m)?)?;
    m.add_class::<ServeDecision>()?;
    m.add_class::<Abandoned>()?;
    m.add_class::<TaskCalls>()?;
    m.add_class::<PollLog>()?;
    m.add_class::<TaskWatch>()?;
    m.add("CallTimeout", m.py().get_type::<CallTimeout>())?;
    m.add("PS_TOKEN", ps_control::TOKEN)?;
    m.add("ABANDON_AFTER", ps_control::ABANDON_AFTER)?;
    m.add("MAX_ABANDONED", ps_control::MAX_ABANDONED)?;
    m.add("DEFAULT_DRAIN_BOUND", ps_control::DEFAULT_DRAIN_BOUND)?;
    m.add("COORDINATOR_SILENCE", ps_control::COORDINATOR_SILENCE)?;
    m.add("SERVE_CAP_FACTOR", ps_control::SERVE_CAP_FACTOR)?;
    m.add("SERVE_SLICE", ps_control::SERVE_SLICE)?;
    m.add("JOIN_SLICE", ps_control::JOIN_SLICE)?;
    m.add("DRAIN_SETTLE_LOOK", ps_control::DRAIN_SETTLE_LOOK)?;
    m.add("WORKER_GET_SLICE", ps_control::WORKER_GET_SLICE)?;
    m.add("WORKER_SOFT_SLICE", ps_control::WORKER_SOFT_SLICE)?;
    m.add("PS_CALL_TIMEOUT", ps_control::CALL_TIMEOUT)?;
    m.add("PS_POLL_INTERVAL", ps_control::POLL_INTERVAL)?;
    m.add("PS_PORT_PROBE_TIMEOUT", ps_control::PORT_PROBE_TIMEOUT)?;
    m.add("WORKER_EXIT_WAIT", ps_control::EXIT_WAIT)?;
    m.add("DRAIN_ERROR_WAIT", ps_control::DRAIN_ERROR_WAIT)?;
    m.add("GRPC_PING_EVERY", ps_control::GRPC_PING_EVERY)?;
    m.add("GRPC_PING_TIMEOUT", ps_control::GRPC_PING_TIMEOUT)?;
    m.add("GRPC_CONNECT_TIMEOUT", ps_control::GRPC_CONNECT_TIMEOUT)?;
    Ok(())
}
