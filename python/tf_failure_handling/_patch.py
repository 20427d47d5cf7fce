"""``patch()`` / ``unpatch()``: route ``tf.distribute``'s names to this package."""

from __future__ import annotations

import threading
from typing import Any

_lock = threading.Lock()
_saved: dict = {}


def _targets() -> list:
    """``(namespace, attribute, replacement)`` for every name this package replaces."""
    import tensorflow as tf
    from tensorflow.python.distribute.coordinator import cluster_coordinator
    from tensorflow.python.distribute.failure_handling import (
        failure_handling,
        preemption_watcher,
    )

    from .coordinator import ClusterCoordinator
    from .handler import PreemptionCheckpointHandler, TerminationConfig
    from .watcher import PreemptionWatcher

    experimental = tf.distribute.experimental
    return [
        (experimental.coordinator, "ClusterCoordinator", ClusterCoordinator),
        (tf.distribute.coordinator, "ClusterCoordinator", ClusterCoordinator),
        (cluster_coordinator, "ClusterCoordinator", ClusterCoordinator),
        (experimental, "PreemptionCheckpointHandler", PreemptionCheckpointHandler),
        (experimental, "TerminationConfig", TerminationConfig),
        (experimental, "PreemptionWatcher", PreemptionWatcher),
        (preemption_watcher, "PreemptionWatcher", PreemptionWatcher),
        # Libraries that import the module directly (tf_keras' BackupAndRestore).
        (failure_handling, "PreemptionCheckpointHandler", PreemptionCheckpointHandler),
        (failure_handling, "WorkerPreemptionHandler", PreemptionCheckpointHandler),
        (failure_handling, "TerminationConfig", TerminationConfig),
    ]


def patch() -> None:
    """Makes TensorFlow's names this package's classes.

    ``tf.distribute.experimental.PreemptionCheckpointHandler``, ``TerminationConfig``,
    ``PreemptionWatcher``,
    ``tf.distribute[.experimental].coordinator.ClusterCoordinator`` and the modules
    TF defines them in. Idempotent; undone by :func:`unpatch`.
    """
    with _lock:
        for namespace, name, replacement in _targets():
            key = (id(namespace), name)
            if key not in _saved:
                _saved[key] = (namespace, name, getattr(namespace, name, None))
            setattr(namespace, name, replacement)


def unpatch() -> None:
    """Restores TensorFlow's own classes."""
    with _lock:
        for namespace, name, original in _saved.values():
            _restore(namespace, name, original)
        _saved.clear()


def _restore(namespace: Any, name: str, original: Any) -> None:
    if original is None:
        if hasattr(namespace, name):
            delattr(namespace, name)
    else:
        setattr(namespace, name, original)
