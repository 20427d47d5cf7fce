"""Lets a coordinator process end while TensorFlow's coordination-service poller runs,
or while TensorFlow's own coordinator recovers a worker.

:func:`install` registers :func:`stop_now` with ``threading._register_atexit``; why, and
why not the failure handler's own ``stop()``: docs/how-it-works.md, "The coordinator".
For TensorFlow's own ``WorkerPreemptionHandler`` it also registers
:func:`stop_recoveries` with ``atexit`` (:func:`stop_recovery` says why).
Everything of TensorFlow's is looked up by name and may be missing (logged at debug);
TensorFlow is never imported here.
"""

from __future__ import annotations

import atexit
import logging
import sys
import threading
import weakref
from typing import Any, Callable, Optional

from .._native import CoordinatorProtocol

Lane = CoordinatorProtocol.Lane

log = logging.getLogger("tf_failure_handling")

_CC = "tensorflow.python.distribute.coordinator.cluster_coordinator"
_UTILS = "tensorflow.python.distribute.coordinator.utils"

_lock = threading.Lock()
_registered = False
#: The pollers of the coordinators given to install(), weakly.
_pollers: list[weakref.ReferenceType] = []
#: TensorFlow's own worker-recovery handlers of the coordinators given to install(),
#: weakly, and whether stop_recoveries is registered.
_recoveries: list[weakref.ReferenceType] = []
_recoveries_registered = False


def install(coordinator: Optional[Any] = None) -> None:
    """Arranges for TF's coordination-service poller, and TF's own worker-recovery
    thread, to stop at interpreter shutdown.

    ``coordinator``: a ``ClusterCoordinator`` (TF's or ours) whose poller to stop, or
    None to stop whatever poller the live threads show at shutdown. A coordinator
    without a poller (coordination service not enabled) registers no poller stop.
    TensorFlow's own ``WorkerPreemptionHandler`` (that of ``coordinator``, or with None
    those the live threads show) is stopped by :func:`stop_recoveries`. Idempotent;
    call it any time before the shutdown starts.
    """
    _install_recovery_stop(coordinator)
    poller = None
    if coordinator is not None:
        poller = _poller_of(coordinator)
        if poller is None:
            return
    global _registered
    with _lock:
        if poller is not None and not any(ref() is poller for ref in _pollers):
            _pollers.append(weakref.ref(poller))
        if _registered:
            return
        register: Optional[Callable[..., Any]] = getattr(threading, "_register_atexit", None)
        if register is None:
            log.debug("threading._register_atexit is missing: TF's poller is not stopped")
            return
        try:
            register(stop_now)
        except RuntimeError as e:  # the shutdown has started
            log.debug("Cannot stop TF's poller at shutdown: %s", e)
            return
        _registered = True


def _kept_and_live(refs: list, live: Callable[[], list]) -> list:
    """The objects the weak references ``refs`` still reach (read under ``_lock``), then
    those ``live()`` finds among the live threads, each once (by identity)."""
    with _lock:
        found = [ref() for ref in refs]
    unique: list[Any] = []
    for obj in found + live():
        if obj is not None and not any(obj is u for u in unique):
            unique.append(obj)
    return unique


def stop_now() -> None:
    """Stops every coordination-service poller now; it does not start again.

    Called at interpreter shutdown once :func:`install` ran. Before that, only when the
    process is about to end: the coordinator no longer sees a worker's failure after it.
    Never raises (it runs inside ``threading._shutdown``).
    """
    try:
        stopped = _kept_and_live(_pollers, _pollers_of_live_threads)
        for poller in stopped:
            _stop(poller)
        if stopped:
            log.info(
                "Stopped TensorFlow's coordination-service task-state poller (%d) so the "
                "process can exit.",
                len(stopped),
            )
    except Exception:  # the shutdown goes on whatever happens here
        log.debug("Stopping TF's coordination-service poller failed", exc_info=True)


def _poller_of(coordinator: Any) -> Optional[Any]:
    cluster = getattr(coordinator, "_cluster", None)
    handler = getattr(cluster, "failure_handler", None)
    poller = getattr(handler, "_task_state_poller_thread", None)
    if poller is None:
        log.debug(
            "%s has no coordination-service poller (failure handler %s)",
            type(coordinator).__name__,
            type(handler).__name__,
        )
    return poller


def _pollers_of_live_threads() -> list[Any]:
    """The ``RepeatedTimer`` of each live Timer thread that polls for TF's
    ``CoordinationServicePreemptionHandler``."""
    cc = sys.modules.get(_CC)
    utils = sys.modules.get(_UTILS)
    handler_type = getattr(cc, "CoordinationServicePreemptionHandler", None)
    timer_type = getattr(utils, "RepeatedTimer", None)
    if handler_type is None or timer_type is None:
        if cc is not None:
            log.debug("TF's CoordinationServicePreemptionHandler or RepeatedTimer is missing")
        return []
    found = []
    for thread in threading.enumerate():
        # threading.Timer(interval, function): the RepeatedTimer's bound _run.
        poller = getattr(getattr(thread, "function", None), "__self__", None)
        if isinstance(poller, timer_type) and isinstance(
            getattr(getattr(poller, "function", None), "__self__", None), handler_type
        ):
            found.append(poller)
    return found


def _no_start() -> None:
    """Stands in for a stopped poller's ``start``."""


def _stop(poller: Any) -> None:
    stop = getattr(poller, "stop", None)
    if not callable(stop):
        log.debug("%s has no stop(): not stopped", type(poller).__name__)
        return
    # RepeatedTimer._run clears is_running, calls start() (arms the next Timer) and
    # then polls. A stop() between the first two would cancel the Timer that already
    # fired and leave the next one armed; with start() a no-op on this instance, a run
    # in flight arms nothing.
    poller.start = _no_start
    stop()


def _tf_recovery(handler: Any) -> bool:
    """Whether ``handler`` is TensorFlow's own ``WorkerPreemptionHandler`` with TF's
    ``stop`` (ours bounds its stop itself)."""
    tf_type = getattr(sys.modules.get(_CC), "WorkerPreemptionHandler", None)
    return (
        tf_type is not None
        and isinstance(handler, tf_type)
        and getattr(type(handler), "stop", None) is getattr(tf_type, "stop", None)
    )


def _install_recovery_stop(coordinator: Optional[Any]) -> None:
    """Registers :func:`stop_recoveries` with ``atexit`` (once), keeping
    ``coordinator``'s failure handler when it is TF's own (:func:`_tf_recovery`); with no
    coordinator, or another handler, the ones the live threads show are stopped."""
    handler = getattr(getattr(coordinator, "_cluster", None), "failure_handler", None)
    if coordinator is not None and not _tf_recovery(handler):
        return
    global _recoveries_registered
    with _lock:
        if handler is not None and not any(ref() is handler for ref in _recoveries):
            _recoveries.append(weakref.ref(handler))
        if not _recoveries_registered:
            atexit.register(stop_recoveries)
            _recoveries_registered = True


def _recoveries_of_live_threads() -> list[Any]:
    """TF's own ``WorkerPreemptionHandler`` of each live recovery thread (its target is
    the handler's bound ``_preemption_handler``)."""
    found = []
    for thread in threading.enumerate():
        handler = getattr(getattr(thread, "_target", None), "__self__", None)
        if _tf_recovery(handler):
            found.append(handler)
    return found


def stop_recoveries() -> None:
    """:func:`stop_recovery` of every handler :func:`install` kept or the live threads
    show, each within the core's bound. Called by ``atexit``: after the
    non-daemon threads are joined, before the interpreter freezes the daemon ones.
    Never raises."""
    try:
        for handler in _kept_and_live(_recoveries, _recoveries_of_live_threads):
            stop_recovery(handler)
    except Exception:  # the shutdown goes on whatever happens here
        log.debug("Stopping TF's worker-recovery thread failed", exc_info=True)


def _stopped() -> None:
    """Stands in for the ``stop`` of a handler :func:`stop_recovery` stopped."""


def stop_recovery(handler: Any) -> bool:
    """Stops TensorFlow's ``WorkerPreemptionHandler`` as its ``stop()`` does, waiting for
    its recovery thread as long as the coordinator's protocol object says (its stop
    lane: the lock, then the thread's end, within one bound); True if that thread ended.

    Its recovery thread (a daemon) holds ``_cluster_update_lock`` while it rebuilds the
    cluster (``update_server_def``: a worker that restarted, or is away). TF's
    ``ClusterCoordinator.__del__`` calls ``stop()``, which takes that lock, and it runs
    when the interpreter collects the coordinator at exit, after daemon threads are
    frozen: a recovery under way then never lets go, and the process hung at exit
    (a worker restarted near the end of training). Here, before they freeze: the thread
    is told to stop, a rebuild under way gets the bound to end (then the thread
    ends), and the handler's ``stop`` becomes a no-op: its work (the flag, the event) is
    done, and nothing at exit waits on the lock any more."""
    thread = getattr(handler, "_preemption_handler_thread", None)
    lock = handler._cluster_update_lock
    protocol = CoordinatorProtocol([])
    bound = protocol.poll(Lane.Stop()).timeout
    handler._should_preemption_thread_run = False
    if lock.acquire(timeout=bound):
        try:
            handler._cluster_due_for_update_or_finish.set()
        finally:
            lock.release()
    else:
        handler._cluster_due_for_update_or_finish.set()
    if thread is not None:
        thread.join(protocol.poll_timeout(Lane.Stop()))
    handler.stop = _stopped
    ended = thread is None or not thread.is_alive()
    if ended:
        log.info("Stopped TensorFlow's worker-recovery thread so the process can exit.")
    else:
        log.warning(
            "TensorFlow's worker-recovery thread was still rebuilding the cluster after %gs "
            "(a worker is away); the process exits without waiting for it.",
            bound,
        )
    return ended
