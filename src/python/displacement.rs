//! Displaced signal handlers: what `SignalWatch.wait` (`signals.rs`) and
//! `Inbox.recv(signals=)` (`inbox.rs`) both look for between their slices.
//!
//! A handler installed for a watched signal after ours (a later
//! `signal.signal` or `sigaction`) takes its deliveries away: the handler or
//! watcher would never see that signal again. [`SignalWatch::displaced`]
//! says which signals that happened to; each wait checks it between slices
//! and logs one warning per watch ([`warn_displaced`], with no lock held and
//! the GIL taken again).
//!
//! This module sits below both: `signals.rs` extracts a [`Displacement`]
//! from the `SignalWatch` passed to `Inbox.recv` (its `FromPyObject`), so
//! `inbox.rs` needs nothing of `signals.rs`, and `signals.rs` may post into
//! an `Inbox`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::sources::signals::SignalWatch;

/// Where a wait looks for displaced handlers: a signal watch's core and its
/// "warned once" flag, shared by every wait on that watch; nothing once the
/// watch is closed.
#[derive(Clone, Default)]
pub(crate) struct Displacement(Option<(Arc<SignalWatch>, Arc<AtomicBool>)>);

impl Displacement {
    /// Looks at `watch`; `warned` is set once the warning was given.
    pub(crate) fn new(watch: Arc<SignalWatch>, warned: Arc<AtomicBool>) -> Self {
        Displacement(Some((watch, warned)))
    }

    /// The watched signals whose handler was replaced, the first time any
    /// is found (the flag is then set); None before, after, and once closed.
    pub(crate) fn newly_displaced(&self) -> Option<Vec<i32>> {
        let (watch, warned) = self.0.as_ref()?;
        if warned.load(Ordering::Relaxed) {
            return None;
        }
        let displaced = watch.displaced();
        (!displaced.is_empty()).then(|| {
            warned.store(true, Ordering::Relaxed);
            displaced
        })
    }
}

/// The warning for [`Displacement::newly_displaced`]'s signals; it may
/// attach to the interpreter (pyo3-log), so no lock may be held.
pub(crate) fn warn_displaced(signals: &[i32]) {
    let names: Vec<String> = signals.iter().map(|s| format!("signal {s}")).collect();
    log::warn!(
        target: "tf_failure_handling",
        "The handler of {} was replaced after tf_failure_handling installed its own (a later \
         signal.signal or sigaction call): that signal no longer reaches the preemption handler or \
         watcher. Install your handler before building them, or close them first.",
        names.join(", ")
    );
}
