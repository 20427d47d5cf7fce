//! Binding of SLURM's text ([`crate::sources::slurm`]) for `_platforms/slurm.py`.

use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::sources::slurm;

/// The `Key=Value` fields of one `scontrol show ... -o` record, as a dict (a key seen
/// twice keeps its first value).
#[pyfunction]
fn slurm_fields<'py>(py: Python<'py>, text: &str) -> PyResult<Bound<'py, PyDict>> {
    let out = PyDict::new(py);
    for (key, value) in slurm::fields(text) {
        out.set_item(key, value)?;
    }
    Ok(out)
}

/// A SLURM timestamp (`2026-11-25T16:43:17`, local time) as Unix seconds; None for
/// None, `Unknown`, `N/A` or anything else.
#[pyfunction]
#[pyo3(signature = (text))]
fn slurm_time(text: Option<&str>) -> Option<f64> {
    let [year, month, day, hour, minute, second] = slurm::timestamp(text?)?;
    // SAFETY: an all-zero `tm` is valid; mktime reads and normalizes it, nothing else.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    tm.tm_year = i32::try_from(year).ok()? - 1900;
    tm.tm_mon = i32::try_from(month).ok()? - 1;
    tm.tm_mday = i32::try_from(day).ok()?;
    tm.tm_hour = i32::try_from(hour).ok()?;
    tm.tm_min = i32::try_from(minute).ok()?;
    tm.tm_sec = i32::try_from(second).ok()?;
    tm.tm_isdst = -1; // the zone's rule decides, as Python's naive datetime.timestamp()
                      // SAFETY: `tm` is a valid, initialized struct owned by this frame.
    let seconds = unsafe { libc::mktime(&mut tm) };
    #[allow(clippy::cast_precision_loss)] // Unix seconds fit an f64 exactly
    (seconds != -1).then_some(seconds as f64)
}

/// A SLURM duration (`30 sec`, `00:00:20`, `1-00:00:10`, `20`) as seconds; None for
/// None, `UNLIMITED` and anything else.
#[pyfunction]
#[pyo3(signature = (text))]
fn slurm_seconds(text: Option<&str>) -> Option<f64> {
    slurm::seconds(text?)
}

/// The value of `key` in `scontrol show config`'s output, or None.
#[pyfunction]
fn slurm_config_value(config: &str, key: &str) -> Option<String> {
    slurm::config_value(config, key).map(str::to_owned)
}

/// Whether `scontrol`'s error message says the controller was busy or unreachable
/// (worth another try).
#[pyfunction]
fn slurm_controller_busy(message: &str) -> bool {
    slurm::controller_busy(message)
}

/// The requeue decision after the save ([`slurm::requeue`]): `(what, reason)`, `what`
/// one of `already`, `no_reason`, `not_requeueable`, `requeue`, and `reason` the
/// reason's text (None for `no_reason`).
#[pyfunction]
#[pyo3(signature = (*, time_limit_signal, preempted, restarts, restart_count, requeueable))]
fn slurm_requeue(
    time_limit_signal: bool,
    preempted: bool,
    restarts: u64,
    restart_count: u64,
    requeueable: Option<bool>,
) -> (&'static str, Option<&'static str>) {
    let job = slurm::JobEnd {
        time_limit_signal,
        preempted,
        restarts,
        restart_count,
        requeueable,
    };
    match slurm::requeue(&job) {
        slurm::Requeue::Already(r) => ("already", Some(r.text())),
        slurm::Requeue::NoReason => ("no_reason", None),
        slurm::Requeue::NotRequeueable(r) => ("not_requeueable", Some(r.text())),
        slurm::Requeue::Requeue(r) => ("requeue", Some(r.text())),
    }
}

/// Whether this process decides about the job's requeue ([`slurm::decides_requeue`]).
#[pyfunction]
#[pyo3(signature = (*, under_slurm, enabled, procid))]
fn slurm_decides_requeue(under_slurm: bool, enabled: bool, procid: Option<&str>) -> bool {
    slurm::decides_requeue(under_slurm, enabled, procid)
}

/// A signal's `(deadline, kill)` under SLURM, Unix seconds ([`slurm::signal_deadlines`]
/// says which is which).
#[pyfunction]
#[pyo3(signature = (unix_now, *, end, sigterm, grace_end, kill_wait))]
fn slurm_signal_deadlines(
    unix_now: f64,
    end: Option<f64>,
    sigterm: bool,
    grace_end: Option<f64>,
    kill_wait: Option<f64>,
) -> (Option<f64>, Option<f64>) {
    slurm::signal_deadlines(unix_now, end, sigterm, grace_end, kill_wait)
}

/// Seconds from now until the SIGKILL of a job this process requeued, the requeue
/// started `since` seconds ago ([`slurm::kill_after_requeue`]); None without `KillWait`.
#[pyfunction]
fn slurm_kill_after_requeue(since: f64, kill_wait: Option<f64>) -> Option<f64> {
    slurm::kill_after_requeue(since, kill_wait)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(slurm_signal_deadlines, m)?)?;
    m.add_function(wrap_pyfunction!(slurm_kill_after_requeue, m)?)?;
    m.add_function(wrap_pyfunction!(slurm_requeue, m)?)?;
    m.add_function(wrap_pyfunction!(slurm_decides_requeue, m)?)?;
    m.add_function(wrap_pyfunction!(slurm_fields, m)?)?;
    m.add_function(wrap_pyfunction!(slurm_time, m)?)?;
    m.add_function(wrap_pyfunction!(slurm_seconds, m)?)?;
    m.add_function(wrap_pyfunction!(slurm_config_value, m)?)?;
    m.add_function(wrap_pyfunction!(slurm_controller_busy, m)?)?;
    m.add("SLURM_REQUEUE_TIMEOUT", slurm::REQUEUE_TIMEOUT)?;
    m.add("SLURM_READ_TIMEOUT", slurm::READ_TIMEOUT)?;
    m.add("SLURM_NOTICE_READ_TIMEOUT", slurm::NOTICE_READ_TIMEOUT)?;
    Ok(())
}
