"""A worker with a notice taken out of the coordinator's rotation, and let go.

:class:`WorkerDrain` performs the drain lane of the core's ``CoordinatorProtocol``
(``src/ps_control/coordinator.rs``, its steps in ``src/ps_control/drain.rs``): it
holds the worker's closure thread, releases the worker process through the
:class:`~.cluster_poller.ClusterPoller`, waits until it is gone and resumes the
thread, each as an action says: docs/getting-started/parameter-server.md.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from .._native import CoordinatorProtocol
from .cluster_poller import ClusterPoller
from .coordinators import find_coordinator, workers_of

CoordinatorAction = CoordinatorProtocol.Action
CoordinatorEvent = CoordinatorProtocol.Event
Lane = CoordinatorProtocol.Lane

log = logging.getLogger("tf_failure_handling")


class WorkerDrain:
    """Takes worker ``index`` out of the coordinator's rotation and lets it go, in its own
    thread: hold the worker's closure thread, release the worker process, wait until it
    is gone, resume the thread (docs/getting-started/parameter-server.md). Its bounds are
    the core's, from the deadline of the worker's last notice the poll saw."""

    def __init__(self, poller: ClusterPoller, index: int, coordinator: Any = None) -> None:
        self.poller = poller
        self.index = index
        self._coordinator = coordinator
        #: What happened, for tests and the log: "released", "not released", "no hold".
        self.outcome: Optional[str] = None

    def run(self) -> None:
        """Performs the core's drain of this worker: each action, then what happened,
        until the drain is over."""
        coordinator = self._coordinator if self._coordinator is not None else find_coordinator()
        workers = workers_of(coordinator)
        worker = workers[self.index] if self.index < len(workers) else None
        can_hold = callable(getattr(worker, "hold", None))
        protocol, lane = self.poller.protocol, Lane.Drain(self.index)
        reason = f"drain {self.poller.incarnations.get(_task(self.index))}"
        protocol.handle(CoordinatorEvent.DrainStart(self.index, can_hold))
        action, held = None, False
        try:
            while True:
                action = protocol.poll(lane)
                if isinstance(action, CoordinatorAction.Hold):
                    log.info(
                        "Worker %d got a termination notice: it gets no new closures; "
                        "waiting up to %.1fs for its closure in flight.",
                        self.index,
                        action.bound,
                    )
                    worker.hold(reason)
                    held = True
                    idle = worker.wait_idle(action.bound)
                    if not idle:
                        log.warning(
                            "Worker %d's closure %s did not finish within %.1fs; releasing "
                            "the worker anyway: the closure fails with it and runs again on "
                            "another worker (if its effect reached the variables already, "
                            "it is applied twice).",
                            self.index,
                            worker.in_flight() or "?",
                            action.bound,
                        )
                    protocol.handle(CoordinatorEvent.Idled(self.index, idle))
                elif isinstance(action, CoordinatorAction.DrainRelease):
                    if not action.hold:
                        log.warning(
                            "Worker %d got a termination notice, but the coordinator is not "
                            "tf_failure_handling's (use tfh.ClusterCoordinator or "
                            "tfh.patch()): it cannot stop giving that worker closures; "
                            "releasing it now (its closure in flight, if any, is retried as "
                            "after a crash: at least once).",
                            self.index,
                        )
                    why = "drained" if action.hold else "notice; coordinator cannot drain"
                    released = self.poller.release(action.task, why)
                    protocol.handle(CoordinatorEvent.DrainReleased(self.index, released))
                elif isinstance(action, CoordinatorAction.DrainWaitGone):
                    if action.holding is not None:
                        log.warning(
                            "Worker %d could not be released: it takes no new closures until "
                            "it is gone (at most %.0fs).",
                            self.index,
                            action.holding,
                        )
                    gone = self.poller.wait_gone(action.task, action.bound)
                    protocol.handle(CoordinatorEvent.DrainWaited(self.index, gone))
                else:
                    break
        finally:
            if held:  # over, or raised: a held thread is never left held
                worker.resume(reason)
        self._end(action)

    def _end(self, action: Any) -> None:
        """The drain is over: its outcome, and the lines it is worth."""
        if not isinstance(action, CoordinatorAction.DrainOver):
            return
        self.outcome = action.outcome
        if action.why == "still answers":
            log.warning(
                "Worker %d still answers %.0fs after its release.", self.index, action.bound
            )
        elif action.why == "hold bound passed":
            log.warning(
                "Worker %d still serves %.0fs after its release failed; it takes closures again.",
                self.index,
                action.bound,
            )
        if action.held:
            log.info("Worker %d left; its thread takes closures again when it is back.", self.index)


def _task(index: int) -> str:
    return f"/job:worker/replica:0/task:{index}"
