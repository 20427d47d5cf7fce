//! `Inbox` and `Input`: [`crate::inbox`] for Python.
//!
//! The driver thread of a handler blocks in [`PyInbox::recv`] with the GIL
//! released ([`wait_sliced`]: on the main thread in slices with
//! `check_signals` between them, on any other thread detached for the whole
//! wait). Rust sources post without the GIL: a `SignalWatch` built with
//! `inbox=` has the signal dispatcher post each delivery, a `MetadataWatch`
//! built with an inbox as its `wake` posts its first notice and each that ends earlier. Python threads
//! (the step-key reader, the watcher-fn poller, `testing`, `close()`) post
//! through the methods below, which never block.
//!
//! A key-read failure carries the exception object itself, so the driver
//! hands on TF's own error type and message.

use std::sync::Arc;
use std::time::Duration;

use pyo3::prelude::*;

use super::blocking::{deadline_after, wait_sliced};
use super::clock;
use super::displacement::{warn_displaced, Displacement};
use super::handler::round_from_key;
use crate::inbox::{InWait, Inbox, Input, Origin, Poster, RecvError};

/// What the binding's inbox carries for a failed read: the exception.
pub(crate) type PyPoster = Poster<Py<PyAny>>;

/// One input of the driver, as `Inbox.recv` returns it.
#[pyclass(frozen, name = "Input", module = "tf_failure_handling._native")]
pub enum PyInput {
    /// A termination notice: `signal` (its number) for a signal, else
    /// `source` (as the source describes itself); `at` when it was seen and
    /// `deadline` when the machine goes away, `kill` when the platform stated it
    /// ends this process, all Unix seconds.
    Notice {
        source: Option<String>,
        signal: Option<i32>,
        at: f64,
        deadline: Option<f64>,
        kill: Option<f64>,
    },
    /// The step-key reader read `value` from `round_key`.
    StepKey { round_key: String, value: String },
    /// Reading `round_key` failed for longer than the bound; `error` is the
    /// last failure (TF's type). The reader has ended.
    KeyReadFailed { round_key: String, error: Py<PyAny> },
    /// `close()`: the driver ends.
    Stop {},
}

impl From<Input<Py<PyAny>>> for PyInput {
    fn from(input: Input<Py<PyAny>>) -> Self {
        match input {
            Input::Notice {
                origin,
                at,
                deadline,
                kill,
            } => {
                let (source, signal) = match origin {
                    Origin::Signal(s) => (None, Some(s)),
                    Origin::Source(s) => (Some(s), None),
                };
                PyInput::Notice {
                    source,
                    signal,
                    at,
                    deadline,
                    kill,
                }
            }
            Input::StepKey { round, value } => PyInput::StepKey {
                round_key: round.key().to_owned(),
                value,
            },
            Input::KeyReadFailed { round, error } => PyInput::KeyReadFailed {
                round_key: round.key().to_owned(),
                error,
            },
            Input::Stop => PyInput::Stop {},
        }
    }
}

/// What one slice of [`PyInbox::recv`] found.
enum Got {
    Input(Input<Py<PyAny>>),
    /// A watched signal's disposition is no longer ours (first time only).
    Displaced(Vec<i32>),
}

/// The driver's inbox: notices, step keys, key-read failures and stop, in
/// one place (see `src/inbox.rs` for who posts what, and in which order a
/// receive takes them).
#[pyclass(frozen, name = "Inbox", module = "tf_failure_handling._native")]
pub struct PyInbox {
    inbox: Arc<Inbox<Py<PyAny>>>,
    poster: PyPoster,
}

impl PyInbox {
    /// A poster for a Rust source (the signal dispatcher, a metadata watch).
    pub(crate) fn poster(&self) -> PyPoster {
        self.poster.clone()
    }
}

#[pymethods]
impl PyInbox {
    #[new]
    fn new() -> Self {
        let (inbox, poster) = Inbox::new();
        PyInbox {
            inbox: Arc::new(inbox),
            poster,
        }
    }

    /// Posts a notice from `source` (Unix `deadline`, if it announced one; Unix
    /// `kill`, if it stated when this process ends); False once stopped (or when
    /// too many notices wait: it changes nothing then).
    #[pyo3(signature = (source, deadline=None, kill=None))]
    fn post_notice(&self, source: String, deadline: Option<f64>, kill: Option<f64>) -> bool {
        self.poster
            .notice(Origin::Source(source), clock::unix_now(), deadline, kill)
            .is_ok()
    }

    /// Posts the value read from a step key; False once stopped.
    ///
    /// # Errors
    ///
    /// `ValueError` when `round_key` is not a step key.
    fn post_step_key(&self, round_key: &str, value: String) -> PyResult<bool> {
        let round = round_from_key(round_key)?;
        Ok(self.poster.post(Input::StepKey { round, value }).is_ok())
    }

    /// Posts that reading `round_key` failed for good, with the last
    /// `error`; False once stopped.
    ///
    /// # Errors
    ///
    /// `ValueError` when `round_key` is not a step key.
    fn post_key_read_failed(&self, round_key: &str, error: Py<PyAny>) -> PyResult<bool> {
        let round = round_from_key(round_key)?;
        Ok(self.poster.post(Input::KeyReadFailed { round, error }).is_ok())
    }

    /// Stops the inbox: every receive (blocked or later) returns
    /// `Input.Stop`, posts return False. Idempotent, never blocks.
    fn stop(&self) {
        self.inbox.stop();
    }

    /// Whether `stop()` was called.
    #[getter]
    fn stopped(&self) -> bool {
        self.inbox.stopped()
    }

    /// Every input still queued, without waiting, even once stopped (what
    /// arrived before the stop): step keys and failures, then notices.
    fn drain(&self) -> Vec<PyInput> {
        self.inbox.drain().into_iter().map(PyInput::from).collect()
    }

    /// Notices dropped because too many were waiting.
    #[getter]
    fn dropped_notices(&self) -> u64 {
        self.inbox.dropped_notices()
    }

    /// The most urgent input (stop, then step keys and failures, then
    /// notices), waiting up to `timeout` seconds (None: until one arrives)
    /// with the GIL released; None on timeout. With `signals` (a
    /// `SignalWatch`), logs a warning once when someone replaced the handler
    /// of one of its signals (it no longer reaches this inbox).
    ///
    /// # Errors
    ///
    /// `ValueError` for a negative timeout; what a signal handler raised
    /// while the main thread waited (`KeyboardInterrupt`).
    #[pyo3(signature = (timeout=None, signals=None))]
    fn recv(&self, py: Python<'_>, timeout: Option<f64>, signals: Option<Displacement>) -> PyResult<Option<PyInput>> {
        let deadline = deadline_after(timeout)?;
        let displacement = signals.unwrap_or_default();
        // What is queued already is taken without releasing the GIL (a
        // select that finds an input ready does not wait); this also serves
        // a timeout of 0, for which no slice is left.
        match self.inbox.recv_timeout(Duration::ZERO) {
            Ok(input) => return Ok(Some(input.into())),
            Err(RecvError::Disconnected) => return Ok(Some(PyInput::Stop {})),
            Err(RecvError::Timeout) => {}
        }
        let _counted = InWait::enter();
        loop {
            let inbox = Arc::clone(&self.inbox);
            let displacement = displacement.clone();
            let got = wait_sliced(py, deadline, move |slice: Duration| {
                match inbox.recv_timeout(slice) {
                    Ok(input) => return Some(Got::Input(input)),
                    // Nothing can arrive any more: as good as stopped.
                    Err(RecvError::Disconnected) => return Some(Got::Input(Input::Stop)),
                    Err(RecvError::Timeout) => {}
                }
                displacement.newly_displaced().map(Got::Displaced)
            })?;
            match got {
                None => return Ok(None),
                Some(Got::Input(input)) => return Ok(Some(input.into())),
                // Logged with no lock held and the GIL taken again.
                Some(Got::Displaced(signals)) => warn_displaced(&signals),
            }
        }
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyInbox>()?;
    m.add_class::<PyInput>()?;
    Ok(())
}
