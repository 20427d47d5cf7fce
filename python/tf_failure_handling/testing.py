"""Test your training loop's preemption handling without a cluster.

This module is public and documented: it gives you the pieces our own unit
tests use, so you can check how *your* loop behaves when a worker is preempted,
fails, or restarts, in milliseconds and in one process.

* :class:`InMemoryCoordinationService` behaves like TensorFlow's coordination service
  as the handler uses it; it needs no TensorFlow, and uses TF's error classes when
  TF is installed.
* :class:`SimulatedCluster` runs N workers as threads on one such service, with a
  lock-step :meth:`WorkerContext.all_reduce` standing in for MultiWorkerMirroredStrategy's
  collectives; :meth:`SimulatedCluster.preempt` delivers a termination notice.
* :class:`FakeCheckpoint` / :class:`FakeVariable` are a checkpoint without TensorFlow
  (JSON files written atomically, with ``CheckpointManager``'s contract).

The service and the resolver are defined in ``_testing/tf_cluster.py``, the checkpoint in
``_testing/checkpoints.py``; the simulated cluster is here.

Example::

    from tf_failure_handling import testing

    def worker(ctx):
        w = testing.FakeVariable(0.0)
        handler = ctx.handler(testing.FakeCheckpoint(w=w), ctx.checkpoint_dir)
        for step in range(handler.total_run_calls, 100):
            if step == 10 and ctx.index == 1 and ctx.attempt == 0:
                ctx.cluster.preempt(1)
            handler.run(lambda: w.assign_add(ctx.all_reduce(1.0)))
        return w.numpy()

    cluster = testing.SimulatedCluster(num_workers=3, root=tmp_path)
    first = cluster.run(worker)            # all exit 42 at the agreed step
    assert {r.exit_code for r in first} == {42}
    second = cluster.run(worker)           # restart: restores and finishes
    assert {r.value for r in second} == {300.0}
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from . import _errors
from ._cluster import coordination as _coordination
from ._native import coordination_bounds
from ._testing.checkpoints import FakeCheckpoint, FakeCheckpointManager, FakeVariable
from ._testing.tf_cluster import InMemoryCoordinationService, SimpleClusterResolver

__all__ = [
    "FakeCheckpoint",
    "FakeCheckpointManager",
    "FakeVariable",
    "InMemoryCoordinationService",
    "SimpleClusterResolver",
    "SimulatedCluster",
    "WorkerContext",
    "WorkerResult",
    "use_coordination_service",
]

use_coordination_service = _coordination.use
"""Context manager: make a service the current thread's coordination service."""


class _Collective:
    """A lock-step all-reduce for ``n`` workers: MWMS's collectives in miniature.

    Each call joins the current generation; the last arrival completes it and
    wakes the rest. A generation that completed returns its sum even if the
    collective is aborted afterwards (a peer that exits after the step must
    not fail workers that finished it); a later one fails with the cluster's
    reported error, or ``UnavailableError`` when a peer left or the wait timed
    out.
    """

    def __init__(self, n: int, timeout: float, service: InMemoryCoordinationService) -> None:
        self._n = n
        self._timeout = timeout
        self._service = service
        #: Signalled when a generation completes or the collective is aborted.
        self._changed = threading.Condition()
        self._generation = 0
        self._arrived = 0
        self._sum = 0.0
        self._results: dict = {}
        self._aborted: Optional[str] = None

    def all_reduce(self, index: int, value: float) -> float:
        with self._changed:
            if self._aborted is None:
                generation = self._generation
                self._sum += value
                self._arrived += 1
                if self._arrived == self._n:
                    self._results = {generation: self._sum}
                    self._generation += 1
                    self._arrived = 0
                    self._sum = 0.0
                    self._changed.notify_all()
                    return self._results[generation]
                self._changed.wait_for(
                    lambda: self._generation != generation or self._aborted is not None,
                    self._timeout,
                )
                if self._generation != generation:
                    return self._results[generation]
            reason = self._aborted or f"timed out after {self._timeout:g}s"
        error = self._service.error
        if error is not None:
            raise _errors.from_code(error[0], error[1])
        raise _errors.make("UnavailableError", f"collective aborted on worker {index}: {reason}")

    def abort(self, reason: str) -> None:
        with self._changed:
            if self._aborted is None:
                self._aborted = reason
            self._changed.notify_all()


@dataclass
class WorkerResult:
    """How one simulated worker ended."""

    index: int
    #: The worker function's return value (None if it exited or raised).
    value: Any = None
    #: The ``SystemExit`` code if the worker exited (42 after a preemption save).
    exit_code: Optional[int] = None
    #: The exception the worker raised, if any.
    error: Optional[BaseException] = None
    #: Seconds from start to end (None until the worker ends).
    seconds: Optional[float] = None

    @property
    def finished(self) -> bool:
        return self.error is None and self.exit_code is None


@dataclass
class WorkerContext:
    """What a simulated worker function receives."""

    index: int
    cluster: SimulatedCluster
    #: How many times :meth:`SimulatedCluster.run` ran before this one.
    attempt: int
    cluster_resolver: SimpleClusterResolver
    checkpoint_dir: Optional[str]
    handlers: list = field(default_factory=list)

    def handler(
        self,
        checkpoint_or_manager: Any,
        checkpoint_dir: Optional[str] = None,
        termination_config: Any = None,
    ) -> Any:
        """Builds this worker's ``PreemptionCheckpointHandler`` on the simulated cluster."""
        from .handler import PreemptionCheckpointHandler

        h = PreemptionCheckpointHandler(
            self.cluster_resolver, checkpoint_or_manager, checkpoint_dir, termination_config
        )
        self.handlers.append(h)
        self.cluster._handler_ready(self.index, h)
        return h

    def all_reduce(self, value: float) -> float:
        """Sums ``value`` over every worker, in lock step (MWMS's collective)."""
        return self.cluster._all_reduce(self.index, value)


class SimulatedCluster:
    """N workers in threads over one :class:`InMemoryCoordinationService`.

    Each :meth:`run` is one life of the cluster: a fresh service and fresh
    workers, with checkpoints kept under ``root`` between runs, as after a
    restart. Every wait is bounded by ``timeout`` seconds (None: the core's bound,
    60 s); a worker that is still running then is reported by name. ``service_factory`` makes each
    run's service (an :class:`InMemoryCoordinationService` subclass that
    observes or faults the protocol, say).
    """

    def __init__(
        self,
        num_workers: int,
        root: Optional[os.PathLike] = None,
        timeout: Optional[float] = None,
        chief: bool = False,
        service_factory: Optional[Callable[[], InMemoryCoordinationService]] = None,
    ) -> None:
        if not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"num_workers must be a positive int, got {num_workers!r}")
        _errors.module()  # resolve TF's error classes here, not racing in worker threads
        self.num_workers = num_workers
        self.root = os.fspath(root) if root is not None else None
        self.timeout = coordination_bounds(cluster=timeout)["cluster"]
        self._chief = chief
        #: Makes each run's service (a subclass can observe or fault the protocol).
        self._service_factory = service_factory or InMemoryCoordinationService
        self.attempts = 0
        self.service: Optional[InMemoryCoordinationService] = None
        self._lock = threading.Lock()
        self._handlers: dict = {}
        self._pending_notices: dict = {}
        self._collective: Optional[_Collective] = None

    @property
    def checkpoint_dir(self) -> Optional[str]:
        return None if self.root is None else os.path.join(self.root, "ckpt")

    def _spec(self) -> dict:
        addresses = [f"localhost:{i}" for i in range(self.num_workers)]
        if self._chief:
            return {"chief": addresses[:1], "worker": addresses[1:]}
        return {"worker": addresses}

    def _resolver(self, index: int) -> SimpleClusterResolver:
        if self._chief:
            return SimpleClusterResolver(
                self._spec(), "chief" if index == 0 else "worker", 0 if index == 0 else index - 1
            )
        return SimpleClusterResolver(self._spec(), "worker", index)

    def preempt(self, index: int, deadline: Optional[float] = None) -> None:
        """Delivers a termination notice to worker ``index`` (now, or once its handler exists).

        When the handler exists, returns once it has handled the notice (claimed it
        or stood down), bounded by the cluster's ``timeout``: a simulated step takes
        microseconds, and without the wait the rest of training could finish before
        the claim lands, which no real step is short enough to do.
        """
        with self._lock:
            handler = self._handlers.get(index)
            if handler is None:
                self._pending_notices[index] = deadline
                return
        before = handler._notices_handled
        handler._notify_termination(deadline)
        # The driver counts each notice it finished with, and wakes its waiters.
        if not handler._driver.wait_handled(before, self.timeout):
            raise TimeoutError(
                f"worker {index}'s handler did not handle the notice within {self.timeout:g}s"
            )

    def _handler_ready(self, index: int, handler: Any) -> None:
        with self._lock:
            self._handlers[index] = handler
            pending = index in self._pending_notices
            deadline = self._pending_notices.pop(index, None)
        if pending:
            handler._notify_termination(deadline)

    def _all_reduce(self, index: int, value: float) -> float:
        return self._collective.all_reduce(index, value)

    def run(
        self, worker_fn: Callable[[WorkerContext], Any], workers: Optional[Sequence[int]] = None
    ) -> list:
        """Runs ``worker_fn`` on every worker and returns their :class:`WorkerResult`\\ s.

        Raises:
          TimeoutError: a worker did not finish within ``timeout`` seconds (its
            thread is left running as a daemon and named in the message).
        """
        self.service = service = self._service_factory()
        indices = list(range(self.num_workers)) if workers is None else list(workers)
        self._collective = collective = _Collective(len(indices), self.timeout, service)
        service._on_error(lambda: collective.abort("an error was reported to the cluster"))
        with self._lock:
            self._handlers = {}
        results = [WorkerResult(i) for i in indices]
        attempt = self.attempts
        self.attempts += 1
        contexts = []

        def body(slot: int, index: int) -> None:
            ctx = WorkerContext(index, self, attempt, self._resolver(index), self.checkpoint_dir)
            contexts.append(ctx)
            result = results[slot]
            start = time.monotonic()
            try:
                with _coordination.use(service):
                    result.value = worker_fn(ctx)
            except SystemExit as e:
                result.exit_code = e.code if isinstance(e.code, int) else 1
                # A worker that leaves releases peers blocked in a later collective.
                collective.abort(f"worker {index} left the cluster")
            except BaseException as e:  # noqa: BLE001 - reported in the result
                result.error = e
                collective.abort(f"worker {index} failed: {e!r}")
            finally:
                result.seconds = time.monotonic() - start
                for h in ctx.handlers:
                    h.close()

        threads = [
            threading.Thread(target=body, args=(slot, i), name=f"simulated-worker-{i}", daemon=True)
            for slot, i in enumerate(indices)
        ]
        for t in threads:
            t.start()
        deadline = time.monotonic() + self.timeout
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        hung = [t.name for t in threads if t.is_alive()]
        if hung:
            service.report_error_to_cluster(4, "simulated cluster timed out")
            raise TimeoutError(
                f"{', '.join(hung)} still running after {self.timeout:g}s "
                f"(coordination keys: {service.keys()})"
            )
        return results
