"""Kubernetes: a SIGTERM's deadline is the pod's grace period.

Kubernetes sends SIGTERM and, ``terminationGracePeriodSeconds`` later, SIGKILL; the
period is not visible from inside the pod, so it is
``TF_FAILURE_HANDLING_KUBERNETES_GRACE_PERIOD`` (parsed and checked by
``platform.settings``), else Kubernetes' default, 30 s. The other hooks of the
scheduler interface (``registry``) have nothing to do here.
"""

from __future__ import annotations

import os
from typing import Any, Optional

NAME = "kubernetes"


def detected() -> bool:
    """Inside a pod: Kubernetes sets ``KUBERNETES_SERVICE_HOST`` in every container."""
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST", "").strip())


def extra_signals() -> tuple:
    return ()


def start(env: Any) -> None:
    pass


def signal_deadline(env: Any, unix_now: float) -> Optional[float]:
    """``unix_now`` plus the pod's grace period (``env.kubernetes_grace_period``)."""
    return unix_now + env.kubernetes_grace_period


def attach(handler: Any, config: Any) -> None:
    pass


def after_save(handler: Any) -> None:
    pass


def resume_fields() -> dict:
    return {}
