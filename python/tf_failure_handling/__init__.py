"""Preemption handling for ``tf.distribute`` on a Rust core.

A drop-in replacement for TensorFlow's failure-handling module: change the
import, or call :func:`patch` to put these classes into ``tf.distribute`` so that
unchanged scripts (and libraries such as tf_keras' ``BackupAndRestore`` or orbit)
use them. Checkpoints, coordination-service keys and exit codes are TensorFlow's.
"""

from __future__ import annotations

from ._native import __version__
from ._patch import patch, unpatch
from .handler import PreemptionCheckpointHandler, TerminationConfig

__all__ = [
    "PreemptionCheckpointHandler",
    "TerminationConfig",
    "__version__",
    "patch",
    "unpatch",
]
