"""``ClusterCoordinator`` on the native closure queue and failure classifier.

TensorFlow's ``Closure`` attributes, ``RemoteValue``, per-worker resources, retry and
recovery are kept; what is native and what each closure is spared: docs/how-it-works.md,
"The coordinator". Importing this module imports TensorFlow.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from typing import Any, Optional

from tensorflow.python.distribute.coordinator import cluster_coordinator as _tf_cc
from tensorflow.python.distribute.coordinator import coordinator_context as _context
from tensorflow.python.distribute.coordinator import metric_utils as _metric_utils
from tensorflow.python.distribute.coordinator import remote_value as _remote_value
from tensorflow.python.distribute.coordinator import values as _values
from tensorflow.python.eager import cancellation as _cancellation
from tensorflow.python.eager import context as _eager_context
from tensorflow.python.framework import errors as _tf_errors
from tensorflow.python.framework import versions as _tf_versions_module

from . import _failure
from ._coordinator import coordinators as _coordinators
from ._coordinator import function_cache as _function_cache
from ._coordinator import join_checks as _join_checks
from ._coordinator import worker_loop as _worker_loop
from ._coordinator.closure_queue import ClosureQueue
from ._integrations import tf_exit as _tf_exit
from ._integrations import tf_versions as _tf_versions
from ._native import CoordinatorProtocol

CoordinatorAction = CoordinatorProtocol.Action
CoordinatorEvent = CoordinatorProtocol.Event
Lane = CoordinatorProtocol.Lane

log = logging.getLogger("tf_failure_handling")

WORKER_RECOVERY_TIMEOUT_ENV = "TF_FAILURE_HANDLING_WORKER_RECOVERY_TIMEOUT"

RemoteValue = _remote_value.RemoteValue
PerWorkerValues = _values.PerWorkerValues
PerWorkerValue = _values.PerWorkerValues
experimental_get_current_worker_index = _context.get_current_worker_index
ClosureInputError = _tf_cc.ClosureInputError
ClosureAbortedError = _tf_cc.ClosureAbortedError
PSUnavailableError = _tf_cc.PSUnavailableError


_ONLY_PS_STRATEGY = (
    "Only `tf.distribute.experimental.ParameterServerStrategy` is supported to work with "
    "`tf.distribute.experimental.coordinator.ClusterCoordinator` currently."
)


class NotParameterServerStrategyError(ValueError, AttributeError):
    """A coordinator was asked for a strategy that is not a ParameterServerStrategy.

    TF means to raise ``ValueError`` here but fails earlier with an
    ``AttributeError`` (``'MirroredStrategy' object has no attribute
    '_cluster_coordinator'``); this error is both, so code written against
    either keeps working.
    """


def _recovery_timeout(value: Optional[float]) -> Optional[float]:
    """The ``worker_recovery_timeout`` given, else the environment's, checked; None:
    neither (the core's default, TensorFlow's hour)."""
    name = "worker_recovery_timeout"
    if value is None:
        raw = os.environ.get(WORKER_RECOVERY_TIMEOUT_ENV)
        if not raw:
            return None
        try:
            value = float(raw)
        except ValueError as e:
            raise ValueError(
                f"{WORKER_RECOVERY_TIMEOUT_ENV}={raw!r} is not a number of seconds"
            ) from e
        name = f"{WORKER_RECOVERY_TIMEOUT_ENV}={raw!r}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"worker_recovery_timeout must be a number of seconds, got {type(value).__name__}"
        )
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{name} must be a positive, finite number of seconds, got {value}")
    return float(value)


_STOPPED_BEFORE_RECOVERY = (
    "the coordinator's failure handler was stopped while the worker's recovery was awaited"
)


class _WorkerPreemptionHandler(_tf_cc.WorkerPreemptionHandler):
    """TF's worker-failure handling with the native classifier and a bounded, settable
    wait: what to do about a closure's error, how long to wait for the worker's
    recovery and what follows, and how long a stop waits, are the coordinator's
    protocol object's (``CoordinatorProtocol``'s failure and stop lanes)."""

    def __init__(
        self, server_def: Any, cluster: _Cluster, recovery_timeout: Optional[float]
    ) -> None:
        #: The coordinator's protocol object for its worker failures.
        self._protocol = CoordinatorProtocol([], recovery_timeout=recovery_timeout)
        super().__init__(server_def, cluster)

    def stop(self) -> None:
        """Stops the recovery thread (TF's ``stop``), without waiting on it forever.

        TF takes the cluster-update lock to wake that thread, which holds the lock while
        it rebuilds the cluster; ``update_server_def`` blocks until a lost worker is
        back. A worker that was preempted and is not back when training ends (or a
        daemon thread frozen at interpreter exit) held TF's ``stop`` there for good,
        and the process never exited.

        Worker threads waiting for a worker's recovery are woken: no recovery comes
        after the stop (TF's left them waiting up to an hour), and each ends
        (``worker_loop.HandlerStopped``). If the lock is not had within the bound, they
        wake when the recovery thread, done with its update, notifies them."""
        self._should_preemption_thread_run = False
        bound = self._protocol.poll(Lane.Stop()).timeout
        if self._cluster_update_lock.acquire(timeout=bound):
            try:
                self._cluster_due_for_update_or_finish.set()
                self._worker_up_cond.notify_all()
            finally:
                self._cluster_update_lock.release()
            return
        log.warning(
            "ClusterCoordinator: the worker-recovery thread did not let go of the cluster "
            "within %gs (it waits for a lost worker to come back); stopping without it.",
            bound,
        )
        self._cluster_due_for_update_or_finish.set()

    def _validate_preemption_failure(
        self, e: BaseException, worker_failure: Optional[bool] = None
    ) -> None:
        """Returns if ``e`` is a worker failure the coordinator recovers from, else raises it.

        ``worker_failure`` is ``is_worker_failure(e)`` when already known.
        """
        if worker_failure is None:
            worker_failure = _failure.is_worker_failure(e)
        if worker_failure and not self._cluster.closure_queue._cancellation_mgr.is_cancelled:
            _metric_utils.monitor_increment_counter("worker_failures")
            return
        raise e

    @contextlib.contextmanager
    def wait_on_failure(
        self,
        on_failure_fn=None,
        on_transient_failure_fn=None,
        on_recovery_fn=None,
        worker_device_name="(unknown)",
    ):
        """TF's: asserts the handler runs, then :meth:`handle_failure` around the block."""
        assert self._should_preemption_thread_run
        with self.handle_failure(
            on_failure_fn, on_transient_failure_fn, on_recovery_fn, worker_device_name
        ):
            yield

    def _respond(self, e: BaseException, lane: Any, worker_device_name: str) -> Any:
        """Answers the core's questions about ``e`` in its order (its failure lane
        ``lane``), each with TF's own call (two of them count what they see), until it
        says what to do: ``Retry`` (logged here) or ``Recover``; an error that is the
        closure's is raised by TF's ``_validate_preemption_failure``."""
        cluster, protocol = self._cluster, self._protocol
        # Both of TF's questions (_is_ps_failure, _is_worker_failure) in one call.
        ps_failure, worker_failure = _failure.classify_failure(e)
        thread = lane.thread
        protocol.handle(CoordinatorEvent.ClosureFailed(thread))
        while isinstance(action := protocol.poll(lane), CoordinatorAction.Ask):
            question = action.question
            if question == "transient ps failure":
                yes = cluster._record_and_ignore_transient_ps_failure(e, ps_failure=ps_failure)
            elif question == "transient timeout":
                yes = cluster._record_and_ignore_transient_timeouts(e)
            elif question == "derived cancellation":
                yes = isinstance(e, _tf_errors.CancelledError) and "/job:" in str(e)
            else:
                try:
                    self._validate_preemption_failure(e, worker_failure)  # raises when not
                except BaseException:
                    protocol.handle(CoordinatorEvent.FailureAnswered(thread, False))
                    protocol.poll(lane)  # Raise: the lane ends
                    raise
                yes = True
            protocol.handle(CoordinatorEvent.FailureAnswered(thread, yes))
        if isinstance(action, CoordinatorAction.Retry):
            derived = action.why == "derived cancellation"
            log.error(
                "Remote function on worker %s failed with %r:%s; %s",
                worker_device_name,
                e,
                e,
                "this derived error is retried and not reported."
                if derived
                else "treated as a transient failure and retried.",
            )
        return action

    @contextlib.contextmanager
    def handle_failure(
        self,
        on_failure_fn=None,
        on_transient_failure_fn=None,
        on_recovery_fn=None,
        worker_device_name="(unknown)",
    ):
        """Runs the block; on a worker failure waits (bounded) for the cluster to recover.

        Without TF's assertion on entry: this coordinator's worker threads enter it
        once a closure has raised, when the handler may have been stopped since the
        closure started (TF asserted when it started); the closure's error is then
        handled as TF handles it for a closure that started before the stop.

        The order of checks is TF's: transient PS failures and timeouts (within
        their tolerances) and derived cancellations are retried; anything that
        is not a worker failure is re-raised; a worker failure calls
        ``on_failure_fn``, waits for the preemption thread to update the
        cluster, then runs ``on_recovery_fn`` under the same handling. Once the handler
        is stopped (the coordinator stops), a thread waiting for a recovery does not
        wait on or run ``on_recovery_fn`` (TF's assertion failed there): it raises
        ``worker_loop.HandlerStopped`` and ends, its closure already put back.
        """
        try:
            yield
        except (_tf_errors.OpError, ClosureInputError, ClosureAbortedError, TypeError) as e:
            # The core says which question comes next and what to do (TF's order,
            # src/failure/response.rs); each answer is TF's own call.
            protocol, lane = self._protocol, Lane.Failure(threading.get_ident())
            action = self._respond(e, lane, worker_device_name)
            if isinstance(action, CoordinatorAction.Retry):
                if on_transient_failure_fn:
                    on_transient_failure_fn()
                return
            log.error("Worker %s failed with %r:%s", worker_device_name, e, e)
            if on_failure_fn:
                on_failure_fn(e)

            with self._cluster_update_lock:
                # Read under the lock that stop()'s wake-up takes: a stop before the
                # wait is seen here, one after it wakes the wait.
                if not self._should_preemption_thread_run:
                    raise _worker_loop.HandlerStopped(_STOPPED_BEFORE_RECOVERY) from e
                self._cluster_due_for_update_or_finish.set()
                recovered = self._worker_up_cond.wait(action.timeout)
                if self._error_from_recovery:
                    try:
                        raise self._error_from_recovery
                    finally:
                        self._error_from_recovery = None
            protocol.handle(
                CoordinatorEvent.RecoveryWaited(
                    lane.thread, self._should_preemption_thread_run, recovered
                )
            )
            after = protocol.poll(lane)
            if after.stopped:
                raise _worker_loop.HandlerStopped(_STOPPED_BEFORE_RECOVERY) from e
            if not after.timed_out:
                log.info("Worker %s has been recovered.", worker_device_name)
            else:
                log.warning(
                    "Worker %s did not come back within %gs (worker_recovery_timeout); "
                    "its closures are retried on the workers that are up.",
                    worker_device_name,
                    after.timeout,
                )

            if on_recovery_fn:
                # The handler runs (checked just above): TF's entry assertion is not
                # repeated here, where a stop in between would fail the thread.
                with self.handle_failure(
                    on_recovery_fn=on_recovery_fn,
                    on_transient_failure_fn=on_transient_failure_fn,
                    worker_device_name=worker_device_name,
                ):
                    on_recovery_fn()


class _Cluster(_tf_cc.Cluster):
    """TF's ``Cluster`` with the native queue and transient-failure counters.

    ``Cluster.__init__`` is not called: it would start TF's worker threads on
    TF's own queue. Everything it sets up is set up here, in the same order.
    """

    def __init__(self, strategy: Any, recovery_timeout: Optional[float]) -> None:
        self._num_workers = strategy._num_workers
        self._num_ps = strategy._num_ps
        self._transient = _failure.TransientFailures(self._num_ps, self._num_workers)
        # TF's module-level bound, read when the cluster is built as TF does
        # (TF's own tests set it to 2 first); <= 0 is unbounded.
        max_size = _tf_cc._CLOSURE_QUEUE_MAX_SIZE
        if max_size <= 0:
            log.warning(
                "In a `ClusterCoordinator`, creating an infinite closure queue can "
                "consume a significant amount of memory and even lead to OOM."
            )
        self.closure_queue = ClosureQueue(max_size)
        if os.getenv("TF_PSS_ENABLE_COORDINATION_SERVICE"):
            # TF's experimental coordination-service failure detection, as is.
            self.failure_handler = _tf_cc.CoordinationServicePreemptionHandler(
                _eager_context.get_server_def(), self
            )
        else:
            self.failure_handler = _WorkerPreemptionHandler(
                _eager_context.get_server_def(), self, recovery_timeout
            )
        self.workers = [
            _worker_loop.Worker(i, f"/job:worker/replica:0/task:{i}", self)
            for i in range(self._num_workers)
        ]
        self.resource_cancellation_mgr = _cancellation.CancellationManager()

    def _record_and_ignore_transient_ps_failure(
        self, e: BaseException, ps_failure: Optional[bool] = None
    ) -> bool:
        return self._transient.record_and_ignore_transient_ps_failure(e, ps_failure=ps_failure)

    def _record_and_ignore_transient_timeouts(self, e: BaseException) -> bool:
        return self._transient.record_and_ignore_transient_timeouts(e)


class ClusterCoordinator(_tf_cc.ClusterCoordinator):
    """Schedules functions on a ParameterServerStrategy cluster and survives worker loss.

    Replaces ``tf.distribute.experimental.coordinator.ClusterCoordinator`` (and
    ``tf.distribute.coordinator.ClusterCoordinator``) with the same constructor,
    methods and errors, one per strategy as in TF. Differs in: a native closure queue
    with real deadlines, a cache of concrete functions, and a bounded wait for a failed
    worker, ``worker_recovery_timeout`` (keyword-only, seconds, default 3600 as TF);
    the rest is in "Differences from TensorFlow".
    """

    def __new__(cls, strategy: Any, **_kwargs: Any) -> ClusterCoordinator:
        # One coordinator per strategy, as TF.
        if not hasattr(strategy, "_is_parameter_server_strategy_v2"):
            raise NotParameterServerStrategyError(
                f"{_ONLY_PS_STRATEGY} Got {type(strategy).__name__}."
            )
        if strategy._cluster_coordinator is None:
            strategy._cluster_coordinator = object.__new__(cls)
        elif not isinstance(strategy._cluster_coordinator, cls):
            log.warning(
                "This strategy already has TensorFlow's own ClusterCoordinator; it is reused "
                "(two coordinators cannot share one cluster)."
            )
        return strategy._cluster_coordinator

    def __init__(self, strategy: Any, *, worker_recovery_timeout: Optional[float] = None) -> None:
        if getattr(self, "_has_initialized", False):
            return
        timeout = _recovery_timeout(worker_recovery_timeout)
        # This class re-creates and subclasses TF internals (tests/unit/tf_internals.py).
        _tf_versions.warn_if_untested(_tf_versions_module.__version__)
        self._strategy = strategy
        self.strategy.extended._used_with_coordinator = True
        self._cluster = _Cluster(strategy, timeout)
        # TF's coordination-service poller would keep the process from exiting.
        _tf_exit.install(self)
        self._functions = _function_cache.ConcreteFunctionCache()
        self._has_initialized = True
        _coordinators.register_coordinator(self)
        log.info(
            "ClusterCoordinator (native queue and classifier): %d workers, %d parameter servers.",
            strategy._num_workers,
            strategy._num_ps,
        )

    def __del__(self) -> None:
        # TF's __del__ assumes __init__ finished; a coordinator whose
        # construction was refused has no cluster to stop.
        cluster = getattr(self, "_cluster", None)
        if cluster is not None:
            log.info("ClusterCoordinator destructor: stopping cluster")
            cluster.stop()

    def join(self) -> None:
        """Blocks until every scheduled function has run (TF's contract); raises the
        first closure error, as TF.

        With an open ``PreemptionCheckpointHandler`` on this coordinator, a
        termination notice that arrives meanwhile is acted on here: the closures
        finish, the checkpoint is saved and the process exits, as at a ``run()``.
        """
        _join_checks.join(self._cluster.closure_queue)

    def schedule(self, fn: Any, args: Any = None, kwargs: Any = None) -> Any:
        """Schedules ``fn`` on some worker; returns a ``RemoteValue`` (TF's contract).

        A call whose arguments have a structure this ``fn`` was scheduled with
        before reuses the concrete function TF derived then; any other call derives
        it as TF does, under ``strategy.scope()``.
        """
        if not _function_cache.is_schedulable(fn):
            self.strategy.extended._being_scheduled = False
            raise TypeError(
                "`tf.distribute.experimental.coordinator.ClusterCoordinator.schedule`"
                " only accepts a `tf.function` or a concrete function."
            )
        cache = self._functions
        found = _function_cache.argument_key(args, kwargs)
        if found is not None:
            context = _function_cache.context_key(self._strategy)
            if context is None:
                found = None
            else:
                key = (found[0], context)
                entry = cache.lookup(fn, key)
                if entry is not None:
                    cluster = self._cluster
                    queue = cluster.closure_queue
                    closure = _function_cache.Closure(entry, queue._cancellation_mgr, args, kwargs)
                    remote_value = closure.build_output_remote_value()
                    closure._tfh_run = _join_checks.handler_run_index()
                    queue.put(closure)
                    return remote_value
        queue = self._cluster.closure_queue
        extended = self.strategy.extended
        with self.strategy.scope():
            extended._being_scheduled = True
            try:
                closure = _tf_cc.Closure(fn, queue._cancellation_mgr, args=args, kwargs=kwargs)
            finally:
                extended._being_scheduled = False
        if not hasattr(closure, "_concrete_function"):  # pragma: no cover - schedule() refuses
            remote_value = closure.build_output_remote_value()
            queue.put(closure)
            return remote_value
        if found is None:
            # Uncacheable: a one-off entry, with TF's own slice selection.
            cache.uncacheable += 1
            entry = _function_cache._Entry(
                closure._concrete_function, closure._output_type_spec, None, []
            )
        else:
            _, keep, per_worker = found
            entry = _function_cache._Entry(
                closure._concrete_function, closure._output_type_spec, per_worker, keep
            )
            cache.store(fn, key, entry)
        # The wrapper TF just made, for this manager, is the entry's.
        entry._cancelable = (queue._cancellation_mgr, closure._function)
        closure = _function_cache.Closure(entry, queue._cancellation_mgr, args, kwargs)
        remote_value = closure.build_output_remote_value()
        # One of a handler's runs (its index), or None: its run count counts it.
        closure._tfh_run = _join_checks.handler_run_index()
        queue.put(closure)
        return remote_value
