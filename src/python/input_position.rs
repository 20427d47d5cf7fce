//! Binding of the input position's decisions ([`crate::input_position`]) for
//! `_protocol/input_position.py`, which makes the iterators and logs.

use parking_lot::Mutex;
use pyo3::prelude::*;

use super::clock::now_secs;
use crate::input_position::{self, Resume, Resuming, Saved, Timed, Timing};

/// Where a restarted input resumes: `("fresh", None, None, None)`,
/// `("at", iteration, batches, advance)` or `("unreachable", iteration, batches, None)`
/// (module docs of `crate::input_position`).
#[pyfunction]
#[pyo3(signature = (iteration, batches, previous, per_iteration, steps_per_iteration, new_iteration, first_used))]
#[allow(clippy::too_many_arguments)]
fn input_resume(
    iteration: i64,
    batches: u64,
    previous: u64,
    per_iteration: Option<u64>,
    steps_per_iteration: Option<u64>,
    new_iteration: Option<bool>,
    first_used: u64,
) -> (&'static str, Option<u64>, Option<u64>, Option<u64>) {
    let saved = Saved {
        iteration,
        batches,
        previous,
    };
    let resuming = Resuming {
        per_iteration,
        steps_per_iteration,
        new_iteration,
        first_used,
    };
    match input_position::resume(saved, resuming) {
        Resume::Fresh => ("fresh", None, None, None),
        Resume::At {
            iteration,
            batches,
            advance,
        } => ("at", Some(iteration), Some(batches), Some(advance)),
        Resume::Unreachable { iteration, batches } => ("unreachable", Some(iteration), Some(batches), None),
    }
}

/// Batches the iterator in use has given (`crate::input_position::batches_given`).
#[pyfunction]
fn input_batches_given(start: u64, runs_now: u64, runs_at_made: u64, per_run: u64) -> u64 {
    input_position::batches_given(start, runs_now, runs_at_made, per_run)
}

/// The timing of a resume's slow part ([`Timing`]), from its construction:
/// `InputTiming(advance=False)` times a replay of skipped batches (a line every
/// interval), `InputTiming(advance=True)` the making of earlier iterators (a line at
/// its end when slow). It reads the clock itself.
#[pyclass(frozen, module = "tf_failure_handling._native")]
pub(crate) struct InputTiming(Mutex<Timing>);

#[pymethods]
impl InputTiming {
    #[new]
    #[pyo3(signature = (advance = false))]
    fn new(advance: bool) -> Self {
        InputTiming(Mutex::new(Timing::new(
            if advance { Timed::Advance } else { Timed::Replay },
            now_secs(),
        )))
    }

    /// Seconds until the next line is due.
    fn poll_timeout(&self) -> f64 {
        self.0.lock().poll_timeout(now_secs())
    }

    /// The seconds since the start when a line is due now, else None.
    fn poll(&self) -> Option<f64> {
        self.0.lock().poll(now_secs())
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<InputTiming>()?;
    m.add_function(wrap_pyfunction!(input_resume, m)?)?;
    m.add_function(wrap_pyfunction!(input_batches_given, m)?)?;
    Ok(())
}
