"""This process's ``ClusterCoordinator``: ours (registered) or TensorFlow's, and its workers.

The handler finds the coordinator here at save time, a worker's drain when it takes a
worker out of the rotation.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from typing import Any, Iterator

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


def request_reconnect(coordinator: Any, task: str, bound: float) -> bool:
    """Asks ``coordinator``'s worker-recovery thread (TensorFlow's
    ``WorkerPreemptionHandler``, ours or TF's) to rebuild the cluster's context, as a
    closure failing on a restarted worker does: ``task`` restarted and no closure has
    gone to it since, so no op reaches it (its notices are not heard) until the
    coordinator reconnects.

    No closure goes to ``task``'s worker while the rebuild runs (with ours, its thread
    is held; with TF's, no thread takes a closure): TensorFlow registers the
    coordinator's functions on the new process during ``update_server_def``, and a
    closure sent meanwhile failed with "Op type not registered", which no coordinator
    takes for a worker failure. TF's own path has no such race: the thread whose
    closure failed waits for the rebuild. Each step (the hold, the lock, the rebuild)
    waits at most ``bound`` seconds (the core's action says how long).

    False where there is no such thread (the coordination service's handler, or none
    running); True once asked (a rebuild already due is left to TF's own path)."""
    handler = getattr(getattr(coordinator, "_cluster", None), "failure_handler", None)
    due = getattr(handler, "_cluster_due_for_update_or_finish", None)
    if due is None or not getattr(handler, "_should_preemption_thread_run", False):
        return False
    if due.is_set():
        return True
    log.info(
        "%s restarted and no closure has gone to it since: reconnecting to it, so that "
        "its termination notices are heard.",
        task,
    )
    with _no_closure_to(coordinator, task, bound):
        lock = handler._cluster_update_lock
        if not lock.acquire(timeout=bound):
            log.warning(
                "Reconnecting to %s: TensorFlow's cluster-update lock was not free within "
                "%gs (a rebuild is under way); not asking for another.",
                task,
                bound,
            )
            return True
        try:
            # As TF's worker threads ask: the recovery thread takes the lock that the
            # wait lets go of, rebuilds, and wakes the wait.
            due.set()
            if not handler._worker_up_cond.wait(bound):
                log.warning(
                    "Reconnecting to %s: the cluster was not rebuilt within %gs; closures "
                    "go to it again, and TF's own path reconnects if one fails.",
                    task,
                    bound,
                )
        finally:
            lock.release()
    return True


@contextlib.contextmanager
def _no_closure_to(coordinator: Any, task: str, bound: float) -> Iterator[None]:
    """No new closure goes to ``task``'s worker inside the block: ours holds that
    worker's thread (and waits, within ``bound``, for its closure in flight); TF's
    cannot hold one worker, so its closure queue is locked (within ``bound``): no
    thread takes a closure and ``schedule()`` waits."""
    workers = workers_of(coordinator)
    index = int(task.rsplit(":", 1)[1]) if task.startswith("/job:worker/") else -1
    worker = workers[index] if 0 <= index < len(workers) else None
    if callable(getattr(worker, "hold", None)):
        worker.hold("reconnect")
        try:
            if not worker.wait_idle(bound):
                log.warning(
                    "Reconnecting to %s: its closure in flight did not finish within %gs; "
                    "reconnecting anyway.",
                    task,
                    bound,
                )
            yield
        finally:
            worker.resume("reconnect")
        return
    queue = getattr(getattr(coordinator, "_cluster", None), "closure_queue", None)
    queue_lock = getattr(queue, "_queue_lock", None)
    if queue_lock is None or not queue_lock.acquire(timeout=bound):
        if queue_lock is not None:
            log.warning(
                "Reconnecting to %s: TensorFlow's closure queue was not free within %gs; "
                "reconnecting while closures may still go to it.",
                task,
                bound,
            )
        yield
        return
    try:
        yield
    finally:
        queue_lock.release()
