"""Kubernetes: a SIGTERM's deadline is the pod's grace period (the page:
docs/getting-started/kubernetes.md)."""

from __future__ import annotations

from typing import Any

from . import common

#: Seconds Kubernetes leaves between SIGTERM and SIGKILL for this pod (not visible
#: from inside it).
GRACE_ENV = "TF_FAILURE_HANDLING_KUBERNETES_GRACE_PERIOD"


class Kubernetes(common.Platform):
    NAME = "kubernetes"

    def check(self) -> Any:
        """:data:`GRACE_ENV` as stated, or None when not given (the core then assumes
        Kubernetes' default for the deadline, and states no kill)."""
        return common.seconds(GRACE_ENV, minimum=0.0)

    def detect(self, checked: Any) -> bool:
        """Inside a pod: Kubernetes sets ``KUBERNETES_SERVICE_HOST`` in every container."""
        return common.env("KUBERNETES_SERVICE_HOST") is not None

    def deadlines(self, env: Any, unix_now: float) -> tuple:
        """``unix_now`` plus the pod's grace period; a kill only when it was stated
        (its row of the core's table, ``src/sources/kubernetes.rs``)."""
        return common.TABLE[self.NAME]["sigterm_deadlines"](unix_now, env.settings.get(self.NAME))


PLATFORM = Kubernetes()
