//! Binding of the checkpoint's shares ([`crate::shares`]): which worker writes which
//! tensor when the workers write one checkpoint together, and every wait of it
//! (`SharesWaits`: the probe at the handler's construction, one save).

use parking_lot::Mutex;
use pyo3::prelude::*;

use super::clock::now_secs;
use super::errors;
use super::handler::ProtocolCore;
use super::slurm::wait_until;
use super::wire::{nest, py_enum};
use crate::shares::{self, Bounds, MergeStart, SharesEvent, Waiter, Waits};

crate::shares::shares_action!(py_enum[crate::shares]);

/// `(owner, parts)` for tensors of `sizes` bytes over `workers` workers: `owner[t]` is
/// the worker that writes tensor `t`, `parts` the workers that write a part, in part
/// order. A `pinned` tensor goes to worker 0.
#[pyfunction]
fn assign_shares(sizes: Vec<u64>, pinned: Vec<bool>, workers: usize) -> PyResult<(Vec<usize>, Vec<usize>)> {
    let plan = shares::assign(&sizes, &pinned, workers)?;
    Ok((plan.owner, plan.parts))
}

/// A handler's protocol as the bounds of a save: its notice's deadline less the
/// exit's reserve, and the merges it measured.
struct Handler<'a>(&'a ProtocolCore);

impl Bounds for Handler<'_> {
    fn wait_bound(&mut self, own: f64, now: f64, waiter: Waiter) -> f64 {
        self.0.shares_bound(own, now, waiter)
    }

    fn merge_start(&mut self, own: f64, now: f64) -> MergeStart {
        self.0.shares_merge_decision(own, now)
    }

    fn merged(&mut self, took: f64) {
        self.0.shares_took(took);
    }
}

/// The waits of one worker in the shares ([`Waits`]), from its construction: the
/// probe of the checkpoint folder (`SharesWaits(probe=True)`), or one save of the
/// `chief` or not, bounded by a handler's `ProtocolCore` (`core`) or by the rule
/// alone. `handle(event)` takes `"token"`, `"looked"` (with `seen`),
/// `"part_written"`, `"parts_checked"`, `"merged"` or `"failed"`; `poll()` answers a
/// `SharesWaits.Action`, waiting (the GIL released) for the pause before a look;
/// `poll_timeout()` is what is left of the current wait. It reads the clock itself.
#[pyclass(frozen, module = "tf_failure_handling._native", name = "SharesWaits")]
pub(crate) struct PySharesWaits {
    core: Option<Py<ProtocolCore>>,
    waits: Mutex<Waits>,
}

impl PySharesWaits {
    /// `f` with the waits and their bounds (the waits' lock, then the handler's state
    /// lock inside it; neither is held while Python runs).
    fn with<T>(&self, f: impl FnOnce(&mut Waits, &mut dyn Bounds) -> T) -> T {
        let mut waits = self.waits.lock();
        match &self.core {
            Some(core) => f(&mut waits, &mut Handler(core.get())),
            None => f(&mut waits, &mut shares::Rule),
        }
    }
}

#[pymethods]
impl PySharesWaits {
    #[new]
    #[pyo3(signature = (core = None, chief = false, probe = false))]
    fn new(core: Option<Py<ProtocolCore>>, chief: bool, probe: bool) -> Self {
        let now = now_secs();
        let waits = if probe { Waits::probe(now) } else { Waits::save(chief, now) };
        PySharesWaits {
            core,
            waits: Mutex::new(waits),
        }
    }

    #[pyo3(signature = (event, seen = false))]
    fn handle(&self, event: &str, seen: bool) -> PyResult<()> {
        let event = match event {
            "token" => SharesEvent::Token,
            "looked" => SharesEvent::Looked { seen },
            "part_written" => SharesEvent::PartWritten,
            "parts_checked" => SharesEvent::PartsChecked,
            "merged" => SharesEvent::Merged,
            "failed" => SharesEvent::Failed,
            other => return Err(errors::bad_value(format!("not an event of the shares' waits: {other:?}"))),
        };
        self.with(|waits, bounds| waits.handle(event, now_secs(), bounds));
        Ok(())
    }

    fn poll(&self, py: Python<'_>) -> PyResult<SharesAction> {
        loop {
            let (action, pause) = self.with(|waits, bounds| {
                let now = now_secs();
                (waits.poll(now, bounds), waits.poll_timeout(now))
            });
            if let Some(action) = action {
                return Ok(action.into());
            }
            wait_until(py, now_secs() + pause)?;
        }
    }

    fn poll_timeout(&self) -> f64 {
        self.waits.lock().poll_timeout(now_secs())
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(assign_shares, m)?)?;
    m.add_class::<PySharesWaits>()?;
    nest::<PySharesWaits, SharesAction>(m.py(), "Action")
}
