//! `MetadataWatch` and `probe_metadata`: [`crate::sources`] for Python.
//!
//! The polling runs on Rust threads that never touch Python objects; they
//! reach Python only through `log` (pyo3-log attaches to emit a record) and
//! through the `wake` callback, which triggers the core
//! [`crate::termination::SignalWatch`] behind a `SignalWatch` without the
//! GIL. The watch holds that core weakly: closing the `SignalWatch` still
//! uninstalls its handlers, and a notice arriving afterwards wakes nobody.
//!
//! `wait` and `probe_metadata` block in [`SLICE`]s with the GIL released,
//! running pending signal handlers between slices (Ctrl-C works). `close`
//! joins the threads with the GIL released (a thread may be waiting for the
//! GIL to log); dropping the object only stops them. An `atexit` hook closes
//! every watch still alive, so that no polling thread tries to attach (to
//! log) while the interpreter finalizes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

use super::signals::PySignalWatch;
use super::{deadline_after, detach, next_slice, SLICE};
use crate::http::BaseUrl;
use crate::sources::{probe, Cloud, MetadataWatch, Notice, Wake, WatchConfig, WatchError};

/// Every watch created and not yet dropped, for the `atexit` hook.
static LIVE: Mutex<Vec<Weak<MetadataWatch>>> = Mutex::new(Vec::new());

fn to_py(e: WatchError) -> PyErr {
    match e {
        WatchError::Spawn(_) => PyRuntimeError::new_err(e.to_string()),
        _ => PyValueError::new_err(e.to_string()),
    }
}

fn pair(notice: Notice) -> (String, Option<f64>) {
    (notice.description, notice.deadline)
}

/// Watches a cloud's metadata service for termination notices on
/// background Rust threads (GCE maintenance-event and preempted, AWS spot
/// instance-action and rebalance recommendation, Azure scheduled events).
/// Network trouble is counted in `stats` and logged, never raised.
#[pyclass(frozen, name = "MetadataWatch", module = "tf_failure_handling._native")]
pub struct PyMetadataWatch {
    core: Arc<MetadataWatch>,
}

#[pymethods]
impl PyMetadataWatch {
    /// Starts polling `base_url` (`http://host[:port]`) as `cloud` (`"gce"`,
    /// `"aws"`, `"azure"`) at once; the first notice triggers `wake`.
    #[new]
    #[pyo3(signature = (cloud, base_url, wake=None, *, interval=0.5, request_timeout=1.0))]
    fn new(cloud: &str, base_url: &str, wake: Option<&Bound<'_, PySignalWatch>>, interval: f64, request_timeout: f64) -> PyResult<Self> {
        let config = WatchConfig::new(cloud, base_url, interval, request_timeout).map_err(to_py)?;
        let wake = match wake {
            Some(w) => {
                let watch = Arc::downgrade(&w.get().watch()?);
                Some(Box::new(move || {
                    if let Some(w) = watch.upgrade() {
                        w.trigger();
                    }
                }) as Wake)
            }
            None => None,
        };
        let core = Arc::new(MetadataWatch::start(&config, wake).map_err(to_py)?);
        let mut live = LIVE.lock();
        live.retain(|w| w.strong_count() > 0);
        live.push(Arc::downgrade(&core));
        Ok(PyMetadataWatch { core })
    }

    /// `(description, deadline)` of the first notice seen (deadline in Unix
    /// seconds, None when the platform did not say), or None. Sticky.
    #[getter]
    fn notice(&self) -> Option<(String, Option<f64>)> {
        self.core.notice().map(pair)
    }

    /// Blocks up to `timeout` seconds (None: until a notice) for the first
    /// notice and returns it; at once if already seen. None on timeout or
    /// once closed.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<(String, Option<f64>)>> {
        let deadline = deadline_after(timeout)?;
        loop {
            if let Some(notice) = self.core.notice() {
                return Ok(Some(pair(notice)));
            }
            if self.core.closed() {
                return Ok(None);
            }
            let Some(slice) = next_slice(deadline) else {
                return Ok(None);
            };
            let core = Arc::clone(&self.core);
            if let Some(notice) = detach(py, move || core.wait(slice)) {
                return Ok(Some(pair(notice)));
            }
            py.check_signals()?;
        }
    }

    /// The `noticeTime` (Unix seconds) of AWS's rebalance recommendation,
    /// once seen; not a termination notice.
    #[getter]
    fn rebalance(&self) -> Option<f64> {
        self.core.rebalance()
    }

    /// `{"requests", "failures", "malformed", "notices"}` counters.
    #[getter]
    fn stats(&self) -> HashMap<&'static str, u64> {
        let s = self.core.stats();
        HashMap::from([
            ("requests", s.requests),
            ("failures", s.failures),
            ("malformed", s.malformed),
            ("notices", s.notices),
        ])
    }

    /// Whether `close()` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.core.closed()
    }

    /// Stops polling and joins the threads (a blocked request is abandoned
    /// within a fraction of a second). Idempotent.
    fn close(&self, py: Python<'_>) {
        let core = Arc::clone(&self.core);
        detach(py, move || core.close());
    }
}

/// Whether `cloud`'s metadata server answers at `base_url`: one detection
/// request (two for AWS IMDSv1), all within `timeout` seconds, GIL
/// released. False on anything but the expected answer.
#[pyfunction]
#[pyo3(signature = (cloud, base_url, timeout=1.0))]
fn probe_metadata(py: Python<'_>, cloud: &str, base_url: &str, timeout: f64) -> PyResult<bool> {
    let cloud: Cloud = cloud.parse().map_err(to_py)?;
    let base = BaseUrl::parse(base_url).map_err(|e| PyValueError::new_err(e.to_string()))?;
    if !(timeout.is_finite() && timeout >= 0.0) {
        return Err(PyValueError::new_err(format!(
            "timeout must be a non-negative number of seconds, got {timeout}"
        )));
    }
    let timeout = Duration::try_from_secs_f64(timeout).unwrap_or(Duration::MAX);
    let stop = AtomicBool::new(false);
    let (stop_ref, base_ref) = (&stop, &base);
    std::thread::scope(|scope| {
        let (tx, mut rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("tfh-probe".into())
            .spawn_scoped(scope, move || {
                let _ = tx.send(probe(cloud, base_ref, timeout, Some(stop_ref)));
            })
            .map_err(|e| PyRuntimeError::new_err(format!("cannot start the probe thread: {e}")))?;
        loop {
            let (received, back) = detach(py, move || (rx.recv_timeout(SLICE), rx));
            rx = back;
            match received {
                Ok(found) => return Ok(found),
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if let Err(e) = py.check_signals() {
                        // The probe ends within a slice; the scope joins it.
                        stop_ref.store(true, Ordering::SeqCst);
                        return Err(e);
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => return Ok(false),
            }
        }
    })
}

/// Closes every watch still alive; registered with `atexit`.
#[pyfunction]
fn close_metadata_watches(py: Python<'_>) {
    let live: Vec<Arc<MetadataWatch>> = LIVE.lock().drain(..).filter_map(|w| w.upgrade()).collect();
    detach(py, move || {
        for w in &live {
            w.stop();
        }
        for w in &live {
            w.close();
        }
    });
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyMetadataWatch>()?;
    m.add_function(wrap_pyfunction!(probe_metadata, m)?)?;
    let hook = wrap_pyfunction!(close_metadata_watches, m)?;
    m.py().import("atexit")?.call_method1("register", (hook,))?;
    Ok(())
}
