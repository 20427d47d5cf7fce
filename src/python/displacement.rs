//! Displaced signal handlers: what `Inbox.recv(signals=)` (`inbox.rs`) looks
//! for between its slices.
//!
//! A handler installed for a watched signal after ours (a later
//! `signal.signal` or `sigaction`) takes its deliveries away: the handler or
//! watcher would never see that signal again. The core says which signals
//! that happened to, once per watch
//! ([`SignalWatch::newly_displaced`]); the wait then logs its warning
//! ([`warn_displaced`](crate::sources::signals::warn_displaced)) with no lock
//! held and the GIL taken again.
//!
//! This module sits below both: `signals.rs` extracts a [`Displacement`]
//! from the `SignalWatch` passed to `Inbox.recv` (its `FromPyObject`), so
//! `inbox.rs` needs nothing of `signals.rs`, and `signals.rs` may post into
//! an `Inbox`.

use std::sync::Arc;

use crate::sources::signals::SignalWatch;

/// Where a wait looks for displaced handlers: a signal watch's core; nothing
/// once the watch is closed.
#[derive(Clone, Default)]
pub(crate) struct Displacement(pub(crate) Option<Arc<SignalWatch>>);

impl Displacement {
    /// The watched signals whose handler was replaced, the first time any is
    /// found; None before, after, and once closed.
    pub(crate) fn newly_displaced(&self) -> Option<Vec<i32>> {
        self.0.as_ref()?.newly_displaced()
    }
}
