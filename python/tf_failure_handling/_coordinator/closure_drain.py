"""The coordinator's wait for the closures in flight before its save.

:func:`wait_for_closures` holds every worker thread and gives the closures in flight a
bound; what is left at the bound is an :class:`Unfinished` (queued, in flight). What
the save's checkpoint then holds of each: docs/getting-started/parameter-server.md,
"Preemption under ParameterServerStrategy".
"""

from __future__ import annotations

import threading
from typing import Any, Optional

from .._native import CoordinatorProtocol
from .coordinators import workers_of

CoordinatorAction = CoordinatorProtocol.Action
CoordinatorEvent = CoordinatorProtocol.Event
Lane = CoordinatorProtocol.Lane

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
        self.runs: Optional[int] = None
        self.finished_after: list = []
        #: Seconds the wait took (the core's clock).
        self.took = 0.0
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
    scheduled: Optional[int] = None,
    protocol: Any = None,
) -> Unfinished:
    """Before the coordinator's save: holds every worker strictly and gives the closures
    in flight ``bound`` seconds (TF's coordinator cannot be held: then every scheduled
    closure is waited for). A worker whose process was lost put its closure back in
    the queue: it has none in flight (``Worker._on_closure_failure``). With the run
    count ``scheduled``, the queued runs below a finished one (one a lost worker put
    back) are moved to the queue's head and the held workers may take that many,
    within the same bound: then the finished runs are a prefix of the runs. Each step
    is an action of the save lane of ``protocol`` (the coordinator's
    ``CoordinatorProtocol``, ``src/ps_control/coordinator.rs``), which also says the
    run count the checkpoint records. Raises a closure's error as ``join()`` would."""
    if protocol is None:
        protocol = CoordinatorProtocol([])
    queue = coordinator._cluster.closure_queue
    held = hold_all(coordinator, strict=True)
    workers = workers_of(coordinator)
    left = Unfinished(0, {}, held)
    lane = Lane.Save()
    protocol.handle(CoordinatorEvent.SaveStart(bound, scheduled, held))
    while True:
        action = protocol.poll(lane)
        if isinstance(action, CoordinatorAction.WaitAll):
            if not queue.wait(timeout=action.bound):
                unnamed = int(getattr(queue, "inflight_closure_count", 0))
                left = Unfinished(_qsize(queue), {}, held, unnamed)
            protocol.handle(CoordinatorEvent.Unfinished(left.count, None, None))
        elif isinstance(action, CoordinatorAction.WaitIdle):
            left = _left_behind(queue, workers, protocol, action)
            protocol.handle(
                CoordinatorEvent.Unfinished(left.count, left.queued_runs, left.in_flight_runs)
            )
        elif isinstance(action, CoordinatorAction.Promote):
            wanted = set(action.runs)
            found = [c for c in queue.queued_closures() if _run_of(c) in wanted]
            takers = [w for w in workers if not w.lost()]
            protocol.handle(CoordinatorEvent.Promotable([_run_of(c) for c in found], len(takers)))
            by_run = {_run_of(c): c for c in found}
        elif isinstance(action, CoordinatorAction.Grant):
            queue.promote([by_run[r] for r in action.runs])
            passes = Passes(len(action.runs))
            for worker in takers:
                worker.grant(passes)
            # Until the passes are used; the next round waits for the workers to be idle.
            passes.wait_used(action.wait)
            protocol.handle(CoordinatorEvent.Granted())
        else:
            break
    if isinstance(action, CoordinatorAction.Saved):
        left.gap_runs = list(action.filled)
        left.runs, left.finished_after = action.runs, list(action.finished_after)
        left.took = action.took
        error = getattr(queue, "_error", None)
        if action.error_wait is not None and error is not None and not left:
            # Raises the closure's error, as join() would.
            queue.wait(timeout=action.error_wait)
    return left


def _left_behind(queue: Any, workers: list, protocol: Any, action: Any) -> Unfinished:
    """Waits (within what is left of the save's bound) for every held worker to be idle;
    what is unfinished then."""
    in_flight, outside_in_flight, in_flight_runs, by_worker = {}, {}, [], {}
    lane = Lane.Save()
    for worker in workers:
        if not worker.wait_idle(protocol.poll_timeout(lane)):
            closure = worker.taken()
            if closure is None:
                idle, closure = _settle(worker, action)
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


def _settle(worker: Any, action: Any) -> tuple:
    """``(idle, closure)`` of a worker that was neither idle nor running a closure at the
    bound: it was between two closures, in the queue's ``get``. Under the strict hold a
    closure it gets now goes back to the queue, and it is idle at its next turn, within
    one get slice; or it had its closure already and records it. Looked at for the
    ``looks`` of ``look`` seconds the core's ``WaitIdle`` gives (two get slices), in
    real time: counting such a worker as a run in flight made the run count unindexed
    and the save counted a finished run as unfinished (it ran twice after the restart;
    a reliability trial, seed 36). Still unsettled after that: ``(False, None)``,
    counted as before."""
    for _ in range(action.looks):
        closure = worker.taken()
        if closure is not None:
            return False, closure
        if worker.wait_idle(action.look):
            return True, None
    return False, worker.taken()


def _qsize(queue: Any) -> int:
    size = getattr(queue, "qsize", None)
    if callable(size):
        return int(size())
    return int(queue._queue.qsize())
