//! Kubernetes: nothing to poll. The kubelet sends SIGTERM and, the pod's
//! `terminationGracePeriodSeconds` later, SIGKILL; that grace period is not visible
//! from inside the pod, so `_platforms/kubernetes.py` takes it from
//! `TF_FAILURE_HANDLING_KUBERNETES_GRACE_PERIOD`, or else assumes the default below.
//!
//! The assumed default plans the saves; it is no statement of when the pod is
//! killed (a pod's own grace period may be 120 s, a GKE Spot node's shutdown gives
//! non-system pods 15 s whatever the pod says), so it arms no exit guard:
//! [`sigterm_deadlines`].

/// Kubernetes' default `terminationGracePeriodSeconds`, in seconds: a SIGTERM's
/// deadline when the pod's own is not given.
pub const KUBERNETES_DEFAULT_GRACE_PERIOD: f64 = 30.0;

/// A SIGTERM at `unix_now`: `(deadline, kill)`, Unix seconds. `grace` is the pod's
/// grace period as the user stated it (`TF_FAILURE_HANDLING_KUBERNETES_GRACE_PERIOD`),
/// None when not given: then the deadline is [`KUBERNETES_DEFAULT_GRACE_PERIOD`]
/// away, and nothing says when SIGKILL comes (no kill).
#[must_use]
pub fn sigterm_deadlines(unix_now: f64, grace: Option<f64>) -> (Option<f64>, Option<f64>) {
    let stated = grace.filter(|g| g.is_finite() && *g >= 0.0).map(|g| unix_now + g);
    (Some(stated.unwrap_or(unix_now + KUBERNETES_DEFAULT_GRACE_PERIOD)), stated)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_stated_grace_period_says_when_the_pod_is_killed() {
        // (the stated grace period, deadline, kill), for a SIGTERM at 1000.
        let rows = [
            (None, Some(1030.0), None),
            (Some(120.0), Some(1120.0), Some(1120.0)),
            (Some(15.0), Some(1015.0), Some(1015.0)),
            (Some(0.0), Some(1000.0), Some(1000.0)),
            (Some(f64::NAN), Some(1030.0), None),
        ];
        for (grace, deadline, kill) in rows {
            assert_eq!(sigterm_deadlines(1000.0, grace), (deadline, kill), "{grace:?}");
        }
    }
}
