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

impl Notice {
    /// A notice seen at `at` (monotonic) whose source announced the machine's
    /// end as a Unix time, `unix_deadline`, read when the wall clock said
    /// `unix_now`. Platforms speak wall-clock time and the protocol plans on
    /// the monotonic clock: this is the one place a deadline crosses over.
    #[must_use]
    pub fn from_unix(at: f64, unix_now: f64, unix_deadline: Option<f64>) -> Self {
        Notice {
            at,
            deadline: unix_deadline.map(|d| at + (d - unix_now)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Notice;

    #[test]
    fn a_unix_deadline_keeps_its_distance_from_now_on_the_monotonic_clock() {
        let n = Notice::from_unix(50.0, 1_700_000_000.0, Some(1_700_000_030.0));
        assert_eq!(
            n,
            Notice {
                at: 50.0,
                deadline: Some(80.0)
            }
        );
        assert_eq!(Notice::from_unix(50.0, 1_700_000_000.0, None).deadline, None);
    }

    #[test]
    fn a_deadline_already_past_stays_in_the_past() {
        let n = Notice::from_unix(50.0, 1_700_000_000.0, Some(1_699_999_990.0));
        assert_eq!(n.deadline, Some(40.0));
    }
}
