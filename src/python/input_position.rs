//! Binding of the input position's decisions ([`crate::input_position`]) for
//! `_protocol/input_position.py`, which makes the iterators and logs.

use pyo3::prelude::*;

use crate::input_position::{self, Resume, Resuming, Saved};

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

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("INPUT_REPLAY_PROGRESS_EVERY", crate::input_position::REPLAY_PROGRESS_EVERY)?;
    m.add_function(wrap_pyfunction!(input_resume, m)?)?;
    m.add_function(wrap_pyfunction!(input_batches_given, m)?)?;
    Ok(())
}
