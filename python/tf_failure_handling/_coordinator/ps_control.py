"""Preemption notices of a ParameterServerStrategy cluster, over TensorFlow's own RPCs.

:class:`TaskControl` is what ``serve()`` registers in TF's ``py_func`` registry; the
coordinator runs a ``PyFunc`` op on each task's CPU (:func:`call`, bounded) to poll it
(:class:`ClusterPoller`) and release it; :class:`WorkerDrain` takes a worker out of the
rotation. The requests, the bounds and the gRPC keepalive this module adds at import:
docs/getting-started/parameter-server.md, "Preemption under ParameterServerStrategy".
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import weakref
from typing import Any, Callable, Optional

from .._bounded_call import BoundedCall
from .._native import (
    ABANDON_AFTER,
    DEFAULT_DRAIN_BOUND,
    MAX_ABANDONED,
    CallTimeout,
    PollLog,
    Retry,
    RetryVerdict,
    TaskCalls,
    TaskWatch,
    gap_runs,
    release_refused,
    unreleased_hold_bound,
    worker_drain_bound,
)
from .._native import PS_TOKEN as TOKEN

log = logging.getLogger("tf_failure_handling")

# TOKEN (the key of TaskControl in TF's py_func registry), ABANDON_AFTER, MAX_ABANDONED
# and DEFAULT_DRAIN_BOUND are the core's (src/ps_control.rs says what each means).
#: Seconds between two polls of the cluster by the coordinator.
POLL_INTERVAL = 0.5
#: Seconds the coordinator waits for a released worker process to be gone before
#: it gives the worker thread new closures again.
EXIT_WAIT = 30.0
#: Seconds one call to a task may take (a poll, a release): past it the caller goes on
#: and the task counts as unanswered. A call on 127.0.0.1 takes milliseconds.
CALL_TIMEOUT = 5.0

#: Seconds between two keepalive pings on a connection with a call outstanding
#: (gRPC's default of at most 2 pings without data keeps the servers, whose ping policy
#: TensorFlow lets no one change, from answering "too_many_pings").
GRPC_PING_EVERY = 5.0
#: Seconds a ping may go unanswered before gRPC closes the connection, failing its calls
#: (``grpc.http2.ping_timeout_ms`` is the one this gRPC applies to keepalive pings; its
#: default is a minute. ``grpc.keepalive_timeout_ms`` is the documented one).
GRPC_PING_TIMEOUT = 5.0
#: Seconds a reconnection may wait for the peer's HTTP/2 SETTINGS (gRPC's default 20 s):
#: a stopped task accepts the TCP connection and never answers, and new calls to it
#: wait for the attempt.
GRPC_CONNECT_TIMEOUT = 5.0
#: gRPC channel options this package adds to ``TF_GRPC_DEFAULT_OPTIONS`` (the options of
#: every channel TensorFlow creates in this process) unless the user set them there.
GRPC_KEEPALIVE = (
    ("grpc.keepalive_time_ms", int(GRPC_PING_EVERY * 1000)),
    ("grpc.keepalive_timeout_ms", int(GRPC_PING_TIMEOUT * 1000)),
    ("grpc.http2.ping_timeout_ms", int(GRPC_PING_TIMEOUT * 1000)),
    ("grpc.min_reconnect_backoff_ms", int(GRPC_CONNECT_TIMEOUT * 1000)),
)
#: ``1``: add :data:`GRPC_KEEPALIVE` in any process; ``0``: never. Unset: only in a
#: process whose ``TF_CONFIG`` names a ``ps`` job (a ParameterServerStrategy cluster: a
#: MultiWorkerMirroredStrategy process keeps TensorFlow's channels as they are).
GRPC_KEEPALIVE_ENV = "TF_FAILURE_HANDLING_GRPC_KEEPALIVE"
GRPC_OPTIONS_ENV = "TF_GRPC_DEFAULT_OPTIONS"


def keepalive_wanted(environ: Any = None) -> bool:
    """Whether this process should get :data:`GRPC_KEEPALIVE` (:data:`GRPC_KEEPALIVE_ENV`)."""
    environ = os.environ if environ is None else environ
    flag = environ.get(GRPC_KEEPALIVE_ENV, "").strip().lower()
    if flag in ("0", "false", "no", "off"):
        return False
    if flag in ("1", "true", "yes", "on"):
        return True
    try:
        cluster = json.loads(environ.get("TF_CONFIG") or "{}").get("cluster") or {}
    except (ValueError, AttributeError):
        return False  # TensorFlow's resolver says what is wrong with it
    return isinstance(cluster, dict) and bool(cluster.get("ps"))


def add_grpc_keepalive(environ: Any = None) -> Optional[str]:
    """Adds the options of :data:`GRPC_KEEPALIVE` that ``TF_GRPC_DEFAULT_OPTIONS`` does not
    name (TF's format: ``name=value`` pairs separated by commas), when
    :func:`keepalive_wanted`; returns the new value, or None when nothing was added."""
    environ = os.environ if environ is None else environ
    if not keepalive_wanted(environ):
        return None
    current = environ.get(GRPC_OPTIONS_ENV, "")
    named = {item.split("=", 1)[0].strip() for item in current.split(",") if item.strip()}
    added = [f"{name}={value}" for name, value in GRPC_KEEPALIVE if name not in named]
    if not added:
        return None
    kept = [current.strip().strip(",")] if current.strip() else []
    value = ",".join(kept + added)
    environ[GRPC_OPTIONS_ENV] = value
    return value


def grpc_keepalive_time(environ: Any = None) -> Optional[float]:
    """The keepalive period (seconds) ``TF_GRPC_DEFAULT_OPTIONS`` sets, or None (then a
    stopped task stalls this coordinator's new ops until it runs again)."""
    environ = os.environ if environ is None else environ
    for item in environ.get(GRPC_OPTIONS_ENV, "").split(","):
        name, _, value = item.partition("=")
        if name.strip() == "grpc.keepalive_time_ms":
            try:
                return int(value) / 1000.0
            except ValueError:
                return None
    return None


#: What :func:`add_grpc_keepalive` did when this module was imported (None: nothing).
GRPC_OPTIONS_ADDED = add_grpc_keepalive()

#: The control of this process (strongly referenced: TF's registry holds weak ones).
_installed: Optional[TaskControl] = None
#: Our live coordinators (``coordinator.ClusterCoordinator`` registers itself).
_coordinators: weakref.WeakSet = weakref.WeakSet()


#: The step checks of the open handlers of a ParameterServerStrategy coordinator in
#: this process (each has ``closed`` and ``check_in_join()``).
_join_checks: weakref.WeakSet = weakref.WeakSet()
#: Seconds ``ClusterCoordinator.join()`` waits between two looks at the handler.
JOIN_SLICE = 0.2


def register_coordinator(coordinator: Any) -> None:
    """Called by ``ClusterCoordinator.__init__``: the handler finds it here at save time."""
    _coordinators.add(coordinator)


def register_join(check: Any) -> None:
    """Called by a coordinator's handler with its step check; see :func:`join`."""
    _join_checks.add(check)


def unregister_join(check: Any) -> None:
    _join_checks.discard(check)


def join(queue: Any) -> None:
    """``ClusterCoordinator.join()``: ``queue.wait()``, and meanwhile, with an open
    handler, the checks a ``run()`` would make (most training happens inside ``join()``)."""
    wait_checked(queue.wait)


def wait_checked(wait: Callable[..., bool], checks: Optional[list] = None) -> None:
    """``wait()`` (no timeout) in slices of :data:`JOIN_SLICE`, with the checks of the
    open handlers (``checks``: those to make, by default every open one) between the
    slices: a termination notice is acted on while this thread waits -- the checkpoint
    is saved and the process exits, as at a ``run()``."""
    while True:
        if checks is None:
            checks_now = [c for c in list(_join_checks) if not c.closed]
        else:
            checks_now = [c for c in checks if not c.closed]
        if not checks_now:
            wait()
            return
        if wait(timeout=JOIN_SLICE):
            return
        for check in checks_now:
            check.check_in_join()


def handler_run_index() -> Optional[int]:
    """The index of the open handler's ``run()`` that this thread is inside (calling its
    function), or None: a closure scheduled now is that run, which the handler's run
    count counts (``Closure._tfh_run``)."""
    if not _join_checks:
        return None
    me = threading.get_ident()
    for check in list(_join_checks):
        if check.running_thread == me:
            return check.run_index
    return None


def checks_of_this_trainer() -> list:
    """The open handlers whose training thread this is, and that are not inside their
    ``run()`` here: a wait on a result made by this thread may make their checks
    (``ClosureRemoteValue``'s wait; docs/getting-started/parameter-server.md)."""
    if not _join_checks:
        return []
    me = threading.get_ident()
    return [c for c in list(_join_checks) if c.is_trainer(me) and c.running_thread != me]


def _job_task(device: str) -> tuple:
    parts = dict(p.split(":", 1) for p in device.strip("/").split("/") if ":" in p)
    return parts.get("job"), int(parts.get("task", 0))


class TaskControl:
    """What a served PS or worker process answers the coordinator with."""

    def __init__(self, job: str, task: int) -> None:
        self.job = job
        self.task = task
        #: Differs between two runs of the same task (a restart).
        self.incarnation = f"{os.getpid()}-{time.time_ns()}"
        self._lock = threading.Lock()
        self._notice: Optional[dict] = None
        self.released = threading.Event()
        self.release_reason: Optional[str] = None
        #: When (Unix time) the coordinator last asked this task anything (None: never).
        self.last_asked: Optional[float] = None

    def set_notice(self, source: str, deadline: Optional[float]) -> None:
        with self._lock:
            if self._notice is None:
                self._notice = {"source": source, "at": time.time(), "deadline": deadline}

    def __call__(self, request: Any) -> bytes:
        """The body of the ``PyFunc`` op the coordinator runs on this task."""
        try:
            message = json.loads(bytes(request).decode())
        except ValueError:
            message = None
        if not isinstance(message, dict):
            return json.dumps({"error": "not a JSON object"}).encode()
        self.last_asked = time.time()
        op = message.get("op")
        if op == "release":
            return json.dumps(self._release(message)).encode()
        if op != "poll":
            return json.dumps({"error": f"unknown op {op!r}"}).encode()
        with self._lock:
            notice = self._notice
        return json.dumps(
            {"incarnation": self.incarnation, "job": self.job, "task": self.task, "notice": notice}
        ).encode()

    def _release(self, message: dict) -> dict:
        """A release counts only for this incarnation's notice, once it has one (the
        core's ``release_refused``)."""
        with self._lock:
            notice = self._notice
        at = None if notice is None else notice["at"]
        why = release_refused(
            self.incarnation, at, message.get("incarnation"), message.get("notice_at")
        )
        if why is None:
            self.release_reason = str(message.get("reason", "released"))
            self.released.set()
            return {"released": True}
        log.warning(
            "%s %d: a release was refused (%s): only the coordinator that saw this "
            "task's notice releases it.",
            self.job,
            self.task,
            why,
        )
        return {"released": False, "why": why}

    def install(self) -> None:
        """Registers this control in TF's ``py_func`` registry of this process."""
        global _installed
        from tensorflow.python.ops import script_ops

        _installed = self
        script_ops._py_funcs._funcs[TOKEN] = self


def remote_call(task: str, request: dict) -> dict:
    """Runs ``request`` against :class:`TaskControl` of ``task`` (``/job:ps/replica:0/task:0``),
    unbounded (:func:`call` bounds it); raises what TF raises (naming :data:`TOKEN` when the
    task does not run ``serve()``)."""
    from tensorflow.python.eager import context
    from tensorflow.python.framework import constant_op, dtypes, ops
    from tensorflow.python.ops import array_ops, gen_script_ops

    # The request is made, and the answer read, on this process's CPU; only the
    # PyFunc op runs on the task. A tensor created under the task's device scope is
    # copied there while its constructor holds the GIL: a task that does not answer
    # (SIGSTOP) would freeze every Python thread of the coordinator. The op's
    # execution, and the copies of its input and output, release the GIL.
    local = f"{context.context().host_address_space()}/device:CPU:0"
    with ops.device(local):
        message = constant_op.constant(json.dumps(request))
    with ops.device(f"{task}/device:CPU:0"):
        out = gen_script_ops.py_func(input=[message], token=TOKEN, Tout=[dtypes.string])
    with ops.device(local):
        answer = array_ops.identity(out[0])
    return json.loads(answer.numpy().decode())


class CallRefused(CallTimeout):
    """A call not started: the task's earlier call has not returned (the core's
    ``TaskCalls``). A :class:`CallTimeout`, so callers that do not care see one."""


class _Caller:
    """Bounded calls to the tasks (:class:`BoundedCall`). Whether a call may start, and
    which unreturned one it abandons, is the core's (``TaskCalls``: ``abandon_after``,
    ``max_abandoned``); a refused call raises :class:`CallRefused` at once."""

    def __init__(
        self,
        transport: Callable[[str, dict], dict] = remote_call,
        abandon_after: float = ABANDON_AFTER,
        max_abandoned: int = MAX_ABANDONED,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._transport = transport
        self._clock = clock
        self._calls = TaskCalls(abandon_after, max_abandoned)

    def __call__(self, task: str, request: dict, timeout: float = CALL_TIMEOUT) -> dict:
        try:
            call, abandoned = self._calls.start(task, self._clock())
        except CallTimeout as e:
            raise CallRefused(str(e)) from None
        if abandoned is not None:
            log.warning(
                "%s: a call has not returned for %.0fs; it is abandoned (%d of at most %d) "
                "and the task is asked again.",
                task,
                abandoned.age,
                abandoned.count,
                abandoned.max,
            )
        bounded = BoundedCall(lambda: self._run(task, call, request), f"TaskCall {task}")
        try:
            returned = bounded.wait(timeout)
        except BaseException:
            if not bounded.thread.is_alive():
                self._calls.returned(task, call)  # never started: nothing will report it
            raise
        if not returned:
            raise CallTimeout(f"{task} did not answer {request.get('op')!r} within {timeout:.1f}s")
        return bounded.result()

    def _run(self, task: str, call: int, request: dict) -> dict:
        try:
            return self._transport(task, request)
        finally:
            self._calls.returned(task, call)


#: The process's bounded calls to the tasks.
call = _Caller()


class ClusterPoller:
    """The coordinator's watch over the PS and worker tasks' notices.

    ``on_notice(job, task, source, deadline)`` is called once per task incarnation
    with a notice, from the poller's thread. Every task is asked every round,
    whatever it answered before: down, stopped, not (yet) serving.
    """

    def __init__(
        self,
        cluster_spec: dict,
        on_notice: Callable[[str, int, str, Optional[float]], None],
        interval: float = POLL_INTERVAL,
        on_released: Optional[Callable[[str, int, str], None]] = None,
        caller: Optional[Callable[..., dict]] = None,
        call_timeout: float = CALL_TIMEOUT,
        listening: Optional[Callable[[str], bool]] = None,
    ) -> None:
        self._on_released = on_released
        self.tasks = []
        #: task -> its "host:port" in the cluster spec.
        self.addresses: dict = {}
        for job in ("ps", "worker"):
            for i, address in enumerate(cluster_spec.get(job) or ()):
                task = f"/job:{job}/replica:0/task:{i}"
                self.tasks.append(task)
                self.addresses[task] = str(address)
        self._listening = self._port_open if listening is None else listening
        #: Tasks released and not yet seen gone: not asked anything meanwhile (an op
        #: sent to a process that is exiting fails, and TensorFlow can hand that error
        #: to another thread's next op in this process).
        self.leaving: set = set()
        self._on_notice = on_notice
        self._interval = interval
        self._call = call if caller is None else caller
        self._call_timeout = call_timeout
        self._stop = threading.Event()
        self._lock = threading.Lock()
        #: The core's view of each task's answers: incarnations, notices handed on, logs.
        self._watch = TaskWatch()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._loop, name="ParameterServerNoticeWatcher", daemon=True
        )
        self._thread.start()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def stop(self) -> None:
        """Ends the watch; waits (bounded) for a round in progress."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(self._interval + self._call_timeout + 1.0)

    @property
    def incarnations(self) -> dict:
        """Task -> the incarnation of its last answer."""
        return self._watch.incarnations()

    @property
    def unanswered(self) -> dict:
        """Task -> the error type of its last unanswered polls (``"bad answer"``)."""
        return self._watch.unanswered()

    def poll(self, task: str) -> Optional[dict]:
        """One poll of ``task``: its answer, or None (down, stopped, or not served)."""
        try:
            answer = self._call(task, {"op": "poll"}, self._call_timeout)
        except Exception as e:  # noqa: BLE001 - a task that is down is TF's failure path
            self._log(self._watch.failed(task, e), task, e)
            return None
        incarnation = answer.get("incarnation") if isinstance(answer, dict) else None
        if not isinstance(incarnation, str):
            self._watch.bad_answer(task)
            return None
        self._log(self._watch.answered(task, incarnation, answer.get("notice")), task, incarnation)
        return answer

    @staticmethod
    def _log(line: Optional[PollLog], task: str, detail: Any) -> None:
        """The line of the poll's log the core chose (None: nothing to say)."""
        if line == PollLog.NotServed:
            log.info(
                "%s does not run tf_failure_handling.serve(server) (yet): its termination "
                "notices are watched once it does; until then it is handled as a failure "
                "when it goes.",
                task,
            )
        elif line == PollLog.DoesNotAnswer:
            log.info("%s does not answer (%s): asked again next round.", task, detail)
        elif line == PollLog.NewIncarnation:
            log.info("%s answers as a new incarnation (%s): watched like the first.", task, detail)
        elif line == PollLog.AnswersAgain:
            log.info("%s answers again.", task)

    def poll_once(self) -> None:
        """One round: every task asked (but those leaving after their release), each
        incarnation's first notice handed on (the core says which)."""
        for task in self.tasks:
            if self._stop.is_set():
                return
            with self._lock:
                if task in self.leaving:
                    continue
            answer = self.poll(task)
            if answer is None or not self._watch.hand_on(task):
                continue
            notice = answer["notice"]
            job, index = _job_task(task)
            try:
                self._on_notice(job, index, str(notice.get("source")), notice.get("deadline"))
            except Exception as e:  # noqa: BLE001 - the watch goes on
                log.warning("Handling the notice of %s failed: %r", task, e)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll_once()
            except BaseException as e:  # noqa: BLE001 - the watch must not die silently
                log.error("The watch over the cluster's notices failed a round: %r", e)
            self._stop.wait(self._interval)

    def release(self, task: str, reason: str, bound: Optional[float] = None) -> bool:
        """Tells ``task`` that the coordinator is done with it (it exits); False if it
        could not be told (gone, not answering within the bound, or it refused). A
        release that failed is sent again by the core's retry rule for ``bound``
        seconds (by default one call's timeout), unless the watch is stopped."""
        incarnation, notice_at = self._watch.release_names(task)
        request = {
            "op": "release",
            "reason": reason,
            "incarnation": incarnation,
            "notice_at": notice_at,
        }
        retry = Retry(self._call_timeout if bound is None else bound, time.monotonic())
        while True:
            try:
                answer = self._call(task, request, self._call_timeout)
                break
            except CallTimeout as e:
                if not isinstance(e, CallRefused):
                    log.info("Could not release %s (%s): it does not answer.", task, e)
                    return False
                # Refused at once: this task's earlier call (a poll) has not returned.
                error, ask_listening = e, False
            except Exception as e:  # noqa: BLE001 - a task that is gone needs no release
                # TensorFlow can hand one task's error (a stopped PS's) to another
                # thread's next op in this process: while the task still listens, the
                # release is sent again (a release is idempotent for the task).
                error, ask_listening = e, True
            # Either way, sent again by the core's retry rule.
            verdict = retry.failed(time.monotonic(), self._stop.is_set())
            if isinstance(verdict, RetryVerdict.GiveUp) or (
                ask_listening and not self._listening(task)
            ):
                log.info("Could not release %s (%s): it is gone or does not answer.", task, error)
                return False
            log.info("Releasing %s failed (%s); sending it again.", task, error)
            self._stop.wait(max(0.0, verdict.at - time.monotonic()))
        if not isinstance(answer, dict) or not answer.get("released"):
            why = answer.get("why") if isinstance(answer, dict) else answer
            log.warning("%s refused its release (%s).", task, why)
            return False
        with self._lock:
            self.leaving.add(task)
        log.info("Released %s (%s).", task, reason)
        if self._on_released is not None:
            job, index = _job_task(task)
            try:
                self._on_released(job, index, reason)
            except Exception as e:  # noqa: BLE001 - a record must not stop the release
                log.warning("Recording the release of %s failed: %r", task, e)
        return True

    def wait_gone(self, task: str, bound: float) -> bool:
        """After its release: until ``task``'s process is gone -- its port refuses a
        connection -- (True), or ``bound`` seconds pass (False). No op is sent to the
        task meanwhile (see :attr:`leaving`); either way it is asked again afterwards
        (a restarted task is watched like the first)."""
        end = time.monotonic() + bound
        try:
            while not self._stop.is_set():
                if not self._listening(task):
                    return True
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._stop.wait(min(0.1, left))
            return False
        finally:
            with self._lock:
                self.leaving.discard(task)

    def _port_open(self, task: str) -> bool:
        """Whether ``task``'s gRPC port accepts a TCP connection (its server runs)."""
        host, _, port = self.addresses[task].rpartition(":")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
                return True
        except ConnectionRefusedError:
            return False
        except OSError:
            # Not refused (a timeout, no route): the process may still be there.
            return True


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


SAVE_HOLD = "save"


def hold_all(coordinator: Any, strict: bool) -> bool:
    """Holds every worker thread of ``coordinator`` for the coordinator's save (False:
    TensorFlow's own coordinator, whose threads cannot be held)."""
    workers = workers_of(coordinator)
    if not workers or not all(callable(getattr(w, "hold", None)) for w in workers):
        return False
    for worker in workers:
        worker.hold(SAVE_HOLD, strict=strict)
    return True


def resume_all(coordinator: Any) -> None:
    for worker in workers_of(coordinator):
        resume = getattr(worker, "resume", None)
        if callable(resume):
            resume(SAVE_HOLD)


class Unfinished:
    """What :func:`wait_for_closures` left.

    The handler's runs (closures a ``PreemptionCheckpointHandler.run()`` scheduled, by
    their index): ``queued_runs`` never ran and run once after the restart;
    ``in_flight`` (worker index -> function) and ``in_flight_runs`` were in flight at
    the bound: they may be in the checkpoint and run again after it. ``outside_queued``
    and ``outside_in_flight`` are closures scheduled outside ``run()`` (an evaluation,
    say): not in the run count, not run again after the restart. ``unnamed``: closures
    in flight on TensorFlow's own coordinator, which tells neither which worker nor who
    scheduled them (all counted as runs, as ``queued``, without indices). ``gap_runs``:
    the queued runs the save let run first (below a finished run).
    """

    def __init__(
        self,
        queued: int,
        in_flight: dict,
        held: bool,
        unnamed: int = 0,
        outside_queued: int = 0,
        outside_in_flight: Optional[dict] = None,
        queued_runs: Optional[list] = None,
        in_flight_runs: Optional[list] = None,
        gap_runs: Optional[list] = None,
    ) -> None:
        self.queued = queued
        self.in_flight = in_flight
        self.held = held
        self.unnamed = unnamed
        self.outside_queued = outside_queued
        self.outside_in_flight = outside_in_flight or {}
        self.queued_runs = queued_runs
        self.in_flight_runs = in_flight_runs
        self.gap_runs = gap_runs or []

    @property
    def in_flight_count(self) -> int:
        """The handler's runs in flight at the bound."""
        return len(self.in_flight) + self.unnamed

    @property
    def count(self) -> int:
        """The handler's runs not finished."""
        return self.queued + self.in_flight_count

    @property
    def outside_count(self) -> int:
        return self.outside_queued + len(self.outside_in_flight)

    @property
    def indexed(self) -> bool:
        """Whether every unfinished run is known by its index (our coordinator)."""
        return self.queued_runs is not None and self.in_flight_runs is not None

    def __bool__(self) -> bool:
        return self.count + self.outside_count > 0


def _run_of(closure: Any) -> Optional[int]:
    """The index of the handler's ``run()`` that scheduled ``closure``, or None."""
    return getattr(closure, "_tfh_run", None)


class Passes:
    """Closures that held workers may take, in all (:func:`wait_for_closures` lets
    them run the queued runs below a finished one, moved to the queue's head)."""

    def __init__(self, count: int) -> None:
        self._used = threading.Condition()
        self._left = count

    def take(self) -> bool:
        with self._used:
            if self._left <= 0:
                return False
            self._left -= 1
            if self._left == 0:
                self._used.notify_all()
            return True

    @property
    def left(self) -> int:
        with self._used:
            return self._left

    def wait_used(self, timeout: float) -> bool:
        """Until every pass was taken (True) or ``timeout`` seconds pass (False)."""
        with self._used:
            return self._used.wait_for(lambda: self._left <= 0, max(0.0, timeout))


def wait_for_closures(
    coordinator: Any,
    bound: float,
    clock: Callable[[], float] = time.monotonic,
    scheduled: Optional[int] = None,
) -> Unfinished:
    """Before the coordinator's save: holds every worker strictly and gives the closures
    in flight ``bound`` seconds (TF's coordinator cannot be held: then every scheduled
    closure is waited for). A worker whose process was lost put its closure back in
    the queue: it has none in flight (``Worker._on_closure_failure``). With the run
    count ``scheduled``, the queued runs below a finished one (the core's
    ``gap_runs``: one a lost worker put back) are moved to the queue's head and the
    held workers may take that many, within the same bound: then the finished runs
    are a prefix of the runs. Raises a closure's error as ``join()`` would."""
    queue = coordinator._cluster.closure_queue
    held = hold_all(coordinator, strict=True)
    end = clock() + max(0.0, bound)
    if not held:
        if queue.wait(timeout=max(0.0, bound)):
            return Unfinished(0, {}, held)
        unnamed = int(getattr(queue, "inflight_closure_count", 0))
        return Unfinished(_qsize(queue), {}, held, unnamed)
    workers = workers_of(coordinator)
    filled: list = []
    while True:
        left = _left_behind(queue, workers, end, clock)
        if scheduled is None or not left.indexed:
            break
        gaps = gap_runs(scheduled, left.queued_runs, left.in_flight_runs)
        if not gaps or clock() >= end:
            break
        wanted = set(gaps)
        by_run = {_run_of(c): c for c in queue.queued_closures() if _run_of(c) in wanted}
        takers = [w for w in workers if not w.lost()]
        if not by_run or not takers:
            break  # gone from the queue meanwhile, or no worker left to run them
        queue.promote([by_run[r] for r in sorted(by_run)])
        passes = Passes(len(by_run))
        for worker in takers:
            worker.grant(passes)
        filled.extend(sorted(by_run))
        # Until the passes are used; the next round waits for the workers to be idle.
        passes.wait_used(end - clock())
    left.gap_runs = filled
    error = getattr(queue, "_error", None)
    if error is not None and not left:
        queue.wait(timeout=0.0)  # raises the closure's error, as join() would
    return left


def _left_behind(queue: Any, workers: list, end: float, clock: Callable[[], float]) -> Unfinished:
    """Waits (until ``end``) for every held worker to be idle; what is unfinished then."""
    in_flight, outside_in_flight, in_flight_runs = {}, {}, []
    for worker in workers:
        if not worker.wait_idle(max(0.0, end - clock())):
            closure = worker.taken()
            name = worker.in_flight() or "?"
            run = None if closure is None else _run_of(closure)
            if closure is not None and run is None:
                outside_in_flight[worker.worker_index] = name
            else:
                in_flight[worker.worker_index] = name
                if run is not None:
                    in_flight_runs.append(run)
    # The main queue holds the scheduled closures (per-worker resources wait on the
    # workers' tag queues, never counted).
    queued = _qsize(queue)
    listed = getattr(queue, "queued_closures", None)
    if listed is None:  # a queue that cannot list them: every one counts as a run
        return Unfinished(queued, in_flight, True, outside_in_flight=outside_in_flight)
    queued_runs = [r for r in (_run_of(c) for c in listed()) if r is not None]
    return Unfinished(
        len(queued_runs),
        in_flight,
        True,
        outside_queued=queued - len(queued_runs),
        outside_in_flight=outside_in_flight,
        queued_runs=queued_runs,
        in_flight_runs=in_flight_runs if len(in_flight_runs) == len(in_flight) else None,
    )


def _qsize(queue: Any) -> int:
    size = getattr(queue, "qsize", None)
    if callable(size):
        return int(size())
    return int(queue._queue.qsize())


class WorkerDrain:
    """Takes worker ``index`` out of the coordinator's rotation and lets it go, in its own
    thread: hold the worker's closure thread, release the worker process, wait until it
    is gone, resume the thread (docs/getting-started/parameter-server.md)."""

    def __init__(
        self,
        poller: ClusterPoller,
        index: int,
        deadline: Optional[float],
        coordinator: Any = None,
        clock: Callable[[], float] = time.time,
        peer_timeout: Optional[float] = None,
    ) -> None:
        self.poller = poller
        self.index = index
        self.deadline = deadline
        #: The coordinator's ``peer_timeout`` (the handler's; else the default drain
        #: bound): a worker's own wait for its release, when its notice names no
        #: deadline, is taken to be as long (``_hold_until_gone``).
        self.peer_timeout = DEFAULT_DRAIN_BOUND if peer_timeout is None else peer_timeout
        self.task = f"/job:worker/replica:0/task:{index}"
        self._coordinator = coordinator
        self._clock = clock
        #: What happened, for tests and the log: "released", "not released", "no hold".
        self.outcome: Optional[str] = None

    def bound(self) -> float:
        """Seconds the closure in flight gets (the core's ``worker_drain_bound``)."""
        return worker_drain_bound(self.deadline, self._clock())

    def _hold_until_gone(self, incarnation: Optional[str]) -> None:
        """The release failed: the worker still serves its notice and leaves on its own
        bound. It takes no closure meanwhile (each would run on a machine about to go,
        and run again elsewhere after it): held until its process is gone or a new
        incarnation answers, for at most the core's ``unreleased_hold_bound``."""
        bound = unreleased_hold_bound(self.deadline, self.peer_timeout, EXIT_WAIT, self._clock())
        log.warning(
            "Worker %d could not be released: it takes no new closures until it is gone "
            "(at most %.0fs).",
            self.index,
            bound,
        )
        end = time.monotonic() + bound
        while not self.poller.stopped:
            left = end - time.monotonic()
            if left <= 0:
                log.warning(
                    "Worker %d still serves %.0fs after its release failed; it takes "
                    "closures again.",
                    self.index,
                    bound,
                )
                return
            if self.poller.wait_gone(self.task, min(EXIT_WAIT, left)):
                return
            if self.poller.incarnations.get(self.task) != incarnation:
                return  # a new incarnation answers: watched like the first

    def run(self) -> None:
        coordinator = self._coordinator if self._coordinator is not None else find_coordinator()
        workers = workers_of(coordinator)
        worker = workers[self.index] if self.index < len(workers) else None
        if not callable(getattr(worker, "hold", None)):
            log.warning(
                "Worker %d got a termination notice, but the coordinator is not "
                "tf_failure_handling's (use tfh.ClusterCoordinator or tfh.patch()): it cannot "
                "stop giving that worker closures; releasing it now (its closure in flight, "
                "if any, is retried as after a crash: at least once).",
                self.index,
            )
            released = self.poller.release(self.task, "notice; coordinator cannot drain")
            self.outcome = "no hold" if released else "not released"
            return
        bound = self.bound()
        log.info(
            "Worker %d got a termination notice: it gets no new closures; waiting up to "
            "%.1fs for its closure in flight.",
            self.index,
            bound,
        )
        incarnation = self.poller.incarnations.get(self.task)
        reason = f"drain {incarnation}"
        worker.hold(reason)
        try:
            if not worker.wait_idle(bound):
                log.warning(
                    "Worker %d's closure %s did not finish within %.1fs; releasing the worker "
                    "anyway: the closure fails with it and runs again on another worker (if "
                    "its effect reached the variables already, it is applied twice).",
                    self.index,
                    worker.in_flight() or "?",
                    bound,
                )
            released = self.poller.release(self.task, "drained")
            self.outcome = "released" if released else "not released"
            if released:
                if not self.poller.wait_gone(self.task, EXIT_WAIT):
                    log.warning(
                        "Worker %d still answers %.0fs after its release.", self.index, EXIT_WAIT
                    )
            else:
                self._hold_until_gone(incarnation)
        finally:
            worker.resume(reason)
        log.info("Worker %d left; its thread takes closures again when it is back.", self.index)
