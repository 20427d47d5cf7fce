//! The waits of `PreemptionWatcher` (`watcher.py`: `KeyWatch`), of the coordination
//! client (`_cluster/coordination.py`) and of the peer health probes
//! (`_cluster/membership.py`): the core says how long each blocking call lasts, so
//! Python holds no slice, bound or margin of its own.

use parking_lot::Mutex;
use pyo3::prelude::*;

use super::clock::now_secs;
use crate::deadline::TF_WAIT_FOREVER_MS;
use crate::sources::key_watch::{self, JOIN_MARGIN};
use crate::step_resolution::{COORDINATION_WRITE_TIMEOUT, PEER_PROBE_TIMEOUT};

/// The watch of one coordination-service key (`crate::sources::key_watch`):
/// the caller makes each blocking get for `next()` seconds until it answers
/// None (the bound passed, or `close()`d); `close()` answers how long the
/// watching thread may still take.
#[pyclass(frozen, module = "tf_failure_handling._native")]
pub struct KeyWatch {
    core: Mutex<key_watch::KeyWatch>,
}

#[pymethods]
impl KeyWatch {
    /// A watch from now for at most `timeout` seconds (None: until closed).
    #[new]
    #[pyo3(signature = (timeout = None))]
    fn new(timeout: Option<f64>) -> Self {
        KeyWatch {
            core: Mutex::new(key_watch::KeyWatch::new(now_secs(), timeout)),
        }
    }

    /// Seconds of the next blocking get, None once the watch is over.
    fn next(&self) -> Option<f64> {
        self.core.lock().next(now_secs())
    }

    /// Ends the watch; the seconds the thread that watches may still take (the
    /// bound on joining it).
    fn close(&self) -> f64 {
        self.core.lock().close()
    }
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
    m.add_class::<KeyWatch>()?;
    m.add_function(wrap_pyfunction!(peer_probe_bounds, m)?)?;
    m.add_function(wrap_pyfunction!(tf_get_ms, m)?)?;
    m.add_function(wrap_pyfunction!(coordination_write_bound, m)?)?;
    Ok(())
}
