"""The coordinator's wait for the closures in flight before its save.

:func:`wait_for_closures` holds every worker thread and gives the closures in flight a
bound; what is left at the bound is an :class:`Unfinished` (queued, in flight). What
the save's checkpoint then holds of each: docs/getting-started/parameter-server.md,
"Preemption under ParameterServerStrategy".
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional

from .._native import (
    DRAIN_ERROR_WAIT,
    WORKER_GET_SLICE,
    SaveDrainPlan,
    SaveStep,
    now,
    settle_looks,
)
from .._native import DRAIN_SETTLE_LOOK as _SETTLE_LOOK
from .coordinators import workers_of

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
        #: Worker index -> the handler's run it had in flight at the bound (our
        #: coordinator's; the log names each run with its worker).
        self.in_flight_runs_by_worker: dict = {}

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
    clock: Callable[[], float] = now,
    scheduled: Optional[int] = None,
) -> Unfinished:
    """Before the coordinator's save: holds every worker strictly and gives the closures
    in flight ``bound`` seconds (TF's coordinator cannot be held: then every scheduled
    closure is waited for). A worker whose process was lost put its closure back in
    the queue: it has none in flight (``Worker._on_closure_failure``). With the run
    count ``scheduled``, the queued runs below a finished one (the core's
    ``gap_runs``: one a lost worker put back) are moved to the queue's head and the
    held workers may take that many, within the same bound: then the finished runs
    are a prefix of the runs. Each step is the core's ``SaveDrainPlan``'s
    (``src/ps_control/save_drain.rs``). Raises a closure's error as ``join()`` would."""
    queue = coordinator._cluster.closure_queue
    held = hold_all(coordinator, strict=True)
    plan = SaveDrainPlan(bound, scheduled)
    workers = workers_of(coordinator)
    left = Unfinished(0, {}, held)
    step = plan.start(held, clock())
    while not isinstance(step, SaveStep.Done):
        if isinstance(step, SaveStep.WaitAll):
            if not queue.wait(timeout=step.bound):
                unnamed = int(getattr(queue, "inflight_closure_count", 0))
                left = Unfinished(_qsize(queue), {}, held, unnamed)
            return left
        if isinstance(step, SaveStep.WaitIdle):
            left = _left_behind(queue, workers, plan, clock)
            step = plan.unfinished(left.queued_runs, left.in_flight_runs, clock())
        elif isinstance(step, SaveStep.Promote):
            wanted = set(step.runs)
            found = [c for c in queue.queued_closures() if _run_of(c) in wanted]
            takers = [w for w in workers if not w.lost()]
            step = plan.promotable([_run_of(c) for c in found], len(takers), clock())
            by_run = {_run_of(c): c for c in found}
        elif isinstance(step, SaveStep.Grant):
            queue.promote([by_run[r] for r in step.runs])
            passes = Passes(len(step.runs))
            for worker in takers:
                worker.grant(passes)
            # Until the passes are used; the next round waits for the workers to be idle.
            passes.wait_used(step.wait)
            step = plan.granted()
    left.gap_runs = plan.filled
    error = getattr(queue, "_error", None)
    if error is not None and not left:
        queue.wait(timeout=DRAIN_ERROR_WAIT)  # raises the closure's error, as join() would
    return left


def _left_behind(queue: Any, workers: list, plan: Any, clock: Callable[[], float]) -> Unfinished:
    """Waits (within what is left of ``plan``'s bound) for every held worker to be idle;
    what is unfinished then."""
    in_flight, outside_in_flight, in_flight_runs, by_worker = {}, {}, [], {}
    for worker in workers:
        if not worker.wait_idle(plan.left(clock())):
            closure = worker.taken()
            if closure is None:
                idle, closure = _settle(worker)
                if idle:
                    continue
            name = worker.in_flight() or "?"
            run = None if closure is None else _run_of(closure)
            if closure is not None and run is None:
                outside_in_flight[worker.worker_index] = name
            else:
                in_flight[worker.worker_index] = name
                if run is not None:
                    in_flight_runs.append(run)
                    by_worker[worker.worker_index] = run
    # The main queue holds the scheduled closures (per-worker resources wait on the
    # workers' tag queues, never counted).
    queued = _qsize(queue)
    listed = getattr(queue, "queued_closures", None)
    if listed is None:  # a queue that cannot list them: every one counts as a run
        left = Unfinished(queued, in_flight, True, outside_in_flight=outside_in_flight)
        left.in_flight_runs_by_worker = by_worker
        return left
    queued_runs = [r for r in (_run_of(c) for c in listed()) if r is not None]
    left = Unfinished(
        len(queued_runs),
        in_flight,
        True,
        outside_queued=queued - len(queued_runs),
        outside_in_flight=outside_in_flight,
        queued_runs=queued_runs,
        in_flight_runs=in_flight_runs if len(in_flight_runs) == len(in_flight) else None,
    )
    left.in_flight_runs_by_worker = by_worker
    return left


# _SETTLE_LOOK is the core's (src/ps_control.rs's DRAIN_SETTLE_LOOK).


def _settle(worker: Any) -> tuple:
    """``(idle, closure)`` of a worker that was neither idle nor running a closure at the
    bound: it was between two closures, in the queue's ``get``. Under the strict hold a
    closure it gets now goes back to the queue, and it is idle at its next turn, within
    one get slice (``GET_SLICE``); or it had its closure already and records it. Looked
    at for up to two slices, in real time whatever the caller's clock: counting such a
    worker as a run in flight made the run count unindexed and the save counted a
    finished run as unfinished (it ran twice after the restart; a reliability trial,
    seed 36). Still unsettled after that: ``(False, None)``, counted as before."""
    for _ in range(settle_looks(getattr(worker, "GET_SLICE", WORKER_GET_SLICE))):
        closure = worker.taken()
        if closure is not None:
            return False, closure
        if worker.wait_idle(_SETTLE_LOOK):
            return True, None
    return False, worker.taken()


def _qsize(queue: Any) -> int:
    size = getattr(queue, "qsize", None)
    if callable(size):
        return int(size())
    return int(queue._queue.qsize())
