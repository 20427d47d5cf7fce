"""A coordinator worker thread that stops outside a closure's own error handling.

TF's ``Worker._process_queue`` has no handler around its loop: an error there ends
the thread silently, and a ``join()`` then waits forever for closures no thread
takes. Ours (``_coordinator/worker_loop.py``, ``Worker._process_queue``) logs it and
makes it the queue's pending error: an ``InternalError`` naming the worker, caused
by the original error, raised by the next ``join()`` (the queue's ``wait()``) within
its bound. A closure the thread had taken fails with it, so nothing stays counted
as in flight.
"""

from __future__ import annotations

import threading
import types

import pytest

tf = pytest.importorskip("tensorflow", reason="the coordinator's Worker is TF's subclass")

from tensorflow.python.framework import errors  # noqa: E402
from tf_failure_handling._coordinator.closure_queue import ClosureQueue  # noqa: E402
from tf_failure_handling._coordinator.worker_loop import Worker  # noqa: E402

#: Bound on any wait: only turns a hang into a failure.
HANG = 30.0


class StandIn:
    """A closure of TF's interface: records the error its RemoteValue is given."""

    tag = None

    def __init__(self):
        self.errors = []
        self.cancelled = False

    def maybe_call_with_output_remote_value(self, fn):
        fn(types.SimpleNamespace(_set_error=self.errors.append))

    def mark_cancelled(self):
        self.cancelled = True


def cluster(queue):
    return types.SimpleNamespace(failure_handler=None, closure_queue=queue)


def wait_error(queue) -> BaseException:
    with pytest.raises(errors.InternalError) as raised:
        queue.wait(timeout=HANG)
    return raised.value


def test_an_error_before_any_closure_is_raised_by_join():
    reported = threading.Event()

    class Broken(Worker):
        def _maybe_delay(self):
            raise RuntimeError("broken before the loop")

        def _report_stopped(self, e):
            super()._report_stopped(e)
            reported.set()

    queue = ClosureQueue()
    Broken(3, "/job:worker/replica:0/task:3/device:CPU:0", cluster(queue))
    # With nothing scheduled, a join() before the report has nothing to wait for.
    assert reported.wait(HANG), "the stopped thread was not reported"
    error = wait_error(queue)
    assert "/job:worker/task:3" in str(error)
    assert isinstance(error.__cause__, RuntimeError)
    assert queue.inflight_closure_count == 0


def test_a_taken_closure_fails_with_the_thread():
    class Broken(Worker):
        def _process_closure(self, closure):
            raise RuntimeError("broken around a closure")

    queue = ClosureQueue()
    taken, behind = StandIn(), StandIn()
    queue.put(taken)
    queue.put(behind)
    worker = Broken(1, "/job:worker/replica:0/task:1/device:CPU:0", cluster(queue))
    error = wait_error(queue)
    assert "/job:worker/task:1" in str(error) and "broken around a closure" in str(error)
    assert taken.errors == [error], "the taken closure's RemoteValue holds the error"
    assert behind.cancelled, "the closure queued behind it is cancelled, as for any error"
    assert queue.inflight_closure_count == 0
    worker._should_worker_thread_run = False


def test_a_closures_own_error_is_the_closures():
    """Unchanged: an error of the closure itself fails that closure only."""

    class Failing(StandIn):
        def execute_on(self, worker):
            raise ValueError("the closure's own error")

    failure_handler = types.SimpleNamespace(
        wait_on_failure=lambda **kw: _reraise(),
    )
    queue = ClosureQueue()
    closure = Failing()
    queue.put(closure)
    worker = Worker(
        0,
        "/job:worker/replica:0/task:0/device:CPU:0",
        types.SimpleNamespace(failure_handler=failure_handler, closure_queue=queue),
    )
    with pytest.raises(ValueError, match="own error"):
        queue.wait(timeout=HANG)
    assert [type(e) for e in closure.errors] == [ValueError]
    worker._should_worker_thread_run = False


class _reraise:
    """``wait_on_failure`` of a failure handler that lets every error through."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
