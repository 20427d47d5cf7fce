//! The parameter-server task control ([`crate::ps_control`]) for the `_coordinator`
//! modules and `serving.py`, which perform the calls (TensorFlow's `PyFunc` ops on
//! threads of their own), the port probes, the holds and the logging.
//!
//! * `CoordinatorProtocol` with its `Lane`, `Event` and `Action`: the coordinator's
//!   protocol object ([`crate::ps_control::coordinator`]): its poll of the tasks,
//!   their releases, the waits for them to be gone, the workers' drains and the
//!   save's wait for the closures;
//! * `TaskProtocol` with its `TaskEvent` and `TaskAction`: a served task's protocol
//!   object ([`crate::ps_control::task`]): its answers to the coordinator, how long it
//!   serves after its notice;
//! * `TaskCalls`: whether a call to a task may start now, which earlier call
//!   it abandons (`CallTimeout` otherwise).
//!
//! The shared objects hold their core behind a lock that no holder keeps while it
//! runs Python (arguments are read before, results converted after).

use std::collections::BTreeMap;

use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::clock::{now_secs, unix_now};
use super::errors::CallTimeout;
use super::failure_response::FailureQuestion;
use crate::ps_control::coordinator::{self as co, Action as CoreAction, Event as CoreEvent};
use crate::ps_control::{self, task, CallId, Calls};

/// What a served task's threads report (`crate::ps_control::task::TaskEvent`).
#[pyclass(frozen, module = "tf_failure_handling._native")]
#[rustfmt::skip]
pub enum TaskEvent { Notice { source: String, deadline: Option<f64>, grace_period: Option<f64> }, Asked {} }

/// What a served task's serving thread does next (`crate::ps_control::task::TaskAction`).
/// `Serving.source` is where its own bound comes from ("the notice's deadline", "the
/// grace period", "peer_timeout"); `Leave.why` is "released", "deadline",
/// "coordinator silent" or "cap".
#[pyclass(frozen, module = "tf_failure_handling._native")]
#[rustfmt::skip]
pub enum TaskAction {
    WaitNotice { timeout: f64 },
    Serving { own: f64, source: String, at_most: f64 },
    Serve { timeout: f64 },
    Leave { why: String, reason: Option<String>, after: f64, silence: f64, cap_factor: f64 },
}

/// A served task's protocol object (`crate::ps_control::task::Task`): `handle(event)`,
/// `poll() -> TaskAction`, `poll_timeout()`, and `answer(request)`: what it answers
/// the coordinator's call. Each `now` is optional (the binding's wall clock).
#[pyclass(frozen, module = "tf_failure_handling._native")]
pub struct TaskProtocol {
    job: String,
    task: usize,
    core: Mutex<task::Task>,
}

#[pymethods]
impl TaskProtocol {
    #[new]
    #[pyo3(signature = (job, task, incarnation, peer_timeout = None))]
    fn new(job: String, task: usize, incarnation: String, peer_timeout: Option<f64>) -> Self {
        let core = Mutex::new(task::Task::new(incarnation, peer_timeout));
        TaskProtocol { job, task, core }
    }

    /// An event at `now`.
    #[pyo3(signature = (event, now = None))]
    fn handle(&self, event: &Bound<'_, TaskEvent>, now: Option<f64>) {
        let event = match event.get() {
            TaskEvent::Notice {
                source,
                deadline,
                grace_period,
            } => task::TaskEvent::Notice {
                source: source.clone(),
                deadline: *deadline,
                grace_period: *grace_period,
            },
            TaskEvent::Asked {} => task::TaskEvent::Asked,
        };
        self.core.lock().handle(event, now.unwrap_or_else(unix_now));
    }

    /// The serving thread's next action at `now`.
    #[pyo3(signature = (now = None))]
    fn poll(&self, now: Option<f64>) -> TaskAction {
        use ps_control::{Leave, ServeBound};
        match self.core.lock().poll(now.unwrap_or_else(unix_now)) {
            task::TaskAction::WaitNotice { timeout } => TaskAction::WaitNotice { timeout },
            task::TaskAction::Serve { timeout } => TaskAction::Serve { timeout },
            task::TaskAction::Serving { own, from, at_most } => TaskAction::Serving {
                own,
                source: match from {
                    ServeBound::Deadline => "the notice's deadline",
                    ServeBound::GracePeriod => "the grace period",
                    ServeBound::PeerTimeout => "peer_timeout",
                }
                .to_owned(),
                at_most,
            },
            task::TaskAction::Leave {
                why,
                reason,
                after,
                silence,
                cap_factor,
            } => TaskAction::Leave {
                why: match why {
                    Leave::Released => "released",
                    Leave::Deadline => "deadline",
                    Leave::CoordinatorSilent => "coordinator silent",
                    Leave::Cap => "cap",
                }
                .to_owned(),
                reason,
                after,
                silence,
                cap_factor,
            },
        }
    }

    /// Seconds the serving thread may wait from `now`.
    #[pyo3(signature = (now = None))]
    fn poll_timeout(&self, now: Option<f64>) -> f64 {
        self.core.lock().poll_timeout(now.unwrap_or_else(unix_now))
    }

    /// The answer to the coordinator's `request` (its decoded JSON) at `now`: a poll's
    /// (incarnation, job, task, notice), a release's (`released`, or why not), or an
    /// error. Any request object counts as the coordinator asking.
    #[pyo3(signature = (request, now = None))]
    fn answer<'py>(&self, py: Python<'py>, request: &Bound<'py, PyAny>, now: Option<f64>) -> PyResult<Bound<'py, PyDict>> {
        let answer = PyDict::new(py);
        let Ok(request) = request.cast::<PyDict>() else {
            answer.set_item("error", "not a JSON object")?;
            return Ok(answer);
        };
        let now = now.unwrap_or_else(unix_now);
        let op = request.get_item("op")?;
        let text = |key: &str| -> PyResult<Option<String>> { Ok(request.get_item(key)?.and_then(|v| v.extract().ok())) };
        let (incarnation, reason) = (text("incarnation")?, text("reason")?);
        let notice_at: Option<f64> = request.get_item("notice_at")?.and_then(|v| v.extract().ok());
        let mut core = self.core.lock();
        core.handle(task::TaskEvent::Asked, now);
        match op.as_ref().and_then(|o| o.extract::<String>().ok()).as_deref() {
            Some("release") => {
                let reason = reason.unwrap_or_else(|| "released".to_owned());
                let refused = core.release(incarnation.as_deref(), notice_at, reason);
                drop(core);
                answer.set_item("released", refused.is_none())?;
                if let Some(why) = refused {
                    answer.set_item("why", why.to_string())?;
                }
            }
            Some("poll") => {
                let notice = core.notice().map(|(source, at, deadline)| (source.to_owned(), at, deadline));
                let incarnation = core.incarnation().to_owned();
                drop(core);
                answer.set_item("incarnation", incarnation)?;
                answer.set_item("job", &self.job)?;
                answer.set_item("task", self.task)?;
                let notice = match notice {
                    Some((source, at, deadline)) => {
                        let n = PyDict::new(py);
                        n.set_item("source", source)?;
                        n.set_item("at", at)?;
                        n.set_item("deadline", deadline)?;
                        n.into_any()
                    }
                    None => py.None().into_bound(py),
                };
                answer.set_item("notice", notice)?;
            }
            _ => {
                drop(core);
                let op = match op {
                    Some(o) => o.repr()?.to_string(),
                    None => "None".to_owned(),
                };
                answer.set_item("error", format!("unknown op {op}"))?;
            }
        }
        Ok(answer)
    }

    /// For logs and tests: the incarnation, the notice (source, at, deadline), when
    /// the coordinator last asked, the release's reason.
    fn state<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let state = PyDict::new(py);
        let core = self.core.lock();
        state.set_item("incarnation", core.incarnation())?;
        state.set_item("notice", core.notice())?;
        state.set_item("last_asked", core.last_asked())?;
        state.set_item("released", core.released())?;
        Ok(state)
    }
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
    #[pyo3(signature = (abandon_after = None, max_abandoned = None))]
    fn new(abandon_after: Option<f64>, max_abandoned: Option<usize>) -> Self {
        TaskCalls(Mutex::new(Calls::new(
            abandon_after.unwrap_or(ps_control::ABANDON_AFTER),
            max_abandoned.unwrap_or(ps_control::MAX_ABANDONED),
        )))
    }

    /// A call to `task` starts at `now`: its handle, and the earlier call it
    /// abandons or None. `CallTimeout` while an earlier call holds the task up.
    #[pyo3(signature = (task, now = None))]
    fn start(&self, task: &str, now: Option<f64>) -> PyResult<(CallId, Option<Abandoned>)> {
        let now = now.unwrap_or_else(super::clock::now_secs);
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

/// Why a drain that held the worker's thread ends (`Action.DrainOver.why`).
#[pyclass(eq, eq_int, frozen, from_py_object, module = "tf_failure_handling._native")]
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum DrainEnd {
    /// The worker process is gone.
    Gone,
    /// Released, but still answering after the exit wait (`bound`).
    StillAnswers,
    /// A new incarnation of the worker answers.
    NewIncarnation,
    /// The coordinator's poller stopped.
    Stopped,
    /// The release failed and the worker still serves after the hold's bound.
    HoldBoundPassed,
}

/// Which of the coordinator's threads asks (`crate::ps_control::coordinator::Lane`).
#[pyclass(frozen, module = "tf_failure_handling._native")]
#[rustfmt::skip]
pub enum Lane { Poll {}, Release { task: String }, Gone { task: String }, Drain { worker: usize }, Save {}, Join {}, Failure { thread: u64 }, Stop {} }

impl From<&Lane> for co::Lane {
    fn from(l: &Lane) -> Self {
        match l {
            Lane::Poll {} => co::Lane::Poll,
            Lane::Release { task } => co::Lane::Release(task.clone()),
            Lane::Gone { task } => co::Lane::Gone(task.clone()),
            Lane::Drain { worker } => co::Lane::Drain(*worker),
            Lane::Save {} => co::Lane::Save,
            Lane::Join {} => co::Lane::Join,
            Lane::Failure { thread } => co::Lane::Failure(*thread),
            Lane::Stop {} => co::Lane::Stop,
        }
    }
}

/// What the coordinator's threads report (`crate::ps_control::coordinator::Event`).
/// `Answered` takes the poll's answer as it came (anything), `PollFailed` and
/// `ReleaseFailed` the error raised (`busy`: refused at once, the task's earlier call
/// has not returned), `ReleaseAnswered` the release's answer.
#[pyclass(frozen, name = "CoordinatorEvent", module = "tf_failure_handling._native")]
#[rustfmt::skip]
pub enum Event {
    Answered { task: String, answer: Py<PyAny> },
    PollFailed { task: String, error: Py<PyAny> },
    Stop {},
    RoundFailed {},
    ReleaseStart { task: String, reason: String, bound: Option<f64> },
    ReleaseAnswered { task: String, answer: Py<PyAny> },
    ReleaseFailed { task: String, error: Py<PyAny>, busy: bool },
    WaitGone { task: String, bound: f64 },
    Probed { task: String, listening: bool },
    DrainStart { worker: usize, can_hold: bool },
    Idled { worker: usize, idle: bool },
    DrainReleased { worker: usize, ok: bool },
    DrainWaited { worker: usize, gone: bool },
    SaveStart { bound: f64, scheduled: Option<u64>, held: bool },
    Unfinished { count: u64, queued: Option<Vec<u64>>, in_flight: Option<Vec<u64>> },
    Promotable { found: Vec<u64>, takers: usize },
    Granted {},
    OwnNotice { final_round: bool },
    CheckpointSaved {},
    TrainingGoesOn {},
    ClosureFailed { thread: u64 },
    FailureAnswered { thread: u64, yes: bool },
    RecoveryWaited { thread: u64, running: bool, recovered: bool },
}

/// `key` of `dict` (None when absent, or not a dict).
fn item<'py>(dict: &Bound<'py, PyAny>, key: &str) -> Option<Bound<'py, PyAny>> {
    dict.cast::<PyDict>().ok()?.get_item(key).ok().flatten()
}

fn text(value: &Bound<'_, PyAny>) -> PyResult<String> {
    Ok(value.str()?.to_string())
}

/// The variant of `$to` with the same name and fields as `$value`'s (which is one of
/// the variants listed), each field cloned.
macro_rules! same_fields {
    ($value:expr, $from:ident => $to:ident: $($v:ident { $($f:ident),* }),* $(,)?) => {
        match $value {
            $($from::$v { $($f),* } => $to::$v { $($f: $f.clone()),* },)*
            #[allow(unreachable_patterns)]
            _ => unreachable!("a variant converted above"),
        }
    };
}

impl Event {
    /// The core's event: the answers and errors read here, once.
    #[allow(clippy::clone_on_copy)]
    fn to_core(&self, py: Python<'_>) -> PyResult<co::Event> {
        Ok(match self {
            Event::Answered { task, answer } => {
                let answer = answer.bind(py);
                let incarnation = item(answer, "incarnation").and_then(|i| i.extract::<String>().ok());
                let Some(incarnation) = incarnation else {
                    return Ok(co::Event::BadAnswer { task: task.clone() });
                };
                let notice = item(answer, "notice").filter(|n| n.is_instance_of::<PyDict>());
                let notice = match notice {
                    Some(n) => Some(co::NoticeSeen {
                        at: item(&n, "at").and_then(|a| a.extract().ok()),
                        source: item(&n, "source").map_or(Ok("None".to_owned()), |s| text(&s))?,
                        deadline: item(&n, "deadline").and_then(|d| d.extract().ok()),
                        wall: unix_now(),
                    }),
                    None => None,
                };
                co::Event::Answered {
                    task: task.clone(),
                    incarnation,
                    notice,
                }
            }
            Event::PollFailed { task, error } => {
                let error = error.bind(py);
                co::Event::PollFailed {
                    task: task.clone(),
                    kind: error.get_type().name()?.to_string(),
                    message: text(error)?,
                }
            }
            Event::Stop {} => co::Event::Stop,
            Event::RoundFailed {} => co::Event::RoundFailed,
            Event::ReleaseAnswered { task, answer } => {
                let answer = answer.bind(py);
                let released = item(answer, "released").is_some_and(|r| r.is_truthy().unwrap_or(false));
                let answer = if released {
                    co::ReleaseAnswer::Released
                } else {
                    co::ReleaseAnswer::Refused(text(&item(answer, "why").unwrap_or_else(|| answer.clone()))?)
                };
                co::Event::ReleaseAnswered {
                    task: task.clone(),
                    answer,
                }
            }
            Event::ReleaseFailed { task, error, busy } => {
                let error = error.bind(py);
                let message = text(error)?;
                let answer = if *busy {
                    co::ReleaseAnswer::Busy(message)
                } else if error.is_instance_of::<CallTimeout>() {
                    co::ReleaseAnswer::TimedOut(message)
                } else {
                    co::ReleaseAnswer::Failed(message)
                };
                co::Event::ReleaseAnswered {
                    task: task.clone(),
                    answer,
                }
            }
            Event::Unfinished { count, queued, in_flight } => co::Event::Unfinished {
                runs: queued.clone().zip(in_flight.clone()),
                count: *count,
            },
            Event::Granted {} => co::Event::Granted,
            Event::CheckpointSaved {} => co::Event::CheckpointSaved,
            Event::TrainingGoesOn {} => co::Event::TrainingGoesOn,
            other => same_fields!(other, Event => CoreEvent:
                ReleaseStart { task, reason, bound }, WaitGone { task, bound }, Probed { task, listening },
                DrainStart { worker, can_hold }, Idled { worker, idle },
                DrainReleased { worker, ok }, DrainWaited { worker, gone },
                SaveStart { bound, scheduled, held }, Promotable { found, takers }, OwnNotice { final_round },
                ClosureFailed { thread }, FailureAnswered { thread, yes }, RecoveryWaited { thread, running, recovered }),
        })
    }
}

/// What a coordinator's thread does next (`crate::ps_control::coordinator::Action`).
/// `Released.end` is "released", "refused", "no answer" or "gone" (`detail`: why);
/// `DrainOver.outcome` is "released", "not released" or "no hold" (None: unknown).
#[pyclass(frozen, name = "CoordinatorAction", module = "tf_failure_handling._native")]
#[rustfmt::skip]
pub enum Action {
    Poll { task: String, timeout: f64 },
    Say { line: PollLog, task: String, detail: String },
    Reconnect { task: String },
    Notice { task: String, job: String, index: usize, source: String, deadline: Option<f64> },
    Release { task: String, request: Py<PyAny>, timeout: f64 },
    Released { task: String, end: String, detail: String },
    Probe { task: String, timeout: f64 },
    Pause { timeout: f64, after: Option<String> },
    GoneOver { gone: bool },
    Hold { bound: f64 },
    DrainRelease { task: String, drained: bool, hold: bool },
    DrainWaitGone { task: String, bound: f64, holding: Option<f64> },
    DrainOver { held: bool, why: Option<DrainEnd>, bound: f64, outcome: Option<String> },
    WaitAll { bound: f64 },
    WaitIdle { look: f64, looks: u32 },
    Promote { runs: Vec<u64> },
    Grant { runs: Vec<u64>, wait: f64 },
    Saved { runs: Option<u64>, finished_after: Vec<u64>, filled: Vec<u64>, error_wait: Option<f64>, took: f64 },
    HoldAll { strict: bool },
    ReleaseSaved { task: String, silence: f64, bound: f64 },
    StopWatch {},
    ResumeAll { runs: Option<u64> },
    Ask { question: FailureQuestion },
    Retry { why: FailureQuestion },
    Raise {},
    Recover { timeout: f64 },
    AfterRecovery { stopped: bool, timed_out: bool, timeout: f64 },
    StopRecovery { timeout: f64 },
    Done {},
}

impl Action {
    #[allow(clippy::too_many_lines)]
    #[allow(clippy::clone_on_copy, clippy::redundant_clone)]
    fn from_core(py: Python<'_>, action: co::Action) -> PyResult<Self> {
        use crate::ps_control::drain::{Ended, Outcome};
        Ok(match action {
            co::Action::Say { line, task, detail } => Action::Say {
                line: line.into(),
                task,
                detail,
            },
            co::Action::Release {
                task,
                reason,
                incarnation,
                notice_at,
                timeout,
            } => {
                let request = PyDict::new(py);
                request.set_item("op", "release")?;
                request.set_item("reason", reason)?;
                request.set_item("incarnation", incarnation)?;
                request.set_item("notice_at", notice_at)?;
                Action::Release {
                    task,
                    request: request.into_any().unbind(),
                    timeout,
                }
            }
            co::Action::Released { task, end } => {
                let (end, detail) = match end {
                    co::ReleaseEnd::Released => ("released", String::new()),
                    co::ReleaseEnd::Refused(why) => ("refused", why),
                    co::ReleaseEnd::NoAnswer(e) => ("no answer", e),
                    co::ReleaseEnd::Gone(e) => ("gone", e),
                };
                Action::Released {
                    task,
                    end: end.to_owned(),
                    detail,
                }
            }
            co::Action::DrainOver { held, why, outcome } => {
                let (why, bound) = match why {
                    None => (None, 0.0),
                    Some(Ended::Gone) => (Some(DrainEnd::Gone), 0.0),
                    Some(Ended::StillAnswers) => (Some(DrainEnd::StillAnswers), ps_control::EXIT_WAIT),
                    Some(Ended::NewIncarnation) => (Some(DrainEnd::NewIncarnation), 0.0),
                    Some(Ended::Stopped) => (Some(DrainEnd::Stopped), 0.0),
                    Some(Ended::HoldBoundPassed(b)) => (Some(DrainEnd::HoldBoundPassed), b),
                };
                let outcome = outcome.map(|o| {
                    match o {
                        Outcome::Released => "released",
                        Outcome::NotReleased => "not released",
                        Outcome::NoHold => "no hold",
                    }
                    .to_owned()
                });
                Action::DrainOver { held, why, bound, outcome }
            }
            co::Action::Done => Action::Done {},
            co::Action::Raise => Action::Raise {},
            co::Action::Ask { question } => Action::Ask { question: question.into() },
            co::Action::Retry { why } => Action::Retry { why: why.into() },
            co::Action::StopWatch => Action::StopWatch {},
            other => same_fields!(other, CoreAction => Action:
                Poll { task, timeout }, Reconnect { task }, Notice { task, job, index, source, deadline },
                Probe { task, timeout }, Pause { timeout, after }, GoneOver { gone }, Hold { bound },
                DrainRelease { task, drained, hold }, DrainWaitGone { task, bound, holding },
                WaitAll { bound }, WaitIdle { look, looks }, Promote { runs }, Grant { runs, wait },
                Saved { runs, finished_after, filled, error_wait, took }, HoldAll { strict }, ReleaseSaved { task, silence, bound },
                ResumeAll { runs }, Recover { timeout }, AfterRecovery { stopped, timed_out, timeout },
                StopRecovery { timeout }),
        })
    }
}

/// The coordinator's protocol object (`crate::ps_control::coordinator::Coordinator`):
/// `handle(event)`, `poll(lane) -> Action`, `poll_timeout(lane)`, on its own clock
/// (`clock`: a function of no arguments returning monotonic seconds; None: the
/// binding's). Shared by the coordinator's threads; its lock is never held while
/// Python runs (events are read, and the clock, before; actions converted after).
#[pyclass(frozen, module = "tf_failure_handling._native")]
pub struct CoordinatorProtocol {
    core: Mutex<co::Coordinator>,
    clock: Option<Py<PyAny>>,
}

impl CoordinatorProtocol {
    fn now(&self, py: Python<'_>) -> PyResult<f64> {
        match &self.clock {
            Some(clock) => clock.call1(py, ())?.extract(py),
            None => Ok(now_secs()),
        }
    }
}

#[pymethods]
impl CoordinatorProtocol {
    #[new]
    #[pyo3(signature = (tasks, peer_timeout = None, interval = None, call_timeout = None, *, recovery_timeout = None, clock = None))]
    fn new(
        tasks: Vec<String>,
        peer_timeout: Option<f64>,
        interval: Option<f64>,
        call_timeout: Option<f64>,
        recovery_timeout: Option<f64>,
        clock: Option<Py<PyAny>>,
    ) -> Self {
        let core = co::Coordinator::new(tasks, peer_timeout, interval, call_timeout).with_recovery_timeout(recovery_timeout);
        CoordinatorProtocol {
            core: Mutex::new(core),
            clock,
        }
    }

    /// An event, now.
    fn handle(&self, py: Python<'_>, event: &Bound<'_, Event>) -> PyResult<()> {
        let event = event.get().to_core(py)?;
        let now = self.now(py)?;
        self.core.lock().handle(event, now);
        Ok(())
    }

    /// The next action of `lane`.
    fn poll(&self, py: Python<'_>, lane: &Bound<'_, Lane>) -> PyResult<Action> {
        let now = self.now(py)?;
        let action = self.core.lock().poll(&lane.get().into(), now);
        Action::from_core(py, action)
    }

    /// Seconds `lane` may wait from now (None: until an event).
    fn poll_timeout(&self, py: Python<'_>, lane: &Bound<'_, Lane>) -> PyResult<Option<f64>> {
        let now = self.now(py)?;
        Ok(self.core.lock().poll_timeout(&lane.get().into(), now))
    }

    /// For logs and tests: the tasks, each task's last incarnation, the unanswered
    /// ones (why), those leaving, whether stopped.
    fn state<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let (tasks, incarnations, unanswered, leaving, stopped) = {
            let c = self.core.lock();
            (
                c.tasks().to_vec(),
                c.watch().incarnations().into_iter().collect::<BTreeMap<_, _>>(),
                c.watch().unanswered_tasks().into_iter().collect::<BTreeMap<_, _>>(),
                c.leaving().iter().cloned().collect::<Vec<_>>(),
                c.stopped(),
            )
        };
        let state = PyDict::new(py);
        state.set_item("tasks", tasks)?;
        state.set_item("incarnations", incarnations)?;
        state.set_item("unanswered", unanswered)?;
        state.set_item("leaving", pyo3::types::PySet::new(py, leaving)?)?;
        state.set_item("stopped", stopped)?;
        Ok(state)
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<TaskEvent>()?;
    m.add_class::<TaskAction>()?;
    m.add_class::<TaskProtocol>()?;
    m.add_class::<Abandoned>()?;
    m.add_class::<TaskCalls>()?;
    m.add_class::<PollLog>()?;
    m.add_class::<DrainEnd>()?;
    m.add_class::<Lane>()?;
    m.add_class::<Event>()?;
    m.add_class::<Action>()?;
    m.add_class::<CoordinatorProtocol>()?;
    m.add("CallTimeout", m.py().get_type::<CallTimeout>())?;
    m.add("PS_TOKEN", ps_control::TOKEN)?;
    m.add("WORKER_GET_SLICE", ps_control::WORKER_GET_SLICE)?;
    m.add("WORKER_SOFT_SLICE", ps_control::WORKER_SOFT_SLICE)?;
    m.add("GRPC_KEEPALIVE", ps_control::grpc_keepalive_options())?;
    Ok(())
}
