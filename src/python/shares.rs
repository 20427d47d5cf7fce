//! Binding of the checkpoint's shares ([`crate::shares`]): which worker writes which
//! tensor when the workers write one checkpoint together.

use pyo3::prelude::*;

use crate::shares;

/// `(owner, parts)` for tensors of `sizes` bytes over `workers` workers: `owner[t]` is
/// the worker that writes tensor `t`, `parts` the workers that write a part, in part
/// order. A `pinned` tensor goes to worker 0.
#[pyfunction]
fn assign_shares(sizes: Vec<u64>, pinned: Vec<bool>, workers: usize) -> PyResult<(Vec<usize>, Vec<usize>)> {
    let plan = shares::assign(&sizes, &pinned, workers)?;
    Ok((plan.owner, plan.parts))
}

/// Seconds the chief waits for the other parts after its own took `own` seconds (at
/// least `min_wait`).
#[pyfunction]
fn shares_wait_bound(own: f64, min_wait: f64) -> f64 {
    shares::wait_bound(own, min_wait)
}

/// Seconds a worker waits from `now` (the handler's clock) after its own part took
/// `own` seconds: the chief for the other parts, a non-chief (`chief=False`) for the
/// chief's report of the merge; never past `deadline - exit_reserve`
/// ([`shares::wait_bound_at`]).
#[pyfunction]
#[pyo3(signature = (own, min_wait, now, deadline=None, exit_reserve=0.0, chief=true))]
fn shares_wait_bound_at(own: f64, min_wait: f64, now: f64, deadline: Option<f64>, exit_reserve: f64, chief: bool) -> f64 {
    let waiter = if chief { shares::Waiter::Chief } else { shares::Waiter::NonChief };
    shares::wait_bound_at(own, min_wait, deadline, now, exit_reserve, waiter)
}

/// Whether the chief starts the merge of the parts (`shares::MergeStart`): `start`;
/// when it does, `bound`, the seconds it waits for the merge and the state file; when
/// it does not, `needed` (the seconds the merge is expected to take) and `left` (the
/// seconds left before the deadline less the exit's reserve).
#[pyclass(frozen, module = "tf_failure_handling._native", name = "MergeStart")]
pub(crate) struct PyMergeStart {
    #[pyo3(get)]
    start: bool,
    #[pyo3(get)]
    bound: Option<f64>,
    #[pyo3(get)]
    needed: Option<f64>,
    #[pyo3(get)]
    left: Option<f64>,
}

impl From<shares::MergeStart> for PyMergeStart {
    fn from(decision: shares::MergeStart) -> Self {
        match decision {
            shares::MergeStart::Start { bound } => PyMergeStart {
                start: true,
                bound: Some(bound),
                needed: None,
                left: None,
            },
            shares::MergeStart::Keep { needed, left } => PyMergeStart {
                start: false,
                bound: None,
                needed: Some(needed),
                left: Some(left),
            },
        }
    }
}

#[pymethods]
impl PyMergeStart {
    fn __repr__(&self) -> String {
        match (self.bound, self.needed, self.left) {
            (Some(bound), _, _) => format!("MergeStart(start=True, bound={bound})"),
            (_, Some(needed), Some(left)) => format!("MergeStart(start=False, needed={needed}, left={left})"),
            _ => "MergeStart()".to_owned(),
        }
    }
}

/// Whether the chief starts the merge at `now` after its own part took `own` seconds,
/// with no handler's core (no notice, so no deadline unless one is given): the merge
/// is expected to take `measured` (the longest merge measured), else `own`
/// ([`shares::merge_start`]).
#[pyfunction]
#[pyo3(signature = (own, min_wait, now, measured=None, deadline=None, exit_reserve=0.0))]
fn shares_merge_start_at(
    own: f64,
    min_wait: f64,
    now: f64,
    measured: Option<f64>,
    deadline: Option<f64>,
    exit_reserve: f64,
) -> PyMergeStart {
    let needed = shares::merge_estimate(measured, own);
    shares::merge_start(needed, own, min_wait, deadline, now, exit_reserve).into()
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(assign_shares, m)?)?;
    m.add_function(wrap_pyfunction!(shares_wait_bound, m)?)?;
    m.add_function(wrap_pyfunction!(shares_wait_bound_at, m)?)?;
    m.add_function(wrap_pyfunction!(shares_merge_start_at, m)?)?;
    m.add_class::<PyMergeStart>()?;
    m.add("SHARES_MIN_WAIT", shares::MIN_WAIT)?;
    m.add("SHARES_PROBE_WAIT", shares::PROBE_WAIT)?;
    m.add("SHARES_UNMERGED_EXIT_CODE", shares::UNMERGED_EXIT_CODE)?;
    m.add("SHARES_PROBE_LOOK", shares::PROBE_LOOK)?;
    m.add("SHARES_PROBE_LOOK_EVERY", shares::PROBE_LOOK_EVERY)?;
    Ok(())
}
