//! `Retry` and `RetryVerdict`: the protocol's one retry rule
//! ([`crate::retry`]) for the Python threads that perform the calls.
//!
//! The driver, the reader of the step keys and the training thread each hold
//! a `Retry` for the call they are repeating; the rule (pauses, bound, when
//! to give up) is decided here, and Python only waits and logs. The bound
//! itself comes from `HandlerCore._core_retry_bound`, which knows the
//! leading notice's deadline.

use pyo3::prelude::*;

use crate::retry::{self, Verdict};

/// What follows a failed attempt (`Retry.failed`).
#[pyclass(frozen, module = "tf_failure_handling._native")]
pub enum RetryVerdict {
    /// Try again at `at` (seconds, the clock the caller passed); `left`
    /// seconds of the bound remained.
    Again { at: f64, left: f64 },
    /// Give up: raise the last error, after `attempts` failed attempts over
    /// `seconds`.
    GiveUp { attempts: u32, seconds: f64 },
}

/// One run of failures of one coordination-service call, started at `now`
/// and retried for `bound` seconds.
#[pyclass(module = "tf_failure_handling._native")]
pub struct Retry(retry::Retry);

#[pymethods]
impl Retry {
    #[new]
    fn new(bound: f64, now: f64) -> Self {
        Retry(retry::Retry::new(bound).started(now))
    }

    /// An attempt failed at `now`; nothing is retried when `closing`.
    fn failed(&mut self, now: f64, closing: bool) -> RetryVerdict {
        match self.0.failed(now, closing) {
            Verdict::Again { at, left } => RetryVerdict::Again { at, left },
            Verdict::GiveUp { attempts, seconds } => RetryVerdict::GiveUp { attempts, seconds },
        }
    }

    /// The next failure gives up (the handler is closing: one last attempt).
    fn last_attempt(&mut self) {
        self.0.last_attempt();
    }

    /// The bound, in seconds.
    #[getter]
    fn bound(&self) -> f64 {
        self.0.bound()
    }

    /// Failed attempts so far.
    #[getter]
    fn attempts(&self) -> u32 {
        self.0.attempts()
    }

    /// When this run of failures started.
    #[getter]
    fn since(&self) -> Option<f64> {
        self.0.since()
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Retry>()?;
    m.add_class::<RetryVerdict>()?;
    m.add("RETRY_FIRST_PAUSE", retry::FIRST_PAUSE)?;
    m.add("RETRY_MAX_PAUSE", retry::MAX_PAUSE)?;
    m.add("RETRY_MIN_ATTEMPTS", retry::MIN_ATTEMPTS)?;
    m.add("TRANSIENT_FAILURE_WINDOW", retry::TRANSIENT_FAILURE_WINDOW)?;
    Ok(())
}
