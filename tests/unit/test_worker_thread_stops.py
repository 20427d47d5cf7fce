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

from .stop_within import StopWithin  # noqa: E402

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


# ------------------------------------ the failure handler stops during a recovery wait


class Preempted(StandIn):
    """A closure whose worker was restarted: TF's error for it, a worker failure."""

    def __init__(self):
        super().__init__()
        self.runs = 0

    def execute_on(self, worker):
        self.runs += 1
        raise errors.AbortedError(
            None,
            None,
            "Unable to find a context_id matching the specified one. Perhaps the worker "
            "was restarted, or the context was GC'd? Additional GRPC error information "
            "from remote target /job:worker/replica:0/task:0",
        )


def _handler(queue):
    """Our worker-failure handler without its recovery thread (the test plays it)."""
    from tf_failure_handling import coordinator

    handler = object.__new__(coordinator._WorkerPreemptionHandler)
    handler._cluster_update_lock = threading.Lock()
    handler._cluster_due_for_update_or_finish = threading.Event()
    handler._worker_up_cond = threading.Condition(handler._cluster_update_lock)
    handler._error_from_recovery = None
    handler._should_preemption_thread_run = True
    # A recovery bound longer than any here: never the reason.
    handler._protocol = coordinator.CoordinatorProtocol([], recovery_timeout=10 * HANG)
    handler._cluster = types.SimpleNamespace(
        closure_queue=queue,
        _record_and_ignore_transient_ps_failure=lambda e, ps_failure=None: False,
        _record_and_ignore_transient_timeouts=lambda e: False,
    )
    return handler


def _waiting_for_recovery(other_threads: int):
    """A worker thread whose closure failed with its worker and that now waits, in the
    handler's condition, for the recovery; ``other_threads`` other worker threads
    (stand-ins that never end) share its cluster."""
    queue = ClosureQueue()
    handler = _handler(queue)
    others = [types.SimpleNamespace() for _ in range(other_threads)]
    workers = list(others)
    cluster_ = types.SimpleNamespace(failure_handler=handler, closure_queue=queue, workers=workers)
    closure = Preempted()
    queue.put(closure)
    worker = Worker(0, "/job:worker/replica:0/task:0", cluster_)
    workers.insert(0, worker)
    # The thread sets the event under the lock and lets go of the lock only in the
    # condition's wait: once the lock is ours, it waits there.
    assert handler._cluster_due_for_update_or_finish.wait(HANG)
    with handler._cluster_update_lock:
        pass
    assert closure.runs == 1 and queue.qsize() == 1, "the closure went back to the queue"
    return queue, handler, worker, closure


def _thread_of(worker):
    name = f"WorkerClosureProcessingLoop-{worker.worker_index}"
    return next(t for t in threading.enumerate() if t.name == name and t.is_alive())


def test_a_recovery_that_ends_after_the_stop_ends_the_thread_quietly(monkeypatch, caplog):
    """TF's test (testOneWorkerPreemptionWithCancellation) stops the handler while a
    thread waits for a recovery, then the recovery thread finishes its cluster update and
    wakes it. TF's recursive wait_on_failure asserted, its mark_failed asserted (nothing
    in flight) and the thread died; ours reported that as an unexpected stop (a pending
    InternalError) and gave the closure, already put back and run elsewhere, the
    AssertionError. Now: the thread ends, nothing is failed, nothing pending."""

    queue, handler, worker, closure = _waiting_for_recovery(other_threads=1)
    thread = _thread_of(worker)
    # Another thread runs the closure that went back.
    assert queue.get(timeout=HANG) is closure
    queue.mark_finished()
    handler._protocol = StopWithin(handler._protocol, 0.01)
    with handler._cluster_update_lock:  # the recovery thread, in update_server_def
        handler.stop()  # cannot take the lock: gives up after its bound
        handler._worker_up_cond.notify_all()  # "Cluster successfully recovered."
    thread.join(HANG)
    assert not thread.is_alive()
    assert queue._error is None, "no pending error: join() goes on as TF's"
    assert closure.errors == [] and not closure.cancelled
    assert queue.inflight_closure_count == 0
    assert "unexpected error" not in caplog.text
    assert not worker._should_worker_thread_run


def test_stop_wakes_a_thread_waiting_for_a_recovery():
    """The handler's stop() wakes the waits for a recovery that will not come (TF's
    thread waited up to an hour, _WORKER_MAXIMUM_RECOVERY_SEC)."""
    queue, handler, worker, closure = _waiting_for_recovery(other_threads=1)
    thread = _thread_of(worker)
    handler.stop()
    thread.join(HANG)
    assert not thread.is_alive()
    assert queue._error is None
    assert queue.qsize() == 1 and not closure.cancelled, "left queued, as TF leaves it"


def test_the_last_thread_ended_by_a_stop_fails_the_join():
    """With no worker thread left, a closure still queued would never run: a later
    join() raises instead of waiting for good."""
    queue, handler, worker, closure = _waiting_for_recovery(other_threads=0)
    thread = _thread_of(worker)
    handler.stop()
    thread.join(HANG)
    assert not thread.is_alive()
    error = wait_error(queue)
    assert "failure handler was stopped" in str(error)
    assert closure.cancelled, "the queued closure is cancelled with the error, as for any"
    assert queue.inflight_closure_count == 0


def test_a_closure_cancelled_by_the_stop_fails_with_its_own_error():
    """Cluster.stop() stops the handler, then cancels the closures in flight. TF entered
    its wait_on_failure (and its assertion that the handler runs) before the closure
    ran, so such a closure fails with its CancelledError; ours enters it once the
    closure raised, and its assertion replaced that error with an AssertionError."""
    started, release = threading.Event(), threading.Event()

    class Cancelled(StandIn):
        def execute_on(self, worker):
            started.set()
            assert release.wait(HANG)
            raise errors.CancelledError(None, None, "Function was cancelled.")

    queue = ClosureQueue()
    handler = _handler(queue)
    closure = Cancelled()
    queue.put(closure)
    worker = Worker(
        0,
        "/job:worker/replica:0/task:0",
        types.SimpleNamespace(failure_handler=handler, closure_queue=queue, workers=[]),
    )
    assert started.wait(HANG)
    handler.stop()
    release.set()
    with pytest.raises(errors.CancelledError):
        queue.wait(timeout=HANG)
    assert [type(e) for e in closure.errors] == [errors.CancelledError]
    worker._should_worker_thread_run = False


_PS_LOST = (
    "Connection reset by peer. Additional GRPC error information from remote target "
    "/job:ps/replica:0/task:0"
)


@pytest.mark.parametrize(
    ("error", "ps_ignored", "timeout_ignored", "outcome", "asked"),
    [
        # A PS failure within its tolerance: retried; the timeout counter is not asked
        # (TF's `or` short-circuits, and its count depends on it).
        (errors.UnavailableError(None, None, _PS_LOST), True, False, "retried", ["ps"]),
        # A timeout within the cluster's tolerance: retried.
        (errors.DeadlineExceededError(None, None, "slow"), False, True, "retried", ["ps", "t"]),
        # A cancellation derived from another task's failure: retried, not reported.
        (
            errors.CancelledError(None, None, "/job:worker/replica:0/task:1 failed"),
            False,
            False,
            "retried",
            ["ps", "t"],
        ),
        # The closure's own error: raised to the user.
        (errors.InvalidArgumentError(None, None, "bad input"), False, False, "raised", ["ps", "t"]),
    ],
)
def test_a_closures_error_meets_tfs_questions_in_tfs_order(
    error, ps_ignored, timeout_ignored, outcome, asked
):
    """handle_failure asks the core which question comes next (src/failure/response.rs)
    and answers each with TF's own Cluster method; what is asked and what follows is
    TF's order."""
    handler = _handler(ClosureQueue())
    calls = []

    def ps(e, ps_failure=None):
        calls.append("ps")
        return ps_ignored

    def timeouts(e):
        calls.append("t")
        return timeout_ignored

    handler._cluster._record_and_ignore_transient_ps_failure = ps
    handler._cluster._record_and_ignore_transient_timeouts = timeouts
    handler._cluster.closure_queue._cancellation_mgr = types.SimpleNamespace(is_cancelled=False)
    retried, failed = [], []
    got = "retried"
    try:
        with handler.handle_failure(
            on_failure_fn=failed.append, on_transient_failure_fn=lambda: retried.append(1)
        ):
            raise error
    except type(error) as e:
        assert e is error
        got = "raised"
    assert (got, calls, failed) == (outcome, asked, [])
    assert retried == ([1] if outcome == "retried" else [])
