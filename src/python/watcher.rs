//! The waits of `PreemptionWatcher` (`watcher.py`), of the coordination client
//! (`_cluster/coordination.py`) and of the peer health probes
//! (`_cluster/membership.py`): the core says how long each blocking call lasts, so
//! Python holds no slice, bound or margin of its own.

use pyo3::prelude::*;

use super::clock::now_secs;
use crate::deadline::{Deadline, TF_WAIT_FOREVER_MS};
use crate::step_resolution::{COORDINATION_WRITE_TIMEOUT, PEER_PROBE_TIMEOUT, WATCHER_KEY_SLICE};

/// Seconds a join of a thread that waits in a blocking call may last beyond that
/// call's own bound: the call returns at its bound, the thread then ends.
pub const JOIN_MARGIN: f64 = 1.0;

/// The watch of a coordination-service key by a daemon thread (the loop stays in
/// Python: no Rust frame may be on its stack while it waits in a get, see
/// `blocking::detach`): `(get, join)`, the seconds each blocking get lasts (a
/// closing is seen between two) and a join of the thread at most (its get, and the
/// margin to end).
#[pyfunction]
fn key_watch_bounds() -> (f64, f64) {
    (WATCHER_KEY_SLICE, WATCHER_KEY_SLICE + JOIN_MARGIN)
}

/// Watches one coordination-service key for at most `timeout` seconds (None: for
/// ever) from the caller's own thread: `get(seconds)` is each blocking get, one
/// [`WATCHER_KEY_SLICE`] long. Returns the first value that is not None, else None.
///
/// # Errors
///
/// What `get` raised.
#[pyfunction]
#[pyo3(signature = (get, timeout = None))]
fn watch_key(get: &Bound<'_, PyAny>, timeout: Option<f64>) -> PyResult<Option<Py<PyAny>>> {
    let deadline = Deadline::new(now_secs(), timeout);
    while !deadline.passed(now_secs()) {
        let value = get.call1((WATCHER_KEY_SLICE,))?;
        if !value.is_none() {
            return Ok(Some(value.unbind()));
        }
    }
    Ok(None)
}

/// The bounds of the peer health probes: `(probe_ms, join)`: each probe's timeout in
/// milliseconds (TensorFlow's argument), and the join of each probe's thread.
#[pyfunction]
fn peer_probe_bounds() -> (u64, f64) {
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // 2 s
    let millis = (PEER_PROBE_TIMEOUT * 1000.0) as u64;
    (millis, PEER_PROBE_TIMEOUT + JOIN_MARGIN)
}

/// TensorFlow's `timeout_in_ms` for a coordination-service get of at most `seconds`:
/// never [`TF_WAIT_FOREVER_MS`], which TensorFlow reads as "wait for ever".
#[pyfunction]
fn tf_get_ms(seconds: f64) -> u64 {
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // saturates
    let millis = (seconds * 1000.0) as u64;
    millis.max(TF_WAIT_FOREVER_MS + 1)
}

/// Seconds one write of a coordination client lasts at most: `timeout` when its
/// owner gave one, else [`COORDINATION_WRITE_TIMEOUT`].
#[pyfunction]
#[pyo3(signature = (timeout = None))]
fn coordination_write_bound(timeout: Option<f64>) -> f64 {
    timeout.unwrap_or(COORDINATION_WRITE_TIMEOUT)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(key_watch_bounds, m)?)?;
    m.add_function(wrap_pyfunction!(watch_key, m)?)?;
    m.add_function(wrap_pyfunction!(peer_probe_bounds, m)?)?;
    m.add_function(wrap_pyfunction!(tf_get_ms, m)?)?;
    m.add_function(wrap_pyfunction!(coordination_write_bound, m)?)?;
    Ok(())
}
