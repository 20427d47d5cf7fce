"""The gRPC keepalive this package adds to TensorFlow's channels when it is imported.

In a ParameterServerStrategy process (``TF_CONFIG`` names a ``ps`` job), a connection to
a stopped task fails its calls after a ping timeout instead of stalling them: the
options, when they apply and their limits: docs/getting-started/parameter-server.md,
"Preemption under ParameterServerStrategy".
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional

from .._native import CoordinatorProtocol

#: ``1``: add the core's keepalive options (src/ps_control/keepalive.rs says what each
#: value means) to ``TF_GRPC_DEFAULT_OPTIONS`` (the options of every channel TensorFlow
#: creates in this process) in any process; ``0``: never. Unset: only in a
#: process whose ``TF_CONFIG`` names a ``ps`` job (a ParameterServerStrategy cluster: a
#: MultiWorkerMirroredStrategy process keeps TensorFlow's channels as they are).
GRPC_KEEPALIVE_ENV = "TF_FAILURE_HANDLING_GRPC_KEEPALIVE"
GRPC_OPTIONS_ENV = "TF_GRPC_DEFAULT_OPTIONS"


def keepalive_wanted(environ: Any = None) -> bool:
    """Whether this process should get the keepalive (:data:`GRPC_KEEPALIVE_ENV`)."""
    environ = os.environ if environ is None else environ
    flag = environ.get(GRPC_KEEPALIVE_ENV, "").strip().lower()
    if flag in ("0", "false", "no", "off"):
        return False
    if flag in ("1", "true", "yes", "on"):
        return True
    try:
        cluster = json.loads(environ.get("TF_CONFIG") or "{}").get("cluster") or {}
    except (ValueError, AttributeError):
        return False  # TensorFlow's resolver says what is wrong with it
    return isinstance(cluster, dict) and bool(cluster.get("ps"))


def add_grpc_keepalive(environ: Any = None) -> Optional[str]:
    """Adds the core's keepalive options (the coordinator's protocol object's: a bound
    of its calls to the tasks) that ``TF_GRPC_DEFAULT_OPTIONS`` does not name
    (TF's format: ``name=value`` pairs separated by commas), when
    :func:`keepalive_wanted`; returns the new value, or None when nothing was added."""
    environ = os.environ if environ is None else environ
    if not keepalive_wanted(environ):
        return None
    value = CoordinatorProtocol.grpc_options_with_keepalive(environ.get(GRPC_OPTIONS_ENV, ""))
    if value is not None:
        environ[GRPC_OPTIONS_ENV] = value
    return value


def grpc_keepalive_time(environ: Any = None) -> Optional[float]:
    """The keepalive period (seconds) ``TF_GRPC_DEFAULT_OPTIONS`` sets, or None (then a
    stopped task stalls this coordinator's new ops until it runs again)."""
    environ = os.environ if environ is None else environ
    for item in environ.get(GRPC_OPTIONS_ENV, "").split(","):
        name, _, value = item.partition("=")
        if name.strip() == "grpc.keepalive_time_ms":
            try:
                return int(value) / 1000.0
            except ValueError:
                return None
    return None


#: What :func:`add_grpc_keepalive` did when this module was imported (None: nothing).
GRPC_OPTIONS_ADDED = add_grpc_keepalive()
