//! `MetadataWatch`, `WatcherFnPoll` and `platforms` (the platforms' table, each cloud's
//! probe in its row): [`crate::sources`] for Python.
//!
//! The polling runs on Rust threads that never touch Python objects; they
//! reach Python only through `log` (pyo3-log attaches to emit a record) and
//! through the `wake` callback, which runs without the GIL: it posts the
//! notice into an `Inbox` (a handler's or watcher's sources). A stopped inbox
//! refuses the post.
//!
//! # Waiting on threads that log
//!
//! Every thread started here may log, and pyo3-log needs the GIL for a
//! record (always, the first time a logger's level is looked up; for every
//! record that passes the level). So no wait here on one of those threads,
//! or on anything they must do first, ever holds the GIL or a Rust lock:
//! `wait`, `close`, `probe_metadata`, the watcher fn's waits and the `atexit`
//! hook all wait with the GIL released ([`wait_sliced`]: on the main thread for
//! at most a [`SLICE`](super::blocking::SLICE) at a time, then re-attached to
//! run pending signal handlers, so Ctrl-C raises `KeyboardInterrupt` within a
//! slice). Joining a thread the
//! moment it is known to have ended is the only other wait.
//!
//! Dropping a `MetadataWatch` only stops its threads. `probe_metadata`
//! interrupted by a signal stops its probe thread, gives it a moment
//! (detached) to end, and raises; a stopped probe logs nothing. An `atexit`
//! hook closes every watch still alive, so that no polling thread tries to
//! attach (to log) while the interpreter finalizes.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::{PyCFunction, PyDict};

use super::blocking::{deadline_after, detach, wait_sliced};
use super::clock::{unix_now, At};
use super::errors;
use super::inbox::{PyInbox, PyPoster};
use super::logs;
use crate::inbox::{InWait, Origin};
use crate::sources::http::BaseUrl;
use crate::sources::{self, Cloud, MetadataWatch, Notice, Probing, Wake, WatchConfig, WatcherFnNext, WatcherFnPoll, CLOSE_WAIT};

/// Every watch created and not yet dropped, for the `atexit` hook.
static LIVE: Mutex<Vec<Weak<MetadataWatch>>> = Mutex::new(Vec::new());

/// Stops `watches` and joins their threads, waiting in slices until
/// [`CLOSE_WAIT`] from now; threads still running then are left to end on
/// their own (logged).
///
/// # Errors
///
/// Whatever a signal handler raised; the watches are stopped then, and their
/// threads end on their own.
fn stop_and_join(py: Python<'_>, watches: &[Arc<MetadataWatch>]) -> PyResult<()> {
    for w in watches {
        w.stop();
    }
    let deadline = Some(At::after(CLOSE_WAIT));
    for w in watches {
        if wait_sliced(py, deadline, |slice| w.join(slice).then_some(()))?.is_none() {
            // A thread left running must not be inside Python when the interpreter
            // finalizes (`logs.rs`): no more records from such threads, and the ones
            // inside a handler now end first.
            if logs::shut() {
                log::warn!(
                    target: "tf_failure_handling",
                    "metadata polling threads are still running: records of the package's own threads are dropped from now on"
                );
            }
            let outside = Some(At::after(LOG_WAIT));
            if wait_sliced(py, outside, |slice| logs::wait_outside(slice).then_some(()))?.is_none() {
                log::warn!(
                    target: "tf_failure_handling",
                    "a metadata polling thread is still inside a logging handler after {LOG_WAIT:?}; if the interpreter exits before the handler returns, CPython may abort the process"
                );
            }
            // Logging may attach: not while waiting, and with no lock held.
            w.abandon();
        }
    }
    Ok(())
}

/// Bound on `close()`'s wait for a thread it leaves running to leave a logging
/// handler (after [`CLOSE_WAIT`]).
const LOG_WAIT: Duration = Duration::from_secs(10);

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
    /// `"aws"`, `"azure"`) at once. The first notice (and each that ends
    /// earlier) is posted into the `Inbox` `wake` (an `Input.Notice` with the
    /// notice's description and deadline).
    #[new]
    #[pyo3(signature = (cloud, base_url, wake=None, *, interval=sources::WATCH_INTERVAL, request_timeout=sources::WATCH_REQUEST_TIMEOUT))]
    fn new(cloud: &str, base_url: &str, wake: Option<&Bound<'_, PyInbox>>, interval: f64, request_timeout: f64) -> PyResult<Self> {
        let config = WatchConfig::new(cloud, base_url, interval, request_timeout)?;
        let wake = wake.map(|inbox| {
            let poster = inbox.get().poster();
            Box::new(move |notice: &Notice| {
                // Refused only once the inbox is stopped: nobody reads it.
                // A cloud's announced end is when the machine goes: its deadline is the kill.
                let _ = poster.notice(
                    Origin::Source(notice.description.clone()),
                    unix_now(),
                    notice.deadline,
                    notice.deadline,
                );
            }) as Wake
        });
        let core = Arc::new(MetadataWatch::start(&config, wake)?);
        let mut live = LIVE.lock();
        live.retain(|w| w.strong_count() > 0);
        live.push(Arc::downgrade(&core));
        Ok(PyMetadataWatch { core })
    }

    /// Stops polling and joins the threads (a blocked request is abandoned
    /// within a fraction of a second; a thread still running after two
    /// seconds is left to end on its own). Idempotent. Interruptible: a
    /// signal handler's exception (Ctrl-C) propagates, with polling stopped.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        stop_and_join(py, std::slice::from_ref(&self.core))
    }
}

/// Whether `cloud`'s metadata server answers at `base_url` (a cloud's row's `probe`, in
/// [`platforms`]): one detection
/// request (two for AWS IMDSv1), all within `timeout` seconds (None:
/// [`METADATA_TIMEOUT`](sources::METADATA_TIMEOUT)), GIL released. False on
/// anything but the expected answer. With `terminating` (GCE only), instead
/// whether GCE's maintenance event says the VM terminates: TensorFlow's GCE
/// termination watcher (`sources::gce_terminating`). With `sysfs` (the
/// kernel's `/sys`, or a test's copy), the probe is made only when the lines
/// there name the cloud's machines (`sources::Cloud::named`; else False, no
/// request).
///
/// The probe runs on its own thread (`sources::Probing`); this one waits in
/// slices with the GIL released and runs signal handlers between them. When
/// one raises (Ctrl-C), the probe is stopped, given up to
/// [`PROBE_STOP_WAIT`](sources::PROBE_STOP_WAIT) (detached) to end, and the
/// exception propagates.
#[pyfunction]
#[pyo3(signature = (cloud, base_url, timeout=None, *, terminating=false, sysfs=None))]
fn probe_metadata(
    py: Python<'_>,
    cloud: &str,
    base_url: &str,
    timeout: Option<f64>,
    terminating: bool,
    sysfs: Option<PathBuf>,
) -> PyResult<bool> {
    let timeout = timeout.unwrap_or(sources::METADATA_TIMEOUT);
    let cloud: Cloud = cloud.parse()?;
    if terminating && cloud != Cloud::Gce {
        return Err(errors::bad_value(format!(
            "only GCE's termination is asked this way, not {}'s",
            cloud.name()
        )));
    }
    let base = BaseUrl::parse(base_url)?;
    if !(timeout.is_finite() && timeout >= 0.0) {
        return Err(errors::bad_timeout(timeout));
    }
    let timeout = Duration::try_from_secs_f64(timeout).unwrap_or(Duration::MAX);
    if sysfs.is_some_and(|sysfs| !detach(py, || cloud.named(&sysfs))) {
        return Ok(false);
    }
    let mut probing = Probing::start(cloud, base, timeout, terminating)?;
    // No deadline of its own: the probe is bounded by `timeout`.
    match wait_sliced(py, None, |slice| probing.answer(slice)) {
        Ok(found) => Ok(found.unwrap_or(false)),
        Err(e) => {
            detach(py, move || probing.stop());
            Err(e)
        }
    }
}

/// The schedule of a `termination_watcher_fn` poll (`sources::WatcherFnPoll`):
/// the Python thread that calls the fn reports each call to [`next`](Self::next)
/// and calls again when it answers True; the core times the calls, reports a
/// slow one, and posts the notice into the inbox when the fn fires.
#[pyclass(frozen, name = "WatcherFnPoll", module = "tf_failure_handling._native")]
pub struct PyWatcherFnPoll {
    core: Arc<WatcherFnPoll>,
    poster: PyPoster,
}

#[pymethods]
impl PyWatcherFnPoll {
    /// A poll posting into `inbox`; the fn is called every `interval` seconds
    /// (from the start of one call to the next), and a call longer than
    /// `slow` seconds is logged, once.
    #[new]
    #[pyo3(signature = (inbox, *, interval=sources::WATCHER_FN_INTERVAL, slow=sources::SLOW_WATCHER_FN))]
    fn new(inbox: &Bound<'_, PyInbox>, interval: f64, slow: f64) -> PyResult<Self> {
        Ok(PyWatcherFnPoll {
            core: Arc::new(WatcherFnPoll::new(interval, slow)?),
            poster: inbox.get().poster(),
        })
    }

    /// Reports the last call's answer (`fired`; False before the first call),
    /// then waits, GIL released, until the next call is due: True to call it
    /// now, False when the poll is over (stopped, or the fn fired: its notice
    /// is posted, unless the poll was stopped meanwhile).
    ///
    /// # Errors
    ///
    /// Whatever a signal handler raised while it waited.
    fn next(&self, py: Python<'_>, fired: bool) -> PyResult<bool> {
        match self.core.returned(fired).over {
            Some(WatcherFnNext::Post) => {
                // Refused only once the inbox is stopped: nobody reads it.
                let _ = self
                    .poster
                    .notice(Origin::Source("termination_watcher_fn".into()), unix_now(), None, None);
                return Ok(false);
            }
            Some(_) => return Ok(false),
            None => {}
        }
        let core = &self.core;
        let _counted = InWait::enter();
        let next = wait_sliced(py, None, |slice| core.wait_due(slice))?;
        Ok(next == Some(WatcherFnNext::Call))
    }

    /// Ends the poll; with `wait`, then waits (GIL released, at most
    /// [`WATCHER_FN_JOIN_TIMEOUT`](sources::WATCHER_FN_JOIN_TIMEOUT)) for a
    /// call under way to return: one that blocks is not waited out.
    ///
    /// # Errors
    ///
    /// Whatever a signal handler raised while it waited.
    #[pyo3(signature = (wait=true))]
    fn stop(&self, py: Python<'_>, wait: bool) -> PyResult<()> {
        self.core.stop();
        if wait {
            let deadline = deadline_after(Some(sources::WATCHER_FN_JOIN_TIMEOUT))?;
            let core = &self.core;
            wait_sliced(py, deadline, |slice| core.idle(slice).then_some(()))?;
        }
        Ok(())
    }
}

/// At the interpreter's exit (registered with `atexit` when the module loads, so it
/// runs after `_platforms/notice_sources.py`'s hook, which closes every open notice
/// sources): closes every watch still alive, then waits, GIL released and at most
/// [`EXIT_JOIN_TIMEOUT`](crate::inbox::EXIT_JOIN_TIMEOUT), until no thread is left
/// inside the wait of an inbox or a watcher-fn poll (closing woke them). Not a name
/// of the module: nothing else calls it.
///
/// # Errors
///
/// Whatever a signal handler raised while it waited (the watches are
/// stopped then; their threads end on their own).
fn at_exit(py: Python<'_>) -> PyResult<()> {
    let live: Vec<Arc<MetadataWatch>> = LIVE.lock().drain(..).filter_map(|w| w.upgrade()).collect();
    stop_and_join(py, &live)?;
    let bound = Duration::try_from_secs_f64(crate::inbox::EXIT_JOIN_TIMEOUT).unwrap_or(Duration::ZERO);
    wait_sliced(py, Some(At::after(bound)), |slice| {
        // The waiters need the GIL to leave; this thread waits detached.
        InWait::none().then_some(()).or_else(|| {
            std::thread::sleep(slice.min(Duration::from_millis(5)));
            None
        })
    })?;
    Ok(())
}

/// The platforms' table, one dict per platform: each cloud (`sources::Cloud::row`), in
/// detection order, then Kubernetes. A cloud's row: `name`, `kind` (`"cloud"`),
/// `variable` (the one naming its metadata service), `host_port` (whether that variable
/// is `host[:port]`, TensorFlow's `GCE_METADATA_IP`, rather than
/// `[http://]host[:port]`), `default_base`, `exit_code`, `grace_period` (`{True: on a
/// GPU machine, False: on others}`) and `probe` ([`probe_metadata`] for this cloud:
/// `probe(base_url, timeout=None, *, terminating=False, sysfs=None)`). Kubernetes' row:
/// `name`, `kind` (`"scheduler"`) and `sigterm_deadlines(unix_now, grace)`: a SIGTERM's
/// `(deadline, kill)`, Unix seconds, with the pod's grace period as stated (None: not
/// given; `sources::kubernetes_sigterm_deadlines`).
#[pyfunction]
fn platforms(py: Python<'_>) -> PyResult<Vec<Bound<'_, PyDict>>> {
    let partial = py.import("functools")?.getattr("partial")?;
    let probe = wrap_pyfunction!(probe_metadata, py)?;
    let mut rows = Cloud::all()
        .map(|cloud| {
            let row = cloud.row();
            let d = PyDict::new(py);
            d.set_item("name", row.name)?;
            d.set_item("kind", "cloud")?;
            d.set_item("variable", row.variable.0)?;
            d.set_item("host_port", row.variable.1)?;
            d.set_item("default_base", row.default_base)?;
            d.set_item("exit_code", row.exit_code)?;
            d.set_item(
                "grace_period",
                HashMap::from([(true, row.grace_period.0), (false, row.grace_period.1)]),
            )?;
            d.set_item("probe", partial.call1((&probe, row.name))?)?;
            Ok(d)
        })
        .collect::<PyResult<Vec<_>>>()?;
    let kubernetes = PyDict::new(py);
    kubernetes.set_item("name", "kubernetes")?;
    kubernetes.set_item("kind", "scheduler")?;
    kubernetes.set_item("sigterm_deadlines", wrap_pyfunction!(kubernetes_sigterm_deadlines, py)?)?;
    rows.push(kubernetes);
    Ok(rows)
}

/// Kubernetes' row's `sigterm_deadlines` (see [`platforms`]).
#[pyfunction]
fn kubernetes_sigterm_deadlines(unix_now: f64, grace: Option<f64>) -> (Option<f64>, Option<f64>) {
    sources::kubernetes_sigterm_deadlines(unix_now, grace)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyMetadataWatch>()?;
    m.add_class::<PyWatcherFnPoll>()?;
    let hook = PyCFunction::new_closure(m.py(), Some(c"close_notice_sources"), None, |args, _| at_exit(args.py()))?;
    m.py().import("atexit")?.call_method1("register", (hook,))?;
    m.add_function(wrap_pyfunction!(platforms, m)?)?;
    m.add("DEFAULT_EXIT_CODE", sources::DEFAULT_EXIT_CODE)?;
    Ok(())
}
