//! `Retry` and `RetryVerdict`: the protocol's one retry rule
//! ([`crate::retry`]) for the Python threads that perform the calls.
//!
//! The driver, the reader of the step keys and the training thread each hold
//! a `Retry` for the call they are repeating; the rule (pauses, bound, when
//! to give up) is decided here, and Python only waits and logs. The bound
//! itself comes from `ProtocolCore.retry_bound`, which knows the
//! leading notice's deadline.
//!
//! `Writes` is the driver's side: which of its writes to attempt now and
//! when to wake for the next ([`crate::writes`]); the driver performs them.

use pyo3::prelude::*;

use super::clock::now_secs;
use crate::retry::{self, Verdict};
use crate::writes::{self, WriteId};

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
    fn at(v: Verdict, now: f64) -> Self {
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

impl From<WriteKind> for writes::Kind {
    fn from(k: WriteKind) -> Self {
        match k {
            WriteKind::Acknowledge => writes::Kind::Acknowledge,
            WriteKind::Claim => writes::Kind::Claim,
            WriteKind::Announce => writes::Kind::Announce,
        }
    }
}

/// The driver's pending writes ([`crate::writes`]): the driver asks which to
/// attempt (`poll_action`) and when to wake (`poll_timeout`), performs it,
/// and reports the outcome (`done`, `failed`). Used by the driver thread only.
#[pyclass(module = "tf_failure_handling._native")]
pub struct Writes(writes::Writes);

#[pymethods]
impl Writes {
    #[new]
    fn new() -> Self {
        Writes(writes::Writes::new())
    }

    /// Queues a write retried for `bound` seconds from `now`, due at once;
    /// its handle. `RuntimeError` for a claim or announce while `busy`.
    #[pyo3(signature = (kind, bound, now = None))]
    fn push(&mut self, kind: WriteKind, bound: f64, now: Option<f64>) -> PyResult<WriteId> {
        Ok(self.0.push(kind.into(), bound, now.unwrap_or_else(now_secs))?)
    }

    /// A notice's write is pending: the next notice waits.
    #[getter]
    fn busy(&self) -> bool {
        self.0.busy()
    }

    fn __len__(&self) -> usize {
        self.0.len()
    }

    /// The write to attempt at `now`, or None when none is due.
    #[pyo3(signature = (now = None))]
    fn poll_action(&self, now: Option<f64>) -> Option<WriteId> {
        self.0.poll_action(now.unwrap_or_else(now_secs))
    }

    /// When the next write is due, or None with none pending.
    fn poll_timeout(&self) -> Option<f64> {
        self.0.poll_timeout()
    }

    /// Seconds from `now` until the next write is due (0 if it is), or None
    /// with none pending: how long the driver's receive may wait.
    #[pyo3(signature = (now = None))]
    fn poll_wait(&self, now: Option<f64>) -> Option<f64> {
        let now = now.unwrap_or_else(now_secs);
        self.0.poll_timeout().map(|due| (due - now).max(0.0))
    }

    /// The attempt succeeded: the write is forgotten. False for a stale handle.
    fn done(&mut self, id: WriteId) -> bool {
        self.0.done(id).is_some()
    }

    /// The attempt failed at `now`: when to try again, or give up (the write
    /// is then forgotten). None for a stale handle.
    #[pyo3(signature = (id, now = None, closing = false))]
    fn failed(&mut self, id: WriteId, now: Option<f64>, closing: bool) -> Option<RetryVerdict> {
        let now = now.unwrap_or_else(now_secs);
        self.0.failed(id, now, closing).map(|v| RetryVerdict::at(v, now))
    }

    /// Failed attempts of `id` so far.
    fn attempts(&self, id: WriteId) -> u32 {
        self.0.attempts(id)
    }

    /// The handler closes: `(last attempts, dropped claim or None)`.
    #[pyo3(signature = (now = None))]
    fn close(&mut self, now: Option<f64>) -> (Vec<WriteId>, Option<WriteId>) {
        let closing = self.0.close(now.unwrap_or_else(now_secs));
        (closing.last_attempts, closing.dropped)
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Retry>()?;
    m.add_class::<RetryVerdict>()?;
    m.add_class::<Writes>()?;
    m.add_class::<WriteKind>()?;
    m.add("RETRY_FIRST_PAUSE", retry::FIRST_PAUSE)?;
    m.add("RETRY_MAX_PAUSE", retry::MAX_PAUSE)?;
    m.add("RETRY_MIN_ATTEMPTS", retry::MIN_ATTEMPTS)?;
    m.add("TRANSIENT_FAILURE_WINDOW", retry::TRANSIENT_FAILURE_WINDOW)?;
    Ok(())
}
