//! Binding of the SLURM job ([`crate::sources::slurm::Job`]) for
//! `_platforms/slurm.py`: `SlurmJob.handle(event)` answers the reporting
//! thread's next action (`SlurmJob.Event`, `SlurmJob.Action`: the core's declarations),
//! which Python performs (`scontrol`, within the timeout the action carries).
//! The requeue's pauses between attempts are waited here, in slices that let
//! signals through: nothing but the time ends them.

use std::time::Duration;

use parking_lot::Mutex;
use pyo3::prelude::*;

use super::blocking;
use super::clock::{now_secs, At};
use super::wire::{nest, py_enum};
use crate::sources::slurm::{Job, Step};

crate::sources::slurm::slurm_event!(py_enum[crate::sources::slurm]);
crate::sources::slurm::slurm_action!(py_enum[crate::sources::slurm]);

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

/// The SLURM job this process runs in (`crate::sources::slurm::Job`): each
/// thread reports a `SlurmJob.Event` and performs the `SlurmJob.Action` it gets back,
/// until that is an outcome (`Read`, `Deadlines`, `Requeued`, `Done`).
#[pyclass(frozen, module = "tf_failure_handling._native")]
pub struct SlurmJob {
    core: Mutex<Job>,
}

#[pymethods]
impl SlurmJob {
    #[new]
    fn new(job_id: String, restart_count: u64) -> Self {
        SlurmJob {
            core: Mutex::new(Job::new(job_id, restart_count)),
        }
    }

    /// `event` reported now: what this thread does next (a requeue's pause is
    /// waited here first).
    ///
    /// # Errors
    ///
    /// What a signal handler raised during a pause.
    fn handle(&self, py: Python<'_>, event: &Bound<'_, SlurmEvent>) -> PyResult<SlurmAction> {
        let mut step = self.core.lock().handle(event.get().into(), now_secs());
        loop {
            match step {
                Step::Do(action) => return Ok(action.into()),
                Step::Wait { at } => {
                    wait_until(py, at)?;
                    step = self.core.lock().poll(now_secs());
                }
            }
        }
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<SlurmJob>()?;
    nest::<SlurmJob, SlurmEvent>(m.py(), "Event")?;
    nest::<SlurmJob, SlurmAction>(m.py(), "Action")
}
