//! The waits of `PreemptionWatcher` (`watcher.py`: `KeyWatch`), of the coordination
//! client (`_cluster/coordination.py`) and of the peer health probes
//! (`_cluster/membership.py`): the core says how long each blocking call lasts, so
//! Python holds no slice, bound or margin of its own.

use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::clock::now_secs;
use crate::deadline::{SIMULATED_CLUSTER_BOUND, TF_WAIT_FOREVER_MS};
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

/// The bounds of a coordination client's calls, by name: `write`, the seconds one
/// write lasts at most (the owner's `write_timeout`, else
/// [`COORDINATION_WRITE_TIMEOUT`]); `probe_ms`, each peer health probe's timeout in
/// milliseconds (TensorFlow's argument), and `probe_join`, the join of its thread;
/// `get_ms`, TensorFlow's `timeout_in_ms` for a get of at most `get` seconds (None
/// without `get`; never [`TF_WAIT_FOREVER_MS`], which TensorFlow reads as "wait for
/// ever"); and `cluster`, the bound of each wait of a simulated cluster
/// (`testing.SimulatedCluster`'s `cluster` timeout, else [`SIMULATED_CLUSTER_BOUND`]).
#[pyfunction]
#[pyo3(signature = (write_timeout = None, get = None, cluster = None))]
fn coordination_bounds(py: Python<'_>, write_timeout: Option<f64>, get: Option<f64>, cluster: Option<f64>) -> PyResult<Bound<'_, PyDict>> {
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // saturates
    let millis = |seconds: f64| ((seconds * 1000.0) as u64).max(TF_WAIT_FOREVER_MS + 1);
    let bounds = PyDict::new(py);
    bounds.set_item("write", write_timeout.unwrap_or(COORDINATION_WRITE_TIMEOUT))?;
    bounds.set_item("probe_ms", millis(PEER_PROBE_TIMEOUT))?;
    bounds.set_item("probe_join", PEER_PROBE_TIMEOUT + JOIN_MARGIN)?;
    bounds.set_item("get_ms", get.map(millis))?;
    bounds.set_item("cluster", cluster.unwrap_or(SIMULATED_CLUSTER_BOUND))?;
    Ok(bounds)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<KeyWatch>()?;
    m.add_function(wrap_pyfunction!(coordination_bounds, m)?)?;
    Ok(())
}
