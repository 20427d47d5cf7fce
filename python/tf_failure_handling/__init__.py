"""Preemption handling for ``tf.distribute`` on a Rust core.

A drop-in replacement for TensorFlow's failure-handling module: change the
import, or call :func:`patch` to put these classes into ``tf.distribute`` so that
unchanged scripts (and libraries such as tf_keras' ``BackupAndRestore`` or orbit)
use them. Checkpoints, coordination-service keys and exit codes are TensorFlow's.

The package, floor by floor; a module imports only from the floors below its own:

6. **the face**: this module (the public names) and ``__main__`` (``python -m
   tf_failure_handling report``);
5. **built on the API**: ``keras`` (Keras 3's callback, over the handler), ``serving``
   (``serve()``, what a PS or worker task runs), ``testing`` (the fakes; it builds
   handlers), ``report`` (the records' report), ``_patch`` (``patch()``: it puts the
   API's classes into TensorFlow, finding them by module name);
4. **the API**, TensorFlow's classes: ``handler`` (``PreemptionCheckpointHandler``,
   ``TerminationConfig``), ``watcher`` (``PreemptionWatcher``), ``coordinator``
   (``ClusterCoordinator``), none of which imports another;
3. ``_protocol/``: the handler's protocol driver, one concern a class (its docstring
   lists them);
2. ``_coordinator/``: the coordinator's closures, its closure queue and the
   parameter-server control; ``_platforms/``: platform detection and the notice sources,
   SLURM among them; ``_cluster/``: membership and the coordination service;
   ``_integrations/``: the Keras internals and the TensorFlow releases relied on. None
   imports another;
1. **the ground**: ``_native`` (the Rust core), ``_errors`` (TensorFlow's error types)
   and ``_failure`` (the failure classifier), which the native module imports by these
   names, so they stay here; ``records`` (the preemption records' format).
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
