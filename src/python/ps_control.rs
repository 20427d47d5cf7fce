//! The parameter-server task control ([`crate::ps_control`]) for the `_coordinator`
//! modules, `coordinator.py` and `serving.py`, which perform the calls (TensorFlow's
//! `PyFunc` ops on threads of their own), the port probes, the holds, the waits and
//! the logging.
//!
//! * `CoordinatorProtocol` with its `.Lane`, `.Event` and `.Action`: the
//!   coordinator's protocol object ([`crate::ps_control::coordinator`]): its poll of
//!   the tasks, their releases, the waits for them to be gone, the workers' drains,
//!   the save's wait for the closures, the response to a closure's error, the stop of
//!   the failure handling, and whether a call to a task may start now and which
//!   earlier call it abandons (its `.CallTimeout` otherwise), and the gRPC keepalive
//!   that bounds those calls at the transport;
//! * `TaskProtocol` with its `.Event` and `.Action`: a served task's protocol
//!   object ([`crate::ps_control::task`]): its answers to the coordinator, how long it
//!   serves after its notice.
//!
//! The event and action types are the core's declarations (`crate::wire`), expanded
//! here in one line each. What their fields hold that is not a plain value is
//! converted below: a poll's or a release's answer (the task's JSON object) and a
//! call's error are read into the core's types once, as the event is built (a notice's
//! deadline then meets the wall clock); the core's words (a log line, a drain's end, a
//! question) are Python strings.
//!
//! The shared objects hold their core behind a lock that no holder keeps while it
//! runs Python (events are read, and the clock, before; actions converted after).

use std::collections::BTreeMap;
use std::convert::Infallible;

use parking_lot::Mutex;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};

use super::clock::{now_secs, unix_now};
use super::errors::CallTimeout;
use super::wire::{nest, py_enum};
use crate::failure::response::Question;
use crate::ps_control::coordinator::{self as co, CallError, DrainEnd, NoticeSeen, PollAnswer, ReleaseEnd, ReleaseReply};
use crate::ps_control::drain::Outcome;
use crate::ps_control::task::{self, TaskReply, TaskRequest};
use crate::ps_control::{self, CallId, Leave, PollLog, ServeBound};
use crate::words::Words;

crate::ps_control::coordinator::lane!(py_enum[crate::ps_control::coordinator]);
crate::ps_control::coordinator::coordinator_event!(py_enum[crate::ps_control::coordinator]);
crate::ps_control::coordinator::coordinator_action!(py_enum[crate::ps_control::coordinator]);
crate::ps_control::task::task_event!(py_enum[crate::ps_control::task]);
crate::ps_control::task::task_action!(py_enum[crate::ps_control::task]);

/// Core types whose values are words in Python: each variant's word is the core's
/// ([`Words`]).
macro_rules! py_words {
    ($($ty:ty),*) => {$(
        impl<'py> IntoPyObject<'py> for $ty {
            type Target = PyString;
            type Output = Bound<'py, PyString>;
            type Error = Infallible;

            fn into_pyobject(self, py: Python<'py>) -> Result<Self::Output, Self::Error> {
                Ok(PyString::new(py, self.word()))
            }
        }

        impl<'py> IntoPyObject<'py> for &$ty {
            type Target = PyString;
            type Output = Bound<'py, PyString>;
            type Error = Infallible;

            fn into_pyobject(self, py: Python<'py>) -> Result<Self::Output, Self::Error> {
                (*self).into_pyobject(py)
            }
        }

        impl FromPyObject<'_, '_> for $ty {
            type Error = PyErr;

            fn extract(ob: Borrowed<'_, '_, PyAny>) -> PyResult<Self> {
                let word: String = ob.extract()?;
                <$ty>::from_word(&word).ok_or_else(|| PyValueError::new_err(format!("{word:?} is not a {}", stringify!($ty))))
            }
        }
    )*};
}

py_words!(PollLog, ReleaseEnd, DrainEnd, Outcome, Question, ServeBound, Leave);

/// `key` of `dict` (None when absent, or not a dict).
fn item<'py>(dict: &Bound<'py, PyAny>, key: &str) -> Option<Bound<'py, PyAny>> {
    dict.cast::<PyDict>().ok()?.get_item(key).ok().flatten()
}

/// A poll's answer as it came (anything): a task's, when it names its incarnation.
impl FromPyObject<'_, '_> for PollAnswer {
    type Error = PyErr;

    fn extract(ob: Borrowed<'_, '_, PyAny>) -> PyResult<Self> {
        let answer = ob.to_owned();
        let Some(incarnation) = item(&answer, "incarnation").and_then(|i| i.extract::<String>().ok()) else {
            return Ok(PollAnswer::Bad);
        };
        let notice = match item(&answer, "notice").filter(|n| n.is_instance_of::<PyDict>()) {
            Some(n) => Some(NoticeSeen {
                at: item(&n, "at").and_then(|a| a.extract().ok()),
                source: item(&n, "source").map_or(Ok("None".to_owned()), |s| Ok::<_, PyErr>(s.str()?.to_string()))?,
                deadline: item(&n, "deadline").and_then(|d| d.extract().ok()),
                // The answer arrives now: where its deadline is placed on the core's clock.
                wall: unix_now(),
            }),
            None => None,
        };
        Ok(PollAnswer::Task { incarnation, notice })
    }
}

impl<'py> IntoPyObject<'py> for &PollAnswer {
    type Target = PyAny;
    type Output = Bound<'py, PyAny>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Self::Output> {
        let PollAnswer::Task { incarnation, notice } = self else {
            return Ok(py.None().into_bound(py));
        };
        let answer = PyDict::new(py);
        answer.set_item("incarnation", incarnation)?;
        if let Some(n) = notice {
            let d = PyDict::new(py);
            d.set_item("at", n.at)?;
            d.set_item("source", &n.source)?;
            d.set_item("deadline", n.deadline)?;
            answer.set_item("notice", d)?;
        }
        Ok(answer.into_any())
    }
}

/// A release's answer: accepted when its `released` is true, else refused (its `why`).
impl FromPyObject<'_, '_> for ReleaseReply {
    type Error = PyErr;

    fn extract(ob: Borrowed<'_, '_, PyAny>) -> PyResult<Self> {
        let answer = ob.to_owned();
        if item(&answer, "released").is_some_and(|r| r.is_truthy().unwrap_or(false)) {
            return Ok(ReleaseReply::Released);
        }
        Ok(ReleaseReply::Refused(item(&answer, "why").unwrap_or(answer).str()?.to_string()))
    }
}

impl<'py> IntoPyObject<'py> for &ReleaseReply {
    type Target = PyDict;
    type Output = Bound<'py, PyDict>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Self::Output> {
        let answer = PyDict::new(py);
        answer.set_item("released", *self == ReleaseReply::Released)?;
        if let ReleaseReply::Refused(why) = self {
            answer.set_item("why", why)?;
        }
        Ok(answer)
    }
}

/// The error a call raised: its type's name, its message, whether it is the call's
/// bound (`CallTimeout`).
impl FromPyObject<'_, '_> for CallError {
    type Error = PyErr;

    fn extract(ob: Borrowed<'_, '_, PyAny>) -> PyResult<Self> {
        Ok(CallError {
            kind: ob.get_type().name()?.to_string(),
            message: ob.str()?.to_string(),
            timed_out: ob.is_instance_of::<CallTimeout>(),
        })
    }
}

impl<'py> IntoPyObject<'py> for &CallError {
    type Target = PyString;
    type Output = Bound<'py, PyString>;
    type Error = Infallible;

    fn into_pyobject(self, py: Python<'py>) -> Result<Self::Output, Self::Error> {
        Ok(PyString::new(py, &format!("{}: {}", self.kind, self.message)))
    }
}

/// `IntoPyObject` of the owned value, through the reference's (a getter of an event's
/// field).
macro_rules! by_ref {
    ($($ty:ty),*) => {$(
        impl<'py> IntoPyObject<'py> for $ty {
            type Target = PyAny;
            type Output = Bound<'py, PyAny>;
            type Error = PyErr;

            fn into_pyobject(self, py: Python<'py>) -> PyResult<Self::Output> {
                Ok((&self).into_pyobject(py)?.into_any())
            }
        }
    )*};
}

by_ref!(PollAnswer, ReleaseReply, CallError);

/// A protocol object's clock: a function of no arguments returning seconds, or
/// the binding's `read` (None).
struct Clock(Option<Py<PyAny>>, fn() -> f64);

impl Clock {
    fn now(&self, py: Python<'_>) -> PyResult<f64> {
        match &self.0 {
            Some(clock) => clock.call0(py)?.extract(py),
            None => Ok((self.1)()),
        }
    }
}

/// A served task's protocol object (`crate::ps_control::task::Task`): `handle(event)`,
/// `poll() -> TaskAction`, `poll_timeout()`, and `answer(request)`: what it answers
/// the coordinator's call. Its clock is the wall clock (a notice's time and deadline
/// are Unix times, which the coordinator reads), or `clock`.
#[pyclass(frozen, module = "tf_failure_handling._native")]
pub struct TaskProtocol {
    job: String,
    task: usize,
    core: Mutex<task::Task>,
    clock: Clock,
}

#[pymethods]
impl TaskProtocol {
    #[new]
    #[pyo3(signature = (job, task, incarnation, peer_timeout = None, *, clock = None))]
    fn new(job: String, task: usize, incarnation: String, peer_timeout: Option<f64>, clock: Option<Py<PyAny>>) -> Self {
        let core = Mutex::new(task::Task::new(incarnation, peer_timeout));
        TaskProtocol {
            job,
            task,
            core,
            clock: Clock(clock, unix_now),
        }
    }

    /// An event, now.
    fn handle(&self, py: Python<'_>, event: &Bound<'_, TaskEvent>) -> PyResult<()> {
        let now = self.clock.now(py)?;
        self.core.lock().handle(event.get().into(), now);
        Ok(())
    }

    /// The serving thread's next action, and how long it may wait (None: an action
    /// that is no wait).
    fn poll(&self, py: Python<'_>) -> PyResult<TaskAction> {
        let now = self.clock.now(py)?;
        Ok(self.core.lock().poll(now).into())
    }

    /// The answer to the coordinator's `request` (its decoded JSON): a poll's
    /// (incarnation, job, task, notice), a release's (`released`, or why not), or an
    /// error (`crate::ps_control::task::Task::answer`).
    fn answer<'py>(&self, py: Python<'py>, request: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyDict>> {
        let request = match request.cast::<PyDict>() {
            Err(_) => TaskRequest::NotAnObject,
            Ok(r) => {
                let text = |key: &str| item(r, key).and_then(|v| v.extract::<String>().ok());
                match text("op").as_deref() {
                    Some("poll") => TaskRequest::Poll,
                    Some("release") => TaskRequest::Release {
                        incarnation: text("incarnation"),
                        notice_at: item(r, "notice_at").and_then(|v| v.extract().ok()),
                        reason: text("reason"),
                    },
                    _ => TaskRequest::Unknown(item(r, "op").map_or(Ok("None".to_owned()), |o| Ok::<_, PyErr>(o.repr()?.to_string()))?),
                }
            }
        };
        let now = self.clock.now(py)?;
        let reply = self.core.lock().answer(request, now);
        let answer = PyDict::new(py);
        match reply {
            TaskReply::Poll { incarnation, notice } => {
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
            TaskReply::Release(refused) => {
                answer.set_item("released", refused.is_none())?;
                if let Some(why) = refused {
                    answer.set_item("why", why.to_string())?;
                }
            }
            TaskReply::Error(error) => answer.set_item("error", error)?,
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

/// A call abandoned so that a new one could start (`CoordinatorProtocol.start_call`).
#[pyclass(frozen, get_all, module = "tf_failure_handling._native")]
pub struct Abandoned {
    /// Seconds since the abandoned call started.
    age: f64,
    /// Abandoned calls of the task now outstanding, this one included.
    count: usize,
    /// The most that may be.
    max: usize,
}

/// The coordinator's protocol object (`crate::ps_control::coordinator::Coordinator`):
/// `handle(event)`, `poll(lane) -> CoordinatorAction`, `poll_timeout(lane)`, on its own
/// clock (`clock`: a function of no arguments returning monotonic seconds; None: the
/// binding's). Shared by the coordinator's threads.
#[pyclass(frozen, module = "tf_failure_handling._native")]
pub struct CoordinatorProtocol {
    core: Mutex<co::Coordinator>,
    clock: Clock,
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
            clock: Clock(clock, now_secs),
        }
    }

    /// An event, now.
    fn handle(&self, py: Python<'_>, event: &Bound<'_, CoordinatorEvent>) -> PyResult<()> {
        let now = self.clock.now(py)?;
        self.core.lock().handle(event.get().into(), now);
        Ok(())
    }

    /// The next action of `lane`.
    fn poll(&self, py: Python<'_>, lane: &Bound<'_, Lane>) -> PyResult<CoordinatorAction> {
        let now = self.clock.now(py)?;
        Ok(self.core.lock().poll(&lane.get().into(), now).into())
    }

    /// A call to `task` starts now: its handle, and the earlier call it abandons or
    /// None. `CoordinatorProtocol.CallTimeout` while an earlier call holds the task up.
    fn start_call(&self, py: Python<'_>, task: &str) -> PyResult<(CallId, Option<Abandoned>)> {
        let now = self.clock.now(py)?;
        let started = self.core.lock().start_call(task, now);
        let (id, abandoned) = started?;
        let abandoned = abandoned.map(|a| Abandoned {
            age: a.age,
            count: a.count,
            max: a.max,
        });
        Ok((id, abandoned))
    }

    /// Call `id` to `task` returned, with an answer or an error (reported by the
    /// call's thread); False if it was reported before.
    fn call_returned(&self, task: &str, id: CallId) -> bool {
        self.core.lock().call_returned(task, id)
    }

    /// `TF_GRPC_DEFAULT_OPTIONS` (`current`) with the keepalive options it does not
    /// name added (`crate::ps_control::with_keepalive`); None when it names them all.
    /// The third bound of the coordinator's calls to its tasks, beside a call's timeout
    /// and the abandoned calls': a call to a stopped task fails after a ping timeout
    /// instead of stalling. Static: it is set in the environment before TensorFlow
    /// creates a channel, before any coordinator exists.
    #[staticmethod]
    fn grpc_options_with_keepalive(current: &str) -> Option<String> {
        ps_control::with_keepalive(current)
    }

    /// Seconds `lane` may wait from now (None: until an event).
    fn poll_timeout(&self, py: Python<'_>, lane: &Bound<'_, Lane>) -> PyResult<Option<f64>> {
        let now = self.clock.now(py)?;
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

/// Each protocol object with its own vocabulary nested in it (`TaskProtocol.Event`,
/// `CoordinatorProtocol.Lane`, its calls' `CoordinatorProtocol.CallTimeout`).
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<TaskProtocol>()?;
    // The key a served task's control is registered under in TF's `py_func` registry,
    // which the coordinator's calls name.
    py.get_type::<TaskProtocol>().setattr("TOKEN", ps_control::TOKEN)?;
    nest::<TaskProtocol, TaskEvent>(py, "Event")?;
    nest::<TaskProtocol, TaskAction>(py, "Action")?;
    m.add_class::<Abandoned>()?;
    m.add_class::<CoordinatorProtocol>()?;
    nest::<CoordinatorProtocol, Lane>(py, "Lane")?;
    nest::<CoordinatorProtocol, CoordinatorEvent>(py, "Event")?;
    nest::<CoordinatorProtocol, CoordinatorAction>(py, "Action")?;
    nest::<CoordinatorProtocol, CallTimeout>(py, "CallTimeout")?;
    Ok(())
}
