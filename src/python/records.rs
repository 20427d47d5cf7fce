//! Binding of the records reader ([`crate::records`]): Python reads the files
//! (local, or through `tf.io.gfile`) and passes their bytes; the core parses,
//! checks and folds them with the GIL released; the results come back as
//! dicts of `records.Preemption`'s and `records.Resume`'s fields, which the
//! Python module turns into its dataclasses.
//!
//! Numbers come back as Python's `json` gives them: an integer as `int`, any
//! other number as `float`.

use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use serde_json::{Map, Number, Value};

use super::errors;
use crate::records::schema::{self, Shape};
use crate::records::{self as core, Claims, IntOrStr, Preemption, Records, Resume};

/// The claims of this process (`records.claim_resume`). Taken without calling
/// Python.
static CLAIMS: Mutex<Claims> = Mutex::new(Claims::new());

type Sources = Vec<(String, Option<PyBackedBytes>)>;

fn read(py: Python<'_>, sources: &Sources) -> Records {
    py.detach(|| core::read(sources.iter().map(|(name, data)| (name.as_str(), data.as_deref()))))
}

/// `(preemptions, resumes, skipped)` of the record files `sources`, each
/// `(name, bytes or None when it could not be read)`.
#[pyfunction]
fn read_records<'py>(py: Python<'py>, sources: Sources) -> PyResult<(Bound<'py, PyList>, Bound<'py, PyList>, Bound<'py, PyDict>)> {
    let found = read(py, &sources);
    let preemptions = PyList::empty(py);
    for p in &found.preemptions {
        preemptions.append(preemption(py, p)?)?;
    }
    let resumes = PyList::empty(py);
    for r in &found.resumes {
        resumes.append(resume(py, r)?)?;
    }
    let skipped = PyDict::new(py);
    for (name, numbers) in &found.skipped {
        skipped.set_item(name, numbers)?;
    }
    Ok((preemptions, resumes, skipped))
}

/// The fields of `job`/`task`'s last exit not yet resumed from
/// ([`core::last_exit`]) in the record files `sources`, or None.
#[pyfunction]
fn last_exit_record<'py>(py: Python<'py>, sources: Sources, job: &str, task: &str) -> PyResult<Option<Bound<'py, PyDict>>> {
    let found = read(py, &sources);
    core::last_exit(&found, job, task).map(|p| preemption(py, p)).transpose()
}

/// Whether `obj` (a parsed line) is of the schema's shape.
#[pyfunction]
fn valid_record(obj: &Bound<'_, PyAny>) -> PyResult<bool> {
    let Ok(obj) = obj.cast::<PyDict>() else { return Ok(false) };
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

/// Whether `value` may be the value of the known field `name`.
#[pyfunction]
fn record_field_ok(name: &str, value: &Bound<'_, PyAny>) -> PyResult<bool> {
    let kind = schema::kind(name).ok_or_else(|| errors::bad_value(format!("not a field of the records' schema: {name:?}")))?;
    Ok(kind.accepts(shape(value)))
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

fn preemption<'py>(py: Python<'py>, p: &Preemption) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("job", &p.job)?;
    d.set_item("task", int_or_str(py, &p.task)?)?;
    d.set_item("host", &p.host)?;
    d.set_item("pid", opt_number(py, p.pid.as_ref())?)?;
    d.set_item("id", &p.id)?;
    d.set_item("platform", &p.platform)?;
    d.set_item("source", &p.source)?;
    d.set_item("notice_time", opt_number(py, p.notice_time.as_ref())?)?;
    d.set_item("deadline", opt_number(py, p.deadline.as_ref())?)?;
    d.set_item("grace_period", opt_number(py, p.grace_period.as_ref())?)?;
    d.set_item("agreed_step", opt_number(py, p.agreed_step.as_ref())?)?;
    d.set_item("proposer", &p.proposer)?;
    d.set_item("agreement_time", opt_number(py, p.agreement_time.as_ref())?)?;
    d.set_item("save_start", opt_number(py, p.save_start.as_ref())?)?;
    d.set_item("save_end", opt_number(py, p.save_end.as_ref())?)?;
    d.set_item("checkpoint_path", &p.checkpoint_path)?;
    let code = p.exit_code.as_ref().map(|c| int_or_str(py, c)).transpose()?;
    d.set_item("exit_code", code)?;
    d.set_item("exit_time", opt_number(py, p.exit_time.as_ref())?)?;
    d.set_item("error", &p.error)?;
    d.set_item("extra", object(py, &p.extra)?)?;
    Ok(d)
}

fn resume<'py>(py: Python<'py>, r: &Resume) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("job", &r.job)?;
    d.set_item("task", int_or_str(py, &r.task)?)?;
    d.set_item("time", number(py, &r.time)?)?;
    d.set_item("step", opt_number(py, r.step.as_ref())?)?;
    d.set_item("lost", opt_number(py, r.lost.as_ref())?)?;
    d.set_item("downtime", opt_number(py, r.downtime.as_ref())?)?;
    d.set_item("host", &r.host)?;
    d.set_item("extra", object(py, &r.extra)?)?;
    Ok(d)
}

fn number<'py>(py: Python<'py>, n: &Number) -> PyResult<Bound<'py, PyAny>> {
    if let Some(i) = n.as_i64() {
        Ok(i.into_pyobject(py)?.into_any())
    } else if let Some(u) = n.as_u64() {
        Ok(u.into_pyobject(py)?.into_any())
    } else {
        Ok(PyFloat::new(py, n.as_f64().unwrap_or(f64::NAN)).into_any())
    }
}

fn opt_number<'py>(py: Python<'py>, n: Option<&Number>) -> PyResult<Option<Bound<'py, PyAny>>> {
    n.map(|n| number(py, n)).transpose()
}

fn int_or_str<'py>(py: Python<'py>, v: &IntOrStr) -> PyResult<Bound<'py, PyAny>> {
    match v {
        IntOrStr::Int(n) => number(py, n),
        IntOrStr::Str(s) => Ok(PyString::new(py, s).into_any()),
    }
}

fn object<'py>(py: Python<'py>, map: &Map<String, Value>) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (k, v) in map {
        d.set_item(k, value(py, v)?)?;
    }
    Ok(d)
}

/// A JSON value as Python's `json` gives it (nesting is at most 128 deep:
/// serde_json's bound).
fn value<'py>(py: Python<'py>, v: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        Value::Number(n) => number(py, n)?,
        Value::String(s) => PyString::new(py, s).into_any(),
        Value::Array(items) => PyList::new(py, items.iter().map(|i| value(py, i)).collect::<PyResult<Vec<_>>>()?)?.into_any(),
        Value::Object(map) => object(py, map)?.into_any(),
    })
}

/// `report`: whether a preemption noticed at `t` belongs to the cluster-wide one that
/// began at `first` and ended at `end` ([`crate::records::same_preemption`]).
#[pyfunction]
#[pyo3(signature = (t, first, end))]
fn report_same_preemption(t: f64, first: f64, end: Option<f64>) -> bool {
    crate::records::same_preemption(t, first, end)
}

/// Seconds `Recorder.close` waits for an object store to take the lines still queued
/// before the process exits without them: `timeout` when the caller gave one, else
/// the core's bound before the exit ([`crate::records::FLUSH_BOUND`]).
#[pyfunction]
#[pyo3(signature = (timeout = None))]
fn records_flush_bound(timeout: Option<f64>) -> f64 {
    timeout.unwrap_or(crate::records::FLUSH_BOUND)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("RECORD_FIELDS", PyTuple::new(py, schema::FIELDS.iter().map(|(name, _)| *name))?)?;
    m.add("RECORD_REQUIRED", PyTuple::new(py, schema::REQUIRED)?)?;
    m.add("RECORDS_NOTICE_LINE_BOUND", crate::records::NOTICE_LINE_BOUND)?;
    m.add_function(wrap_pyfunction!(report_same_preemption, m)?)?;
    m.add_function(wrap_pyfunction!(records_flush_bound, m)?)?;
    m.add_function(wrap_pyfunction!(read_records, m)?)?;
    m.add_function(wrap_pyfunction!(last_exit_record, m)?)?;
    m.add_function(wrap_pyfunction!(valid_record, m)?)?;
    m.add_function(wrap_pyfunction!(record_field_ok, m)?)?;
    m.add_function(wrap_pyfunction!(claim_resume, m)?)?;
    Ok(())
}
