"""A worker with a notice taken out of the coordinator's rotation, and let go.

:class:`WorkerDrain` holds the worker's closure thread, releases the worker process
through the :class:`~.cluster_poller.ClusterPoller`, waits until it is gone and resumes
the thread: docs/getting-started/parameter-server.md.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional

from .._native import (
    DEFAULT_DRAIN_BOUND,
    Deadline,
    unix_now,
    unreleased_hold_bound,
    worker_drain_bound,
)
from .._native import WORKER_EXIT_WAIT as EXIT_WAIT
from .cluster_poller import ClusterPoller
from .coordinators import find_coordinator, workers_of

log = logging.getLogger("tf_failure_handling")

# DEFAULT_DRAIN_BOUND and EXIT_WAIT are the core's (src/ps_control.rs says what each
# means).


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
        clock: Callable[[], float] = unix_now,
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
        holding = Deadline(bound)
        while not self.poller.stopped:
            if holding.passed():
                log.warning(
                    "Worker %d still serves %.0fs after its release failed; it takes "
                    "closures again.",
                    self.index,
                    bound,
                )
                return
            if self.poller.wait_gone(self.task, holding.slice(EXIT_WAIT)):
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
