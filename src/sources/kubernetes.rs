//! Kubernetes: nothing to poll. The kubelet sends SIGTERM and, the pod's
//! `terminationGracePeriodSeconds` later, SIGKILL; that grace period is not visible
//! from inside the pod, so `_platforms/kubernetes.py` takes it from
//! `TF_FAILURE_HANDLING_KUBERNETES_GRACE_PERIOD`, or else from the default below.

/// Kubernetes' default `terminationGracePeriodSeconds`, in seconds: a SIGTERM's
/// deadline when the pod's own is not given.
pub const KUBERNETES_DEFAULT_GRACE_PERIOD: f64 = 30.0;
