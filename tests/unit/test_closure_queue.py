"""The closure queue, as TensorFlow's ``Cluster`` and ``Worker`` use it.

Drop-in tests: every behaviour script runs against ours and against TensorFlow's own
``_CoordinatedClosureQueue`` (the ``tf`` parameter, skipped without TensorFlow), with
stand-in closures. Where we deliberately differ (real deadlines, Ctrl-C), only ours is
asserted. Note TF's ``put`` raises a pending error *after* enqueuing, so the closure
just put is cancelled too; both implementations are held to that.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any, Callable, Optional

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from tf_failure_handling._coordinator.closure_queue import MAX_SIZE, ClosureQueue

from .conftest import BLOCK_TENSORFLOW, wait_until

HAVE_TF = importlib.util.find_spec("tensorflow") is not None
IMPLS = [
    "ours",
    pytest.param("tf", marks=pytest.mark.skipif(not HAVE_TF, reason="TensorFlow is not installed")),
]

#: How long a thread is given to reach a blocking call before we check it blocks
#: (only ever followed by checks that it has *not* returned: a slow thread cannot
#: fail them).
SETTLE = 0.1
#: A bound that only turns a hang into a failure.
HANG = 60.0


def tf_module() -> Any:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from tensorflow.python.distribute.coordinator import cluster_coordinator

    return cluster_coordinator


class FakeClosure:
    """A closure stand-in: a ``tag`` slot and a ``mark_cancelled`` that counts."""

    def __init__(self, name: Any = None) -> None:
        self.name = name
        self.tag: Any = "never set"
        self.cancelled = 0

    def mark_cancelled(self) -> None:
        self.cancelled += 1

    def __repr__(self) -> str:
        return f"FakeClosure({self.name!r})"


class Background:
    """Runs ``fn`` on a daemon thread; ``result()`` joins and re-raises."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self._value: Any = None
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self._value = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised by result()
            self._error = e

    @property
    def finished(self) -> bool:
        return not self._thread.is_alive()

    def result(self, timeout: float = HANG) -> Any:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the background call did not return"
        if self._error is not None:
            raise self._error
        return self._value


@pytest.fixture(params=IMPLS)
def make_queue(request, monkeypatch):
    """``make(max_size=None)`` builds the parametrized queue; stopped at teardown."""
    made: list = []

    def make(max_size: Optional[int] = None) -> Any:
        if request.param == "ours":
            q = ClosureQueue() if max_size is None else ClosureQueue(max_size)
        else:
            cc = tf_module()
            if max_size is not None:
                monkeypatch.setattr(cc, "_CLOSURE_QUEUE_MAX_SIZE", max_size)
            q = cc._CoordinatedClosureQueue()
        made.append(q)
        return q

    make.impl = request.param
    yield make
    for q in made:
        q.stop()


def closures(*names: Any) -> list:
    return [FakeClosure(n) for n in names]


# ---- ordering and counting ---------------------------------------------------


def test_main_queue_is_fifo_and_counts_in_flight(make_queue):
    q = make_queue()
    cs = closures("a", "b", "c")
    for c in cs:
        q.put(c)
    assert [c.tag for c in cs] == [None, None, None]
    assert [q.get(), q.get(), q.get()] == cs
    assert q.inflight_closure_count == 3
    for _ in cs:
        assert not q.done()
        q.mark_finished()
    assert q.inflight_closure_count == 0
    assert q.done()


def test_tag_queue_first_and_tagged_gets_not_in_flight(make_queue):
    q = make_queue()
    main, t0, t1 = closures("main", "t0", "t1")
    q.put(main)
    q.put(t0, tag=0)
    q.put(t1, tag=1)
    assert (main.tag, t0.tag, t1.tag) == (None, 0, 1)
    assert q.get(tag=0) is t0
    assert q.inflight_closure_count == 0
    assert q.get(timeout=0.05) is main, "an untagged get skips tag queues"
    assert q.inflight_closure_count == 1
    assert q.get(timeout=0.05) is None
    assert q.get(tag=1) is t1
    assert q.inflight_closure_count == 1


def test_get_from_an_empty_tag_falls_back_to_the_main_queue(make_queue):
    q = make_queue()
    (a,) = closures("a")
    q.put(a)
    assert q.get(tag=5) is a
    assert q.inflight_closure_count == 1


def test_get_times_out_with_none(make_queue):
    q = make_queue()
    start = time.monotonic()
    assert q.get(timeout=0.1) is None
    assert q.get(timeout=0) is None
    assert q.get(timeout=-1) is None
    assert 0.09 <= time.monotonic() - start < HANG


def test_get_wakes_when_a_closure_arrives(make_queue):
    q = make_queue()
    getter = Background(lambda: q.get(timeout=HANG, tag=2))
    time.sleep(SETTLE)
    (a,) = closures("a")
    q.put(a, tag=2)
    assert getter.result() is a


def test_put_back_goes_to_the_tail(make_queue):
    q = make_queue()
    a, b = closures("a", "b")
    q.put(a)
    q.put(b)
    assert q.get() is a
    q.put_back(a)
    assert q.inflight_closure_count == 0
    assert a.cancelled == 0
    assert q.get() is b
    assert q.get() is a


def test_put_back_of_a_tagged_closure_is_an_assertion_error(make_queue):
    q = make_queue()
    (a,) = closures("a")
    q.put(a, tag=0)
    assert q.get(tag=0) is a
    with pytest.raises(AssertionError):
        q.put_back(a)


def test_clear_tag_unlocked_drops_without_cancelling(make_queue):
    q = make_queue()
    a, b = closures("a", "b")
    q.put(a, tag=0)
    q.put(b, tag=0)
    q.clear_tag_unlocked(0)
    assert q.get(timeout=0.05, tag=0) is None
    assert (a.cancelled, b.cancelled) == (0, 0)


def test_done_reports_idle(make_queue):
    q = make_queue()
    assert q.done()
    (a,) = closures("a")
    q.put(a)
    assert not q.done()
    q.get()
    assert not q.done()
    q.mark_finished()
    assert q.done()
    assert q.wait(timeout=0.1) is True


@pytest.mark.parametrize("method", ["mark_finished", "put_back", "mark_failed"])
def test_reports_with_nothing_in_flight_are_assertion_errors(make_queue, method):
    q = make_queue()
    (a,) = closures("a")
    q.put(a)
    q.put(FakeClosure("t"), tag=0)
    q.get(tag=0)  # a tagged get: still nothing in flight
    untagged = FakeClosure("x")
    untagged.tag = None
    args = {"mark_finished": (), "put_back": (untagged,), "mark_failed": (ValueError(),)}
    with pytest.raises(AssertionError, match=f"^There is no inflight closures to {method}\\.$"):
        getattr(q, method)(*args[method])
    assert q.inflight_closure_count == 0
    assert not q.done()
    assert q.get() is a


# ---- blocking puts -----------------------------------------------------------


def test_put_blocks_while_full_and_a_get_unblocks_it(make_queue):
    q = make_queue(max_size=2)
    a, b, c = closures("a", "b", "c")
    q.put(a)
    q.put(b)
    putter = Background(lambda: q.put(c))
    time.sleep(SETTLE)
    assert not putter.finished, "put blocks while the main queue is full"
    assert q.get() is a
    putter.result()
    assert [q.get(), q.get()] == [b, c]


def test_tagged_put_never_blocks(make_queue):
    q = make_queue(max_size=1)
    q.put(FakeClosure("a"))
    for i in range(5):
        q.put(FakeClosure(i), tag=0)  # would hang the test if it blocked
    assert q.get(tag=0).name == 0


class ReadTimeout:
    """A timeout that records that it was read.

    Our native ``wait()`` reads its timeout (``float()``) as it starts and then closes
    the gate to untagged puts before it first releases the GIL; ``__float__`` releases
    no GIL between its store and its return. So a thread that holds the GIL and sees
    ``read`` set knows that the wait runs and the gate is closed.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.read = False

    def __float__(self) -> float:
        self.read = True
        return self.seconds


def test_put_blocks_while_a_wait_runs(make_queue):
    q = make_queue()
    a, b = closures("a", "b")
    q.put(a)
    assert q.get() is a
    if make_queue.impl == "tf":
        # TF's wait() holds _put_wait_lock throughout; put() takes it first.
        waiter = Background(lambda: q.wait())
        wait_until(lambda: q._put_wait_lock.locked(), HANG, "the wait to run")
    else:
        timeout = ReadTimeout(HANG)
        waiter = Background(lambda: q.wait(timeout))
        wait_until(lambda: timeout.read, HANG, "the wait to run")
    putter = Background(lambda: q.put(b))
    # put() sets the tag first, then blocks (ours: before it releases the GIL).
    wait_until(lambda: b.tag is None, HANG, "the put to start")
    assert q.get(timeout=0) is None, "an untagged put does not enqueue while a wait() runs"
    assert not waiter.finished, "a is in flight"
    assert not putter.finished, "an untagged put waits for the running wait()"
    q.mark_finished()
    assert waiter.result() is True
    putter.result()
    assert q.get(timeout=1) is b


# ---- errors and cancellation -------------------------------------------------


def test_put_raises_the_error_once_and_cancels_what_is_queued(make_queue):
    q = make_queue()
    a, b, c, d, e = closures("a", "b", "c", "d", "e")
    for x in (a, b, c):
        q.put(x)
    assert q.get() is a
    old_manager = q._cancellation_mgr
    error = ValueError("boom")
    q.mark_failed(error)
    with pytest.raises(ValueError) as raised:
        q.put(d)
    assert raised.value is error, "the same exception object"
    assert [x.cancelled for x in (a, b, c, d)] == [0, 1, 1, 1], (
        "the closure just put is cancelled too"
    )
    assert old_manager.is_cancelled
    assert q._cancellation_mgr is not old_manager and not q._cancellation_mgr.is_cancelled
    assert q.inflight_closure_count == 0
    q.put(e)  # the error was cleared: scheduling works again
    assert q.get() is e
    q.mark_finished()
    assert q.done()


def test_wait_raises_the_error_and_clears_it(make_queue):
    q = make_queue()
    a, b = closures("a", "b")
    q.put(a)
    q.put(b)
    assert q.get() is a
    waiter = Background(lambda: q.wait(timeout=HANG))
    time.sleep(SETTLE)
    error = RuntimeError("worker failed")
    q.mark_failed(error)
    with pytest.raises(RuntimeError) as raised:
        waiter.result()
    assert raised.value is error
    assert (a.cancelled, b.cancelled) == (0, 1)
    assert q.wait(timeout=1) is True
    assert q.done()


def test_done_raises_the_error_and_clears_it(make_queue):
    q = make_queue()
    a, b = closures("a", "b")
    q.put(a)
    q.put(b)
    q.get()
    error = KeyError("k")
    q.mark_failed(error)
    with pytest.raises(KeyError) as raised:
        q.done()
    assert raised.value is error
    assert b.cancelled == 1
    assert q.done()


def test_cancellation_waits_for_closures_in_flight(make_queue):
    q = make_queue()
    a, b, c = closures("a", "b", "c")
    for x in (a, b, c):
        q.put(x)
    assert q.get() is a
    assert q.get() is b
    error = ValueError("a failed")
    q.mark_failed(error)
    waiter = Background(lambda: q.wait(timeout=HANG))
    time.sleep(SETTLE)
    assert not waiter.finished, "cancelling waits until b lands"
    q.mark_finished()
    with pytest.raises(ValueError):
        waiter.result()
    assert (a.cancelled, b.cancelled, c.cancelled) == (0, 0, 1)


def test_put_back_with_an_error_pending_cancels(make_queue):
    q = make_queue()
    a, b = closures("a", "b")
    q.put(a)
    q.put(b)
    assert q.get() is a
    assert q.get() is b
    error = ValueError("a failed")
    q.mark_failed(error)
    q.put_back(b)
    assert b.cancelled == 1
    assert q.inflight_closure_count == 0
    with pytest.raises(ValueError):
        q.wait()


def test_mark_failed_first_error_wins(make_queue):
    q = make_queue()
    for c in closures("a", "b"):
        q.put(c)
    q.get()
    q.get()
    first, second = ValueError("first"), ValueError("second")
    q.mark_failed(first)
    q.mark_failed(second)
    with pytest.raises(ValueError) as raised:
        q.wait()
    assert raised.value is first
    assert q.wait(timeout=0.1) is True, "the second error was dropped"


# ---- stop and deadlines ------------------------------------------------------


def test_stop_releases_blocked_gets(make_queue):
    q = make_queue()
    getters = [Background(lambda t=t: q.get(tag=t)) for t in (None, 0, 1)]
    time.sleep(SETTLE)
    assert not any(g.finished for g in getters)
    q.stop()
    assert [g.result() for g in getters] == [None, None, None]
    q.put(FakeClosure("late"))
    assert q.get() is None, "after stop() even a queued closure is not served"


def test_wait_timeout_is_a_deadline_under_steady_progress(make_queue):
    """Both keep wait()'s deadline while closures finish one by one.

    TF's wait is woken only when the work is done or fails, so steady progress does
    not restart its timeout; what TF does not bound is a wait behind another wait
    (below). The work takes at least 10 s (4,000 closures of >= 5 ms on two
    threads), so a wait(0.2) that returned True would have ignored its deadline.
    """
    q = make_queue()
    for c in closures(*range(4000)):
        q.put(c)
    stop = threading.Event()

    def worker():
        while not stop.is_set() and q.get(timeout=0.5) is not None:
            time.sleep(0.005)
            q.mark_finished()

    workers = [threading.Thread(target=worker, daemon=True) for _ in range(2)]
    for w in workers:
        w.start()
    start = time.monotonic()
    result = q.wait(timeout=0.2)
    elapsed = time.monotonic() - start
    stop.set()
    q.stop()
    for w in workers:
        w.join(HANG)
    assert result is False
    assert elapsed >= 0.19, elapsed


class CountingCondition:
    """Wraps a queue's ``threading.Condition``, recording the timeout of every wait."""

    def __init__(self, condition: threading.Condition) -> None:
        self._condition = condition
        self.timeouts: list = []

    def wait(self, timeout: Optional[float] = None) -> bool:
        self.timeouts.append(timeout)  # under the queue's lock, as the wait begins
        return self._condition.wait(timeout)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._condition, name)


# Backstop above its own bounds in sequence: TF's path, five waits of HANG (+ 60 s: the
# TensorFlow import).
@pytest.mark.timeout(5 * HANG + 60)
def test_get_timeout_is_a_deadline_while_other_tags_are_fed(make_queue):
    """TF restarts get()'s timeout at every wake-up, and a put for any tag wakes it.

    So a quiet worker's get(timeout) never returns while other workers are fed.
    TF: every wait after a wake-up is given the whole timeout again. Ours: the get
    returns at its deadline although closures for another tag keep arriving until
    it does.
    """
    q = make_queue()
    if make_queue.impl == "tf":
        condition = CountingCondition(q._closures_queued_condition)
        q._closures_queued_condition = condition
        getter = Background(lambda: q.get(timeout=HANG, tag=1))
        for wakeups in range(3):
            wait_until(lambda n=wakeups: len(condition.timeouts) > n, HANG, "the get to wait")
            q.put(FakeClosure("other"), tag=0)  # wakes the get, which waits again
        wait_until(lambda: len(condition.timeouts) == 4, HANG, "the get to wait again")
        assert condition.timeouts == [HANG] * 4, "each wait after a wake-up: the whole timeout"
        assert not getter.finished
        q.stop()
        assert getter.result() is None
        return

    feeding = threading.Event()
    feeding.set()
    fed = []

    def feed():
        end = time.monotonic() + HANG
        while feeding.is_set() and time.monotonic() < end:
            q.put(FakeClosure("other"), tag=0)
            fed.append(1)
            time.sleep(0.01)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    wait_until(lambda: fed, HANG, "the feeder to start")
    start = time.monotonic()
    result = q.get(timeout=0.2, tag=1)
    elapsed = time.monotonic() - start
    still_feeding = feeder.is_alive()
    feeding.clear()
    feeder.join(HANG)
    assert result is None
    assert elapsed >= 0.19, elapsed
    assert still_feeding, "the get returned only once the feeding stopped"


class RecordingLock:
    """Wraps a lock used as a context manager, counting the threads that try to enter."""

    def __init__(self, lock: Any) -> None:
        self._lock = lock
        self.attempts = 0

    def __enter__(self) -> Any:
        self.attempts += 1
        return self._lock.__enter__()

    def __exit__(self, *exc: Any) -> Any:
        return self._lock.__exit__(*exc)


def test_wait_deadline_next_to_another_wait(make_queue):
    """A second wait(timeout) while another wait runs.

    TF: the second waits for the first to end on a lock that takes no timeout, so its
    timeout is never applied: it returns True once the first is done. Ours: the
    second returns False at its own deadline while the first still waits.
    """
    q = make_queue()
    (a,) = closures("a")
    q.put(a)
    q.get()
    if make_queue.impl == "tf":
        lock = RecordingLock(q._put_wait_lock)
        q._put_wait_lock = lock
    first = Background(lambda: q.wait(timeout=HANG))
    if make_queue.impl == "tf":
        wait_until(lambda: lock.attempts == 1, HANG, "the first wait to run")
        second = Background(lambda: q.wait(timeout=0.1))
        wait_until(lambda: lock.attempts == 2, HANG, "the second wait to block")
        time.sleep(0.3)  # past the second's timeout: it cannot return before the first
        assert not second.finished and not first.finished
        q.mark_finished()
        assert first.result() is True
        assert second.result() is True, "the second's timeout was never applied"
        return
    second = Background(lambda: q.wait(timeout=0.1))
    assert second.result() is False
    assert not first.finished, "the first wait cannot end before the closure finishes"
    q.mark_finished()
    assert first.result() is True


def test_native_class_and_defaults():
    q = ClosureQueue()
    assert MAX_SIZE == 256 * 1024
    assert q.inflight_closure_count == 0
    assert hasattr(q._cancellation_mgr, "start_cancel")
    q.stop()
    assert q._cancellation_mgr.is_cancelled
    with pytest.raises(TypeError):
        ClosureQueue().put(FakeClosure(), tag="not an int")


def test_mark_cancelled_failure_is_raised_and_the_rest_still_cancelled():
    q = ClosureQueue()

    class Broken(FakeClosure):
        def mark_cancelled(self) -> None:
            super().mark_cancelled()
            raise OSError("cannot cancel")

    a, c = FakeClosure("a"), FakeClosure("c")
    b = Broken("b")
    for x in (a, b, c):
        q.put(x)
    q.get()
    q.mark_failed(ValueError("boom"))
    with pytest.raises(OSError):
        q.done()
    assert (b.cancelled, c.cancelled) == (1, 1)
    assert q.done()


def test_unbounded_when_max_size_is_not_positive():
    q = ClosureQueue(0)
    for c in closures(*range(100)):
        q.put(c)
    assert q.qsize() == 100


def test_a_cycle_through_the_pending_error_is_collected():
    import gc
    import weakref

    q = ClosureQueue()
    q.put(FakeClosure("a"))
    q.get()
    error = ValueError("boom")
    error.queue = q  # queue -> error -> queue
    q.mark_failed(error)
    ref = weakref.ref(q)
    del q, error
    gc.collect()
    assert ref() is None


# ---- Ctrl-C ------------------------------------------------------------------

CTRL_C_SCRIPT = (
    BLOCK_TENSORFLOW
    + """
import signal
import time

from tf_failure_handling._coordinator.closure_queue import ClosureQueue

# A parent that ignores SIGINT (a shell's background job) passes that on, and
# Python then installs no KeyboardInterrupt handler: install it.
signal.signal(signal.SIGINT, signal.default_int_handler)


class C:
    tag = None

    def mark_cancelled(self):
        pass


q = ClosureQueue(1)
case = sys.argv[1]
if case == "get":
    call = q.get
elif case == "wait":
    q.put(C())
    q.get()
    call = q.wait
elif case == "put":
    q.put(C())
    call = lambda: q.put(C())
elif case == "cancel":
    q.put(C())
    q.get()
    q.put(C())
    q.get()
    q.mark_failed(ValueError("x"))  # one closure still in flight: cancelling waits
    call = q.done
try:
    print("READY", flush=True)
    call()
    print("RETURNED", flush=True)
except KeyboardInterrupt:
    print("INTERRUPTED", flush=True)
    if case == "cancel":
        q.mark_finished()
        try:
            q.done()
        except ValueError:
            print("ERROR STILL PENDING", flush=True)
"""
)


def main_thread_blocked(pid: int) -> bool:
    """Whether process ``pid``'s main thread sleeps on a futex (a lock or condition wait).

    The script has no other thread that could hold the GIL, so after ``READY`` its
    main thread sleeps on a futex only inside the blocking call.
    """
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        with open(f"/proc/{pid}/wchan") as f:
            wchan = f.read()
    except OSError:
        return False
    return state == "S" and "futex" in wchan


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/<pid>/wchan")
@pytest.mark.parametrize("case", ["get", "wait", "put", "cancel"])
def test_ctrl_c_interrupts_a_blocked_call(case, tmp_path):
    """SIGINT reaches a call blocked without a timeout: KeyboardInterrupt, not a hang.

    The signal is sent once the call is seen blocked (not after a guessed delay),
    and the call would otherwise never return, so the verdict cannot depend on the
    machine's speed. (How fast it answers is a figure for a bench, not a test.)
    """
    script = tmp_path / "block.py"
    script.write_text(textwrap.dedent(CTRL_C_SCRIPT))
    proc = subprocess.Popen(
        [sys.executable, str(script), case],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "READY", proc.stderr.read()
        wait_until(lambda: main_thread_blocked(proc.pid), HANG, f"{case}() to block")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=HANG)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    lines = out.splitlines()
    assert lines[:1] == ["INTERRUPTED"], (out, err)
    if case == "cancel":
        assert "ERROR STILL PENDING" in lines, "an interrupted cancellation keeps the error"


# ---- property: threads -------------------------------------------------------

ACTIONS = st.lists(
    st.sampled_from(["finish", "slow_finish", "fail", "put_back"]), min_size=1, max_size=4
).map(lambda a: a if any(x != "put_back" for x in a) else [*a, "finish"])
SCHEDULE = st.lists(
    st.sampled_from(["put", "put", "put", "put_tagged", "pause", "wait", "done"]), max_size=30
)


class Recorded(FakeClosure):
    def __init__(self, name: int, ends: dict, tagged: bool) -> None:
        super().__init__(name)
        self.ends = ends
        self.tagged = tagged

    def end(self, how: str) -> None:
        self.ends.setdefault(self.name, []).append(how)

    def mark_cancelled(self) -> None:
        self.end("cancelled")


def run_schedule(q: Any, schedule: list, workers: list) -> None:
    ends: dict = {}
    stopping = threading.Event()
    lock = threading.Lock()

    def work(index: int, actions: list) -> None:
        turn = 0
        while not stopping.is_set():
            c = q.get(timeout=0.01, tag=index)
            if c is None:
                continue
            if c.tagged:
                c.end("finished")
                continue
            action = actions[turn % len(actions)]
            turn += 1
            with lock:
                max_inflight[0] = max(max_inflight[0], q.inflight_closure_count)
            if action == "slow_finish":
                time.sleep(0.002)  # lets the queue back up, so errors find closures to cancel
            if action in ("finish", "slow_finish"):
                c.end("finished")
                q.mark_finished()
            elif action == "fail":
                c.end("failed")
                q.mark_failed(ValueError(c.name))
            else:
                q.put_back(c)

    max_inflight = [0]
    threads = [
        threading.Thread(target=work, args=(i, a), daemon=True) for i, a in enumerate(workers)
    ]
    for t in threads:
        t.start()
    raised: list = []
    untagged: list = []

    def check_all_ended() -> None:
        missing = [n for n in untagged if n not in ends]
        assert not missing, f"settled with {missing} neither queued, in flight nor ended"

    def settle(call: Callable[[], Any]) -> Any:
        try:
            return call()
        except ValueError as e:
            raised.append(e)
            check_all_ended()
            return None

    try:
        for n, op in enumerate(schedule):
            if op == "put":
                untagged.append(n)
                settle(lambda n=n: q.put(Recorded(n, ends, False)))
            elif op == "put_tagged":
                q.put(Recorded(n, ends, True), tag=n % len(workers))
            elif op == "pause":
                time.sleep(0.001)  # let the workers run between puts
            elif op == "wait":
                if settle(lambda: q.wait(timeout=0.005)):
                    check_all_ended()
            elif settle(q.done):
                check_all_ended()
        while True:
            try:
                assert q.wait(timeout=HANG) is True
                break
            except ValueError as e:
                raised.append(e)
        check_all_ended()
        scheduled = sum(op in ("put", "put_tagged") for op in schedule)
        wait_until(lambda: len(ends) == scheduled, HANG, "tagged closures to be served")
    finally:
        stopping.set()
        q.stop()
        for t in threads:
            t.join(5)
    assert q.inflight_closure_count == 0
    assert all(len(v) == 1 for v in ends.values()), {k: v for k, v in ends.items() if len(v) != 1}
    assert len({id(e) for e in raised}) == len(raised), "an error was raised twice"
    assert max_inflight[0] <= len(workers)
    event(f"errors raised: {min(len(raised), 2)}")
    event(f"closures cancelled: {min(sum(v == ['cancelled'] for v in ends.values()), 3)}")


@pytest.mark.parametrize("impl", IMPLS)
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    schedule=SCHEDULE, workers=st.lists(ACTIONS, min_size=1, max_size=3), max_size=st.integers(1, 5)
)
def test_threads_end_every_closure_exactly_once(impl, schedule, workers, max_size):
    if impl == "ours":
        q = ClosureQueue(max_size)
    else:
        cc = tf_module()
        saved = cc._CLOSURE_QUEUE_MAX_SIZE
        cc._CLOSURE_QUEUE_MAX_SIZE = max_size
        try:
            q = cc._CoordinatedClosureQueue()
        finally:
            cc._CLOSURE_QUEUE_MAX_SIZE = saved
    run_schedule(q, schedule, workers)
