//! The coordinator's response to a closure's error (`failure::response`): the
//! question to answer next, or what to do, and what follows the recovery wait.

use pyo3::prelude::*;

use crate::failure::response::{self as core, Question, Response};

/// A question about a closure's error, in TF's order (`failure_response`).
#[pyclass(eq, eq_int, frozen, from_py_object, module = "tf_failure_handling._native")]
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum FailureQuestion {
    /// A PS failure within its tolerance (`Cluster._record_and_ignore_transient_ps_failure`).
    TransientPsFailure,
    /// A timeout within the cluster's tolerance (`Cluster._record_and_ignore_transient_timeouts`).
    TransientTimeout,
    /// A `CancelledError` naming a `/job:`: derived from another task's failure.
    DerivedCancellation,
    /// A worker failure while the queue was not cancelled (`_validate_preemption_failure`).
    WorkerFailure,
}

impl From<FailureQuestion> for Question {
    fn from(q: FailureQuestion) -> Self {
        match q {
            FailureQuestion::TransientPsFailure => Question::TransientPsFailure,
            FailureQuestion::TransientTimeout => Question::TransientTimeout,
            FailureQuestion::DerivedCancellation => Question::DerivedCancellation,
            FailureQuestion::WorkerFailure => Question::WorkerFailure,
        }
    }
}

impl From<Question> for FailureQuestion {
    fn from(q: Question) -> Self {
        match q {
            Question::TransientPsFailure => FailureQuestion::TransientPsFailure,
            Question::TransientTimeout => FailureQuestion::TransientTimeout,
            Question::DerivedCancellation => FailureQuestion::DerivedCancellation,
            Question::WorkerFailure => FailureQuestion::WorkerFailure,
        }
    }
}

/// What `failure_response` says next.
#[pyclass(frozen, module = "tf_failure_handling._native")]
pub enum FailureResponse {
    /// Answer `question`, then call `failure_response` with it.
    Ask { question: FailureQuestion },
    /// Put the closure back; `why` is the question answered yes.
    Retry { why: FailureQuestion },
    /// The error is the closure's: re-raise it.
    Raise {},
    /// A worker failed: put the closure back and wait for its recovery.
    Recover {},
}

/// The step after `answered` (None: the error was just caught) was answered `yes`.
#[pyfunction]
#[pyo3(signature = (answered=None, yes=false))]
fn failure_response(answered: Option<FailureQuestion>, yes: bool) -> FailureResponse {
    match core::respond(answered.map(Question::from), yes) {
        Response::Ask(q) => FailureResponse::Ask { question: q.into() },
        Response::Retry(q) => FailureResponse::Retry { why: q.into() },
        Response::Raise => FailureResponse::Raise {},
        Response::Recover => FailureResponse::Recover {},
    }
}

/// What follows the wait for a failed worker's recovery.
#[pyclass(eq, eq_int, frozen, from_py_object, module = "tf_failure_handling._native")]
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum AfterRecoveryWait {
    /// The failure handler was stopped: the thread ends; no recovery function runs.
    Stopped,
    /// The worker is back: run the recovery function.
    Recovered,
    /// The bound passed: the closure is retried on the workers that are up.
    TimedOut,
}

/// The step after the recovery wait (`running`: the failure handler still runs).
#[pyfunction]
fn after_recovery_wait(running: bool, recovered: bool) -> AfterRecoveryWait {
    match core::after_recovery_wait(running, recovered) {
        core::AfterWait::Stopped => AfterRecoveryWait::Stopped,
        core::AfterWait::Recovered => AfterRecoveryWait::Recovered,
        core::AfterWait::TimedOut => AfterRecoveryWait::TimedOut,
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<FailureQuestion>()?;
    m.add_class::<FailureResponse>()?;
    m.add_class::<AfterRecoveryWait>()?;
    m.add_function(wrap_pyfunction!(failure_response, m)?)?;
    m.add_function(wrap_pyfunction!(after_recovery_wait, m)?)?;
    Ok(())
}
