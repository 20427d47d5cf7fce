"""The coordinator's closure queue: TensorFlow's ``_CoordinatedClosureQueue`` on a native core.

The queue itself (main queue, per-worker tag queues, in-flight count, first error,
waits) is :class:`tf_failure_handling._native.ClosureQueue`; this module only adds
what TensorFlow's ``Cluster`` and ``Worker`` read from it: the cancellation manager.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional

from .._native import ClosureQueue as _NativeClosureQueue

log = logging.getLogger("tf_failure_handling")

#: TensorFlow's ``_CLOSURE_QUEUE_MAX_SIZE``.
MAX_SIZE: int = _NativeClosureQueue.MAX_SIZE

_manager_factory: Optional[Callable[[], Any]] = None


class _CancellationManager:
    """Stand-in for ``tensorflow.python.eager.cancellation.CancellationManager`` without TF."""

    def __init__(self) -> None:
        self._cancelled = False

    @property
    def is_cancelled(self) -> bool:
        return self._cancelled

    def start_cancel(self) -> None:
        self._cancelled = True

    def get_cancelable_function(self, concrete_function: Any) -> Any:
        return concrete_function


def _new_cancellation_manager() -> Any:
    """TensorFlow's ``CancellationManager`` when TF is importable, else the stand-in."""
    global _manager_factory
    if _manager_factory is None:
        try:
            from tensorflow.python.eager import cancellation
        except ImportError:
            _manager_factory = _CancellationManager
        else:
            _manager_factory = cancellation.CancellationManager
    return _manager_factory()


class ClosureQueue(_NativeClosureQueue):
    """Replaces ``cluster_coordinator._CoordinatedClosureQueue``, with the same interface.

    ``put(closure, tag=None)``, ``get(timeout=None, tag=None)``, ``mark_finished()``,
    ``put_back(closure)``, ``mark_failed(e)``, ``wait(timeout=None)``, ``done()``,
    ``stop()``, ``clear_tag_unlocked(tag)``, ``inflight_closure_count`` (and its setter),
    ``_inflight_closure_count``, ``_error`` (the pending error) and ``_cancellation_mgr``
    behave as TensorFlow's (tags are worker indices), and a cancellation logs TF's
    ``Start cancelling closures due to error ...`` at ERROR. Blocking calls release the
    GIL and answer Ctrl-C; where the timeouts, ``put_back``, ``put`` and ``done()``
    differ from TF's: docs/differences.md.

    The three reports of a closure a worker took are the native ``finish``:
    ``mark_finished()`` is ``finish()`` and ``mark_failed(e)`` is ``finish(e)`` (the
    same method, so the worker's hot path is one native call).
    """

    #: TF's ``mark_finished()``: the closure taken last by a worker finished.
    mark_finished = _NativeClosureQueue.finish
    #: TF's ``mark_failed(e)``: a closure taken by a worker failed with ``e``.
    mark_failed = _NativeClosureQueue.finish
    #: Whether :meth:`stop` was called (every ``get`` returns None since).
    stopped = False

    def __init__(self, max_size: int = MAX_SIZE) -> None:
        self._cancellation_mgr = _new_cancellation_manager()

    def put_back(self, closure: Any) -> None:
        """TF's: the closure a worker took goes back to the tail of the main queue
        (cancelled instead when an error is pending)."""
        self.finish(put_back=closure)

    def done(self) -> bool:
        """TF's: whether nothing is queued or in flight; raises the pending error."""
        return self.wait(0)

    @property
    def _inflight_closure_count(self) -> int:
        """TensorFlow's private counter, as a view of the native one.

        TensorFlow's tests read it and add to it (``+= 1`` holds a ``join()``
        open, ``-= 1`` lets it return); both act on the count the queue waits on.
        """
        return self.inflight_closure_count

    @_inflight_closure_count.setter
    def _inflight_closure_count(self, value: int) -> None:
        self.inflight_closure_count = value

    def _start_cancel(self) -> None:
        # Called by the native side, holding no lock, before it waits for the
        # closures in flight. TF's log lines, at TF's levels.
        error = self._error
        log.error("Start cancelling closures due to error %r: %s", error, error)
        log.info("Canceling all closures: waiting for inflight closures to finish")
        self._cancellation_mgr.start_cancel()

    def _cancel_done(self) -> None:
        # A cancelled manager cannot be reused (TF recreates it the same way).
        self._cancellation_mgr = _new_cancellation_manager()

    def stop(self) -> None:
        """Releases every ``get`` (they return None) and cancels running closures."""
        self.stopped = True
        super().stop()
        self._cancellation_mgr.start_cancel()
