"""What a ``schedule()`` leaves for the garbage collector, and the native objects behind it.

CPython's collector runs a full collection of every tracked object each time the
tracked objects that survived two young collections grow by a quarter of that
number; with TensorFlow imported that is ~275k objects and ~120 ms per full
collection. The objects a ``schedule()`` leaves alive until its closure runs decide
how often that happens inside a loop of ``schedule()`` calls (issue 24, item 5).

Here, without a cluster: the closure and ``RemoteValue`` our ``schedule()`` makes
(``_coordinator/function_cache.py``, ``_coordinator/remote_values.py``,
``src/python/closure.rs``'s completion count) against TF's own ``Closure`` and
``RemoteValueImpl``, counted the way the collector sees them; the ``RemoteValue``'s
waits on the native completion count against ``threading.Event``'s contract; and
the closure's references, which the collector must still see so that cycles
through the user's arguments are collected. On a real cluster:
``benches/bench_coordinator.py``.
"""

from __future__ import annotations

import collections
import gc
import statistics
import sys
import threading
import weakref

import pytest

tf = pytest.importorskip("tensorflow", reason="the closures run TensorFlow functions")

from tensorflow.python.distribute.coordinator import cluster_coordinator as tf_cc  # noqa: E402
from tensorflow.python.distribute.coordinator import remote_value as tf_remote_value  # noqa: E402
from tensorflow.python.distribute.coordinator import values as tf_values  # noqa: E402
from tensorflow.python.eager import cancellation  # noqa: E402
from tf_failure_handling import _native  # noqa: E402
from tf_failure_handling._coordinator import function_cache as _function_cache  # noqa: E402
from tf_failure_handling._coordinator import remote_values as _remote_values  # noqa: E402
from tf_failure_handling._coordinator.closure_queue import ClosureQueue  # noqa: E402

#: Bound on any wait in these tests: only turns a hang into a failure.
HANG = 30.0
CALLS = 200


@tf.function
def add(x, y):
    return x + y, x * y


def our_closure(mgr, args=(1, 2)):
    """What our ``schedule()`` builds for a cached call (entry made as after a miss)."""
    tf_closure = tf_cc.Closure(add, mgr, args=args)
    entry = _function_cache._Entry(
        tf_closure._concrete_function, tf_closure._output_type_spec, (), []
    )
    return _function_cache.Closure(entry, mgr, args, None)


def histogram() -> collections.Counter:
    return collections.Counter(type(o).__qualname__ for o in gc.get_objects())


def tracked_per_call(schedule) -> tuple[float, collections.Counter]:
    """Tracked objects ``schedule()`` leaves alive per call, and their types (per call)."""
    warm = [schedule() for _ in range(20)]  # TF's first-use work (thread-locals, caches)
    del warm
    histogram()  # the first look at some types' names makes objects (a metaclass's cache)
    gc.collect()
    gc.disable()
    try:
        before = histogram()
        kept = [schedule() for _ in range(CALLS)]
        after = histogram()
    finally:
        gc.enable()
    del kept
    grown = after - before
    grown.pop("list", None)  # ``kept`` and its growth
    grown.pop("Counter", None)  # ``before``
    return sum(grown.values()) / CALLS, grown


def allocated_per_call(schedule) -> float:
    """Objects of collector-managed types (tracked or not) each call leaves alive: the
    collector's allocation count, which starts its young collections."""
    kept = []
    grown = []
    for _ in range(CALLS):
        before = gc.get_count()[0]
        result = schedule()
        after = gc.get_count()[0]
        kept.append(result)
        if after >= before:  # no collection reset the count meanwhile
            grown.append(after - before)
    return statistics.median(grown)


# ----------------------------------------------------------------------------- per schedule()
def test_a_schedule_leaves_two_tracked_objects_where_tfs_leaves_many():
    mgr = cancellation.CancellationManager()
    entry_closure = our_closure(mgr)
    entry = entry_closure._entry
    ours_queue = ClosureQueue(0)
    tf_queue = ClosureQueue(0)
    args = (1, 2)

    def ours():
        closure = _function_cache.Closure(entry, mgr, args, None)
        rv = closure.build_output_remote_value()
        ours_queue.put(closure)
        return rv

    def theirs():
        closure = tf_cc.Closure(add, mgr, args=args)
        rv = closure.build_output_remote_value()
        tf_queue.put(closure)
        return rv

    ours_per_call, ours_types = tracked_per_call(ours)
    tf_per_call, tf_types = tracked_per_call(theirs)
    # The closure and the RemoteValue, nothing else. Python 3.10 keeps an
    # instance's attributes in a dict object of its own (3.11 and later keep them in
    # the instance), so there the RemoteValue (TF's class, which has no __slots__)
    # brings its attribute dict.
    own_dict = 1 if sys.version_info < (3, 11) else 0
    assert ours_per_call == 2 + own_dict, ours_types
    assert {k: v // CALLS for k, v in ours_types.items()} == {
        "Closure": 1,
        "ClosureRemoteValue": 1,
        **({"dict": 1} if own_dict else {}),
    }
    # No untracked object either (no event, no lock).
    assert allocated_per_call(ours) == 2 + own_dict
    # TF's: its Closure, cancellable wrapper (function, cells, tuple), the
    # RemoteValueImpl's Event/Condition/locks/deque/bound methods, a weakref.
    assert tf_per_call >= 10, tf_types
    for name in ("Closure", "RemoteValueImpl", "Event", "Condition", "function", "cell"):
        assert tf_types[name] >= CALLS, (name, tf_types)
    assert allocated_per_call(theirs) >= 10


def test_the_remote_value_is_tfs_class_and_the_closure_is_tracked():
    mgr = cancellation.CancellationManager()
    closure = our_closure(mgr)
    rv = closure.build_output_remote_value()
    assert isinstance(rv, tf_values.RemoteValueImpl)
    assert isinstance(rv, tf_remote_value.RemoteValue)
    assert gc.is_tracked(closure)  # it holds the user's arguments
    assert gc.is_tracked(rv)
    assert closure._kwargs == {} and closure._kwargs is not closure._kwargs  # TF's fresh {}


def test_the_cancelable_wrapper_is_made_once_per_entry_and_manager():
    mgr = cancellation.CancellationManager()
    a = our_closure(mgr)
    b = _function_cache.Closure(a._entry, mgr, (1, 2))
    assert a._function is b._function
    other = cancellation.CancellationManager()
    c = _function_cache.Closure(a._entry, other, (1, 2))
    assert c._function is not a._function


# ----------------------------------------------------------------------------- the closure
class FakeWorker:
    worker_index = 0
    device_name = "/job:localhost/replica:0/task:0/device:CPU:0"

    def __init__(self):
        from tensorflow.python.eager import executor

        self.executor = executor.new_executor(enable_async=False)


def test_closure_runs_and_fills_its_remote_value_as_tfs():
    mgr = cancellation.CancellationManager()
    closure = our_closure(mgr, (3, 4))
    rv = closure.build_output_remote_value()
    with pytest.raises(ValueError, match="cannot be built more than once"):
        closure.build_output_remote_value()
    assert closure._output_remote_value() is rv
    assert closure._output_remote_value_ref() is rv
    closure.execute_on(FakeWorker())
    assert [int(t) for t in rv._get_values()] == [7, 12]  # get() copies to a cluster's chief
    closure._release_output_remote_value()
    assert closure._output_remote_value() is None
    assert closure._output_remote_value_ref is None


def test_a_remote_value_nobody_holds_is_not_filled():
    """TF's closure holds its RemoteValue weakly: one its caller dropped is skipped."""
    mgr = cancellation.CancellationManager()
    closure = our_closure(mgr)
    closure.build_output_remote_value()  # dropped at once
    assert closure._output_remote_value() is None
    assert closure.maybe_call_with_output_remote_value(lambda r: 1 / 0) is None
    closure.execute_on(FakeWorker())  # runs; nothing to fill
    closure.mark_cancelled()  # nothing to cancel


def test_cancelled_and_failed_closures_set_tfs_errors():
    mgr = cancellation.CancellationManager()
    closure = our_closure(mgr)
    rv = closure.build_output_remote_value()
    closure.mark_cancelled()
    with pytest.raises(tf.errors.CancelledError, match=r"cancelled\. Please reschedule"):
        rv.fetch()
    closure = our_closure(mgr)
    rv = closure.build_output_remote_value()
    error = tf.errors.UnavailableError(None, None, "worker lost")
    closure._set_output_error(error)
    assert rv._error is error
    with pytest.raises(tf.errors.UnavailableError, match="worker lost"):
        rv.get()
    assert closure._output_remote_value() is None  # let go after an error


def test_tag_and_function_are_settable_as_tfs_attributes():
    mgr = cancellation.CancellationManager()
    closure = our_closure(mgr)
    assert closure.tag is None
    ClosureQueue(4).put(closure, tag=1)
    assert closure.tag == 1
    original = closure._function
    closure._function = len
    assert closure._function is len
    closure._function = original
    assert closure._concrete_function is closure._entry.concrete_function
    assert closure._output_type_spec is closure._entry.output_type_spec
    assert closure._args == (1, 2) and closure._kwargs == {}


def test_a_cycle_through_a_closures_arguments_is_collected():
    class Payload:
        pass

    mgr = cancellation.CancellationManager()
    entry = our_closure(mgr)._entry
    payload = Payload()
    box = [payload]
    closure = _function_cache.Closure(entry, mgr, (box,), None)
    box.append(closure)  # closure -> args -> box -> closure
    payload.closure = closure
    alive = weakref.ref(payload)
    del payload, box, closure
    gc.collect()
    assert alive() is None


def test_an_error_whose_traceback_holds_the_closure_is_collected():
    """The RemoteValue holds the error, the error's frames hold the closure."""

    class Marker(Exception):
        pass

    mgr = cancellation.CancellationManager()
    closure = our_closure(mgr)
    rv = closure.build_output_remote_value()
    try:
        raise Marker("failed")
    except Marker as e:
        closure._set_output_error(e)
    alive = weakref.ref(rv)
    caught = []
    try:
        rv.get()
    except Marker as e:  # the frame of this test now holds rv through e's traceback
        caught.append(weakref.ref(e))
    del rv, closure
    gc.collect()
    assert alive() is None
    assert caught[0]() is None


# ----------------------------------------------------------------------------- waits
def test_status_event_is_threading_events_contract():
    rv = _remote_values.ClosureRemoteValue(None, None)
    event = rv._status_available_event
    assert not event.is_set()
    assert event.wait(0) is False
    assert event.wait(-1) is False  # no wait, as threading.Event
    assert event.wait(0.01) is False
    rv._set_values(5)
    assert event.is_set() and event.wait() is True and event.wait(0) is True
    assert rv._get_values() == 5 and rv._get_error() is None
    assert rv._status is tf_remote_value.RemoteValueStatus.READY


def test_a_waiting_thread_wakes_when_the_remote_value_is_set():
    rv = _remote_values.ClosureRemoteValue(None, None)
    other = _remote_values.ClosureRemoteValue(None, None)
    started = threading.Event()
    got = []

    def waiter():
        started.set()
        got.append(rv._get_values())

    t = threading.Thread(target=waiter)
    t.start()
    assert started.wait(HANG)
    other._set_values("not mine")  # wakes every waiter; this one waits on
    rv._set_values("mine")
    t.join(HANG)
    assert got == ["mine"]


def test_get_waits_then_raises_or_returns_as_tfs():
    rv = _remote_values.ClosureRemoteValue(None, None)
    rv._set_aborted(tf.errors.UnavailableError(None, None, "gone"))
    with pytest.raises(tf.errors.CancelledError, match="aborted"):
        rv.get()
    rv = _remote_values.ClosureRemoteValue(None, None)
    rv._set_fetched_values((1, 2), ("a", "b"))
    assert rv.get() == ("a", "b")
    assert rv._values == (1, 2) and rv._has_fetched_to_local
    assert rv._fetch_lock is None  # fetched with the values: no lock made


def test_completions_wait_reads_the_status_at_first_and_at_each_advance():
    not_ready = object()
    completions = _native.Completions(not_ready)

    class Value:
        _status = not_ready

    value = Value()
    value._status = not_ready
    assert completions.wait(value, 0) is False
    assert completions.wait(value, -1) is False  # no wait, as threading.Event
    assert completions.wait(value, 0.01) is False
    value._status = "ready"
    assert completions.wait(value) is True  # ready: no wait
    value._status = not_ready
    started = threading.Event()
    woke = []

    def waiter():
        started.set()
        woke.append(completions.wait(value, HANG))

    t = threading.Thread(target=waiter)
    t.start()
    assert started.wait(HANG)
    completions.advance()  # a wake-up for another value: it waits on
    value._status = "ready"
    completions.advance()
    t.join(HANG)
    assert woke == [True]


def test_timed_adds_the_seconds_to_its_cell():
    class Cell:
        def __init__(self):
            self.added = []

        def add(self, seconds):
            self.added.append(seconds)

    cell = Cell()
    timer = _native.Timed(cell)
    timer.add()
    assert len(cell.added) == 1 and 0 <= cell.added[0] < HANG
