"""A worker with a notice taken out of the coordinator's rotation, and let go.

:class:`WorkerDrain` holds the worker's closure thread, releases the worker process
through the :class:`~.cluster_poller.ClusterPoller`, waits until it is gone and resumes
the thread, each step as the core's ``WorkerDrainPlan`` says
(``src/ps_control/drain.rs``): docs/getting-started/parameter-server.md.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional

from .._native import (
    DEFAULT_DRAIN_BOUND,
    DrainEnd,
    DrainStep,
    WorkerDrainPlan,
    unix_now,
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

    def run(self) -> None:
        """Performs the core's drain (``WorkerDrainPlan``, ``src/ps_control/drain.rs``):
        each step it says, then what happened, until it says the drain is over."""
        coordinator = self._coordinator if self._coordinator is not None else find_coordinator()
        workers = workers_of(coordinator)
        worker = workers[self.index] if self.index < len(workers) else None
        can_hold = callable(getattr(worker, "hold", None))
        plan = WorkerDrainPlan(self.deadline, self.peer_timeout)
        incarnation = self.poller.incarnations.get(self.task)
        reason = f"drain {incarnation}"
        held = False
        step = plan.start(can_hold, self._clock())
        try:
            while True:
                if isinstance(step, DrainStep.Hold):
                    log.info(
                        "Worker %d got a termination notice: it gets no new closures; "
                        "waiting up to %.1fs for its closure in flight.",
                        self.index,
                        step.bound,
                    )
                    worker.hold(reason)
                    held = True
                    idle = worker.wait_idle(step.bound)
                    if not idle:
                        log.warning(
                            "Worker %d's closure %s did not finish within %.1fs; releasing "
                            "the worker anyway: the closure fails with it and runs again on "
                            "another worker (if its effect reached the variables already, "
                            "it is applied twice).",
                            self.index,
                            worker.in_flight() or "?",
                            step.bound,
                        )
                    step = plan.idled(idle)
                elif isinstance(step, DrainStep.Release):
                    if not step.hold:
                        log.warning(
                            "Worker %d got a termination notice, but the coordinator is not "
                            "tf_failure_handling's (use tfh.ClusterCoordinator or "
                            "tfh.patch()): it cannot stop giving that worker closures; "
                            "releasing it now (its closure in flight, if any, is retried as "
                            "after a crash: at least once).",
                            self.index,
                        )
                    why = "drained" if step.hold else "notice; coordinator cannot drain"
                    released = self.poller.release(self.task, why)
                    step = plan.released(released, self.poller.stopped, self._clock())
                elif isinstance(step, DrainStep.WaitGone):
                    if step.holding is not None:
                        log.warning(
                            "Worker %d could not be released: it takes no new closures until "
                            "it is gone (at most %.0fs).",
                            self.index,
                            step.holding,
                        )
                    gone = self.poller.wait_gone(self.task, step.bound)
                    same = self.poller.incarnations.get(self.task) == incarnation
                    step = plan.waited(gone, same, self.poller.stopped, self._clock())
                elif isinstance(step, DrainStep.Resume):
                    if step.why == DrainEnd.StillAnswers:
                        log.warning(
                            "Worker %d still answers %.0fs after its release.",
                            self.index,
                            EXIT_WAIT,
                        )
                    elif step.why == DrainEnd.HoldBoundPassed:
                        log.warning(
                            "Worker %d still serves %.0fs after its release failed; it "
                            "takes closures again.",
                            self.index,
                            step.bound,
                        )
                    break
                else:  # Done: nothing was held
                    break
        finally:
            self.outcome = plan.outcome
            if held:
                worker.resume(reason)
        if held:
            log.info("Worker %d left; its thread takes closures again when it is back.", self.index)
