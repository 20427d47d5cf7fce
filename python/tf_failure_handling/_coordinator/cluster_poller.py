"""The coordinator's poll of every PS and worker task for a notice, and their release.

:class:`ClusterPoller` asks each task's :class:`~.task_calls.TaskControl` every
:data:`POLL_INTERVAL` seconds (the core's ``TaskWatch`` says what each answer leads to)
and releases a task the coordinator is done with: docs/getting-started/
parameter-server.md, "Preemption under ParameterServerStrategy".
"""

from __future__ import annotations

import logging
import socket
import threading
from typing import Any, Callable, Optional

from .._native import PS_POLL_INTERVAL as POLL_INTERVAL
from .._native import PS_PORT_PROBE_TIMEOUT as PORT_PROBE_TIMEOUT
from .._native import CallTimeout, Deadline, PollLog, Retry, RetryVerdict, TaskWatch, reconnect
from .task_calls import CALL_TIMEOUT, CallRefused, call

log = logging.getLogger("tf_failure_handling")

# POLL_INTERVAL and PORT_PROBE_TIMEOUT are the core's (src/ps_control.rs says what each
# means).


def _job_task(device: str) -> tuple:
    parts = dict(p.split(":", 1) for p in device.strip("/").split("/") if ":" in p)
    return parts.get("job"), int(parts.get("task", 0))


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
        on_stale_context: Optional[Callable[[str], None]] = None,
    ) -> None:
        self._on_released = on_released
        #: Called (the poller's thread) with a worker task whose poll failed because it
        #: restarted and this coordinator has not reconnected to it (the core's
        #: ``reconnect``; never a PS): the coordinator asks TensorFlow to reconnect.
        self._on_stale_context = on_stale_context
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
            if self._on_stale_context is not None and reconnect(task, str(e)):
                try:
                    self._on_stale_context(task)
                except Exception as err:  # noqa: BLE001 - the watch goes on
                    log.warning("Reconnecting to %s failed: %r", task, err)
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
        retry = Retry(self._call_timeout if bound is None else bound)
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
            verdict = retry.failed(closing=self._stop.is_set())
            if isinstance(verdict, RetryVerdict.GiveUp) or (
                ask_listening and not self._listening(task)
            ):
                log.info("Could not release %s (%s): it is gone or does not answer.", task, error)
                return False
            log.info("Releasing %s failed (%s); sending it again.", task, error)
            self._stop.wait(verdict.pause)
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
        deadline = Deadline(bound)
        try:
            while not self._stop.is_set():
                if not self._listening(task):
                    return True
                if deadline.passed():
                    return False
                self._stop.wait(deadline.slice(0.1))
            return False
        finally:
            with self._lock:
                self.leaving.discard(task)

    def _port_open(self, task: str) -> bool:
        """Whether ``task``'s gRPC port accepts a TCP connection (its server runs)."""
        host, _, port = self.addresses[task].rpartition(":")
        try:
            with socket.create_connection(
                (host.strip("[]"), int(port)), timeout=PORT_PROBE_TIMEOUT
            ):
                return True
        except ConnectionRefusedError:
            return False
        except OSError:
            # Not refused (a timeout, no route): the process may still be there.
            return True
