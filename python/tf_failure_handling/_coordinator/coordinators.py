"""This process's ``ClusterCoordinator``: ours (registered) or TensorFlow's, and its workers.

The handler finds the coordinator here at save time, a worker's drain when it takes a
worker out of the rotation.
"""

from __future__ import annotations

import weakref
from typing import Any

#: Our live coordinators (``coordinator.ClusterCoordinator`` registers itself).
_coordinators: weakref.WeakSet = weakref.WeakSet()


def register_coordinator(coordinator: Any) -> None:
    """Called by ``ClusterCoordinator.__init__``: the handler finds it here at save time."""
    _coordinators.add(coordinator)


def find_coordinator(strategy: Any = None) -> Any:
    """The live ``ClusterCoordinator`` of this process: ours (registered), else TF's,
    found in ``strategy._cluster_coordinator`` of ``strategy`` or the current strategy
    (a few attribute reads, no search of the heap)."""
    for found in list(_coordinators):
        return found
    candidates = [strategy]
    try:
        from tensorflow.python.distribute import distribute_lib

        if distribute_lib.has_strategy():
            candidates.append(distribute_lib.get_strategy())
    except Exception:  # noqa: BLE001 - no TF, or no strategy: nothing found here
        pass
    for candidate in candidates:
        found = getattr(candidate, "_cluster_coordinator", None)
        if found is not None and hasattr(found, "_cluster"):
            return found
    return None


def strategy_of(checkpoint: Any) -> Any:
    """The ``tf.distribute`` strategy of the first variable ``checkpoint`` tracks, or None
    (read once, when the handler is built)."""
    if callable(getattr(checkpoint, "_sweep", None)) and hasattr(checkpoint, "checkpoint"):
        checkpoint = checkpoint.checkpoint  # a CheckpointManager: its checkpoint
    seen = 0
    stack = [checkpoint]
    while stack and seen < 10_000:
        obj = stack.pop()
        seen += 1
        strategy = getattr(obj, "_distribute_strategy", None)
        if strategy is not None:
            return strategy
        children = getattr(obj, "_trackable_children", None)
        if callable(children):
            try:
                stack.extend(children().values())
            except Exception:  # noqa: BLE001 - an object that cannot list them
                continue
    return None


def workers_of(coordinator: Any) -> list:
    return list(getattr(getattr(coordinator, "_cluster", None), "workers", None) or [])
