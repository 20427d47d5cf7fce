//! Binding of the input position's decisions ([`crate::input_position`]) for
//! `_protocol/input_position.py`, which makes the iterators and logs.

use parking_lot::Mutex;
use pyo3::prelude::*;

use super::clock::now_secs;
use super::wire::py_enum;
use crate::input_position::{self, Resuming, Saved, Timed, Timing};

crate::input_position::input_resume_decl!(py_enum[crate::input_position]);

/// Where a restarted input resumes (module docs of `crate::input_position`).
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
) -> InputResume {
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
    input_position::resume(saved, resuming).into()
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
#[pyclass(frozen, name = "Timing", module = "tf_failure_handling._native")]
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
    // One name crosses: `InputResume`, the answer, with the functions that give
    // it (`InputResume.of`, `InputResume.batches_given`: plain functions, not
    // methods) and the timing of a slow resume (`InputResume.Timing`).
    m.add_class::<InputResume>()?;
    super::wire::nest::<InputResume, InputTiming>(m.py(), "Timing")?;
    let t = m.py().get_type::<InputResume>();
    t.setattr("of", wrap_pyfunction!(input_resume, m)?)?;
    t.setattr("batches_given", wrap_pyfunction!(input_batches_given, m)?)
}
