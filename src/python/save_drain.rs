//! The coordinator's wait for its closures before its save
//! ([`crate::ps_control::save_drain`]) for `_coordinator/closure_drain.py`, which holds
//! the worker threads, waits and moves runs as each step says. The plan is used by the
//! save's one thread; its lock is never held while Python runs.

use parking_lot::Mutex;
use pyo3::prelude::*;

use crate::ps_control::save_drain::{self, SaveDrain};

/// What the save does next (`SaveDrainPlan`).
#[pyclass(frozen, module = "tf_failure_handling._native")]
pub enum SaveStep {
    /// The threads cannot be held: wait for every scheduled closure, at most `bound` s.
    WaitAll { bound: f64 },
    /// Wait for every held worker to be idle until `until` (each wait: `plan.left(now)`).
    WaitIdle { until: f64 },
    /// Find which of these runs are still queued, and the workers that can take them.
    Promote { runs: Vec<u64> },
    /// Move these runs to the queue's head, let the held workers take that many, and
    /// wait at most `wait` s until they have.
    Grant { runs: Vec<u64>, wait: f64 },
    /// Over.
    Done {},
}

impl From<save_drain::SaveStep> for SaveStep {
    fn from(step: save_drain::SaveStep) -> Self {
        match step {
            save_drain::SaveStep::WaitAll { bound } => SaveStep::WaitAll { bound },
            save_drain::SaveStep::WaitIdle { until } => SaveStep::WaitIdle { until },
            save_drain::SaveStep::Promote { runs } => SaveStep::Promote { runs },
            save_drain::SaveStep::Grant { runs, wait } => SaveStep::Grant { runs, wait },
            save_drain::SaveStep::Done => SaveStep::Done {},
        }
    }
}

/// One save's wait for the closures: `start`, then report what each step saw
/// (`unfinished`, `promotable`, `granted`) and perform the step returned. Times are on
/// the caller's clock.
#[pyclass(frozen, module = "tf_failure_handling._native")]
pub struct SaveDrainPlan {
    drain: Mutex<SaveDrain>,
}

#[pymethods]
impl SaveDrainPlan {
    #[new]
    #[pyo3(signature = (bound, scheduled=None))]
    fn new(bound: f64, scheduled: Option<u64>) -> Self {
        SaveDrainPlan {
            drain: Mutex::new(SaveDrain::new(bound, scheduled)),
        }
    }

    /// The first step; `held`: every worker thread was held.
    fn start(&self, held: bool, now: f64) -> SaveStep {
        self.drain.lock().start(held, now).into()
    }

    /// Seconds left of the bound at `now` (never below 0).
    fn left(&self, now: f64) -> f64 {
        self.drain.lock().left(now)
    }

    /// What the wait left: the runs queued and in flight by index (None for either:
    /// not all known by index).
    #[pyo3(signature = (queued, in_flight, now))]
    fn unfinished(&self, queued: Option<Vec<u64>>, in_flight: Option<Vec<u64>>, now: f64) -> SaveStep {
        let runs = match (&queued, &in_flight) {
            (Some(q), Some(f)) => Some((q.as_slice(), f.as_slice())),
            _ => None,
        };
        self.drain.lock().unfinished(runs, now).into()
    }

    /// Of the runs to promote, `found` are still queued; `takers` workers can run them.
    fn promotable(&self, found: Vec<u64>, takers: usize, now: f64) -> SaveStep {
        self.drain.lock().promotable(&found, takers, now).into()
    }

    /// The wait for the granted runs to be taken ended.
    fn granted(&self) -> SaveStep {
        self.drain.lock().granted().into()
    }

    /// The runs the save let run first.
    #[getter]
    fn filled(&self) -> Vec<u64> {
        self.drain.lock().filled().to_vec()
    }
}

/// How many `DRAIN_SETTLE_LOOK` looks a worker settling between two closures gets.
#[pyfunction]
fn settle_looks(get_slice: f64) -> u32 {
    save_drain::settle_looks(get_slice)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<SaveStep>()?;
    m.add_class::<SaveDrainPlan>()?;
    m.add_function(wrap_pyfunction!(settle_looks, m)?)?;
    Ok(())
}
