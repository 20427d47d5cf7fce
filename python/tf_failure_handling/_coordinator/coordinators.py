"""This process's ``ClusterCoordinator``: ours (registered) or TensorFlow's, and its workers.

The handler finds the coordinator here at save time, a worker's drain when it takes a
worker out of the rotation.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

log = logging.getLogger("tf_failure_handling")

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


def protocol_of(coordinator: Any) -> Any:
    """The protocol object of ``coordinator``'s worker-failure handling (ours: the
    coordinator's ``CoordinatorProtocol``, which its watch then shares), or None (TF's
    coordinator, or none)."""
    handler = getattr(getattr(coordinator, "_cluster", None), "failure_handler", None)
    return getattr(handler, "_protocol", None)


def request_reconnect(coordinator: Any, task: str) -> bool:
    """Asks ``coordinator``'s worker-recovery thread (TensorFlow's
    ``WorkerPreemptionHandler``, ours or TF's) to rebuild the cluster's context, as a
    closure failing on a restarted worker does: ``task`` restarted and no closure has
    gone to it since, so no op reaches it (its notices are not heard) until the
    coordinator reconnects. False where there is no such thread (the coordination
    service's handler, or none running); True once asked (asking again while a
    rebuild is due is a no-op)."""
    handler = getattr(getattr(coordinator, "_cluster", None), "failure_handler", None)
    due = getattr(handler, "_cluster_due_for_update_or_finish", None)
    if due is None or not getattr(handler, "_should_preemption_thread_run", False):
        return False
    if not due.is_set():
        log.info(
            "%s restarted and no closure has gone to it since: reconnecting to it, so that "
            "its termination notices are heard.",
            task,
        )
        # The recovery thread holds its lock while it rebuilds; an Event needs none.
        due.set()
    return True
