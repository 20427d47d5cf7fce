//! The questions of the coordinator's response to a closure's error
//! (`failure::response`), asked by `CoordinatorProtocol`'s failure lane.

use pyo3::prelude::*;

use crate::failure::response::Question;

/// A question about a closure's error, in TF's order (`CoordinatorAction.Ask`).
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

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<FailureQuestion>()?;
    Ok(())
}
