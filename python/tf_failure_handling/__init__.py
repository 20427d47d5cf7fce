"""Preemption handling for ``tf.distribute`` on a Rust core.

A drop-in replacement for TensorFlow's failure-handling module: change the import, or
call :func:`patch` so that unchanged scripts (and tf_keras, orbit) use these classes.
Checkpoints, coordination-service keys and exit codes are TensorFlow's. How the package
is layered: docs/development.md, "The package, floor by floor".
"""

from __future__ import annotations

from typing import Any

from ._native import __version__
from ._patch import patch, unpatch
from .handler import PreemptionCheckpointHandler, TerminationConfig
from .serving import serve
from .watcher import PreemptionWatcher

# The coordinator needs TensorFlow; it is imported on first use so that this
# package (and its `testing` module) imports fast and without TF.
_COORDINATOR_NAMES = (
    "ClusterCoordinator",
    "PerWorkerValue",
    "PerWorkerValues",
    "RemoteValue",
    "experimental_get_current_worker_index",
)

__all__ = [
    "PreemptionCheckpointHandler",
    "PreemptionWatcher",
    "TerminationConfig",
    "__version__",
    "patch",
    "serve",
    "unpatch",
    *_COORDINATOR_NAMES,
]


def __getattr__(name: str) -> Any:
    if name in _COORDINATOR_NAMES:
        from . import coordinator

        return getattr(coordinator, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
