//! `Inbox` and its `Inbox.Input`: [`crate::inbox`] for Python.
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
//! `Input` is the core's declaration (`crate::inbox::Input`, one `wire!`): a
//! key-read failure names its round only; the exception stays on the Python
//! side (`NoticeSources.read_failed`), so the driver hands on TF's own error.

use std::sync::Arc;
use std::time::Duration;

use pyo3::prelude::*;

use super::blocking::{deadline_after, wait_sliced};
use super::clock;
use super::displacement::Displacement;
use super::errors;
use super::wire::py_enum;
use crate::inbox::{self as core, InWait, Inbox, Poster, RecvError};
use crate::step_resolution::Round;

/// The poster a Rust source (the signal dispatcher, a metadata watch) is given.
pub(crate) type PyPoster = Poster;

crate::inbox::input!(py_enum[crate::inbox]);

/// What one slice of [`PyInbox::recv`] found.
enum Got {
    Input(core::Input),
    /// A watched signal's disposition is no longer ours (first time only).
    Displaced(Vec<i32>),
}

/// The driver's inbox: notices, step keys, key-read failures and stop, in
/// one place (see `src/inbox.rs` for who posts what, and in which order a
/// receive takes them).
#[pyclass(frozen, name = "Inbox", module = "tf_failure_handling._native")]
pub struct PyInbox {
    inbox: Arc<Inbox>,
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

    /// Posts `input` (an `Input` built in Python): a notice from a source
    /// (`Input.Notice(source, deadline=, kill=)`: Unix `deadline` if it announced
    /// one, Unix `kill` if it stated when this process ends; stamped now, its
    /// `at` is not read; refused too when too many notices wait), a step key the
    /// reader read (`Input.StepKey`), the failure that ended the reader
    /// (`Input.KeyReadFailed`, with its exception), or the stop (`Input.Stop`:
    /// every receive, blocked or later, returns it; posts return False from then
    /// on; idempotent, never blocks). False once stopped.
    ///
    /// # Errors
    ///
    /// `ValueError` when a round key is not a step key, or a notice names no
    /// source.
    fn post(&self, input: &Bound<'_, Input>) -> PyResult<bool> {
        let input = match core::Input::from(input.get()) {
            core::Input::Notice { source: None, .. } => return Err(errors::bad_value("a posted notice names its source")),
            core::Input::Notice {
                source, deadline, kill, ..
            } => core::Input::Notice {
                source,
                signal: None,
                at: clock::unix_now(),
                deadline,
                kill,
            },
            input => input,
        };
        Ok(self.poster.post(input).is_ok())
    }

    /// Every input still queued, without waiting, even once stopped (what
    /// arrived before the stop): step keys and failures, then notices.
    fn drain(&self) -> Vec<Input> {
        self.inbox.drain().into_iter().map(Input::from).collect()
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
    fn recv(&self, py: Python<'_>, timeout: Option<f64>, signals: Option<Displacement>) -> PyResult<Option<Input>> {
        let deadline = deadline_after(timeout)?;
        let displacement = signals.unwrap_or_default();
        // What is queued already is taken without releasing the GIL (a
        // select that finds an input ready does not wait); this also serves
        // a timeout of 0, for which no slice is left.
        match self.inbox.recv_timeout(Duration::ZERO) {
            Ok(input) => return Ok(Some(input.into())),
            Err(RecvError::Disconnected) => return Ok(Some(Input::Stop {})),
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
                    Err(RecvError::Disconnected) => return Some(Got::Input(core::Input::Stop {})),
                    Err(RecvError::Timeout) => {}
                }
                displacement.newly_displaced().map(Got::Displaced)
            })?;
            match got {
                None => return Ok(None),
                Some(Got::Input(input)) => return Ok(Some(input.into())),
                // Logged with no lock held and the GIL taken again.
                Some(Got::Displaced(signals)) => crate::sources::signals::warn_displaced(&signals),
            }
        }
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyInbox>()?;
    // `Input` is what an inbox holds: Python reaches it as `Inbox.Input`.
    super::wire::nest::<PyInbox, Input>(m.py(), "Input")
}
