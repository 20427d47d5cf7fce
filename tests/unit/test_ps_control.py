"""The parameter-server control with fakes (issue 32): ``TaskControl``, the bounded
calls, ``ClusterPoller``, ``WorkerDrain``, the coordinator's hold before a save, and the
worker thread's holds.

No TensorFlow cluster: the transport to the tasks is a function of the test, the
coordinator and its workers are small fakes with the interface the ``_coordinator``
modules read.
Every wait is bounded; no verdict depends on how fast the machine is.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time

import pytest
from tf_failure_handling._coordinator import (
    closure_drain,
    cluster_poller,
    coordinators,
    grpc_keepalive,
    task_calls,
    worker_drain,
)
from tf_failure_handling._coordinator.worker_loop import Worker, _Holds
from tf_failure_handling._native import CoordinatorProtocol, TaskProtocol

CoordinatorAction = CoordinatorProtocol.Action
CoordinatorEvent = CoordinatorProtocol.Event
Lane = CoordinatorProtocol.Lane
TaskAction = TaskProtocol.Action
TaskEvent = TaskProtocol.Event

BOUND = 10.0  # turns a hang into a failure
#: A served task serves at most this many times its own bound (src/ps_control.rs).
SERVE_CAP_FACTOR = 3.0


class NotFound(Exception):
    """What TF raises for a task that does not run serve()."""

    def __init__(self) -> None:
        super().__init__(f"Could not find callback with key={task_calls.TOKEN}")


class UnavailableError(Exception):
    """Named as TF's: the task's server is gone."""


# ----------------------------------------------------------------------- TaskControl


def ask(control: task_calls.TaskControl, request) -> dict:
    raw = request if isinstance(request, bytes) else json.dumps(request).encode()
    return json.loads(control(raw))


def test_task_control_poll_answers_incarnation_and_notice():
    control = task_calls.TaskControl("ps", 0)
    answer = ask(control, {"op": "poll"})
    assert answer == {
        "incarnation": control.incarnation,
        "job": "ps",
        "task": 0,
        "notice": None,
    }
    control.set_notice("signal SIGTERM", 123.0)
    control.set_notice("later", None)  # the first notice stays
    notice = ask(control, {"op": "poll"})["notice"]
    assert notice["source"] == "signal SIGTERM" and notice["deadline"] == 123.0


def test_task_control_refuses_a_release_before_its_notice():
    """Item 5: a release sent ahead of the notice (pre-arming) does not count."""
    control = task_calls.TaskControl("ps", 0)
    answer = ask(control, {"op": "release", "reason": "x", "incarnation": control.incarnation})
    assert answer == {"released": False, "why": "no notice to release"}
    control.set_notice("signal SIGTERM", None)
    assert not control.released.is_set()


def test_task_control_refuses_a_release_of_another_incarnation_or_notice():
    control = task_calls.TaskControl("worker", 1)
    control.set_notice("signal SIGTERM", None)
    at = ask(control, {"op": "poll"})["notice"]["at"]
    for request, why in (
        ({"op": "release", "notice_at": at}, "not this incarnation"),
        ({"op": "release", "incarnation": "1-2", "notice_at": at}, "not this incarnation"),
        (
            {"op": "release", "incarnation": control.incarnation, "notice_at": at - 1},
            "not this notice",
        ),
    ):
        assert ask(control, request) == {"released": False, "why": why}
    assert not control.released.is_set()


def test_task_control_release_of_this_notice_counts():
    control = task_calls.TaskControl("worker", 1)
    control.set_notice("signal SIGTERM", None)
    at = ask(control, {"op": "poll"})["notice"]["at"]
    answer = ask(
        control,
        {"op": "release", "reason": "drained", "incarnation": control.incarnation, "notice_at": at},
    )
    assert answer == {"released": True}
    assert control.released.is_set() and control.release_reason == "drained"


@pytest.mark.parametrize("raw", [b"not json", b"[1, 2]", b'"poll"'])
def test_task_control_answers_bad_requests_with_an_error(raw):
    assert "error" in ask(task_calls.TaskControl("ps", 0), raw)


def test_task_control_answers_an_unknown_op_with_an_error():
    assert ask(task_calls.TaskControl("ps", 0), {"op": "exit"}) == {"error": "unknown op 'exit'"}


# ------------------------------------------------------------------- bounded calls


def test_call_returns_the_answer_and_raises_the_error():
    def transport(task, request):
        if task == "bad":
            raise UnavailableError("gone")
        return {"task": task, "op": request["op"]}

    caller = task_calls._Caller(transport)
    assert caller("t", {"op": "poll"}, BOUND) == {"task": "t", "op": "poll"}
    with pytest.raises(UnavailableError):
        caller("bad", {"op": "poll"}, BOUND)


def test_call_to_a_task_that_does_not_answer_gives_up_at_its_bound():
    """Item 4: a call to a stopped task returns at its bound, and a second call to that
    task fails at once (no thread piles up) until the first returns."""
    stopped = threading.Event()

    def transport(task, request):
        if task == "stopped":
            stopped.wait(BOUND)
        return {"task": task}

    caller = task_calls._Caller(transport)
    with pytest.raises(task_calls.CallTimeout, match=r"did not answer 'poll' within 0\.2s"):
        caller("stopped", {"op": "poll"}, 0.2)
    threads = threading.active_count()
    with pytest.raises(task_calls.CallTimeout, match="earlier call has not returned"):
        caller("stopped", {"op": "poll"}, BOUND)
    assert threading.active_count() == threads
    assert caller("other", {"op": "poll"}, BOUND) == {"task": "other"}
    stopped.set()  # SIGCONT: the first call returns, the task is asked again
    deadline = time.monotonic() + BOUND
    while True:
        try:
            assert caller("stopped", {"op": "poll"}, BOUND) == {"task": "stopped"}
            break
        except task_calls.CallTimeout:
            assert time.monotonic() < deadline, "the stopped task's call never returned"
            time.sleep(0.01)


def clocked_calls(now: list) -> CoordinatorProtocol:
    """The coordinator's protocol object, which decides whether a call to a task may
    start (its bounds: a call is abandoned after 30 s, at most 4 per task), on the
    test's clock (``now[0]``)."""
    return CoordinatorProtocol([], clock=lambda: now[0])


def test_a_call_that_never_returns_is_abandoned_and_the_task_asked_again(caplog):
    """A call that never returns (one caught in TF's cluster update after a restart)
    holds up its task's calls for ``abandon_after`` seconds, not for good: then the
    task is asked again, and its answer counts."""
    now = [0.0]
    stuck = threading.Event()
    calls = []

    def transport(task, request):
        calls.append(task)
        if len(calls) == 1:
            stuck.wait(BOUND)  # the first call does not return in this test
        return {"task": task, "n": len(calls)}

    caller = task_calls._Caller(transport, clocked_calls(now))
    try:
        with pytest.raises(task_calls.CallTimeout, match="did not answer"):
            caller("w", {"op": "poll"}, 0.05)
        now[0] = 29.0
        with pytest.raises(task_calls.CallTimeout, match=r"has not returned yet \(29s\)"):
            caller("w", {"op": "poll"}, BOUND)
        assert calls == ["w"]
        now[0] = 30.0
        with caplog.at_level(logging.WARNING, logger="tf_failure_handling"):
            assert caller("w", {"op": "poll"}, BOUND) == {"task": "w", "n": 2}
        assert "has not returned for 30s; it is abandoned (1 of at most 4)" in caplog.text
        assert caller("w", {"op": "poll"}, BOUND) == {"task": "w", "n": 3}
    finally:
        stuck.set()


def test_abandoned_calls_are_bounded_per_task():
    """A task whose every call hangs (a stopped process) holds ``max_abandoned`` (4) + 1
    threads at most, however long it stays stopped."""
    now = [0.0]
    stopped = threading.Event()

    def transport(task, request):
        stopped.wait(BOUND)
        return {"task": task}

    caller = task_calls._Caller(transport, clocked_calls(now))
    try:
        for _ in range(5):  # the first call, then four abandoned ones replaced
            with pytest.raises(task_calls.CallTimeout, match="did not answer"):
                caller("stopped", {"op": "poll"}, 0.05)
            now[0] += 30.0
        threads = threading.active_count()
        with pytest.raises(task_calls.CallTimeout, match="4 abandoned call"):
            caller("stopped", {"op": "poll"}, BOUND)
        now[0] += 100.0
        with pytest.raises(task_calls.CallTimeout, match="4 abandoned call"):
            caller("stopped", {"op": "poll"}, BOUND)
        assert threading.active_count() == threads
    finally:
        stopped.set()


# ------------------------------------------------------------------- ClusterPoller

SPEC = {"chief": ["c"], "ps": ["p"], "worker": ["w0", "w1"]}
PS = "/job:ps/replica:0/task:0"
W0 = "/job:worker/replica:0/task:0"
W1 = "/job:worker/replica:0/task:1"


class FakeCluster:
    """The tasks' answers, set by the test: a TaskControl per task, or an error."""

    def __init__(self) -> None:
        self.controls: dict = {}
        self.errors: dict = {}
        self.calls: list = []

    def serve(self, task: str, job: str, index: int) -> task_calls.TaskControl:
        control = self.controls[task] = task_calls.TaskControl(job, index)
        self.errors.pop(task, None)
        return control

    def __call__(self, task, request, timeout=None):
        self.calls.append((task, request["op"]))
        if task in self.errors:
            raise self.errors[task]
        return json.loads(self.controls[task](json.dumps(request).encode()))


def make_poller(cluster: FakeCluster, notices: list, released=None):
    return cluster_poller.ClusterPoller(
        SPEC,
        lambda *n: notices.append(n),
        interval=0.01,
        on_released=(lambda *r: released.append(r)) if released is not None else None,
        caller=cluster,
    )


def test_poller_asks_every_ps_and_worker_task():
    cluster, notices = FakeCluster(), []
    for task, job, i in ((PS, "ps", 0), (W0, "worker", 0), (W1, "worker", 1)):
        cluster.serve(task, job, i)
    poller = make_poller(cluster, notices)
    assert poller.tasks == [PS, W0, W1]
    poller.poll_once()
    assert [t for t, _ in cluster.calls] == [PS, W0, W1]
    assert notices == []
    assert poller.incarnations[W1] == cluster.controls[W1].incarnation


def test_poller_hands_on_each_incarnations_first_notice_once():
    cluster, notices = FakeCluster(), []
    for task, job, i in ((PS, "ps", 0), (W0, "worker", 0), (W1, "worker", 1)):
        cluster.serve(task, job, i)
    poller = make_poller(cluster, notices)
    cluster.controls[W1].set_notice("signal SIGTERM", 50.0)
    poller.poll_once()
    poller.poll_once()
    assert notices == [("worker", 1, "signal SIGTERM", 50.0)]
    # The restarted worker (a new incarnation) is preempted again: handed on again.
    cluster.serve(W1, "worker", 1).set_notice("signal SIGTERM", None)
    poller.poll_once()
    assert notices[1:] == [("worker", 1, "signal SIGTERM", None)]


def test_a_task_that_did_not_serve_yet_is_asked_again_and_watched():
    """Item 2: a task whose control is not registered yet ("Could not find callback":
    a restarted task whose serve() has not installed it) was never asked again. Now
    every round asks it, and its notice is handed on once it serves."""
    cluster, notices = FakeCluster(), []
    cluster.serve(PS, "ps", 0)
    cluster.serve(W0, "worker", 0)
    cluster.errors[W1] = NotFound()
    poller = make_poller(cluster, notices)
    poller.poll_once()
    poller.poll_once()
    assert cluster.calls.count((W1, "poll")) == 2
    cluster.serve(W1, "worker", 1).set_notice("signal SIGTERM", None)
    poller.poll_once()
    assert notices == [("worker", 1, "signal SIGTERM", None)]


def test_a_task_that_does_not_answer_is_asked_again():
    cluster, notices = FakeCluster(), []
    cluster.serve(PS, "ps", 0)
    cluster.serve(W0, "worker", 0)
    cluster.errors[W1] = UnavailableError("connection refused")
    poller = make_poller(cluster, notices)
    poller.poll_once()
    assert poller.unanswered == {W1: "UnavailableError"}
    cluster.serve(W1, "worker", 1).set_notice("kubernetes", 9.0)
    poller.poll_once()
    assert poller.unanswered == {}
    assert notices == [("worker", 1, "kubernetes", 9.0)]


def test_the_log_tells_why_a_task_is_unanswered_and_when_it_is_back(caplog):
    """One line per streak and reason (not one per round), one when the task answers
    again, and one naming a new incarnation: the coordinator's log shows whether a
    restarted worker is watched."""
    cluster, notices = FakeCluster(), []
    first = cluster.serve(W1, "worker", 1)
    poller = make_poller(cluster, notices)
    with caplog.at_level(logging.INFO, logger="tf_failure_handling"):
        poller.poll_once()
        cluster.errors[W1] = UnavailableError("connection refused")
        poller.poll_once()
        poller.poll_once()
        cluster.errors[W1] = task_calls.CallTimeout("an earlier call has not returned yet")
        poller.poll_once()
        cluster.serve(W1, "worker", 1)
        poller.poll_once()
    lines = [r.getMessage() for r in caplog.records if W1 in r.getMessage()]
    assert len([m for m in lines if "connection refused" in m]) == 1, lines
    assert len([m for m in lines if "has not returned yet" in m]) == 1, lines
    new = cluster.controls[W1].incarnation
    assert lines[-1].endswith(f"answers as a new incarnation ({new}): watched like the first.")
    assert cluster.controls[W1].incarnation != first.incarnation


def test_a_stopped_task_does_not_hold_up_the_others():
    """Item 4 with the real bounded caller: worker 0 never answers; the PS's notice is
    still handed on in the same round, within a bound of one call timeout."""
    cluster = FakeCluster()
    for task, job, i in ((PS, "ps", 0), (W0, "worker", 0), (W1, "worker", 1)):
        cluster.serve(task, job, i)
    stopped = threading.Event()

    def transport(task, request):
        if task == W0:
            stopped.wait(BOUND)
        return cluster(task, request)

    notices: list = []
    poller = cluster_poller.ClusterPoller(
        SPEC,
        lambda *n: notices.append(n),
        interval=0.01,
        caller=task_calls._Caller(transport),
        call_timeout=0.2,
    )
    cluster.controls[PS].set_notice("signal SIGTERM", None)
    cluster.controls[W1].set_notice("signal SIGTERM", None)
    poller.poll_once()
    assert notices == [("ps", 0, "signal SIGTERM", None), ("worker", 1, "signal SIGTERM", None)]
    assert poller.unanswered == {W0: "CallTimeout"}
    stopped.set()


STALE = (
    "Failed copying input tensor from /job:chief/replica:0/task:0/device:CPU:0 to "
    "/job:worker/replica:0/task:0/device:CPU:0 in order to run PyFunc: Unable to find a "
    "context_id matching the specified one (5521992485756649495). Perhaps the worker was "
    "restarted, or the context was GC'd?"
)


def test_a_restarted_task_the_coordinator_has_not_reconnected_to_is_reconnected():
    """A worker restarted and no closure went to it since: its polls fail with
    TensorFlow's stale-context error, and the coordinator is asked to reconnect (else
    the new incarnation's notice is never heard; seen in a ps_preemption trial, the
    worker left unreleased at its own bound). Other failures, and a PS, ask nothing."""
    cluster, notices, stale = FakeCluster(), [], []
    for task, job, i in ((PS, "ps", 0), (W0, "worker", 0), (W1, "worker", 1)):
        cluster.serve(task, job, i)
    cluster.errors[W0] = RuntimeError(STALE)
    cluster.errors[W1] = RuntimeError("failed to connect to all addresses; Connection refused")
    # A restarted PS is not reconnected: its loss stays TensorFlow's fatal failure.
    cluster.errors[PS] = RuntimeError(STALE)
    poller = cluster_poller.ClusterPoller(
        SPEC,
        lambda *n: notices.append(n),
        caller=cluster,
        on_stale_context=lambda task, bound: stale.append(task),
    )
    poller.poll_once()
    assert stale == [W0]
    # Once reconnected, the new incarnation answers and its notice is handed on.
    cluster.serve(W0, "worker", 0).set_notice("signal SIGTERM", None)
    poller.poll_once()
    assert stale == [W0] and notices == [("worker", 0, "signal SIGTERM", None)]


def test_a_reconnection_that_raises_does_not_end_the_watch():
    cluster = FakeCluster()
    for task, job, i in ((PS, "ps", 0), (W0, "worker", 0), (W1, "worker", 1)):
        cluster.serve(task, job, i)
    cluster.errors[W0] = RuntimeError(STALE)

    def broken(task, bound):
        raise ValueError("no coordinator")

    poller = cluster_poller.ClusterPoller(
        SPEC, lambda *n: None, caller=cluster, on_stale_context=broken
    )
    poller.poll_once()
    assert [t for t, _ in cluster.calls] == [PS, W0, W1]


class _RecoveryThread:
    """TensorFlow's WorkerPreemptionHandler as request_reconnect sees it: with
    ``rebuild``, a recovery thread that, once a rebuild is due, takes the cluster-update
    lock, calls ``rebuild()`` (what holds then is what TF's ``update_server_def`` would
    see), clears the due flag and wakes the waiters, as TF's ``_preemption_handler``."""

    def __init__(self, running: bool = True, rebuild=None) -> None:
        self._cluster_due_for_update_or_finish = threading.Event()
        self._should_preemption_thread_run = running
        self._cluster_update_lock = threading.Lock()
        self._worker_up_cond = threading.Condition(self._cluster_update_lock)
        if rebuild is not None:
            threading.Thread(target=self._recover, args=(rebuild,), daemon=True).start()

    def _recover(self, rebuild) -> None:
        self._cluster_due_for_update_or_finish.wait()
        with self._cluster_update_lock:
            rebuild()
            self._worker_up_cond.notify_all()
            self._cluster_due_for_update_or_finish.clear()


class _HeldWorker:
    """Our coordinator's worker as request_reconnect sees it: its holds, by reason."""

    def __init__(self) -> None:
        self.holds: list = []
        self.seen: list = []

    def hold(self, reason: str = "drain", strict: bool = True) -> None:
        self.holds.append(reason)
        self.seen.append(("hold", reason))

    def wait_idle(self, timeout: float) -> bool:
        return True

    def resume(self, reason: str = "drain") -> None:
        self.holds.remove(reason)
        self.seen.append(("resume", reason))


class _Coordinator:
    def __init__(self, handler, workers=(), queue=None) -> None:
        cluster = type("Cluster", (), {})()
        cluster.failure_handler = handler
        cluster.workers = list(workers)
        cluster.closure_queue = queue
        self._cluster = cluster


def test_request_reconnect_holds_the_worker_while_the_cluster_is_rebuilt(caplog):
    """With our coordinator, the restarted worker's thread takes no closure while TF
    rebuilds the cluster (a closure sent then failed with "Op type not registered",
    which ended the training: CI, test_a_restarted_worker_that_no_closure_goes_to_is_
    released_again); the other worker's is not held, and the hold is lifted after."""
    workers = [_HeldWorker(), _HeldWorker()]
    during = []
    handler = _RecoveryThread(rebuild=lambda: during.append(list(workers[1].holds)))
    with caplog.at_level(logging.INFO, logger="tf_failure_handling"):
        assert coordinators.request_reconnect(_Coordinator(handler, workers), W1, 30.0)
    assert during == [["reconnect"]]
    assert workers[1].seen == [("hold", "reconnect"), ("resume", "reconnect")]
    assert workers[0].seen == []
    assert not handler._cluster_due_for_update_or_finish.is_set()
    assert sum("reconnecting to it" in r.getMessage() for r in caplog.records) == 1


def test_request_reconnect_with_tf_s_coordinator_locks_its_queue_during_the_rebuild():
    """TF's coordinator cannot hold one worker: its closure queue is locked while the
    cluster is rebuilt (no thread takes a closure), and unlocked after."""
    queue = type("Queue", (), {})()
    queue._queue_lock = threading.Lock()
    during = []
    handler = _RecoveryThread(rebuild=lambda: during.append(queue._queue_lock.locked()))
    assert coordinators.request_reconnect(_Coordinator(handler, [object()], queue), W0, 30.0)
    assert during == [True]
    assert not queue._queue_lock.locked()


def test_request_reconnect_without_a_rebuild_gives_up_within_its_bound(caplog):
    """No recovery thread answers: the wait ends at the bound, says so, and the worker
    takes closures again."""
    workers = [_HeldWorker()]
    handler = _RecoveryThread()
    with caplog.at_level(logging.INFO, logger="tf_failure_handling"):
        assert coordinators.request_reconnect(_Coordinator(handler, workers), W0, 0.05)
    assert workers[0].holds == []
    assert any("was not rebuilt within" in r.getMessage() for r in caplog.records)


def test_request_reconnect_leaves_a_due_rebuild_to_tf():
    """A rebuild already due (a closure failed on the worker: TF's own path) is not
    asked again, and nothing is held."""
    workers = [_HeldWorker()]
    handler = _RecoveryThread()
    handler._cluster_due_for_update_or_finish.set()
    assert coordinators.request_reconnect(_Coordinator(handler, workers), W0, 30.0)
    assert workers[0].seen == []


def test_request_reconnect_asks_nothing_without_a_running_recovery_thread():
    stopped = _RecoveryThread(running=False)
    assert not coordinators.request_reconnect(_Coordinator(stopped), W0, 30.0)
    assert not stopped._cluster_due_for_update_or_finish.is_set()
    # The coordination service's handler has no such thread.
    assert not coordinators.request_reconnect(_Coordinator(object()), W0, 30.0)
    assert not coordinators.request_reconnect(object(), W0, 30.0)


def test_a_notice_handler_that_raises_does_not_end_the_watch():
    cluster = FakeCluster()
    for task, job, i in ((PS, "ps", 0), (W0, "worker", 0), (W1, "worker", 1)):
        cluster.serve(task, job, i).set_notice("signal SIGTERM", None)
    seen = []

    def on_notice(*n):
        seen.append(n)
        raise RuntimeError("boom")

    poller = cluster_poller.ClusterPoller(SPEC, on_notice, interval=0.01, caller=cluster)
    poller.poll_once()
    assert len(seen) == 3


def test_the_poller_thread_runs_until_stopped():
    cluster, notices = FakeCluster(), []
    for task, job, i in ((PS, "ps", 0), (W0, "worker", 0), (W1, "worker", 1)):
        cluster.serve(task, job, i)
    poller = make_poller(cluster, notices)
    poller.start()
    cluster.controls[PS].set_notice("signal SIGTERM", None)
    end = time.monotonic() + BOUND
    while not notices:
        assert time.monotonic() < end, "the poller thread handed on no notice"
        time.sleep(0.01)
    poller.stop()
    assert not poller._thread.is_alive()
    count = len(cluster.calls)
    time.sleep(0.05)
    assert len(cluster.calls) == count, "the poller went on after stop()"


class RoundBreaker(BaseException):
    """Not an ``Exception``: the poll's own handling does not take it."""


def test_a_round_that_raises_is_logged_and_the_watch_goes_on(caplog):
    """A round that fails ends; the next comes after the interval (the core's), and the
    notice is handed on then."""
    cluster, notices = FakeCluster(), []
    for task, job, i in ((PS, "ps", 0), (W0, "worker", 0), (W1, "worker", 1)):
        cluster.serve(task, job, i)
    failures = [RoundBreaker("once")]

    def caller(task, request, timeout=None):
        if failures:
            raise failures.pop()
        return cluster(task, request, timeout)

    poller = cluster_poller.ClusterPoller(
        SPEC, lambda *n: notices.append(n), interval=0.01, caller=caller
    )
    cluster.controls[PS].set_notice("signal SIGTERM", None)
    with caplog.at_level(logging.ERROR, logger="tf_failure_handling"):
        poller.start()
        end = time.monotonic() + BOUND
        while not notices:
            assert time.monotonic() < end, "the watch ended with the failed round"
            time.sleep(0.01)
        poller.stop()
    assert "failed a round" in caplog.text
    assert notices == [("ps", 0, "signal SIGTERM", None)]


def test_release_names_the_incarnation_and_notice_it_saw():
    cluster, notices, released = FakeCluster(), [], []
    control = cluster.serve(PS, "ps", 0)
    cluster.serve(W0, "worker", 0)
    cluster.serve(W1, "worker", 1)
    poller = make_poller(cluster, notices, released)
    control.set_notice("signal SIGTERM", None)
    poller.poll_once()
    assert poller.release(PS, "checkpoint saved")
    assert control.released.is_set() and released == [("ps", 0, "checkpoint saved")]


def test_release_of_a_task_that_restarted_is_refused():
    """The coordinator's release for the old incarnation does not stop the new one."""
    cluster, notices, released = FakeCluster(), [], []
    cluster.serve(PS, "ps", 0).set_notice("signal SIGTERM", None)
    cluster.serve(W0, "worker", 0)
    cluster.serve(W1, "worker", 1)
    poller = make_poller(cluster, notices, released)
    poller.poll_once()
    restarted = cluster.serve(PS, "ps", 0)
    restarted.set_notice("signal SIGTERM", None)
    assert not poller.release(PS, "checkpoint saved")
    assert not restarted.released.is_set() and released == []


def test_release_of_a_task_that_is_gone_returns_false():
    """Its port refuses connections: the failed release is not sent again."""
    cluster, released = FakeCluster(), []
    cluster.errors[PS] = UnavailableError("gone")
    poller = cluster_poller.ClusterPoller(
        SPEC,
        lambda *n: None,
        on_released=lambda *r: released.append(r),
        caller=cluster,
        listening=lambda task, timeout: False,
    )
    assert not poller.release(PS, "checkpoint saved")
    assert cluster.calls == [(PS, "release")] and released == []


@pytest.mark.parametrize(
    "failure",
    [
        UnavailableError("/job:ps/replica:0/task:0 is unavailable"),
        task_calls.CallRefused(f"{W1}: an earlier call has not returned yet (0s)"),
    ],
    ids=["another_tasks_error", "refused_while_a_poll_is_in_flight"],
)
def test_a_release_that_fails_while_the_task_listens_is_sent_again(failure):
    """The release is sent again (the core's retry rule) and counts when it fails with:

    * another task's error: TensorFlow can hand a stopped PS's error to the next op of
      another thread (``test_worker_notice_with_the_ps_stopped_is_drained`` met it);
    * a refusal (``CallRefused``): the task's earlier call, a poll, had not returned. It
      used to count as "does not answer", and the task waited for its release until its
      own peer timeout (the full run at d1ab8cc, test_a_restarted_worker_is_watched_again).
    """
    cluster, notices, released = FakeCluster(), [], []
    cluster.serve(PS, "ps", 0)
    cluster.serve(W0, "worker", 0)
    control = cluster.serve(W1, "worker", 1)
    control.set_notice("signal SIGTERM", None)
    failures = [failure]

    def caller(task, request, timeout=None):
        if request["op"] == "release" and failures:
            cluster.calls.append((task, "release"))
            raise failures.pop()
        return cluster(task, request, timeout)

    poller = cluster_poller.ClusterPoller(
        SPEC,
        lambda *n: notices.append(n),
        interval=0.01,
        on_released=lambda *r: released.append(r),
        caller=caller,
        listening=lambda task, timeout: True,
    )
    poller.poll_once()
    assert poller.release(W1, "drained")
    assert [c for c in cluster.calls if c == (W1, "release")] == [(W1, "release")] * 2
    assert control.released.is_set() and released == [("worker", 1, "drained")]


def test_a_release_whose_call_times_out_is_not_sent_again():
    """A call that used its whole bound: the task does not answer, one attempt."""
    cluster = FakeCluster()
    cluster.serve(W1, "worker", 1).set_notice("signal SIGTERM", None)

    def caller(task, request, timeout=None):
        if request["op"] == "release":
            cluster.calls.append((task, "release"))
            raise task_calls.CallTimeout(f"{task} did not answer 'release' within {timeout}s")
        return cluster(task, request, timeout)

    poller = cluster_poller.ClusterPoller(
        SPEC, lambda *n: None, caller=caller, listening=lambda task, timeout: True
    )
    poller.poll_once()
    assert not poller.release(W1, "drained")
    assert [c for c in cluster.calls if c == (W1, "release")] == [(W1, "release")]


def test_the_caller_tells_a_refusal_from_a_timeout():
    started = threading.Event()
    stop = threading.Event()

    def transport(task, request):
        started.set()
        stop.wait(BOUND)
        return {}

    caller = task_calls._Caller(transport)
    with pytest.raises(task_calls.CallTimeout) as timed_out:
        caller(W1, {"op": "poll"}, 0.05)
    assert type(timed_out.value) is task_calls.CallTimeout
    with pytest.raises(task_calls.CallRefused, match="earlier call has not returned"):
        caller(W1, {"op": "release"}, 0.05)
    stop.set()


def test_a_failing_release_record_does_not_stop_the_release():
    cluster = FakeCluster()
    control = cluster.serve(PS, "ps", 0)
    control.set_notice("signal SIGTERM", None)

    def on_released(*r):
        raise OSError("disk full")

    poller = cluster_poller.ClusterPoller(
        SPEC, lambda *n: None, interval=0.01, on_released=on_released, caller=cluster
    )
    poller.poll(PS)
    assert poller.release(PS, "checkpoint saved") and control.released.is_set()


def test_a_released_task_is_not_asked_until_it_is_gone():
    """After its release a task's process exits; an op sent to it meanwhile fails, and
    TensorFlow handed such an error to the coordinator's next op on another thread
    (the trials' seed 7). So it is not polled until its port refuses connections;
    then it is asked again, and its restarted incarnation is watched."""
    cluster, notices = FakeCluster(), []
    for task, job, i in ((PS, "ps", 0), (W0, "worker", 0), (W1, "worker", 1)):
        cluster.serve(task, job, i)
    listening = {W1: True}
    poller = cluster_poller.ClusterPoller(
        SPEC,
        lambda *n: notices.append(n),
        interval=0.01,
        caller=cluster,
        listening=lambda task, timeout: listening.get(task, True),
    )
    cluster.controls[W1].set_notice("signal SIGTERM", None)
    poller.poll_once()
    assert poller.release(W1, "drained") and poller.leaving == {W1}
    cluster.calls.clear()
    poller.poll_once()
    assert (W1, "poll") not in cluster.calls, "a leaving task was polled"
    assert not poller.wait_gone(W1, 0.05), "gone while its port still listens"
    assert poller.leaving == set(), "asked again after the bound"
    assert poller.release(W1, "drained") and poller.leaving == {W1}
    listening[W1] = False
    assert poller.wait_gone(W1, BOUND)
    assert poller.leaving == set()
    cluster.serve(W1, "worker", 1).set_notice("signal SIGTERM", None)
    poller.poll_once()
    assert notices[-1] == ("worker", 1, "signal SIGTERM", None) and len(notices) == 2


def test_the_port_probe_tells_a_listening_task_from_a_gone_one():
    import socket

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    poller = cluster_poller.ClusterPoller(
        {"worker": [f"127.0.0.1:{port}"]}, lambda *n: None, caller=FakeCluster()
    )
    assert poller._port_open("/job:worker/replica:0/task:0", 1.0)
    server.close()
    assert not poller._port_open("/job:worker/replica:0/task:0", 1.0)


# ------------------------------------------------------- the coordinator's workers


class FakeWorker:
    """What ``closure_drain`` and ``worker_drain`` read of a worker of ours: holds,
    idleness, its closure."""

    def __init__(self, index: int) -> None:
        self.worker_index = index
        self.holds = _Holds()
        self.running = None  # the function name of the closure in flight
        self.finished = threading.Event()

    def hold(self, reason="drain", strict=True):
        self.holds.add(reason, strict)
        if self.running is None:
            self.holds.idle.set()

    def resume(self, reason="drain"):
        self.holds.remove(reason)

    def wait_idle(self, timeout):
        return self.holds.idle.wait(timeout)

    def in_flight(self):
        return self.running

    def taken(self):
        """The closure in flight: none here (the tests that need one set it)."""
        return None

    def lost(self):
        return False

    def finish(self):
        self.running = None
        if self.holds.held():
            self.holds.idle.set()


class FakeQueue:
    def __init__(self, queued=0, inflight=0, done=True) -> None:
        self.queued = queued
        self.inflight_closure_count = inflight
        self._done = done
        self._error = None

    def qsize(self):
        return self.queued

    def wait(self, timeout=None):
        return self._done


class FakeCoordinator:
    def __init__(self, workers, queue) -> None:
        self._cluster = type("Cluster", (), {"workers": workers, "closure_queue": queue})()


def test_wait_for_closures_holds_every_worker_and_waits_for_the_ones_in_flight():
    workers = [FakeWorker(0), FakeWorker(1)]
    workers[1].running = "train_step"
    coordinator = FakeCoordinator(workers, FakeQueue(queued=7))
    threading.Timer(0.05, workers[1].finish).start()
    unfinished = closure_drain.wait_for_closures(coordinator, BOUND)
    assert all(w.holds.strict() for w in workers)
    assert (unfinished.queued, unfinished.in_flight, unfinished.held) == (7, {}, True)
    assert unfinished.count == 7 and unfinished


def test_wait_for_closures_names_the_closure_in_flight_at_the_bound():
    """Item 1: the bound expires with worker 1's closure running: it is named."""
    workers = [FakeWorker(0), FakeWorker(1)]
    workers[1].running = "train_step"
    coordinator = FakeCoordinator(workers, FakeQueue(queued=3))
    unfinished = closure_drain.wait_for_closures(coordinator, 0.1)
    assert unfinished.in_flight == {1: "train_step"} and unfinished.queued == 3
    assert unfinished.count == 4
    closure_drain.resume_all(coordinator)
    assert not any(w.holds.held() for w in workers)


def test_wait_for_closures_with_tensorflows_coordinator_cannot_hold():
    class TfWorker:
        worker_index = 0

    finished = FakeCoordinator([TfWorker()], FakeQueue(done=True))
    assert not closure_drain.wait_for_closures(finished, 0.1)
    stuck = FakeCoordinator([TfWorker()], FakeQueue(queued=2, inflight=1, done=False))
    unfinished = closure_drain.wait_for_closures(stuck, 0.1)
    assert (unfinished.queued, unfinished.in_flight, unfinished.held) == (2, {}, False)
    assert unfinished.unnamed == unfinished.in_flight_count == 1 and unfinished.count == 3


def test_a_save_hold_and_a_drain_hold_are_lifted_separately():
    worker = FakeWorker(0)
    coordinator = FakeCoordinator([worker], FakeQueue())
    worker.hold("drain x")
    assert closure_drain.hold_all(coordinator, strict=True)
    worker.resume("drain x")
    assert worker.holds.held(), "the drain's resume lifted the save's hold"
    closure_drain.resume_all(coordinator)
    assert not worker.holds.held()


class FakePoller:
    """``gone``: what each ``wait_gone`` answers (a list: one answer per call, in turn).
    ``protocol``: the coordinator's, which has seen worker 1 answer as ``inc-1``."""

    def __init__(self, released=True, gone=True, deadline=None) -> None:
        self.protocol = CoordinatorProtocol([PS, W0, W1], 30.0)
        answer = {"incarnation": "inc-1"}
        if deadline is not None:  # worker 1's notice, naming this Unix deadline
            answer["notice"] = {"at": 1.0, "source": "signal SIGTERM", "deadline": deadline}
        self.protocol.handle(CoordinatorEvent.Answered(W1, answer))
        self.calls: list = []
        self._released = released
        self._gone = gone

    @property
    def incarnations(self):
        return self.protocol.state()["incarnations"]

    def release(self, task, reason):
        self.calls.append(("release", task, reason))
        return self._released

    def wait_gone(self, task, bound):
        self.calls.append(("wait_gone", task))
        return self._gone.pop(0) if isinstance(self._gone, list) else self._gone


def test_drain_holds_waits_releases_waits_for_the_exit_then_resumes():
    worker = FakeWorker(1)
    worker.running = "train_step"
    poller = FakePoller()
    drain = worker_drain.WorkerDrain(
        poller, 1, coordinator=FakeCoordinator([FakeWorker(0), worker], FakeQueue())
    )
    released = []
    original = poller.release

    def release(task, reason):
        released.append(worker.holds.held() and worker.running is None)
        return original(task, reason)

    poller.release = release
    threading.Timer(0.05, worker.finish).start()
    drain.run()
    assert released == [True], "released before its closure finished"
    assert poller.calls == [
        ("release", W1, "drained"),
        ("wait_gone", W1),
    ]
    assert drain.outcome == "released" and not worker.holds.held()


def test_drain_releases_at_its_bound_with_the_closure_still_running(caplog):
    worker = FakeWorker(1)
    worker.running = "train_step"
    # 1.1 s to the deadline, less the 1 s margin.
    poller = FakePoller(deadline=time.time() + 1.1)
    drain = worker_drain.WorkerDrain(
        poller, 1, coordinator=FakeCoordinator([FakeWorker(0), worker], FakeQueue())
    )
    assert _first_drain_step(1.1).bound == pytest.approx(0.1, abs=0.05)
    with caplog.at_level("WARNING", logger="tf_failure_handling"):
        drain.run()
    assert re.search(r"train_step did not finish within 0\.[01]s", caplog.text)
    assert "applied twice" in caplog.text
    assert poller.calls[0] == ("release", W1, "drained")
    assert not worker.holds.held()


def _first_drain_step(left, peer_timeout=30.0):
    """The first action of a drain of worker 1 (it can be held) whose notice's deadline
    is ``left`` seconds away (a Unix time, placed on the coordinator's clock as its
    answer arrives; None: no deadline)."""
    protocol = CoordinatorProtocol([W1], peer_timeout)
    notice = {"at": 1.0, "source": "signal SIGTERM", "deadline": None}
    if left is not None:
        notice["deadline"] = time.time() + left
    protocol.handle(CoordinatorEvent.Answered(W1, {"incarnation": "i", "notice": notice}))
    protocol.handle(CoordinatorEvent.DrainStart(1, True))
    return protocol.poll(Lane.Drain(1))


def _unreleased_drain(gone, on_wait=None):
    """A drain whose release fails; ``on_wait(poller)`` runs at each ``wait_gone``.
    Returns the drain, its worker and whether the worker was held at each wait."""
    worker = FakeWorker(1)
    poller = FakePoller(released=False, gone=gone)
    held = []
    wait_gone = poller.wait_gone

    def observed(task, bound):
        held.append(worker.holds.held())
        if on_wait is not None:
            on_wait(poller)
        return wait_gone(task, bound)

    poller.wait_gone = observed
    drain = worker_drain.WorkerDrain(
        poller, 1, coordinator=FakeCoordinator([FakeWorker(0), worker], FakeQueue())
    )
    drain.run()
    return drain, worker, poller, held


def test_drain_that_cannot_release_keeps_the_worker_out_until_it_is_gone():
    """Item 5 of issue 48: a worker whose release failed still serves its notice; put
    back to work, it would run closures until it leaves on its own bound (each then runs
    again elsewhere, unnamed). It stays held until its process is gone."""
    drain, worker, poller, held = _unreleased_drain([False, False, True])
    assert poller.calls == [("release", W1, "drained")] + [("wait_gone", W1)] * 3
    assert held == [True, True, True], "the worker took closures before it was gone"
    assert drain.outcome == "not released" and not worker.holds.held()


def test_drain_that_cannot_release_resumes_a_new_incarnation():
    def restarted(poller):
        poller.protocol.handle(CoordinatorEvent.Answered(W1, {"incarnation": "inc-2"}))

    _, worker, poller, held = _unreleased_drain(False, on_wait=restarted)
    assert poller.calls == [("release", W1, "drained"), ("wait_gone", W1)]
    assert held == [True] and not worker.holds.held()


def test_an_unreleased_worker_is_held_for_as_long_as_it_may_serve():
    """As long as it may serve (its cap, from the coordinator's peer_timeout) and the
    exit wait (30 s)."""
    protocol = CoordinatorProtocol([W1], 30.0)
    protocol.handle(CoordinatorEvent.DrainStart(1, True))
    assert isinstance(protocol.poll(Lane.Drain(1)), CoordinatorAction.Hold)
    protocol.handle(CoordinatorEvent.Idled(1, True))
    assert isinstance(protocol.poll(Lane.Drain(1)), CoordinatorAction.DrainRelease)
    protocol.handle(CoordinatorEvent.DrainReleased(1, False))
    wait = protocol.poll(Lane.Drain(1))
    assert wait.holding == pytest.approx(SERVE_CAP_FACTOR * 30.0 + 30.0)


def test_drain_with_a_coordinator_that_cannot_hold_releases_at_once(caplog):
    class TfWorker:
        worker_index = 1

    poller = FakePoller()
    drain = worker_drain.WorkerDrain(
        poller, 1, coordinator=FakeCoordinator([TfWorker(), TfWorker()], FakeQueue())
    )
    with caplog.at_level("WARNING", logger="tf_failure_handling"):
        drain.run()
    assert "cannot stop giving that worker closures" in caplog.text
    # Released, and waited for as a held worker is: the poll asks it again once gone.
    assert poller.calls == [("release", W1, "notice; coordinator cannot drain"), ("wait_gone", W1)]
    assert drain.outcome == "no hold"


def test_a_restarted_workers_second_notice_is_released_with_tensorflows_coordinator():
    """Issue 60 (``ps_preemption`` seed 310, TensorFlow's coordinator): worker 1's
    notice was released at once (TF's coordinator cannot hold a worker) and its drain
    ended there, so the poll never asked worker 1 again (a released task is asked nothing
    until its drain has seen it gone). Its restarted incarnation's notice went unheard
    and it left at its deadline, unreleased. Each incarnation's notice is now handed on
    and released, the second as the first."""

    class TfWorker:
        worker_index = 1

    cluster, notices = FakeCluster(), []
    for task, job, i in ((PS, "ps", 0), (W0, "worker", 0), (W1, "worker", 1)):
        cluster.serve(task, job, i)
    listening = {W1: True}
    drains = []
    coordinator = FakeCoordinator([TfWorker(), TfWorker()], FakeQueue())

    def on_notice(job, index, source, deadline):
        notices.append((job, index, source, deadline))
        # The drain runs in the poller's thread here; its wait_gone ends once the
        # worker's port refuses (the test's exit of that incarnation below).
        drain = worker_drain.WorkerDrain(poller, index, coordinator=coordinator)
        listening[W1] = False  # the released incarnation exits
        drain.run()
        drains.append(drain.outcome)

    poller = cluster_poller.ClusterPoller(
        SPEC,
        on_notice,
        interval=0.01,
        caller=cluster,
        listening=lambda task, timeout: listening.get(task, True),
    )
    first = cluster.controls[W1]
    first.set_notice("signal SIGTERM", 25.0)
    poller.poll_once()
    assert first.released.is_set() and drains == ["no hold"]
    # The launcher restarts worker 1; it is preempted again.
    listening[W1] = True
    second = cluster.serve(W1, "worker", 1)
    second.set_notice("signal SIGTERM", 60.0)
    poller.poll_once()
    assert notices == [
        ("worker", 1, "signal SIGTERM", 25.0),
        ("worker", 1, "signal SIGTERM", 60.0),
    ], "the restarted incarnation's notice was not handed on"
    assert second.released.is_set(), "the restarted incarnation was not released"
    assert second.release_reason == "notice; coordinator cannot drain"
    assert drains == ["no hold", "no hold"]


def test_drain_bound_without_a_deadline_is_the_default():
    """The core's plan gives the closure in flight the default bound when the notice
    names no deadline, and nothing once the deadline passed."""
    assert _first_drain_step(None).bound == 300.0
    assert _first_drain_step(-5.0).bound == 0.0


# ------------------------------------------------------------- the worker's thread


class CountingQueue:
    """A closure queue that is never given a closure; counts the thread's looks."""

    stopped = False

    def __init__(self, size=0) -> None:
        self.gets = 0
        self.size = size
        self.put_back_calls = 0

    def qsize(self):
        return self.size

    def get(self, timeout=None, tag=None):
        self.gets += 1
        time.sleep(min(timeout or 0.0, 0.01))
        return None


def held_worker(queue) -> Worker:
    """A ``Worker`` whose loop runs on ``queue``, built without TF's cluster."""
    worker = Worker.__new__(Worker)
    worker.worker_index = 0
    worker._should_worker_thread_run = True
    worker._cluster = type("Cluster", (), {"closure_queue": queue})()
    worker._maybe_delay = lambda: None
    return worker


def test_a_held_worker_thread_waits_without_spinning():
    """Item 3: the thread of a held worker waited on the hold event it had just seen
    set (``hold.wait`` returns at once while set), looping on the GIL for the whole
    drain. Now it waits on its holds being lifted: a few looks per second, and no CPU."""
    queue = CountingQueue()
    worker = held_worker(queue)
    worker.hold("drain")
    looks = []
    original = worker._holds().wait_turn

    def counting_wait_turn(q, slice_):
        looks.append(1)
        return original(q, slice_)

    worker._holds().wait_turn = counting_wait_turn
    thread = threading.Thread(target=worker._take_closures, daemon=True)
    cpu = time.process_time()
    thread.start()
    assert worker.wait_idle(BOUND), "the held thread never reported idle"
    time.sleep(1.0)
    used = time.process_time() - cpu
    worker._should_worker_thread_run = False
    worker.resume("drain")
    thread.join(BOUND)
    assert not thread.is_alive()
    # One look per GET_SLICE (0.5 s) while held, and a last one after the resume.
    print(f"held 1.0 s: {len(looks)} looks, {used * 1000:.1f} ms of process CPU")
    assert len(looks) <= 5, f"{len(looks)} looks in 1 s: the held thread spins"
    assert queue.gets == 0, "a held thread asked the queue for a closure"


def test_a_non_strict_hold_lets_a_full_queue_drain():
    """The coordinator's notice holds the workers loosely: with the queue full (a
    schedule() waiting for room) the thread still takes closures."""
    queue = CountingQueue(size=ps_control_max_size())
    worker = held_worker(queue)
    worker.hold("save", strict=False)
    thread = threading.Thread(target=worker._take_closures, daemon=True)
    thread.start()
    end = time.monotonic() + BOUND
    while queue.gets < 2:
        assert time.monotonic() < end, "a loosely held thread did not take from a full queue"
        time.sleep(0.01)
    worker.hold("save", strict=True)  # the save begins: strictly held now
    assert worker.wait_idle(BOUND)
    gets = queue.gets
    time.sleep(0.2)
    assert queue.gets == gets, "a strictly held thread asked the queue for a closure"
    worker._should_worker_thread_run = False
    worker.resume("save")
    thread.join(BOUND)


def ps_control_max_size() -> int:
    from tf_failure_handling._coordinator.closure_queue import MAX_SIZE

    return MAX_SIZE


def test_a_closure_taken_after_a_strict_hold_goes_back_untouched():
    class OneClosureQueue(CountingQueue):
        def __init__(self, worker_ref) -> None:
            super().__init__()
            self.worker_ref = worker_ref
            self.given = object()
            self.back = []

        def get(self, timeout=None, tag=None):
            self.gets += 1
            if self.gets == 1:
                # The hold arrives while this thread waits in get().
                self.worker_ref[0].hold("save", strict=True)
                return self.given
            time.sleep(0.01)
            return None

        def put_back(self, closure):
            self.back.append(closure)

    ref: list = []
    queue = OneClosureQueue(ref)
    worker = held_worker(queue)
    ref.append(worker)
    processed = []
    worker._process_closure = processed.append
    thread = threading.Thread(target=worker._take_closures, daemon=True)
    thread.start()
    assert worker.wait_idle(BOUND)
    worker._should_worker_thread_run = False
    worker.resume("save")
    thread.join(BOUND)
    assert queue.back == [queue.given] and processed == []


# ------------------------------------------------------- finding TF's coordinator


def test_tensorflows_coordinator_is_found_on_the_checkpoints_strategy(monkeypatch):
    """Item 7: no heap walk. TF keeps a strategy's coordinator in
    ``strategy._cluster_coordinator``; the handler reads the strategy off the
    checkpoint's variables when it is built (a manager's checkpoint too)."""
    import tensorflow as tf

    monkeypatch.setattr(coordinators, "_coordinators", __import__("weakref").WeakSet())

    class Strategy:
        _cluster_coordinator = None

    strategy = Strategy()
    variable = tf.Variable(1.0)
    variable._distribute_strategy = strategy
    checkpoint = tf.train.Checkpoint(model=tf.Module(), step=variable)
    assert coordinators.strategy_of(checkpoint) is strategy
    manager = tf.train.CheckpointManager(checkpoint, "/nonexistent-tfh-test", 1)
    assert coordinators.strategy_of(manager) is strategy
    assert coordinators.strategy_of(tf.train.Checkpoint()) is None
    assert coordinators.find_coordinator(strategy) is None
    coordinator = FakeCoordinator([], FakeQueue())
    strategy._cluster_coordinator = coordinator
    assert coordinators.find_coordinator(strategy) is coordinator
    ours = FakeCoordinator([], FakeQueue())
    coordinators.register_coordinator(ours)
    assert coordinators.find_coordinator(strategy) is ours


# --------------------------------------------------------------- gRPC keepalive (item 4)
PS_TF_CONFIG = '{"cluster": {"chief": ["h:1"], "ps": ["h:2"], "worker": ["h:3"]}}'


def test_keepalive_is_added_in_a_ps_cluster_only():
    """A MultiWorkerMirroredStrategy process (or one with no TF_CONFIG) keeps TensorFlow's
    channels as they are; TF_CONFIG naming a ps job, or the variable at 1, adds it."""
    mwms = {"TF_CONFIG": '{"cluster": {"worker": ["h:1", "h:2"]}}'}
    for env in ({}, mwms, {"TF_CONFIG": "not json"}, {"TF_CONFIG": "[1]"}):
        assert grpc_keepalive.add_grpc_keepalive(env) is None, env
        assert "TF_GRPC_DEFAULT_OPTIONS" not in env
    assert grpc_keepalive.add_grpc_keepalive({"TF_CONFIG": PS_TF_CONFIG}) is not None
    forced = dict(mwms, TF_FAILURE_HANDLING_GRPC_KEEPALIVE="1")
    assert grpc_keepalive.add_grpc_keepalive(forced) is not None
    off = {"TF_CONFIG": PS_TF_CONFIG, "TF_FAILURE_HANDLING_GRPC_KEEPALIVE": "0"}
    assert grpc_keepalive.add_grpc_keepalive(off) is None


def test_keepalive_is_added_to_an_empty_environment():
    env = {"TF_FAILURE_HANDLING_GRPC_KEEPALIVE": "1"}
    value = grpc_keepalive.add_grpc_keepalive(env)
    assert value == env["TF_GRPC_DEFAULT_OPTIONS"]
    assert value.split(",") == [
        f"{name}=5000"
        for name in (
            "grpc.keepalive_time_ms",
            "grpc.keepalive_timeout_ms",
            "grpc.http2.ping_timeout_ms",
            "grpc.min_reconnect_backoff_ms",
        )
    ]
    assert grpc_keepalive.grpc_keepalive_time(env) == 5.0


def test_keepalive_keeps_the_users_options_and_values():
    env = {
        "TF_GRPC_DEFAULT_OPTIONS": "grpc.keepalive_time_ms=60000,grpc.foo=1,",
        "TF_CONFIG": PS_TF_CONFIG,
    }
    value = grpc_keepalive.add_grpc_keepalive(env)
    items = value.split(",")
    assert items[:2] == ["grpc.keepalive_time_ms=60000", "grpc.foo=1"]
    names = [item.split("=")[0] for item in items]
    assert names.count("grpc.keepalive_time_ms") == 1
    assert {"grpc.http2.ping_timeout_ms", "grpc.min_reconnect_backoff_ms"} <= set(names)
    assert all(item.count("=") == 1 for item in items), items  # TF's format
    assert grpc_keepalive.grpc_keepalive_time(env) == 60.0


def test_keepalive_adds_nothing_when_every_option_is_set_or_it_is_turned_off():
    full = grpc_keepalive.add_grpc_keepalive({"TF_FAILURE_HANDLING_GRPC_KEEPALIVE": "1"})
    env = {"TF_GRPC_DEFAULT_OPTIONS": full, "TF_CONFIG": PS_TF_CONFIG}
    assert grpc_keepalive.add_grpc_keepalive(env) is None and env["TF_GRPC_DEFAULT_OPTIONS"] == full
    off = {"TF_FAILURE_HANDLING_GRPC_KEEPALIVE": "0"}
    assert grpc_keepalive.add_grpc_keepalive(off) is None
    assert "TF_GRPC_DEFAULT_OPTIONS" not in off
    assert grpc_keepalive.grpc_keepalive_time(off) is None
    assert grpc_keepalive.grpc_keepalive_time({"TF_GRPC_DEFAULT_OPTIONS": "grpc.x=1"}) is None
    bad = {"TF_GRPC_DEFAULT_OPTIONS": "grpc.keepalive_time_ms=soon"}
    assert grpc_keepalive.grpc_keepalive_time(bad) is None


def test_the_import_added_keepalive_as_keepalive_wanted_says():
    import os

    if grpc_keepalive.keepalive_wanted():
        assert grpc_keepalive.grpc_keepalive_time() is not None
    elif not os.environ.get(grpc_keepalive.GRPC_OPTIONS_ENV):
        assert grpc_keepalive.GRPC_OPTIONS_ADDED is None


# ----------------------------------------------------------------------------- issue 48


class Run:
    """A closure; ``_tfh_run``: the index of the handler's ``run()`` that scheduled it
    (None: scheduled outside a run)."""

    def __init__(self, run) -> None:
        self._tfh_run = run


class ListingQueue(FakeQueue):
    def __init__(self, closures) -> None:
        super().__init__()
        self.closures = closures
        self.promoted: list = []

    def qsize(self):
        return len(self.closures)

    def queued_closures(self):
        return list(self.closures)

    def promote(self, closures):
        self.promoted.append([c._tfh_run for c in closures])
        rest = [c for c in self.closures if all(c is not p for p in closures)]
        self.closures[:] = list(closures) + rest
        return len(closures)


def test_only_the_handlers_runs_are_taken_off_the_run_count():
    """Item 2 of issue 48: an evaluation closure scheduled outside ``handler.run`` and
    unfinished at the save is not one of the runs: taking it off the run count made a
    finished training step run again after the restart."""
    workers = [FakeWorker(0), FakeWorker(1)]
    workers[0].running, workers[1].running = "train_step", "eval_step"
    workers[0].taken = lambda: Run(8)
    workers[1].taken = lambda: Run(None)
    queue = ListingQueue([Run(9), Run(None), Run(None), Run(10), Run(11)])
    unfinished = closure_drain.wait_for_closures(
        FakeCoordinator(workers, queue), 0.05, scheduled=12
    )
    assert (unfinished.queued, unfinished.in_flight) == (3, {0: "train_step"})
    assert (unfinished.queued_runs, unfinished.in_flight_runs) == ([9, 10, 11], [8])
    assert (unfinished.outside_queued, unfinished.outside_in_flight) == (2, {1: "eval_step"})
    assert unfinished.count == 4 and unfinished.outside_count == 3


class BetweenClosures(FakeWorker):
    """A worker thread in the queue's ``get`` when the hold came: no closure, not idle
    until its next turn (``settles_after`` seconds), or a closure taken meanwhile."""

    def __init__(self, index: int, settles_after: float, takes=None) -> None:
        super().__init__(index)
        self._settles_after = settles_after
        self._takes = takes
        self._taken = None

    def hold(self, reason="drain", strict=True):
        self.holds.add(reason, strict)
        threading.Timer(self._settles_after, self._settle).start()

    def _settle(self):
        if self._takes is None:
            self.holds.idle.set()
        else:
            self.running, self._taken = "train_step", self._takes

    def taken(self):
        return self._taken


@pytest.mark.parametrize("takes", [None, 9], ids=["goes-idle", "had-taken-run-9"])
def test_a_worker_between_two_closures_at_the_bound_is_not_a_run_in_flight(takes):
    """A reliability trial (ps_preemption, seed 36) found it: at a bound of 0 s, a worker
    thread still in the queue's get (no closure, not yet idle) was counted as a closure
    in flight with no run index; the run count then fell back to "scheduled less every
    unfinished closure", one below the finished runs, and a finished run ran twice after
    the restart with nothing naming it. It settles within its get slice: idle (nothing
    in flight) or with the closure it had taken, whose run then counts."""
    workers = [FakeWorker(0), BetweenClosures(1, 0.1, None if takes is None else Run(takes))]
    workers[0].running = "train_step"
    workers[0].taken = lambda: Run(8)
    queue = ListingQueue([] if takes is not None else [Run(9)])
    unfinished = closure_drain.wait_for_closures(FakeCoordinator(workers, queue), 0.0, scheduled=10)
    assert unfinished.indexed, unfinished.in_flight
    if takes is None:
        assert unfinished.in_flight == {0: "train_step"}
        assert (unfinished.queued_runs, unfinished.in_flight_runs) == ([9], [8])
    else:
        assert unfinished.in_flight == {0: "train_step", 1: "train_step"}
        assert sorted(unfinished.in_flight_runs) == [8, 9]
    assert unfinished.runs == 8


class FailingClosure:
    pass


def test_a_lost_workers_closure_counts_once_and_its_thread_holds_up_no_save():
    """Item 3 of issue 48: a worker whose process was lost puts its closure back in the
    queue, then waits in TensorFlow's recovery. It has nothing in flight: a save's wait
    for it ends at once (it used to wait out its whole bound, the closure counted as
    queued and in flight)."""
    queue = CountingQueue()
    put_back = []
    queue.put_back = put_back.append
    worker = held_worker(queue)
    worker._resource_tracking_lock = threading.Lock()
    worker._resource_remote_value_refs = []
    closure = FailingClosure()
    worker.__dict__["_tfh_taken"] = closure
    worker.hold("save", strict=True)
    assert not worker.wait_idle(0.0)
    worker._on_closure_failure(closure, UnavailableError("worker 0 is gone"))
    assert put_back == [closure]
    assert worker.taken() is None and worker.in_flight() is None
    assert worker.wait_idle(0.0), "the save waits for a worker that lost its closure"


class FakeState:
    peer_timeout = 30.0
    grace_period = 0.0


class FakeCore:
    #: The peer timeout the core was configured with.
    peer_timeout = 30.0


def test_the_ps_release_after_the_save_is_sent_again_before_the_watch_stops():
    """Item 4 of issue 48: the save's release of a PS stopped the watch first, and the
    retry rule gives up at the first failure of a stopped watch: the PS stayed up until
    its own bound. Now the release is sent again (the core's retry bound), then the
    watch stops."""
    from tf_failure_handling._protocol.ps_steps import PsSteps

    cluster = FakeCluster()
    control = cluster.serve(PS, "ps", 0)
    cluster.serve(W0, "worker", 0)
    cluster.serve(W1, "worker", 1)
    control.set_notice("signal SIGTERM", None)
    failures = [UnavailableError("/job:worker/replica:0/task:1 is unavailable")] * 2

    def caller(task, request, timeout=None):
        if request["op"] == "release" and failures:
            raise failures.pop()
        return cluster(task, request, timeout)

    poller = cluster_poller.ClusterPoller(
        SPEC, lambda *n: None, interval=0.01, caller=caller, listening=lambda task, timeout: True
    )
    poller.poll_once()
    bounds, release = [], poller.release

    def bounded_release(task, reason, bound=None):
        bounds.append(bound)
        return release(task, reason, bound)

    poller.release = bounded_release
    steps = PsSteps(FakeState(), FakeCore(), None, None)
    steps.poller = poller
    steps.after_save()
    assert control.released.is_set(), "the PS was not released after the save"
    # The core's retry rule: its window (the notice names no deadline).
    assert failures == [] and bounds == [10.0] and poller.stopped


def test_a_served_task_waits_while_the_coordinator_asks():
    """The core's ``serving``: past its own bound a PS waits for a coordinator that still
    asks (its save may be under way), not for one that fell silent."""
    notice, bound = 1000.0, 30.0
    asked = serving_at = notice + bound + 1.0

    def serving(deadline, last_asked, released, now):
        """The serving thread's action at ``now`` (its own bound said before), on the
        task's clock (``clock[0]``)."""
        clock = [notice]
        task = TaskProtocol("ps", 0, "inc", bound, clock=lambda: clock[0])
        task.handle(TaskEvent.Notice("signal SIGTERM", deadline, 0.0))
        assert isinstance(task.poll(), TaskAction.Serving)
        if released:
            at = task.answer({"op": "poll"})["notice"]["at"]
            release = {"op": "release", "incarnation": "inc", "notice_at": at}
            assert task.answer(release)["released"]
        if last_asked is not None:
            clock[0] = last_asked
            task.handle(TaskEvent.Asked())
        clock[0] = now
        return task.poll()

    decision = serving(None, asked - 1.0, False, serving_at)
    assert isinstance(decision, TaskAction.Serve) and decision.timeout > 0
    silent = serving(None, notice, False, serving_at)
    assert silent.why == "coordinator silent"
    assert serving(None, asked, True, asked).why == "released"
    assert serving(1010.0, asked, False, 1010.0).why == "deadline"
    capped = notice + SERVE_CAP_FACTOR * bound
    assert serving(None, capped - 0.1, False, capped).why == "cap"


def test_task_control_notes_when_the_coordinator_asked():
    control = task_calls.TaskControl("ps", 0)
    assert control.last_asked is None
    before = time.time()
    ask(control, {"op": "poll"})
    assert control.last_asked is not None and control.last_asked >= before


def test_a_pass_lets_a_strictly_held_thread_take_one_closure():
    """The save's gap runs: a strictly held thread takes closures while the shared
    passes last, then waits on its holds again."""
    holds = _Holds()
    holds.add("save", strict=True)
    queue = CountingQueue()
    assert holds.wait_turn(queue, 0.0) == _Holds.WAIT and holds.idle.is_set()
    passes = closure_drain.Passes(1)
    holds.grant(passes)
    assert holds.wait_turn(queue, 0.0) == _Holds.TAKE_GRANTED and not holds.idle.is_set()
    assert passes.left == 0
    assert holds.wait_turn(queue, 0.0) == _Holds.WAIT and not holds.go.is_set()


def test_the_save_saves_at_the_first_unfinished_run():
    """The checkpoint counts runs, and a restart schedules from the count on: it must be
    the first unfinished run (the core's ``runs_at_save``), with the finished runs after
    it named (they run again); a queued run below a finished one is run first."""

    def saved(scheduled, queued, in_flight, takers=0):
        protocol, lane = CoordinatorProtocol([]), Lane.Save()
        protocol.handle(CoordinatorEvent.SaveStart(5.0, scheduled, True))
        assert isinstance(protocol.poll(lane), CoordinatorAction.WaitIdle)
        protocol.handle(
            CoordinatorEvent.Unfinished(len(queued) + len(in_flight), queued, in_flight)
        )
        action = protocol.poll(lane)
        if isinstance(action, CoordinatorAction.Promote):
            promoted = list(action.runs)
            protocol.handle(CoordinatorEvent.Promotable(promoted, takers))
            return promoted, protocol.poll(lane)
        return None, action

    _, done = saved(39, [36, 37, 38], [30])
    assert (done.runs, done.finished_after) == (30, [31, 32, 33, 34, 35])
    _, done = saved(46, [43, 44, 45], [])
    assert (done.runs, done.finished_after) == (43, [])
    promoted, done = saved(38, [36, 37, 30], [])
    assert promoted == [30] and done.runs == 30


def test_the_save_lets_a_live_worker_run_a_put_back_run_first():
    """Run 10 was put back at the queue's tail by a lost worker (0), and run 11 finished:
    the save moves run 10 to the head and lets the live worker (1) take it, so that the
    checkpoint's run count, the first unfinished run, is 12 and nothing runs twice."""
    workers = [FakeWorker(0), FakeWorker(1)]
    workers[0].lost = lambda: True
    workers[0].holds.mark_lost()
    queue = ListingQueue([Run(12), Run(13), Run(10)])

    def grant(passes):
        def take_the_head():
            if passes.take():
                queue.closures.pop(0)  # taken from the head, and finished

        threading.Thread(target=take_the_head).start()

    workers[0].grant = lambda passes: pytest.fail("a lost worker was granted a pass")
    workers[1].grant = grant
    unfinished = closure_drain.wait_for_closures(
        FakeCoordinator(workers, queue), BOUND, scheduled=14
    )
    assert queue.promoted == [[10]] and unfinished.gap_runs == [10]
    assert unfinished.queued_runs == [12, 13] and unfinished.in_flight_runs == []
    assert (unfinished.runs, unfinished.finished_after) == (12, [])
