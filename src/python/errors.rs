//! The one map from errors to Python exceptions: every exception the binding
//! raises is made here.
//!
//! | error | Python exception | why that type |
//! | --- | --- | --- |
//! | [`StepKeyError`] (a step key that is not a run count) | `ValueError` | a bad value read from the coordination service |
//! | [`SaveError`] (a save reported that was not asked for) | `RuntimeError` | a misuse of the protocol by the caller |
//! | [`CompletionError`] (nothing in flight to report) | `AssertionError` | TensorFlow's `_CoordinatedClosureQueue` asserts the same |
//! | [`TransientError`] (a PS task the cluster does not have) | `IndexError` | TensorFlow's `Cluster` raises `IndexError` here |
//! | [`InstallError`] (a signal that cannot be watched) | `ValueError` | an argument |
//! | [`Busy`] (a notice's write queued while another is pending) | `RuntimeError` | a misuse of the driver's writes by the caller |
//! | [`Refused`] (a call to a task held up by its earlier, unreturned one) | [`CallTimeout`] (an `Exception`, defined here; Python reaches it as `CoordinatorProtocol.CallTimeout`) | the parameter-server control's own: the task counts as unanswered |
//! | [`SharesError`] (no worker, or sizes and flags of different lengths) | `ValueError` | an argument |
//! | [`UrlError`], [`WatchError`] (a bad cloud, URL or duration) | `ValueError`; a thread that cannot start: `RuntimeError` | an argument; the system |
//! | [`bad_value`], [`bad_type`], [`misuse`], [`bad_timeout`] | `ValueError`, `TypeError`, `RuntimeError` | an argument or a call out of order |
//!
//! A new core error gets a row in `raises!` here, and the `?` operator does the
//! rest; a binding module never calls `new_err` itself.

use pyo3::exceptions::{PyAssertionError, PyIndexError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::PyErr;

use crate::closure_queue::CompletionError;
use crate::failure::TransientError;
use crate::ps_control::Refused;
use crate::shares::SharesError;
use crate::sources::http::UrlError;
use crate::sources::signals::InstallError;
use crate::sources::WatchError;
use crate::step_resolution::{SaveError, StepKeyError};
use crate::writes::Busy;

pyo3::create_exception!(
    tf_failure_handling._native,
    CallTimeout,
    pyo3::exceptions::PyException,
    "A call to a task did not return within its bound (the task is stopped, partitioned or \
     too busy to answer)."
);

/// `From<error> for PyErr` of each core error: the Python exception named beside it,
/// with the error's message (the table above).
macro_rules! raises {
    ($($error:ty => $exception:ty),* $(,)?) => {$(
        impl From<$error> for PyErr {
            fn from(e: $error) -> Self {
                <$exception>::new_err(e.to_string())
            }
        }
    )*};
}

raises! {
    Refused => CallTimeout,
    SharesError => PyValueError,
    StepKeyError => PyValueError,
    SaveError => PyRuntimeError,
    Busy => PyRuntimeError,
    CompletionError => PyAssertionError,
    TransientError => PyIndexError,
    InstallError => PyValueError,
    UrlError => PyValueError,
}

impl From<WatchError> for PyErr {
    fn from(e: WatchError) -> Self {
        match e {
            WatchError::Spawn(_) => PyRuntimeError::new_err(e.to_string()),
            _ => PyValueError::new_err(e.to_string()),
        }
    }
}

/// An argument with a value the call cannot take (`ValueError`).
pub(crate) fn bad_value(message: impl Into<String>) -> PyErr {
    PyValueError::new_err(message.into())
}

/// An argument of a type the call cannot take (`TypeError`).
pub(crate) fn bad_type(message: impl Into<String>) -> PyErr {
    PyTypeError::new_err(message.into())
}

/// A call out of order, or something the system refused (`RuntimeError`).
pub(crate) fn misuse(message: impl Into<String>) -> PyErr {
    PyRuntimeError::new_err(message.into())
}

/// A bare `AssertionError`, as TensorFlow's closure queue raises for a
/// closure put back with a tag.
pub(crate) fn assertion() -> PyErr {
    PyAssertionError::new_err(())
}

/// A timeout in seconds that is negative or not a number (`ValueError`).
pub(crate) fn bad_timeout(timeout: f64) -> PyErr {
    bad_value(format!("timeout must be a non-negative number of seconds, got {timeout}"))
}
