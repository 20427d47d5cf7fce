"""Kubernetes: a SIGTERM's deadline is the pod's grace period (the page:
docs/getting-started/kubernetes.md)."""

from __future__ import annotations

from typing import Any, Optional

from .._native import KUBERNETES_DEFAULT_GRACE_PERIOD
from . import common

#: Seconds Kubernetes leaves between SIGTERM and SIGKILL for this pod (not visible
#: from inside it).
GRACE_ENV = "TF_FAILURE_HANDLING_KUBERNETES_GRACE_PERIOD"
# KUBERNETES_DEFAULT_GRACE_PERIOD is the core's (src/sources/kubernetes.rs says what it
# means).


class Kubernetes(common.Platform):
    NAME = "kubernetes"

    def check(self) -> float:
        """:data:`GRACE_ENV`, else Kubernetes' default."""
        grace = common.seconds(GRACE_ENV, minimum=0.0)
        return KUBERNETES_DEFAULT_GRACE_PERIOD if grace is None else grace

    def detect(self, checked: Any) -> bool:
        """Inside a pod: Kubernetes sets ``KUBERNETES_SERVICE_HOST`` in every container."""
        return common.env("KUBERNETES_SERVICE_HOST") is not None

    def deadline(self, env: Any, unix_now: float) -> Optional[float]:
        """``unix_now`` plus the pod's grace period."""
        return unix_now + env.settings.get(self.NAME, KUBERNETES_DEFAULT_GRACE_PERIOD)


PLATFORM = Kubernetes()
