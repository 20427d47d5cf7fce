//! `SignalWatch`: [`SignalWatch`] for Python, posting every delivery into an
//! `Inbox`; the inbox's wait (`Inbox.recv(signals=)`) looks for displaced
//! handlers.

use std::sync::Arc;

use parking_lot::Mutex;
use pyo3::prelude::*;

use super::clock::unix_now;
use super::displacement::Displacement;
use super::inbox::PyInbox;
use crate::inbox::Origin;
use crate::sources::signals::{Role, SignalWatch, Sink};

/// Watches signals for one handler (or watcher), posting into its inbox.
#[pyclass(frozen, name = "SignalWatch", module = "tf_failure_handling._native")]
pub struct PySignalWatch {
    inner: Mutex<Option<Arc<SignalWatch>>>,
}

impl PySignalWatch {
    /// Where a wait looks for this watch's displaced handlers (nothing once
    /// closed).
    fn displacement(&self) -> Displacement {
        Displacement(self.inner.lock().clone())
    }
}

/// A `SignalWatch` argument (`Inbox.recv(signals=)`) as the [`Displacement`]
/// to check between slices.
impl<'a, 'py> FromPyObject<'a, 'py> for Displacement {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        Ok(obj.cast::<PySignalWatch>()?.get().displacement())
    }
}

#[pymethods]
impl PySignalWatch {
    /// Installs handlers for `signals` from any thread. An `owner` (a
    /// handler) holds back the previously installed handlers while it lives;
    /// an observer (a watcher) chains them. With `inbox`, the signal
    /// dispatcher posts every delivery into it at once (as an
    /// `Input.Notice` with the signal's number), without the GIL.
    #[new]
    #[pyo3(signature = (signals, owner=false, inbox=None))]
    fn new(signals: Vec<i32>, owner: bool, inbox: Option<&Bound<'_, PyInbox>>) -> PyResult<Self> {
        let role = if owner { Role::Owner } else { Role::Observer };
        let watch = match inbox {
            None => SignalWatch::new(&signals, role),
            Some(inbox) => {
                let poster = inbox.get().poster();
                let sink: Sink = Box::new(move |signal| {
                    // Refused only once the inbox is stopped (nobody reads
                    // it) or full (the resolver would absorb it).
                    let _ = poster.notice(Origin::Signal(signal), unix_now(), None, None);
                });
                SignalWatch::with_sink(&signals, role, sink)
            }
        }?;
        Ok(PySignalWatch {
            inner: Mutex::new(Some(Arc::new(watch))),
        })
    }

    /// Uninstalls (restoring previous handlers once nothing else watches);
    /// a waiter is woken first. Idempotent.
    fn close(&self) {
        if let Some(w) = self.inner.lock().take() {
            w.trigger();
        }
    }
}

/// At the process's exit: the warning signals among `signals` (SIGUSR1, SIGUSR2)
/// are ignored from now on instead of ending the process by their default
/// action (`crate::sources::signals::ignore_warnings_at_exit`); returns those.
#[pyfunction]
fn ignore_warnings_at_exit(signals: Vec<i32>) -> Vec<i32> {
    crate::sources::signals::ignore_warnings_at_exit(&signals)
}

/// Number of times `signal` was delivered to this process.
#[pyfunction]
fn signal_deliveries(signal: i32) -> u64 {
    crate::sources::signals::delivered(signal)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PySignalWatch>()?;
    m.add_function(wrap_pyfunction!(signal_deliveries, m)?)?;
    m.add_function(wrap_pyfunction!(ignore_warnings_at_exit, m)?)?;
    Ok(())
}
