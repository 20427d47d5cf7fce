"""The coordinator's poll of every PS and worker task for a notice, and their release.

:class:`ClusterPoller` performs the core's ``CoordinatorProtocol``
(``src/ps_control/coordinator.rs``): its poll lane asks each task's
:class:`~.task_calls.TaskControl` in rounds, its release lane releases a task the
coordinator is done with, its gone lane waits for a released task's process to exit.
Each loop performs the action, reports its result as an event, and polls again; every
timeout is the action's. docs/getting-started/parameter-server.md, "Preemption under
ParameterServerStrategy".
"""

from __future__ import annotations

import logging
import socket
import threading
from typing import Any, Callable, Optional

from .._native import CoordinatorProtocol
from .task_calls import CallRefused, _Caller

CoordinatorAction = CoordinatorProtocol.Action
CoordinatorEvent = CoordinatorProtocol.Event
Lane = CoordinatorProtocol.Lane

log = logging.getLogger("tf_failure_handling")


class ClusterPoller:
    """The coordinator's watch over the PS and worker tasks' notices.

    ``on_notice(job, task, source, deadline)`` is called once per task incarnation
    with a notice, from the poller's thread. Every task is asked every round,
    whatever it answered before: down, stopped, not (yet) serving. ``protocol``: the
    coordinator's protocol object, which then watches the tasks too (one object for
    the coordinator's role); None: one of the poller's own, with ``interval`` and
    ``call_timeout`` (None: the core's). ``peer_timeout`` is the handler's.
    """

    def __init__(
        self,
        cluster_spec: dict,
        on_notice: Callable[[str, int, str, Optional[float]], None],
        interval: Optional[float] = None,
        on_released: Optional[Callable[[str, int, str], None]] = None,
        caller: Optional[Callable[..., dict]] = None,
        call_timeout: Optional[float] = None,
        listening: Optional[Callable[[str, float], bool]] = None,
        on_stale_context: Optional[Callable[[str, float], None]] = None,
        peer_timeout: Optional[float] = None,
        protocol: Any = None,
    ) -> None:
        self._on_released = on_released
        #: Called (the poller's thread) with a worker task whose poll failed because it
        #: restarted and this coordinator has not reconnected to it (the core says so;
        #: never a PS), and the bound of each step: the coordinator asks TensorFlow to
        #: reconnect.
        self._on_stale_context = on_stale_context
        tasks = []
        #: task -> its "host:port" in the cluster spec.
        self.addresses: dict = {}
        for job in ("ps", "worker"):
            for i, address in enumerate(cluster_spec.get(job) or ()):
                task = f"/job:{job}/replica:0/task:{i}"
                tasks.append(task)
                self.addresses[task] = str(address)
        self._listening = self._port_open if listening is None else listening
        self._on_notice = on_notice
        #: Set by :meth:`stop`: wakes every pause of the lanes.
        self._stop = threading.Event()
        #: The coordinator's protocol object: every decision about the tasks, and
        #: whether a call to one may start.
        if protocol is None:
            protocol = CoordinatorProtocol(tasks, peer_timeout, interval, call_timeout)
        else:
            protocol.handle(CoordinatorEvent.Watch(tasks, peer_timeout))
        self.protocol = protocol
        self._call = _Caller(protocol=protocol) if caller is None else caller
        self._thread: Optional[threading.Thread] = None

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._loop, name="ParameterServerNoticeWatcher", daemon=True
        )
        self._thread.start()

    @property
    def tasks(self) -> list:
        return self.protocol.state()["tasks"]

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def stop(self) -> None:
        """Ends the watch; waits for a round in progress, as long as the core says it
        may still take."""
        self.protocol.handle(CoordinatorEvent.Stop())
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(self.protocol.poll_timeout(Lane.Poll()))

    @property
    def incarnations(self) -> dict:
        """Task -> the incarnation of its last answer."""
        return self.protocol.state()["incarnations"]

    @property
    def unanswered(self) -> dict:
        """Task -> the error type of its last unanswered polls (``"bad answer"``)."""
        return self.protocol.state()["unanswered"]

    @property
    def leaving(self) -> set:
        """Tasks released and not yet seen gone: not asked anything meanwhile (an op
        sent to a process that is exiting fails, and TensorFlow can hand that error
        to another thread's next op in this process)."""
        return self.protocol.state()["leaving"]

    def poll(self, task: str, timeout: Optional[float] = None) -> Optional[dict]:
        """One poll of ``task``, reported to the core: its answer, or None (down,
        stopped, or not served)."""
        try:
            answer = self._call(task, {"op": "poll"}, timeout)
        except Exception as e:  # noqa: BLE001 - a task that is down is TF's failure path
            self.protocol.handle(CoordinatorEvent.PollFailed(task, e))
            return None
        self.protocol.handle(CoordinatorEvent.Answered(task, answer))
        return answer

    def _perform(self, action: Any) -> bool:
        """Performs one action of the poll lane; False at a pause or the end."""
        if isinstance(action, CoordinatorAction.Poll):
            self.poll(action.task, action.timeout)
        elif isinstance(action, CoordinatorAction.Say):
            _say(action)
        elif isinstance(action, CoordinatorAction.Notice):
            try:
                self._on_notice(action.job, action.index, action.source, action.deadline)
            except Exception as e:  # noqa: BLE001 - the watch goes on
                log.warning("Handling the notice of %s failed: %r", action.task, e)
        elif isinstance(action, CoordinatorAction.Reconnect):
            if self._on_stale_context is not None:
                try:
                    self._on_stale_context(action.task, action.bound)
                except Exception as err:  # noqa: BLE001 - the watch goes on
                    log.warning("Reconnecting to %s failed: %r", action.task, err)
        else:
            return False
        return True

    def poll_once(self) -> None:
        """One round: every task asked (but those leaving after their release), each
        incarnation's first notice handed on (the core says which). A round due later
        is waited for first."""
        polled = False
        while True:
            action = self.protocol.poll(Lane.Poll())
            if isinstance(action, CoordinatorAction.Pause):
                if polled:
                    return
                self._stop.wait(action.timeout)
                continue
            if not self._perform(action):
                return
            polled = polled or isinstance(action, CoordinatorAction.Poll)

    def _loop(self) -> None:
        while True:
            try:
                action = self.protocol.poll(Lane.Poll())
                if isinstance(action, CoordinatorAction.Pause):
                    self._stop.wait(action.timeout)
                elif not self._perform(action):
                    return
            except BaseException as e:  # noqa: BLE001 - the watch must not die silently
                log.error("The watch over the cluster's notices failed a round: %r", e)
                self.protocol.handle(CoordinatorEvent.RoundFailed())

    def release(self, task: str, reason: str, bound: Optional[float] = None) -> bool:
        """Tells ``task`` that the coordinator is done with it (it exits); False if it
        could not be told (gone, not answering within the bound, or it refused). A
        release that failed is sent again by the core's retry rule for ``bound``
        seconds (None: one call's timeout), unless the watch is stopped."""
        lane = Lane.Release(task)
        self.protocol.handle(CoordinatorEvent.ReleaseStart(task, reason, bound))
        while True:
            action = self.protocol.poll(lane)
            if isinstance(action, CoordinatorAction.Release):
                try:
                    request = {
                        "op": "release",
                        "reason": action.reason,
                        "incarnation": action.incarnation,
                        "notice_at": action.notice_at,
                    }
                    answer = self._call(task, request, action.timeout)
                except CallRefused as e:
                    self.protocol.handle(CoordinatorEvent.ReleaseFailed(task, e, True))
                except Exception as e:  # noqa: BLE001 - the core says what follows
                    self.protocol.handle(CoordinatorEvent.ReleaseFailed(task, e, False))
                else:
                    self.protocol.handle(CoordinatorEvent.ReleaseAnswered(task, answer))
            elif isinstance(action, CoordinatorAction.Probe):
                listening = self._listening(task, action.timeout)
                self.protocol.handle(CoordinatorEvent.Probed(task, listening))
            elif isinstance(action, CoordinatorAction.Pause):
                if action.after is not None:
                    log.info("Releasing %s failed (%s); sending it again.", task, action.after)
                self._stop.wait(action.timeout)
            elif isinstance(action, CoordinatorAction.Released):
                return self._released(task, reason, action)
            else:
                return False

    def _released(self, task: str, reason: str, action: Any) -> bool:
        if action.end == "no answer":
            log.info("Could not release %s (%s): it does not answer.", task, action.detail)
            return False
        if action.end == "gone":
            log.info(
                "Could not release %s (%s): it is gone or does not answer.", task, action.detail
            )
            return False
        if action.end == "refused":
            log.warning("%s refused its release (%s).", task, action.detail)
            return False
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
        lane = Lane.Gone(task)
        self.protocol.handle(CoordinatorEvent.WaitGone(task, bound))
        while True:
            action = self.protocol.poll(lane)
            if isinstance(action, CoordinatorAction.Probe):
                self.protocol.handle(
                    CoordinatorEvent.Probed(task, self._listening(task, action.timeout))
                )
            elif isinstance(action, CoordinatorAction.Pause):
                self._stop.wait(action.timeout)
            else:
                return isinstance(action, CoordinatorAction.GoneOver) and action.gone

    def _port_open(self, task: str, timeout: float) -> bool:
        """Whether ``task``'s gRPC port accepts a TCP connection within ``timeout``
        seconds (its server runs)."""
        host, _, port = self.addresses[task].rpartition(":")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
                return True
        except ConnectionRefusedError:
            return False
        except OSError:
            # Not refused (a timeout, no route): the process may still be there.
            return True


def _job_task(device: str) -> tuple:
    parts = dict(p.split(":", 1) for p in device.strip("/").split("/") if ":" in p)
    return parts.get("job"), int(parts.get("task", 0))


def _say(action: Any) -> None:
    """The line of the poll's log the core chose."""
    task, detail = action.task, action.detail
    if action.line == "not served":
        log.info(
            "%s does not run tf_failure_handling.serve(server) (yet): its termination "
            "notices are watched once it does; until then it is handled as a failure "
            "when it goes.",
            task,
        )
    elif action.line == "does not answer":
        log.info("%s does not answer (%s): asked again next round.", task, detail)
    elif action.line == "new incarnation":
        log.info("%s answers as a new incarnation (%s): watched like the first.", task, detail)
    elif action.line == "answers again":
        log.info("%s answers again.", task)
