//! Binding of SLURM ([`crate::sources::slurm`]) for `_platforms/slurm.py`: the read of
//! the job's limits ([`JobRead`]), a notice's deadlines and the requeue
//! ([`RequeueRun`]): the core's steps, which Python performs (`scontrol`), each within
//! the timeout the step carries. The read runs on a daemon thread, so its loop stays
//! in Python; the requeue runs on the thread that saved (never a daemon thread), so
//! its loop is driven here and Python's callbacks only perform.

use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::blocking;
use super::clock::{now_secs, At};
use crate::sources::slurm::{self, Attempt, JobRead, JobShown, RequeueRun, RequeueStep};

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

/// Whether this process decides about the job's requeue ([`slurm::decides_requeue`]).
#[pyfunction]
#[pyo3(signature = (*, under_slurm, enabled, procid))]
fn slurm_decides_requeue(under_slurm: bool, enabled: bool, procid: Option<&str>) -> bool {
    slurm::decides_requeue(under_slurm, enabled, procid)
}

/// Sleeps until `at`, on [`now_secs`]'s clock (a time a core object named): in
/// slices, so that signals are handled on the main thread.
pub(crate) fn wait_until(py: Python<'_>, at: f64) -> PyResult<()> {
    let left = Duration::try_from_secs_f64((at - now_secs()).max(0.0)).unwrap_or(Duration::MAX);
    blocking::wait_sliced(py, Some(At::after(left)), |slice| {
        std::thread::sleep(slice);
        None::<()>
    })?;
    Ok(())
}

/// A dict of the job's fields (`show_job`'s) as the core reads them.
fn job_fields(job: &Bound<'_, PyDict>) -> PyResult<Vec<(String, String)>> {
    job.iter()
        .filter(|(_, v)| !v.is_none())
        .map(|(k, v)| Ok((k.str()?.to_string(), v.str()?.to_string())))
        .collect()
}

/// An exception as Python's `f"{type(e).__name__}: {e}"` and `f"{e}"` print it.
fn said(py: Python<'_>, e: &PyErr) -> (String, String) {
    let value = e.value(py);
    let name = value.get_type().name().map_or_else(|_| "Exception".to_owned(), |n| n.to_string());
    let text = value.str().map_or_else(|_| String::new(), |t| t.to_string());
    (name, text)
}

/// The job's limits for Python.
type Facts = (Option<f64>, Option<String>, Option<f64>, Option<f64>, Option<bool>, Option<String>);

/// The read of the job's limits when the handler starts ([`JobRead`]), given what
/// the calls made so far answered (`outputs`: `(code, stdout, stderr)` each, `code`
/// None when the call could not be made or did not end in time, `stderr` then says
/// why). Returns `(call, facts)`: the next `scontrol` call, `(arguments, timeout)`,
/// None once the read is over; and what was read so far: `(end_time, partition,
/// grace_time, kill_wait, requeue, error)` (`EndTime` in Unix seconds, `Partition`,
/// its `GraceTime` and the cluster's `KillWait` in seconds, whether the job is
/// requeueable, why the read ended early). The caller is a daemon thread: it keeps
/// the outputs and loops (no Rust frame may be on its stack while `scontrol` runs,
/// see `blocking::detach`).
#[pyfunction]
fn slurm_job_read(job_id: &str, outputs: Vec<(Option<i32>, String, String)>) -> (Option<(Vec<String>, f64)>, Facts) {
    let read = JobRead::replay(outputs);
    let call = read.next().map(|(query, timeout)| (query.args(job_id), timeout));
    let facts = (
        read.end_time(),
        read.field("Partition").map(str::to_owned),
        read.grace_time,
        read.kill_wait,
        read.requeueable(),
        read.error.clone(),
    );
    (call, facts)
}

/// A signal's `(deadline, kill, read_timeout)` under SLURM ([`slurm::signal_deadlines`]:
/// Unix seconds or None). A new SIGTERM of an `srun` task whose partition has a
/// `GraceTime` may be a preemption ([`slurm::notice_reads_job`]): without `job`, the
/// answer then names `read_timeout`, the bound on reading the job (its fields), and
/// the caller asks again with them (an unreadable job: the answer it has stands).
///
/// # Errors
///
/// A field that cannot be read as text.
#[pyfunction]
#[pyo3(signature = (unix_now, *, end, sigterm, srun_step, grace_time, kill_wait, job = None))]
#[allow(clippy::too_many_arguments)] // the notice's facts, by name
fn slurm_notice(
    unix_now: f64,
    end: Option<f64>,
    sigterm: bool,
    srun_step: bool,
    grace_time: Option<f64>,
    kill_wait: Option<f64>,
    job: Option<&Bound<'_, PyDict>>,
) -> PyResult<(Option<f64>, Option<f64>, Option<f64>)> {
    let job = job.map(job_fields).transpose()?;
    Ok(slurm::notice(
        unix_now,
        end,
        (sigterm, srun_step),
        (grace_time, kill_wait),
        job.as_deref(),
    ))
}

/// What a requeue did, for Python: `(requeued, message, what, reason, took,
/// kill_in, job)`.
type Requeued<'py> = (
    bool,
    String,
    Option<&'static str>,
    Option<&'static str>,
    f64,
    Option<f64>,
    Bound<'py, PyDict>,
);

/// The job back in the queue after the save ([`RequeueRun`]): the job read
/// (`show_job(timeout)`: its fields, raising when unreadable), the decision, then
/// `scontrol requeue` (`requeue(timeout)`: `(code, said)`, `code` None when it did
/// not finish in time (`said` None) or could not be started (`said`: why)),
/// retried while the controller is busy, the pauses waited here. Returns
/// `(requeued, message, what, reason, took, kill_in, job)`: the outcome and what
/// scontrol said; the decision (`already`, `no_reason`, `not_requeueable`,
/// `requeue`) and its reason; the seconds it took; the seconds from now until
/// SLURM's SIGKILL when this requeued the job ([`RequeueRun::kill_after`], None
/// otherwise or without `kill_wait`); the job's fields as first read.
///
/// # Errors
///
/// What a signal handler raised during a pause; a callback's result of the wrong
/// shape.
#[pyfunction]
#[pyo3(signature = (job_id, *, time_limit_signal, restart_count, kill_wait, show_job, requeue))]
fn slurm_requeue<'py>(
    py: Python<'py>,
    job_id: &str,
    time_limit_signal: bool,
    restart_count: u64,
    kill_wait: Option<f64>,
    show_job: &Bound<'py, PyAny>,
    requeue: &Bound<'py, PyAny>,
) -> PyResult<Requeued<'py>> {
    let started = now_secs();
    let mut run = RequeueRun::new(time_limit_signal, restart_count);
    let mut first: Option<Bound<'py, PyDict>> = None;
    loop {
        match run.poll(now_secs()) {
            // Each outcome is reported before the next poll: a wait is a pause.
            RequeueStep::Wait { at } => wait_until(py, at)?,
            RequeueStep::Show { timeout } => {
                let job = match show_job.call1((timeout,)) {
                    Ok(job) => job.cast_into::<PyDict>().map_err(PyErr::from)?,
                    Err(e) => {
                        let (_, text) = said(py, &e);
                        run.shown(now_secs(), Err(format!("scontrol show job failed: {text}")));
                        first.get_or_insert_with(|| PyDict::new(py));
                        continue;
                    }
                };
                run.shown(now_secs(), Ok(JobShown::from_fields(&job_fields(&job)?)));
                first.get_or_insert(job);
            }
            RequeueStep::Run { timeout, again } => {
                if let Some(again) = again {
                    log::info!(
                        target: "tf_failure_handling",
                        "SLURM job {job_id}: scontrol requeue failed ({again}); trying again."
                    );
                }
                let (code, said): (Option<i32>, Option<String>) = requeue.call1((timeout,))?.extract()?;
                run.ran(match (code, said) {
                    (Some(code), said) => Attempt::Exited {
                        code,
                        said: said.unwrap_or_default(),
                    },
                    (None, None) => Attempt::TimedOut,
                    (None, Some(why)) => Attempt::CouldNotRun(why),
                });
            }
            RequeueStep::Done { requeued, message } => {
                let (what, reason) = run.decision().map_or(("no_reason", None), slurm::Requeue::names);
                let now = now_secs();
                let job = first.unwrap_or_else(|| PyDict::new(py));
                return Ok((
                    requeued,
                    message,
                    Some(what),
                    reason,
                    now - started,
                    run.kill_after(now, kill_wait),
                    job,
                ));
            }
        }
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(slurm_job_read, m)?)?;
    m.add_function(wrap_pyfunction!(slurm_notice, m)?)?;
    m.add_function(wrap_pyfunction!(slurm_requeue, m)?)?;
    m.add_function(wrap_pyfunction!(slurm_decides_requeue, m)?)?;
    m.add_function(wrap_pyfunction!(slurm_fields, m)?)?;
    Ok(())
}
