//! A termination notice, as the protocol sees it: when it was seen and when
//! the machine goes away.
//!
//! Two subsystems read it: the step resolver ([`crate::step_resolution`])
//! keeps the notice its worker leads with, and the grace planner
//! ([`crate::grace`]) turns it into the deadline the final round is planned
//! against. It lives here, below both, so that neither imports the other for
//! it: the resolver asks the planner whether the final round is due, and the
//! planner needs nothing of the resolver. `step_resolution::Notice` names the
//! same type.
//!
//! Times are seconds on the caller's monotonic clock (the resolver and the
//! planner never read a clock themselves). Where the notice came from (a
//! signal, a metadata server, a user's watcher function) is the inbox's
//! business ([`crate::inbox::Origin`]), not the protocol's.

/// A termination notice as a source reported it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Notice {
    /// When the notice was seen (seconds, caller's monotonic clock).
    pub at: f64,
    /// When the platform takes the machine away, if it said so.
    pub deadline: Option<f64>,
}
