//! `Retry` and `RetryVerdict`: the protocol's one retry rule
//! ([`crate::retry`]) for the Python threads that perform the calls.
//!
//! The handler's own calls are retried inside its protocol (the driver's
//! writes, the leader's round and the step-key reader: `crate::protocol`);
//! `Retry` is the rule for the other Python loops that repeat a call (the
//! cluster poller, SLURM's requeue): the rule (pauses, bound, when to give
//! up) is decided here, and Python only waits and logs.
//!
//! `WriteKind` names the driver's writes, whose schedule is the protocol's
//! (`ProtocolCore.handle`, `poll`, `poll_timeout`: [`crate::protocol`] over
//! [`crate::writes`]); the driver performs them.

use pyo3::prelude::*;

use super::clock::now_secs;
use crate::retry::{self, Verdict};
use crate::writes;

/// What follows a failed attempt (`Retry.failed`).
#[pyclass(frozen, module = "tf_failure_handling._native")]
pub enum RetryVerdict {
    /// Try again at `at` (seconds, on the clock of the `now` the failure
    /// was reported at), that is `pause` seconds after it; `left` seconds
    /// of the bound remained.
    Again { at: f64, left: f64, pause: f64 },
    /// Give up: raise the last error, after `attempts` failed attempts over
    /// `seconds`.
    GiveUp { attempts: u32, seconds: f64 },
}

/// One run of failures of one coordination-service call, started at `now`
/// and retried for `bound` seconds. Every `now` is optional: without it the
/// binding reads its clock (`clock::now_secs`), so the package's threads
/// read none; a test passes its own.
#[pyclass(module = "tf_failure_handling._native")]
pub struct Retry(retry::Retry);

#[pymethods]
impl Retry {
    #[new]
    #[pyo3(signature = (bound, now = None))]
    fn new(bound: f64, now: Option<f64>) -> Self {
        Retry(retry::Retry::new(bound).started(now.unwrap_or_else(now_secs)))
    }

    /// An attempt starts at `now`: one that fails after taking the whole
    /// bound by itself ends a run past its bound (`src/retry.rs`).
    #[pyo3(signature = (now = None))]
    fn attempt(&mut self, now: Option<f64>) {
        self.0.attempt(now.unwrap_or_else(now_secs));
    }

    /// An attempt failed at `now`; nothing is retried when `closing`.
    #[pyo3(signature = (now = None, closing = false))]
    fn failed(&mut self, now: Option<f64>, closing: bool) -> RetryVerdict {
        let now = now.unwrap_or_else(now_secs);
        RetryVerdict::at(self.0.failed(now, closing), now)
    }

    /// Seconds since this run of failures started (0 before it has).
    #[pyo3(signature = (now = None))]
    fn elapsed(&self, now: Option<f64>) -> f64 {
        self.0.since().map_or(0.0, |since| (now.unwrap_or_else(now_secs) - since).max(0.0))
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

impl RetryVerdict {
    /// The core's verdict on a failure reported at `now`.
    pub(crate) fn at(v: Verdict, now: f64) -> Self {
        match v {
            Verdict::Again { at, left } => RetryVerdict::Again {
                at,
                left,
                pause: (at - now).max(0.0),
            },
            Verdict::GiveUp { attempts, seconds } => RetryVerdict::GiveUp { attempts, seconds },
        }
    }
}

/// What a write of the driver is (`Writes.push`).
#[pyclass(eq, eq_int, frozen, from_py_object, module = "tf_failure_handling._native")]
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum WriteKind {
    /// The acknowledgement of a step key: goes first.
    Acknowledge,
    /// A notice's claim: dropped at `close`.
    Claim,
    /// A notice's announce: one last attempt at `close`.
    Announce,
}

impl From<writes::Kind> for WriteKind {
    fn from(k: writes::Kind) -> Self {
        match k {
            writes::Kind::Acknowledge => WriteKind::Acknowledge,
            writes::Kind::Claim => WriteKind::Claim,
            writes::Kind::Announce => WriteKind::Announce,
        }
    }
}

impl From<WriteKind> for writes::Kind {
    fn from(k: WriteKind) -> Self {
        match k {
            WriteKind::Acknowledge => writes::Kind::Acknowledge,
            WriteKind::Claim => writes::Kind::Claim,
            WriteKind::Announce => writes::Kind::Announce,
        }
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Retry>()?;
    m.add_class::<RetryVerdict>()?;
    m.add_class::<WriteKind>()?;
    Ok(())
}
