//! Binding of the checkpoint's shares ([`crate::shares`]): which worker writes which
//! tensor when the workers write one checkpoint together.

use parking_lot::Mutex;
use pyo3::prelude::*;

use super::clock::now_secs;
use super::handler::ProtocolCore;
use crate::shares::{self, Waiter};

/// `(owner, parts)` for tensors of `sizes` bytes over `workers` workers: `owner[t]` is
/// the worker that writes tensor `t`, `parts` the workers that write a part, in part
/// order. A `pinned` tensor goes to worker 0.
#[pyfunction]
fn assign_shares(sizes: Vec<u64>, pinned: Vec<bool>, workers: usize) -> PyResult<(Vec<usize>, Vec<usize>)> {
    let plan = shares::assign(&sizes, &pinned, workers)?;
    Ok((plan.owner, plan.parts))
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

/// The chief's wait, at the handler's construction, for each other worker's answer to
/// the probe of the checkpoint folder ([`shares::Probe`]): `ask(worker, seconds)` is
/// one wait for `worker`'s answer, bounded by what is left of [`shares::PROBE_WAIT`].
/// Returns `(worker, answer, bound)` for the first answer that is not `ok` (None: it
/// did not come), None when all are; `bound` is the probe's, for the message.
///
/// # Errors
///
/// What `ask` raised.
#[pyfunction]
fn shares_probe_answers(workers: usize, ask: &Bound<'_, PyAny>) -> PyResult<Option<(usize, Option<String>, f64)>> {
    let probe = shares::Probe::new(now_secs());
    for worker in 1..workers {
        let answer: Option<String> = ask.call1((worker, probe.left(now_secs())))?.extract()?;
        if answer.as_deref() != Some("ok") {
            return Ok(Some((worker, answer, shares::PROBE_WAIT)));
        }
    }
    Ok(None)
}

/// A non-chief's part of the probe: `ask(seconds)` waits for the chief's token
/// (within [`shares::PROBE_WAIT`]); then `look(token)` says whether the probe file
/// holds it, asked again after each pause until it does or [`shares::PROBE_LOOK`]
/// passed (the pauses are waited here). Returns `(token, seen, bound, look_bound)`:
/// the token (None: it did not come), whether the file was seen, and both bounds for
/// the messages.
///
/// # Errors
///
/// What `ask` or `look` raised; what a signal handler raised during a pause.
#[pyfunction]
fn shares_probe_file(py: Python<'_>, ask: &Bound<'_, PyAny>, look: &Bound<'_, PyAny>) -> PyResult<(Option<String>, bool, f64, f64)> {
    let mut probe = shares::Probe::new(now_secs());
    let bounds = (shares::PROBE_WAIT, shares::PROBE_LOOK);
    let token: Option<String> = ask.call1((probe.left(now_secs()),))?.extract()?;
    let Some(token) = token else {
        return Ok((None, false, bounds.0, bounds.1));
    };
    loop {
        let seen: bool = look.call1((&token,))?.extract()?;
        match probe.look(now_secs(), seen) {
            Some(at) => super::slurm::wait_until(py, at)?,
            None => return Ok((Some(token), seen, bounds.0, bounds.1)),
        }
    }
}

/// The waits of one worker's part of a save the workers write together
/// ([`shares::SaveWaits`]), from the moment its part starts (its construction), each
/// bounded by the core: with a handler's `ProtocolCore` (`SharesSave(core)`), by its
/// notice's deadline less the exit's reserve too, and the merges it measured;
/// without one (`SharesSave()`), by the rule alone. Every method reads the clock
/// itself.
#[pyclass(frozen, module = "tf_failure_handling._native", name = "SharesSave")]
pub(crate) struct PySharesSave {
    core: Option<Py<ProtocolCore>>,
    waits: Mutex<shares::SaveWaits>,
}

impl PySharesSave {
    fn bound(&self, own: f64, now: f64, waiter: Waiter) -> f64 {
        match &self.core {
            Some(core) => core.get().shares_bound(own, now, waiter),
            None => shares::wait_bound_at(own, shares::MIN_WAIT, None, now, 0.0, waiter),
        }
    }
}

#[pymethods]
impl PySharesSave {
    #[new]
    #[pyo3(signature = (core = None))]
    fn new(core: Option<Py<ProtocolCore>>) -> Self {
        let mut waits = shares::SaveWaits::default();
        waits.part_started(now_secs());
        PySharesSave {
            core,
            waits: Mutex::new(waits),
        }
    }

    /// Its part is written: the waits that follow (the chief's for the other parts,
    /// a non-chief's for the merge) end at the core's bound from now.
    fn part_written(&self, chief: bool) {
        let now = now_secs();
        let own = self.waits.lock().part_written(now);
        let bound = self.bound(own, now, if chief { Waiter::Chief } else { Waiter::NonChief });
        self.waits.lock().wait(now, bound);
    }

    /// Seconds the next wait lasts: what is left until the end the core set; with
    /// `after_failure`, a fresh wait: the chief's removal of a failed save's parts.
    #[pyo3(signature = (after_failure = false))]
    fn left(&self, after_failure: bool) -> f64 {
        let now = now_secs();
        if after_failure {
            return self.bound(0.0, now, Waiter::Chief).max(shares::MIN_TIMEOUT);
        }
        self.waits.lock().left(now)
    }

    /// Whether the chief starts the merge now (the core's decision); when it does,
    /// the waits that follow end at its bound.
    fn merge_start(&self) -> PyMergeStart {
        let now = now_secs();
        let own = self.waits.lock().own();
        let decision = match &self.core {
            Some(core) => core.get().shares_merge_decision(own, now),
            None => shares::merge_start(shares::merge_estimate(None, own), own, shares::MIN_WAIT, None, now, 0.0),
        };
        if let shares::MergeStart::Start { bound } = decision {
            self.waits.lock().merge_started(now, bound);
        }
        decision.into()
    }

    /// The merge ended: the state file names the checkpoint. The core keeps how
    /// long it took.
    fn merged(&self) {
        let took = self.waits.lock().merge_took(now_secs());
        if let (Some(core), Some(took)) = (&self.core, took) {
            core.get().shares_took(took);
        }
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(assign_shares, m)?)?;
    m.add_class::<PyMergeStart>()?;
    m.add_function(wrap_pyfunction!(shares_probe_answers, m)?)?;
    m.add_function(wrap_pyfunction!(shares_probe_file, m)?)?;
    m.add_class::<PySharesSave>()?;
    m.add("SHARES_UNMERGED_EXIT_CODE", shares::UNMERGED_EXIT_CODE)?;
    Ok(())
}
