"""Child of ``test_first_calls.py``: in a fresh interpreter, eight threads make
the first call of one native entry point (or of all of them) at the same moment.

``python first_calls_child.py SCENARIO [THREADS]`` prints ``ok SCENARIO`` and
exits 0 when every thread returned. It never decides a verdict by time: its only
bound (``faulthandler.dump_traceback_later``) turns a hang into exit code 1 with
every thread's stack on stderr, which the test shows.

TensorFlow is blocked (its import would take seconds per process and is not
what is tested): the classifier then uses the stand-in error classes, which
take the same native paths (per-type cache, type-layout check).
"""

from __future__ import annotations

import faulthandler
import logging
import random
import signal
import sys
import threading
import traceback


class _NoTensorFlow:
    def find_spec(self, name, path=None, target=None):
        if name == "tensorflow" or name.startswith("tensorflow."):
            raise ImportError("tensorflow is blocked in this test")
        return None


#: A hang becomes a failure after this many seconds, with every thread's stack.
HANG_BOUND = 60.0

# Nothing native is called at import but the module's init; TensorFlow is
# imported lazily (``_errors.module()``), after ``main`` blocked it. The test
# imports this module for its names only.
from tf_failure_handling import _errors, _native, testing  # noqa: E402

CLOSED_PORT_URL = "http://127.0.0.1:9"


def _error() -> BaseException:
    return _errors.make("InvalidArgumentError", "assertion failed: [x == y]")


def classifier() -> None:
    assert _native.classify_failure(_error()) == (False, False)


def _resolve_error_classes() -> None:
    """Resolves the classifier's error classes without classifying an exception.

    A coordinator has imported TensorFlow's error classes long before its
    workers' first closures fail, so their first classifications meet in the
    type-layout check at once; this puts the child in the same place (an object
    that is not an exception takes ``isinstance``, not the per-type cache).
    """
    assert _native.classify_failure(object()) == (False, False)


def is_worker_failure() -> None:
    assert (
        _native.is_worker_failure(
            _errors.make("UnavailableError", "/job:worker/replica:0/task:1: Socket closed")
        )
        is True
    )


def is_ps_failure() -> None:
    message = "GRPC error information from remote target /job:ps/replica:0/task:0"
    assert _native.is_ps_failure(_errors.make("UnavailableError", message)) is True


def failed_ps_instances() -> None:
    assert _native.failed_ps_instances("/job:ps/replica:0/task:3 down") == {3}


def type_layout() -> None:
    assert _native._type_layout_known() is True


def transient_failures() -> None:
    t = _native.TransientFailures(1, 8)
    t.record_and_ignore_transient_ps_failure(_error())
    t.record_and_ignore_transient_timeouts(_errors.make("DeadlineExceededError", "late"))
    t.state()


def closure_queue() -> None:
    class Closure:
        def mark_cancelled(self) -> None:
            pass

    q = _native.ClosureQueue(4)
    q.put(Closure())
    assert q.get(timeout=5) is not None
    q._error  # noqa: B018 - the getter is an entry point too
    q.inflight_closure_count = q.inflight_closure_count
    error = _error()
    q.finish(error)  # the subclass's mark_failed
    try:
        q.wait(timeout=5)
    except type(error) as e:  # the pending error is raised, as TF's queue does
        assert e is error
    assert q.wait(0) is True  # the subclass's done()


def handler_core() -> None:
    core = _native.HandlerCore()
    protocol = core._protocol_core()
    protocol.configure(worker_id=0, num_workers=2, grace_period=0.0)
    assert core.run(lambda x: x + 1, 1) == 2
    protocol.begin_step()
    protocol.state()
    protocol.handle(_native.Event.Notice("test", "m"))
    protocol.poll()
    protocol.poll_timeout()


def inbox() -> None:
    box = _native.Inbox()
    box.post(_native.Inbox.Input.Notice("test"))
    box.post(_native.Inbox.Input.StepKey(_native.RUN_TO_CHECKPOINT, "7"))
    assert box.recv(timeout=5) is not None
    box.drain()
    box.post(_native.Inbox.Input.Stop())


def signal_watch() -> None:
    box = _native.Inbox()
    watch = _native.SignalWatch([signal.SIGUSR2], inbox=box)
    assert box.recv(0, watch) is None
    watch.close()
    box.post(_native.Inbox.Input.Stop())


def metadata_probe() -> None:
    gce = next(row["probe"] for row in _native.platforms() if row["name"] == "gce")
    assert gce(CLOSED_PORT_URL, 0.5) is False


def metadata_watch() -> None:
    watch = _native.MetadataWatch("aws", CLOSED_PORT_URL, interval=0.05, request_timeout=0.2)
    watch.close()


def testing_service() -> None:
    service = testing.InMemoryCoordinationService()
    name = threading.current_thread().name
    service.set_config_key_value(name, "v")
    assert service.get_config_key_value(name, timeout_in_ms=5000) == "v"
    service.keys()


#: Shared by the threads, as the poller's and the calls' cores are in a coordinator.
_PROTOCOL = _native.CoordinatorProtocol([])


def ps_control() -> None:
    task = threading.current_thread().name
    call, abandoned = _PROTOCOL.start_call(task)
    assert abandoned is None and _PROTOCOL.call_returned(task, call)
    event, lane = _native.CoordinatorProtocol.Event, _native.CoordinatorProtocol.Lane
    _PROTOCOL.handle(event.PollFailed(task, RuntimeError("Could not find callback")))
    _PROTOCOL.handle(event.Answered(task, {"incarnation": "inc", "notice": {"at": 1.0}}))
    _PROTOCOL.handle(event.ReleaseStart(task, "drained", None))
    release = _PROTOCOL.poll(lane.Release(task))
    assert release.incarnation == "inc" and release.notice_at == 1.0
    _PROTOCOL.handle(event.ReleaseAnswered(task, {"released": True}))
    assert _PROTOCOL.poll(lane.Release(task)).end == "released"
    _PROTOCOL.poll_timeout(lane.Poll())
    _PROTOCOL.state()
    served = _native.TaskProtocol("ps", 0, task, 30.0)
    served.handle(_native.TaskProtocol.Event.Notice("signal SIGTERM", None, 0.0))
    at = served.answer({"op": "poll"})["notice"]["at"]
    assert served.answer({"op": "release", "incarnation": task, "notice_at": at})["released"]
    served.poll()
    served.state()


def records_and_shares() -> None:
    """The records' reading (detached), stamping and claims; the shares' waits, whose
    poll waits (detached, no lock held) for the pause before a look; the input's
    timing."""
    line = b'{"schema": 1, "stage": "exit", "time": 5.0, "job": "w", "task": 0}\n'
    name = threading.current_thread().name
    assert '"preemptions"' in _native.read_records([(name, line), (name + "x", None)])
    assert _native.read_records([(name, line)], ("w", "0")) != "null"
    assert _native.record_valid({"stage": "exit", "time": 1.0, "job": "w", "task": 0})
    assert _native.stamp_record({"stage": "exit"}) > 0
    _native.claim_resume(name, "w", "0", None)
    probe = _native.SharesWaits(probe=True)
    assert probe.poll().timeout > 0
    probe.handle("token")
    probe.handle("looked", seen=False)
    assert isinstance(probe.poll(), _native.SharesWaits.Action.Look), "after the pause"
    save = _native.SharesWaits(chief=True)
    save.handle("part_written")
    save.handle("parts_checked")
    assert isinstance(save.poll(), _native.SharesWaits.Action.Merge)
    save.handle("merged")
    assert _native.InputResume.Timing(advance=True).poll_timeout() >= 0


SCENARIOS = {
    f.__name__: f
    for f in (
        classifier,
        is_worker_failure,
        is_ps_failure,
        failed_ps_instances,
        type_layout,
        transient_failures,
        closure_queue,
        handler_core,
        inbox,
        signal_watch,
        metadata_probe,
        metadata_watch,
        testing_service,
        ps_control,
        records_and_shares,
    )
}


def everything() -> None:
    """Every entry point, each thread in its own order."""
    order = list(SCENARIOS.values())
    random.Random(threading.get_ident()).shuffle(order)
    for call in order:
        call()


def main() -> int:
    name = sys.argv[1]
    threads = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    call = everything if name == "everything" else SCENARIOS[name]
    sys.meta_path.insert(0, _NoTensorFlow())
    # Every record reaches a handler: pyo3-log hands each one to Python logging,
    # which needs the GIL (one of the ways a Rust lock could wait for it).
    logging.basicConfig(level=logging.DEBUG, stream=sys.stdout, format="%(threadName)s %(message)s")
    if name == "classifier":
        _resolve_error_classes()
    faulthandler.dump_traceback_later(HANG_BOUND, exit=True)
    # Python switches threads as often as it can: an initializer that runs
    # Python is interrupted right away, with others already at the door.
    sys.setswitchinterval(1e-6)
    start = threading.Barrier(threads)
    errors: list[BaseException] = []

    def worker() -> None:
        start.wait()
        try:
            call()
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    pool = [threading.Thread(target=worker, name=f"first-call-{i}") for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    sys.setswitchinterval(0.005)
    faulthandler.cancel_dump_traceback_later()
    if errors:
        print(f"{len(errors)} of {threads} threads raised; the first:", file=sys.stderr)
        traceback.print_exception(errors[0], file=sys.stderr)
        return 2
    print(f"ok {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
