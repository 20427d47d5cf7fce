//! Binding of the preemption records ([`crate::records`]).
//!
//! Reading: Python reads the files (local, or through `tf.io.gfile`) and passes
//! their bytes; the core parses, checks and folds them with the GIL released and
//! answers in JSON text ([`crate::records::Records::to_json`]), which the Python
//! module turns into its dataclasses. Writing: the binding stamps each line with
//! the wall clock as it is built ([`stamp`]).

use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyString};

use super::clock::unix_now;
use super::errors;
use crate::records::schema::{self, Shape};
use crate::records::{self as core, Claims};

/// The claims of this process (`RecordsCore.claim_resume`). Taken without calling
/// Python.
static CLAIMS: Mutex<Claims> = Mutex::new(Claims::new());

/// The record files `sources`, each `(name, bytes or None when it could not be
/// read)`, folded: `{"preemptions", "resumes", "skipped"}` as JSON text; with
/// `task`, `(job, str(task))`, that task's last exit not yet resumed from
/// ([`core::last_exit`]), or `null`.
#[pyfunction]
#[pyo3(signature = (sources, task = None))]
fn read(py: Python<'_>, sources: Vec<(String, Option<PyBackedBytes>)>, task: Option<(String, String)>) -> String {
    py.detach(|| {
        let found = core::read(sources.iter().map(|(name, data)| (name.as_str(), data.as_deref())));
        match task {
            None => found.to_json(),
            Some((job, task)) => core::last_exit(&found, &job, &task).map_or_else(|| "null".to_owned(), |p| p.to_json().to_string()),
        }
    })
}

/// Whether `value` (a parsed line) is of the schema's shape; with `field`, whether
/// it may be the value of that known field.
///
/// # Errors
///
/// `ValueError` for a `field` the schema does not name; what a look-up raised.
#[pyfunction]
#[pyo3(signature = (value, field = None))]
fn valid(value: &Bound<'_, PyAny>, field: Option<&str>) -> PyResult<bool> {
    if let Some(name) = field {
        let kind = schema::kind(name).ok_or_else(|| errors::bad_value(format!("not a field of the records' schema: {name:?}")))?;
        return Ok(kind.accepts(shape(value)));
    }
    let Ok(obj) = value.cast::<PyDict>() else { return Ok(false) };
    let mut failed = None;
    let ok = schema::conforms(|name| match obj.get_item(name) {
        Ok(value) => value.map_or(Shape::Null, |v| shape(&v)),
        Err(e) => {
            failed.get_or_insert(e);
            Shape::Other
        }
    });
    failed.map_or(Ok(ok), Err)
}

/// True the first time this process claims `(folder, job, task, preemption)`.
#[pyfunction]
#[pyo3(signature = (folder, job, task, preemption))]
fn claim_resume(folder: &str, job: &str, task: &str, preemption: Option<&str>) -> bool {
    CLAIMS.lock().claim(folder, job, task, preemption)
}

/// What the schema sees of a Python value (as Python's `isinstance` sees it).
fn shape(value: &Bound<'_, PyAny>) -> Shape {
    if value.is_none() {
        Shape::Null
    } else if value.is_instance_of::<PyBool>() {
        Shape::Bool
    } else if value.is_instance_of::<PyInt>() {
        // Too large for a float: an integer, not a finite number.
        Shape::Int(value.extract::<f64>().unwrap_or(f64::INFINITY))
    } else if let Ok(f) = value.cast::<PyFloat>() {
        Shape::Float(f.value())
    } else if value.is_instance_of::<PyString>() {
        Shape::Str
    } else {
        Shape::Other
    }
}

/// Stamps a record as it is built: its `time` is the wall clock now unless it has
/// one; an `exited` field (a `resumed` line's exit) becomes its `downtime`
/// ([`core::downtime`]; none when either is not a number: a record never fails to be
/// written for its values). Returns the moment it was built in microseconds since
/// the Unix epoch (an object store's line is named by it).
///
/// # Errors
///
/// What the dict raised (a plain dict raises nothing).
#[pyfunction]
fn stamp(record: &Bound<'_, PyDict>) -> PyResult<u64> {
    let now = unix_now();
    let time = match record.get_item("time")? {
        Some(t) if t.is_truthy()? => t.extract::<f64>().ok(),
        _ => {
            record.set_item("time", now)?;
            Some(now)
        }
    };
    if let Some(exited) = record.get_item("exited")? {
        record.del_item("exited")?;
        if let (Some(time), Ok(exited)) = (time, exited.extract::<f64>()) {
            record.set_item("downtime", core::downtime(time, exited))?;
        }
    }
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok((now * 1e6) as u64)
}

/// Seconds a wait of the records lasts: the caller's `timeout` when it gave one,
/// else the core's bound: with `notice_line`, a stage's wait for the line of its
/// notice ([`crate::records::NOTICE_LINE_BOUND`]); else `Recorder.close`'s for an
/// object store to take the lines still queued before the exit
/// ([`crate::records::FLUSH_BOUND`]).
#[pyfunction]
#[pyo3(signature = (timeout = None, notice_line = false))]
fn bound(timeout: Option<f64>, notice_line: bool) -> f64 {
    timeout.unwrap_or(if notice_line { core::NOTICE_LINE_BOUND } else { core::FLUSH_BOUND })
}

/// The records' core as Python reaches it: one object, `RecordsCore`, that holds
/// the schema (`FIELDS`: each field, and whether a line must have it), its check
/// (`valid`), the reader (`read`, which checks each line), the stamp of a line
/// being written (`stamp`), a task's claim of its resume (`claim_resume`) and the
/// bound of the records' waits (`bound`). It is not made: its attributes are plain
/// functions (not methods).
#[pyclass(frozen, module = "tf_failure_handling._native")]
pub(crate) struct RecordsCore;

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let fields = PyDict::new(m.py());
    for (name, _) in schema::FIELDS {
        fields.set_item(name, schema::REQUIRED.contains(&name))?;
    }
    m.add_class::<RecordsCore>()?;
    let t = m.py().get_type::<RecordsCore>();
    t.setattr("FIELDS", fields)?;
    t.setattr("read", wrap_pyfunction!(read, m)?)?;
    t.setattr("valid", wrap_pyfunction!(valid, m)?)?;
    t.setattr("claim_resume", wrap_pyfunction!(claim_resume, m)?)?;
    t.setattr("stamp", wrap_pyfunction!(stamp, m)?)?;
    t.setattr("bound", wrap_pyfunction!(bound, m)?)
}
