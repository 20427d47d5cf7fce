"""Preemption notices of a ParameterServerStrategy cluster, over TensorFlow's own RPCs.

The processes of a parameter-server cluster run no training code of their own:
the PS and worker processes only serve (``server.join()``), and the coordinator
(the chief) drives everything through TensorFlow's eager remote execution. So
the coordinator asks: :func:`tf_failure_handling.serve` registers a Python
function in its process (:class:`TaskControl`, under :data:`TOKEN` in TF's
``py_func`` registry), and the coordinator runs a ``PyFunc`` op on that task's
CPU (:func:`call`) -- TF executes such an op in the process that owns the device,
calling the function registered there. Nothing travels outside TensorFlow's
cluster: no new port, no coordination-service configuration.

The conversation is two JSON requests:

* ``{"op": "poll"}`` -> ``{"incarnation", "job", "task", "notice"}``: the task's
  termination notice, if it has one (``{"source", "at", "deadline"}``, Unix
  seconds);
* ``{"op": "release", "reason"}`` -> ``{"released": true}``: the coordinator is
  done with this task (it saved the checkpoint the PS's variables were part of,
  or the worker's last closure finished); the task exits with the restart code.

:class:`ClusterPoller` is the coordinator's side: one daemon thread polls every
PS and worker task every :data:`POLL_INTERVAL` seconds and hands each first
notice to the handler. A task that does not run ``serve()`` answers with an
error, is logged once and no longer polled; a task that does not answer (down,
restarting) is polled again next round -- that is TF's ordinary failure path.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import weakref
from typing import Any, Callable, Optional

log = logging.getLogger("tf_failure_handling")

#: The key of :class:`TaskControl` in TF's ``py_func`` registry of a served process.
TOKEN = "tf_failure_handling/task_control"
#: Seconds between two polls of the cluster by the coordinator.
POLL_INTERVAL = 0.5
#: Seconds a worker's drain may take when its notice names no deadline.
DEFAULT_DRAIN_BOUND = 300.0
#: Seconds the coordinator waits for a released worker process to be gone before
#: it gives the worker thread new closures again.
EXIT_WAIT = 30.0

#: The control of this process (strongly referenced: TF's registry holds weak ones).
_installed: Optional[TaskControl] = None
#: Our live coordinators (``coordinator.ClusterCoordinator`` registers itself).
_coordinators: weakref.WeakSet = weakref.WeakSet()


#: Open handlers of a ParameterServerStrategy coordinator in this process.
_handlers: weakref.WeakSet = weakref.WeakSet()
#: Seconds ``ClusterCoordinator.join()`` waits between two looks at the handler.
JOIN_SLICE = 0.2


def register_coordinator(coordinator: Any) -> None:
    """Called by ``ClusterCoordinator.__init__``: the handler finds it here at save time."""
    _coordinators.add(coordinator)


def register_handler(handler: Any) -> None:
    """Called by a coordinator's ``PreemptionCheckpointHandler``; see :func:`join`."""
    _handlers.add(handler)


def unregister_handler(handler: Any) -> None:
    _handlers.discard(handler)


def join(queue: Any) -> None:
    """``ClusterCoordinator.join()``: ``queue.wait()``, and meanwhile the checks a
    ``run()`` would make.

    With ParameterServerStrategy ``schedule()`` returns at once, so most of the
    training happens inside ``join()``; a notice that arrives then is acted on
    there (wait for the closures, save, exit), not at a ``run()`` that may never
    come. Without an open handler this is ``queue.wait()``, as TensorFlow.
    """
    while True:
        handlers = [h for h in list(_handlers) if not h._closed]
        if not handlers:
            queue.wait()
            return
        if queue.wait(timeout=JOIN_SLICE):
            return
        for handler in handlers:
            handler._check_in_join()


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

    def set_notice(self, source: str, deadline: Optional[float]) -> None:
        with self._lock:
            if self._notice is None:
                self._notice = {"source": source, "at": time.time(), "deadline": deadline}

    def __call__(self, request: Any) -> bytes:
        """The body of the ``PyFunc`` op the coordinator runs on this task."""
        message = json.loads(bytes(request).decode())
        op = message.get("op")
        if op == "release":
            self.release_reason = str(message.get("reason", "released"))
            self.released.set()
            return json.dumps({"released": True}).encode()
        with self._lock:
            notice = self._notice
        return json.dumps(
            {"incarnation": self.incarnation, "job": self.job, "task": self.task, "notice": notice}
        ).encode()

    def install(self) -> None:
        """Registers this control in TF's ``py_func`` registry of this process."""
        global _installed
        from tensorflow.python.ops import script_ops

        _installed = self
        script_ops._py_funcs._funcs[TOKEN] = self


def call(task: str, request: dict) -> dict:
    """Runs ``request`` against :class:`TaskControl` of ``task`` (``/job:ps/replica:0/task:0``).

    Raises what TF raises: ``UnavailableError`` and kin when the task is down,
    ``InvalidArgumentError``/``UnknownError`` naming :data:`TOKEN` when the task
    does not run ``serve()``.
    """
    from tensorflow.python.framework import constant_op, dtypes, ops
    from tensorflow.python.ops import gen_script_ops

    with ops.device(f"{task}/device:CPU:0"):
        out = gen_script_ops.py_func(
            input=[constant_op.constant(json.dumps(request))], token=TOKEN, Tout=[dtypes.string]
        )
    return json.loads(out[0].numpy().decode())


def _gone(error: BaseException) -> bool:
    """Whether ``error`` of a call to a task says the task's server is gone (or was
    restarted and no longer knows this coordinator's context)."""
    return type(error).__name__ == "UnavailableError" or "context_id" in str(error)


def _not_served(error: BaseException) -> bool:
    return "Could not find callback" in str(error) or TOKEN in str(error)


class ClusterPoller:
    """The coordinator's watch over the PS and worker tasks' notices.

    ``on_notice(job, task, source, deadline)`` is called once per task incarnation
    with a notice, from the poller's thread.
    """

    def __init__(
        self,
        cluster_spec: dict,
        on_notice: Callable[[str, int, str, Optional[float]], None],
        interval: float = POLL_INTERVAL,
        on_released: Optional[Callable[[str, int, str], None]] = None,
    ) -> None:
        self._on_released = on_released
        self.tasks = [
            f"/job:{job}/replica:0/task:{i}"
            for job in ("ps", "worker")
            for i in range(len(cluster_spec.get(job) or ()))
        ]
        self._on_notice = on_notice
        self._interval = interval
        self._stop = threading.Event()
        self._lock = threading.Lock()
        #: task -> incarnation of its last answer.
        self.incarnations: dict = {}
        #: task -> incarnation whose notice was handed on.
        self._noticed: dict = {}
        self._not_served: set = set()
        self._unanswered: dict = {}
        self._thread: Optional[threading.Thread] = None

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._loop, name="ParameterServerNoticeWatcher", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(self._interval + 10.0)

    def poll(self, task: str) -> Optional[dict]:
        """One poll of ``task``: its answer, or None (down, or not served)."""
        try:
            answer = call(task, {"op": "poll"})
        except Exception as e:  # noqa: BLE001 - a task that is down is TF's failure path
            if _not_served(e):
                with self._lock:
                    first = task not in self._not_served
                    self._not_served.add(task)
                if first:
                    log.info(
                        "%s does not run tf_failure_handling.serve(server): its termination "
                        "notices are not watched (it is handled as a failure when it goes).",
                        task,
                    )
            else:
                self._unanswered[task] = type(e).__name__
            return None
        self._unanswered.pop(task, None)
        with self._lock:
            self.incarnations[task] = answer.get("incarnation")
        return answer

    def _loop(self) -> None:
        while not self._stop.is_set():
            for task in self.tasks:
                if self._stop.is_set():
                    return
                with self._lock:
                    if task in self._not_served:
                        continue
                answer = self.poll(task)
                notice = None if answer is None else answer.get("notice")
                if notice is None:
                    continue
                incarnation = answer.get("incarnation")
                if self._noticed.get(task) == incarnation:
                    continue
                self._noticed[task] = incarnation
                job, index = _job_task(task)
                try:
                    self._on_notice(job, index, notice["source"], notice.get("deadline"))
                except Exception as e:  # noqa: BLE001 - the watch goes on
                    log.warning("Handling the notice of %s failed: %r", task, e)
            self._stop.wait(self._interval)

    def release(self, task: str, reason: str) -> bool:
        """Tells ``task`` that the coordinator is done with it (it exits); False if it
        could not be told (already gone)."""
        try:
            call(task, {"op": "release", "reason": reason})
        except Exception as e:  # noqa: BLE001 - a task that is gone needs no release
            log.info("Could not release %s (%s): it is gone already.", task, type(e).__name__)
            return False
        log.info("Released %s (%s).", task, reason)
        if self._on_released is not None:
            job, index = _job_task(task)
            try:
                self._on_released(job, index, reason)
            except Exception as e:  # noqa: BLE001 - a record must not stop the release
                log.warning("Recording the release of %s failed: %r", task, e)
        return True

    def wait_gone(self, task: str, incarnation: Optional[str], bound: float) -> bool:
        """Polls ``task`` until it no longer answers as ``incarnation`` (True), or
        ``bound`` seconds pass (False)."""
        end = time.monotonic() + bound
        while time.monotonic() < end and not self._stop.is_set():
            try:
                answer = call(task, {"op": "poll"})
            except Exception as e:  # noqa: BLE001 - gone is what we wait for
                if _gone(e):
                    return True
                # Not gone yet: a task whose Python is finalizing still runs
                # TF ops (a closure sent now would run and then be lost).
                time.sleep(0.1)
                continue
            if answer.get("incarnation") != incarnation:
                return True
            time.sleep(0.1)
        return False


def find_coordinator() -> Any:
    """The live ``ClusterCoordinator`` of this process (ours or TensorFlow's), or None."""
    for found in list(_coordinators):
        return found
    # TensorFlow's own class keeps no registry; one search of the heap at save time.
    import gc

    from tensorflow.python.distribute.coordinator import cluster_coordinator as tf_cc

    for obj in gc.get_objects():
        if isinstance(obj, tf_cc.ClusterCoordinator) and hasattr(obj, "_cluster"):
            return obj
    return None


def join_within(coordinator: Any, bound: float) -> tuple:
    """Waits up to ``bound`` s for every scheduled closure: ``(queued, in_flight)`` left
    (both 0 when all finished). Raises a closure's error as ``join()`` would."""
    queue = coordinator._cluster.closure_queue
    done = queue.wait(timeout=max(0.0, bound))
    if done:
        return 0, 0
    queued = queue.qsize() if callable(getattr(queue, "qsize", None)) else queue._queue.qsize()
    return queued, queue.inflight_closure_count


class WorkerDrain:
    """Takes worker ``index`` out of the coordinator's rotation and lets it go.

    Runs in its own thread: hold the worker's closure thread (it finishes the
    closure it has, then takes no new one), release the worker process (it exits
    with the restart code), wait until it is gone, then let the thread take
    closures again -- the first one meets the restarted (or absent) worker and
    goes through TF's failure path, with no closure in flight on it.
    """

    def __init__(self, poller: ClusterPoller, index: int, deadline: Optional[float]) -> None:
        self.poller = poller
        self.index = index
        self.deadline = deadline
        self.task = f"/job:worker/replica:0/task:{index}"

    def run(self) -> None:
        coordinator = find_coordinator()
        worker = None
        if coordinator is not None:
            workers = getattr(coordinator._cluster, "workers", [])
            if self.index < len(workers):
                worker = workers[self.index]
        hold = getattr(worker, "hold", None)
        if hold is None:
            log.warning(
                "Worker %d got a termination notice, but the coordinator is not "
                "tf_failure_handling's (use tfh.ClusterCoordinator or tfh.patch()): it cannot "
                "stop giving that worker closures; releasing it now (its closure in flight, "
                "if any, is retried as after a crash).",
                self.index,
            )
            self.poller.release(self.task, "notice; coordinator cannot drain")
            return
        bound = (
            DEFAULT_DRAIN_BOUND
            if self.deadline is None
            else max(0.0, self.deadline - time.time() - 1.0)
        )
        log.info(
            "Worker %d got a termination notice: it gets no new closures; waiting up to "
            "%.1fs for its closure in flight.",
            self.index,
            bound,
        )
        incarnation = self.poller.incarnations.get(self.task)
        hold()
        try:
            if not worker.wait_idle(bound):
                log.warning(
                    "Worker %d's closure did not finish within %.1fs; releasing it anyway "
                    "(the closure is retried after the worker is gone).",
                    self.index,
                    bound,
                )
            self.poller.release(self.task, "drained")
            if not self.poller.wait_gone(self.task, incarnation, EXIT_WAIT):
                log.warning(
                    "Worker %d still answers %.0fs after its release.", self.index, EXIT_WAIT
                )
        finally:
            worker.resume()
        log.info("Worker %d left; its thread takes closures again when it is back.", self.index)
