"""A wait on a per-worker value of our coordinator makes the handler's checks (issue 60).

After a notice with no grace period our coordinator holds its workers until the save,
and the save is made by a handler's check. A per-worker resource (a per-worker
dataset's iterator, a per-worker variable, a distributed table's copy) is made by a
resource closure; created after the notice, its closure is held, and a ``fetch()`` or
``get()`` of its value on the training thread that made no check waited forever
(TensorFlow's ``RemoteValueImpl`` waits on its event alone). Here, without a cluster:
our ``Worker``'s resource values make the checks of a (fake) open handler while they
wait, and TensorFlow's own ``Worker`` in the same process still makes TensorFlow's.
On a real cluster: ``tests/integration/test_ps_preemption.py``
(``test_a_per_worker_fetch_after_a_notice_reaches_the_save``).
"""

from __future__ import annotations

import threading
import types

import pytest

tf = pytest.importorskip("tensorflow", reason="the resource closures trace TF functions")

from tensorflow.python.distribute.coordinator import cluster_coordinator as tf_cc  # noqa: E402
from tensorflow.python.distribute.coordinator import values as tf_values  # noqa: E402
from tensorflow.python.eager import cancellation  # noqa: E402
from tf_failure_handling._coordinator import join_checks as _join_checks  # noqa: E402
from tf_failure_handling._coordinator import worker_loop as _worker_loop  # noqa: E402
from tf_failure_handling._native import CoordinatorProtocol  # noqa: E402

Lane = CoordinatorProtocol.Lane

#: Bound on any wait in these tests: only turns a hang into a failure.
HANG = 30.0
#: The coordinator's protocol object the fake checks are registered with (it times the
#: join waits' slices).
PROTOCOL = CoordinatorProtocol([])
RESTART_CODE = 42


class FakeCheck:
    """An open handler's step check (``join_checks``' contract) whose training thread is
    ``trainer``; its check is the save after a notice: the process exits 42."""

    closed = False
    running_thread = 0  # not inside run()
    run_index = 0

    def __init__(self, trainer: int) -> None:
        self.trainer = trainer
        self.checks = 0

    def is_trainer(self, thread: int) -> bool:
        return thread == self.trainer

    def check_in_join(self) -> None:
        self.checks += 1
        raise SystemExit(RESTART_CODE)


def _worker(worker_class: type, queued: list) -> object:
    """A ``worker_class`` (ours or TF's) with what creating a resource reads, and no
    thread: its resource closures stay queued in ``queued`` (a held worker's)."""
    worker = object.__new__(worker_class)
    worker.worker_index = 0
    worker._cluster = types.SimpleNamespace(
        resource_cancellation_mgr=cancellation.CancellationManager(),
        closure_queue=types.SimpleNamespace(put=lambda c, tag=None: queued.append((c, tag))),
    )
    worker._resource_tracking_lock = threading.Lock()
    worker._resource_remote_value_refs = []
    worker._is_dead_with_error = None
    return worker


@tf.function
def make_resource():
    return tf.constant(1.0)


def _wait_on_a_trainer(wait, remote_value) -> tuple:
    """``wait()`` on a new training thread of an open handler, whose check exits 42;
    returns (what the wait ended with, how many checks it made). A wait still blocked
    after the bound fails the test; it is released by setting ``remote_value``."""
    ended: list = []
    registered = threading.Event()

    def trainer() -> None:
        if not registered.wait(HANG):  # the handler is open before the wait begins
            return
        try:
            ended.append(("returned", wait()))
        except SystemExit as e:
            ended.append(("exit", e.code))

    thread = threading.Thread(target=trainer, daemon=True)
    check = None
    try:
        thread.start()
        check = FakeCheck(thread.ident)
        _join_checks.register_join(check, PROTOCOL)
        registered.set()
        thread.join(HANG)
        blocked = thread.is_alive()
    finally:
        if check is not None:
            _join_checks.unregister_join(check)
        remote_value._set_values(None)  # releases a wait that made no check
        thread.join(HANG)
    assert not blocked, f"the wait made no check within {HANG}s: it hangs behind the hold"
    return ended[0], check.checks


@pytest.mark.parametrize(
    "create, wait",
    [
        ("create_resource", "fetch"),
        ("create_resource", "get"),
        ("create_resource", "coordinator_fetch"),
        ("create_variable_resource", "get"),
    ],
    ids=["resource-fetch", "resource-get", "per-worker-values-fetch", "variable-get"],
)
def test_a_held_per_worker_value_of_ours_reaches_the_save_while_waited_on(create, wait):
    """What counts as success: the wait on a value whose resource closure is never run
    (held) ends with the check's exit 42, after at least one check."""
    queued: list = []
    worker = _worker(_worker_loop.Worker, queued)
    remote_value = getattr(worker, create)(make_resource)
    [(closure, tag)] = queued
    assert tag == 0 and closure.build_output_remote_value() is remote_value
    assert isinstance(closure, tf_cc.ResourceClosure)  # the worker loop tells it apart
    per_worker = tf_values.PerWorkerValues((remote_value,))
    waits = {
        "fetch": remote_value.fetch,
        "get": remote_value.get,
        # TF's ClusterCoordinator.fetch (ours inherits it) of a PerWorkerValues' values.
        "coordinator_fetch": lambda: tf_cc.ClusterCoordinator.fetch(None, per_worker._values),
    }
    ended, checks = _wait_on_a_trainer(waits[wait], remote_value)
    assert ended == ("exit", RESTART_CODE) and checks >= 1, (ended, checks)


class RecordingEvent(threading.Event):
    """A remote value's status event that records the timeout of every wait and is set
    by the first wait without one (the value arrives while the caller waits on it; a
    function with no output, so that no copy to a coordinator is made)."""

    def __init__(self, remote_value) -> None:
        super().__init__()
        self.remote_value = remote_value
        self.timeouts: list = []

    def wait(self, timeout=None) -> bool:
        self.timeouts.append(timeout)
        if timeout is None and not self.is_set():
            self.remote_value._set_values(None)
        return super().wait(timeout)


def test_tfs_own_worker_keeps_tfs_values_and_waits_beside_ours():
    """In one process, TF's ``Worker`` still makes TF's ``RemoteValueImpl``, and its
    wait on the training thread of an open handler is TF's one plain wait (no check),
    while our ``Worker``'s value waits in slices with the checks between them. Nothing
    of TF's classes is replaced (no global patch)."""
    tf_queued: list = []
    ours_queued: list = []
    tf_value = _worker(tf_cc.Worker, tf_queued).create_resource(make_resource)
    ours = _worker(_worker_loop.Worker, ours_queued).create_resource(make_resource)
    assert type(tf_value) is tf_values.RemoteValueImpl
    assert type(tf_queued[0][0]) is tf_cc.ResourceClosure
    assert type(ours) is not tf_values.RemoteValueImpl
    assert isinstance(ours, tf_values.RemoteValueImpl)
    assert tf_cc.ResourceClosure._init_remote_value.__module__ == tf_cc.__name__
    for name in ("_get_values", "_get_error", "_wait_and_maybe_error", "get", "fetch"):
        assert getattr(tf_values.RemoteValueImpl, name).__module__ == tf_values.__name__, name

    check = FakeCheck(threading.get_ident())
    check.check_in_join = lambda: setattr(check, "checks", check.checks + 1)
    _join_checks.register_join(check, PROTOCOL)
    try:
        tf_value._status_available_event = RecordingEvent(tf_value)
        assert tf_value.fetch() is None
        assert tf_value._status_available_event.timeouts[0] is None
        assert check.checks == 0
        ours._status_available_event = event = RecordingEvent(ours)
        event.wait = _first_waits_time_out(event, check)
        assert ours.fetch() is None
        assert check.checks >= 1 and event.timeouts[0] == PROTOCOL.poll_timeout(Lane.Join()) > 0
    finally:
        _join_checks.unregister_join(check)


def _first_waits_time_out(event: RecordingEvent, check: FakeCheck):
    """``event.wait`` whose sliced waits end at once until a check was made, then sets
    the value (the save made room for it), so the test needs no clock."""

    def wait(timeout=None) -> bool:
        event.timeouts.append(timeout)
        if check.checks and not event.is_set():
            event.remote_value._set_values(None)
        return threading.Event.wait(event, 0 if not event.is_set() else timeout)

    return wait
