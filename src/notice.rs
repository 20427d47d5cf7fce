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
    /// When the platform takes the machine away, if it said so: what the saves are
    /// planned against. It may be an assumption (Kubernetes' default grace period,
    /// when the pod's own is not given).
    pub deadline: Option<f64>,
    /// When the platform ends this process (its SIGKILL, the machine gone), only if
    /// the platform stated that moment: the one time the exit guard acts on
    /// ([`crate::grace::exit_guard_delay`]). None for a deadline that is an
    /// assumption and for a platform that names no end. Not always the deadline:
    /// SLURM's SIGKILL comes `KillWait` after the job's end
    /// ([`crate::sources::slurm::signal_deadlines`]).
    pub kill: Option<f64>,
}

impl Notice {
    /// A notice seen at `at` whose platform stated its deadline (or named none): the
    /// deadline is also the moment it ends the process.
    #[must_use]
    pub fn stated(at: f64, deadline: Option<f64>) -> Self {
        Notice {
            at,
            deadline,
            kill: deadline,
        }
    }

    /// A notice seen at `at` (monotonic) whose source announced the machine's
    /// end as a Unix time, `unix_deadline`, and the moment it ends the process as
    /// `unix_kill` (None when it did not state one), both read when the wall clock
    /// said `unix_now`. Platforms speak wall-clock time and the protocol plans on
    /// the monotonic clock: this is the one place a deadline crosses over.
    #[must_use]
    pub fn from_unix(at: f64, unix_now: f64, unix_deadline: Option<f64>, unix_kill: Option<f64>) -> Self {
        Notice {
            at,
            deadline: unix_deadline.map(|d| monotonic(at, unix_now, d)),
            kill: unix_kill.map(|k| monotonic(at, unix_now, k)),
        }
    }
}

/// The Unix time `unix` on the monotonic clock that read `at` when the wall clock
/// said `unix_now`: it keeps its distance from now.
#[must_use]
pub fn monotonic(at: f64, unix_now: f64, unix: f64) -> f64 {
    at + (unix - unix_now)
}

#[cfg(test)]
mod tests {
    use super::Notice;

    #[test]
    fn a_unix_deadline_keeps_its_distance_from_now_on_the_monotonic_clock() {
        let n = Notice::from_unix(50.0, 1_700_000_000.0, Some(1_700_000_030.0), Some(1_700_000_045.0));
        assert_eq!(
            n,
            Notice {
                at: 50.0,
                deadline: Some(80.0),
                kill: Some(95.0),
            }
        );
        let unstated = Notice::from_unix(50.0, 1_700_000_000.0, Some(1_700_000_030.0), None);
        assert_eq!((unstated.deadline, unstated.kill), (Some(80.0), None));
        assert_eq!(Notice::from_unix(50.0, 1_700_000_000.0, None, None).deadline, None);
    }

    #[test]
    fn a_deadline_already_past_stays_in_the_past() {
        let n = Notice::from_unix(50.0, 1_700_000_000.0, Some(1_699_999_990.0), None);
        assert_eq!(n.deadline, Some(40.0));
    }
}
