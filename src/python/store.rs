//! `KeyValueStore`: the in-memory coordination service behind
//! `tf_failure_handling.testing`, with TensorFlow's semantics (a set of an
//! existing key fails, a get blocks until the key is set) plus cluster error
//! reports. Blocked gets release the GIL.

use std::collections::HashMap;

use parking_lot::{Condvar, Mutex};
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use super::blocking::{deadline_after, wait_sliced};

/// What a get found.
enum Found {
    Value(String),
    /// The cluster's error: `(code, message)`.
    Error(i64, String),
}

#[derive(Default)]
struct Store {
    values: HashMap<String, String>,
    /// The first error reported to the cluster: `(code, message)`.
    error: Option<(i64, String)>,
}

/// In-memory coordination service with TensorFlow's key-value semantics.
#[pyclass(frozen, module = "tf_failure_handling._native")]
pub struct KeyValueStore {
    store: Mutex<Store>,
    /// Signalled on every set, delete and error report: what blocked gets
    /// wait for.
    changed: Condvar,
}

impl KeyValueStore {
    /// The error reported to the cluster, else the value of `key`, if any.
    fn lookup(&self, key: &str) -> Option<Found> {
        let s = self.store.lock();
        if let Some((code, message)) = &s.error {
            return Some(Found::Error(*code, message.clone()));
        }
        s.values.get(key).cloned().map(Found::Value)
    }
}

#[pymethods]
impl KeyValueStore {
    #[new]
    fn new() -> Self {
        KeyValueStore {
            store: Mutex::new(Store::default()),
            changed: Condvar::new(),
        }
    }

    /// Sets `key`; False (and nothing changes) when it already exists.
    fn set(&self, key: String, value: String) -> bool {
        let mut s = self.store.lock();
        if s.values.contains_key(&key) {
            return false;
        }
        s.values.insert(key, value);
        drop(s);
        self.changed.notify_all();
        true
    }

    /// Blocks until `key` is set, an error is reported, or `timeout`
    /// seconds pass. Returns `("ok", value)`, `("timeout", None)` or
    /// `("error", (code, message))`.
    #[pyo3(signature = (key, timeout=None))]
    fn get<'py>(&self, py: Python<'py>, key: String, timeout: Option<f64>) -> PyResult<Bound<'py, PyTuple>> {
        let deadline = deadline_after(timeout)?;
        // The answer is taken under the lock and turned into Python objects
        // after it is released (no Rust lock is held while Python runs).
        let answer = match self.lookup(&key) {
            Some(found) => Some(found),
            None => wait_sliced(py, deadline, |slice| {
                let mut s = self.store.lock();
                if s.error.is_none() && !s.values.contains_key(&key) {
                    let _ = self.changed.wait_for(&mut s, slice);
                }
                drop(s);
                self.lookup(&key)
            })?,
        };
        let tuple = match answer {
            None => ("timeout", py.None()).into_pyobject(py)?,
            Some(Found::Error(code, message)) => ("error", (code, message)).into_pyobject(py)?.into_any().cast_into::<PyTuple>()?,
            Some(Found::Value(v)) => ("ok", v).into_pyobject(py)?.into_any().cast_into::<PyTuple>()?,
        };
        Ok(tuple)
    }

    /// The value of `key` without blocking.
    fn try_get(&self, key: &str) -> Option<String> {
        self.store.lock().values.get(key).cloned()
    }

    /// Removes `key`; True if it existed.
    fn delete(&self, key: &str) -> bool {
        let removed = self.store.lock().values.remove(key).is_some();
        self.changed.notify_all();
        removed
    }

    /// Every key currently set, sorted.
    fn keys(&self) -> Vec<String> {
        let mut k: Vec<String> = self.store.lock().values.keys().cloned().collect();
        k.sort();
        k
    }

    /// Records an error for the whole cluster (the first one wins) and fails
    /// every blocked get.
    fn report_error(&self, code: i64, message: String) {
        let mut s = self.store.lock();
        if s.error.is_none() {
            s.error = Some((code, message));
        }
        drop(s);
        self.changed.notify_all();
    }

    /// The reported error, if any.
    #[getter]
    fn error(&self) -> Option<(i64, String)> {
        self.store.lock().error.clone()
    }
}
