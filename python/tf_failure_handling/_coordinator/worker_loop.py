"""The coordinator's worker threads: TensorFlow's ``Worker`` whose loop takes closures from
the queue, runs them, and can be held (a drain, the coordinator's save).

What it spares TensorFlow's worker thread: docs/how-it-works.md, "The coordinator".
"""

from __future__ import annotations

import threading
from typing import Any, Optional

from tensorflow.python.distribute.coordinator import cluster_coordinator as _tf_cc
from tensorflow.python.framework import errors as _tf_errors
from tensorflow.python.platform import tf_logging as _tf_logging

from .._native import Timed
from .closure_queue import MAX_SIZE as MAX_QUEUE_SIZE
from .closure_queue import ClosureQueue
from .function_cache import Closure, run_on
from .remote_values import complete, copy_to_local, metric_cell
from .resource_values import PerWorkerVariableClosure, ResourceClosure, resource_closure

#: Guards the ``_tfh_ended`` marks of one cluster's worker threads (which one ends last).
_ENDED_LOCK = threading.Lock()


class HandlerStopped(BaseException):
    """Raised in a worker thread by the failure handler that was stopped while the
    thread waited for its worker's recovery: no recovery comes, and the thread ends.

    A ``BaseException``, so that no closure's error handling (ours or TF's ``except
    Exception``) takes it for the closure's error: the closure already went back to
    the queue (or its resources were aborted) when the worker failed.
    """


class _Holds:
    """The holds on one worker thread, by reason (a drain, the coordinator's save):
    while any is set, it takes no new closure, but for the passes it was granted
    (:meth:`grant`: the save's queued runs below a finished one). ``idle`` is set by
    the thread while it waits on a hold with no closure in flight, and cleared when it
    takes one: a :meth:`Worker.wait_idle` that sees it knows nothing was taken since.
    ``is_lost``: the thread put its closure back on its worker's failure and waits for
    the worker's recovery."""

    #: What :meth:`wait_turn` answers.
    WAIT, TAKE, TAKE_GRANTED = 0, 1, 2

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reasons: dict = {}  # reason -> strict
        self._passes: Any = None  # closure_drain.Passes, shared by the held workers
        self.go = threading.Event()
        self.go.set()
        self.idle = threading.Event()
        self.is_lost = False

    def add(self, reason: str, strict: bool) -> None:
        with self._lock:
            self._reasons[reason] = strict or self._reasons.get(reason, False)
            self.go.clear()

    def remove(self, reason: str) -> None:
        with self._lock:
            self._reasons.pop(reason, None)
            if not self._reasons:
                self._passes = None
                self.go.set()

    def held(self) -> bool:
        with self._lock:
            return bool(self._reasons)

    def grant(self, passes: Any) -> None:
        """Lets the held thread take closures while ``passes`` has any left."""
        with self._lock:
            self._passes = passes
            self.go.set()  # wakes a thread waiting on a strict hold

    def mark_lost(self) -> None:
        """The thread's closure went back to the queue with its worker's failure: it has
        none in flight while it waits for the worker's recovery (a hold's wait for it
        to be idle ends). Its next turn says again whether it may take one."""
        with self._lock:
            self.is_lost = True
            self.idle.set()

    def strict(self) -> bool:
        with self._lock:
            return any(self._reasons.values())

    def wait_turn(self, queue: Any, slice_: float) -> int:
        """TAKE (or TAKE_GRANTED, on a pass): the thread may take a closure now. WAIT
        after waiting (without spinning) for the holds to be lifted or a pass granted: up
        to ``slice_`` seconds on a strict hold, and on a non-strict one the core's
        shorter look at the queue's size (``ClosureQueue.poll_timeout(False)``)."""
        with self._lock:
            self.is_lost = False
            strict = any(self._reasons.values())
            if not self._reasons or (not strict and _queue_full(queue)):
                self.idle.clear()
                return self.TAKE
            passes = self._passes
            if passes is not None:
                if passes.take():
                    self.idle.clear()
                    return self.TAKE_GRANTED
                self._passes = None  # used up: wait on the holds again
                self.go.clear()
            self.idle.set()
        self.go.wait(slice_ if strict else ClosureQueue.poll_timeout(False))
        return self.WAIT


def _queue_full(queue: Any) -> bool:
    """Whether a ``schedule()`` could be waiting for room in ``queue``."""
    try:
        return queue.qsize() >= MAX_QUEUE_SIZE
    except Exception:  # noqa: BLE001 - a queue without a size: never full
        return False


class Worker(_tf_cc.Worker):
    """TF's ``Worker`` whose closure loop enters TF's ``wait_on_failure`` (same
    callbacks: TF's retry, recovery and reporting) only when a closure raised, and
    that can be held (:meth:`hold`)."""

    def create_resource(self, function: Any, args: Any = None, kwargs: Any = None) -> Any:
        """TF's: a per-worker resource (a dataset, an iterator, a table's copy), whose
        ``RemoteValue``'s waits make the handler's checks (``resource_values``)."""
        return resource_closure(self, ResourceClosure, function, args, kwargs)

    def create_variable_resource(self, function: Any, args: Any = None, kwargs: Any = None) -> Any:
        """TF's: a per-worker variable, whose ``RemoteValue``'s waits make the handler's
        checks (``resource_values``)."""
        return resource_closure(self, PerWorkerVariableClosure, function, args, kwargs)

    def _holds(self) -> _Holds:
        # Created on first use: TF's ``Worker.__init__`` starts the thread before
        # a subclass's ``__init__`` could set anything after it.
        holds = self.__dict__.get("_tfh_holds")
        if holds is None:
            holds = self.__dict__.setdefault("_tfh_holds", _Holds())
        return holds

    def hold(self, reason: str = "drain", strict: bool = True) -> None:
        """Stops giving this worker new closures until :meth:`resume`. A non-``strict``
        hold (the coordinator's notice, before its save) still lets the thread take one
        while the queue is full, so that a ``schedule()`` waiting for room returns."""
        self._holds().add(reason, strict)

    def resume(self, reason: str = "drain") -> None:
        """Lifts the hold named ``reason``."""
        self._holds().remove(reason)

    def grant(self, passes: Any) -> None:
        """While held, lets this thread take closures as long as ``passes`` has any left
        (``closure_drain.Passes``, shared by the workers the save lets run its gap runs)."""
        self._holds().grant(passes)

    def lost(self) -> bool:
        """Whether this thread put its closure back on its worker's failure and waits for
        the worker's recovery (it takes nothing until then)."""
        return self._holds().is_lost

    def wait_idle(self, timeout: float) -> bool:
        """After :meth:`hold`: True once the thread has no closure in flight (it waits
        on the hold), False when ``timeout`` seconds pass first."""
        return self._holds().idle.wait(timeout)

    def taken(self) -> Any:
        """The closure this thread runs, or None."""
        return self.__dict__.get("_tfh_taken")

    def in_flight(self) -> Optional[str]:
        """The name of the function of the closure this thread runs, or None."""
        closure = self.__dict__.get("_tfh_taken")
        if closure is None:
            return None
        # The concrete function's name (``__inference_train_step_97``) names the user's.
        entry = getattr(closure, "_entry", None)
        function = getattr(entry, "concrete_function", None) or getattr(closure, "_function", None)
        name = getattr(function, "name", None) or getattr(function, "__name__", None)
        return name.decode() if isinstance(name, bytes) else (name or "a closure")

    def _process_queue(self) -> None:
        """TF's loop, plus the holds; anything but a closure's error that stops the
        thread (TF's would die silently) is logged and becomes the queue's pending
        error, which the next ``schedule()`` or ``join()`` raises. A stop of the failure
        handler during a recovery wait ends the thread quietly (:meth:`_end_on_handler_stop`)."""
        try:
            self._take_closures()
        except HandlerStopped as stopped:
            self._end_on_handler_stop(stopped)
        except BaseException as e:  # noqa: BLE001 - reported to the queue, then the thread ends
            self._report_stopped(e)
        finally:
            with _ENDED_LOCK:
                self.__dict__["_tfh_ended"] = True

    def _end_on_handler_stop(self, stopped: HandlerStopped) -> None:
        """The failure handler was stopped (the coordinator stops) while this thread
        waited for its worker's recovery. Its closure went back to the queue when the
        worker failed (a resource closure still taken is cancelled, as TF cancels what
        it does not run); the thread takes nothing more. When it is the cluster's last
        worker thread and the queue was not stopped, the queue's pending error says so:
        a later ``join()`` raises it instead of waiting for threads that are gone."""
        self._should_worker_thread_run = False
        closure = self.__dict__.pop("_tfh_taken", None)
        if closure is not None:
            closure.mark_cancelled()
        self._holds().mark_lost()  # no closure in flight: a hold's wait for it ends
        _tf_logging.info(
            "The ClusterCoordinator thread of /job:worker/task:%d ends: %s",
            self.worker_index,
            stopped,
        )
        queue = self._cluster.closure_queue
        with _ENDED_LOCK:
            self.__dict__["_tfh_ended"] = True
            others = [
                w
                for w in getattr(self._cluster, "workers", None) or []
                if w is not self and not w.__dict__.get("_tfh_ended", False)
            ]
        if others or getattr(queue, "stopped", True):
            return
        finish = getattr(queue, "finish", None)
        if finish is not None:
            error = _tf_errors.InternalError(
                None,
                None,
                "Every ClusterCoordinator worker thread has ended: the failure handler was "
                f"stopped while they waited for a worker's recovery ({stopped})",
            )
            error.__cause__ = stopped
            finish(error, in_flight=False)

    def _report_stopped(self, e: BaseException) -> None:
        message = (
            f"The ClusterCoordinator thread of /job:worker/task:{self.worker_index} "
            f"stopped on an unexpected error: {e!r}"
        )
        _tf_logging.error(message, exc_info=e)
        error = _tf_errors.InternalError(None, None, message)
        error.__cause__ = e
        queue = self._cluster.closure_queue
        closure = self.__dict__.pop("_tfh_taken", None)
        if closure is not None:
            # Taken and not reported: it fails with the thread, so that the queue's
            # count of closures in flight (which join() waits for) goes down.
            try:
                _fail_closure(closure, error)
            except Exception as also:  # noqa: BLE001 - the queue is told below either way
                _tf_logging.error("Could not fail the closure of the stopped thread: %r", also)
            try:
                queue.mark_failed(error)
                return
            except AssertionError:  # it was reported before the error: nothing in flight
                pass
        finish = getattr(queue, "finish", None)
        if finish is not None:
            finish(error, in_flight=False)

    def _take_closures(self) -> None:
        self._maybe_delay()
        holds = self._holds()
        queue = self._cluster.closure_queue
        # How long the thread waits on the queue or a hold before it looks at its holds
        # (and whether it should still run) again: the core's.
        look = ClosureQueue.poll_timeout()
        while self._should_worker_thread_run:
            turn = holds.wait_turn(queue, look)
            if turn == _Holds.WAIT:
                continue
            closure = queue.get(timeout=look, tag=self.worker_index)
            if closure is None:
                if queue.stopped or not self._should_worker_thread_run:
                    return
                continue
            if not self._should_worker_thread_run:
                closure.mark_cancelled()
                return
            if (
                turn != _Holds.TAKE_GRANTED
                and holds.strict()
                and not isinstance(closure, _tf_cc.ResourceClosure)
            ):
                # A strict hold came while this thread waited in get(): the closure
                # goes back to the queue untouched (it never ran here).
                queue.put_back(closure)
                del closure
                continue
            self.__dict__["_tfh_taken"] = closure
            if isinstance(closure, _tf_cc.ResourceClosure):
                self._process_resource_closure(closure)
            else:
                self._process_closure(closure)
            # As TF: no reference to the processed closure survives the loop turn.
            self.__dict__.pop("_tfh_taken", None)
            del closure

    def _process_closure(self, closure: Any) -> None:
        """Runs ``closure`` and reports it to the queue; its error goes through TF's
        failure handling, then to its ``RemoteValue`` and the queue."""
        queue = self._cluster.closure_queue
        try:
            try:
                if type(closure) is Closure:
                    self._execute(closure)
                else:  # TF's own class (none of this coordinator's schedule() makes one)
                    closure.execute_on(self)
                    closure.maybe_call_with_output_remote_value(copy_to_local)
                queue.mark_finished()
            except Exception:
                with self._failure_handling(closure, queue):
                    raise
        except Exception as e:  # noqa: BLE001 - TF's contract: the closure's error is stored
            self._log_closure_error(e)
            _fail_closure(closure, e)
            queue.mark_failed(e)

    def _execute(self, closure: Closure) -> None:
        """One of our closures: TF's ``execute_on`` and the copy of its outputs."""
        output_values = run_on(closure, closure._entry.per_worker, self)
        remote_value = closure._output_remote_value()
        if remote_value is not None:
            cell = metric_cell("remote_value_fetch")
            timer = None if cell is None else Timed(cell)
            complete(remote_value, output_values)
            if timer is not None:
                timer.add()
            del remote_value
        del output_values
        # Only now: a copy that failed with the worker is retried with the same
        # RemoteValue.
        closure._release_output_remote_value()

    def _on_closure_failure(self, closure: Any, e: BaseException) -> None:
        """TF's: the closure goes back to the queue and the worker counts as dead. Then
        this thread has no closure in flight while it waits for the worker's recovery:
        a save's or a drain's wait for it ends, and the closure counts once (queued)."""
        super()._on_closure_failure(closure, e)
        self.__dict__.pop("_tfh_taken", None)
        self._holds().mark_lost()

    def _failure_handling(self, closure: Any, queue: Any) -> Any:
        """TF's failure handler around a closure that raised: a worker failure waits
        for the worker's recovery and puts the closure back; others are the closure's.
        Ours is entered by ``handle_failure``: TF's entry assertion (the handler was not
        stopped) held when the closure started, not necessarily now."""
        handler = self.failure_handler
        enter = getattr(handler, "handle_failure", None) or handler.wait_on_failure
        return enter(
            on_failure_fn=lambda e: self._on_closure_failure(closure, e),
            on_transient_failure_fn=lambda: queue.put_back(closure),
            on_recovery_fn=self._on_worker_recovery,
            worker_device_name=self.device_name,
        )

    def _log_closure_error(self, e: BaseException) -> None:
        """TF's error line for a closure's error (not for a cancellation)."""
        if not isinstance(e, _tf_errors.CancelledError):
            _tf_logging.error(
                " /job:worker/task:%d encountered the following error when "
                "processing closure: %r:%s",
                self.worker_index,
                e,
                e,
            )


def _fail_closure(closure: Any, error: BaseException) -> None:
    """Gives ``closure``'s ``RemoteValue`` (if it has one) ``error``."""
    if type(closure) is Closure:
        closure._set_output_error(error)
    else:
        closure.maybe_call_with_output_remote_value(lambda r: r._set_error(error))
