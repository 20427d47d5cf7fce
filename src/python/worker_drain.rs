//! A worker's drain ([`crate::ps_control::drain`]) for `_coordinator/worker_drain.py`,
//! which holds the worker's thread, releases the worker, waits and logs as each step
//! says. The plan is used by one drain thread; its lock is never held while Python
//! runs.

use parking_lot::Mutex;
use pyo3::prelude::*;

use crate::ps_control::drain::{self, Ended, Outcome, WorkerDrain};

/// Why a drain that held the worker's thread ends (`DrainStep.Resume.why`).
#[pyclass(eq, eq_int, frozen, from_py_object, module = "tf_failure_handling._native")]
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum DrainEnd {
    /// The worker process is gone.
    Gone,
    /// Released, but still answering after `WORKER_EXIT_WAIT`.
    StillAnswers,
    /// A new incarnation of the worker answers.
    NewIncarnation,
    /// The coordinator's poller stopped.
    Stopped,
    /// The release failed and the worker still serves after the hold's bound.
    HoldBoundPassed,
}

/// What the drain thread does next (`WorkerDrainPlan`).
#[pyclass(frozen, module = "tf_failure_handling._native")]
pub enum DrainStep {
    /// Hold the worker's thread and wait for its closure in flight, at most `bound` s.
    Hold { bound: f64 },
    /// Release the worker; `drained`: its closure finished; `hold`: its thread is held.
    Release { drained: bool, hold: bool },
    /// Wait until the worker is gone, at most `bound` s; `holding`: the release failed
    /// and the worker is kept out of the rotation this long in all (first wait only).
    WaitGone { bound: f64, holding: Option<f64> },
    /// Resume the worker's thread; `bound` is the hold's, for `HoldBoundPassed`.
    Resume { why: DrainEnd, bound: f64 },
    /// Over, nothing held.
    Done {},
}

impl From<drain::DrainStep> for DrainStep {
    fn from(step: drain::DrainStep) -> Self {
        match step {
            drain::DrainStep::Hold { bound } => DrainStep::Hold { bound },
            drain::DrainStep::Release { drained, hold } => DrainStep::Release { drained, hold },
            drain::DrainStep::WaitGone { bound, holding } => DrainStep::WaitGone { bound, holding },
            drain::DrainStep::Resume(why) => {
                let (why, bound) = match why {
                    Ended::Gone => (DrainEnd::Gone, 0.0),
                    Ended::StillAnswers => (DrainEnd::StillAnswers, 0.0),
                    Ended::NewIncarnation => (DrainEnd::NewIncarnation, 0.0),
                    Ended::Stopped => (DrainEnd::Stopped, 0.0),
                    Ended::HoldBoundPassed(b) => (DrainEnd::HoldBoundPassed, b),
                };
                DrainStep::Resume { why, bound }
            }
            drain::DrainStep::Done => DrainStep::Done {},
        }
    }
}

/// One worker's drain: `start`, then report each step's result (`idled`,
/// `released`, `waited`) and perform the step returned. Times are Unix seconds.
#[pyclass(frozen, module = "tf_failure_handling._native")]
pub struct WorkerDrainPlan {
    drain: Mutex<WorkerDrain>,
}

#[pymethods]
impl WorkerDrainPlan {
    #[new]
    #[pyo3(signature = (deadline, peer_timeout))]
    fn new(deadline: Option<f64>, peer_timeout: f64) -> Self {
        WorkerDrainPlan {
            drain: Mutex::new(WorkerDrain::new(deadline, peer_timeout)),
        }
    }

    /// The first step: hold the thread when the coordinator can, else release now.
    fn start(&self, can_hold: bool, now: f64) -> DrainStep {
        self.drain.lock().start(can_hold, now).into()
    }

    /// The wait for the closure in flight ended (`idle`: it finished).
    fn idled(&self, idle: bool) -> DrainStep {
        self.drain.lock().idled(idle).into()
    }

    /// The release was made (`ok`: accepted; `stopped`: the poller stopped).
    fn released(&self, ok: bool, stopped: bool, now: f64) -> DrainStep {
        self.drain.lock().released(ok, stopped, now).into()
    }

    /// A wait for the worker to be gone ended.
    fn waited(&self, gone: bool, same_incarnation: bool, stopped: bool, now: f64) -> DrainStep {
        self.drain.lock().waited(gone, same_incarnation, stopped, now).into()
    }

    /// "released", "not released", "no hold", or None before the release.
    #[getter]
    fn outcome(&self) -> Option<&'static str> {
        self.drain.lock().outcome().map(|o| match o {
            Outcome::Released => "released",
            Outcome::NotReleased => "not released",
            Outcome::NoHold => "no hold",
        })
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<DrainEnd>()?;
    m.add_class::<DrainStep>()?;
    m.add_class::<WorkerDrainPlan>()?;
    Ok(())
}
