"""The coordinator's closures: the concrete-function cache, the closure, the worker's loop.

What each part spares TensorFlow's ``schedule()`` and worker thread, and when two calls
share a cache entry: docs/how-it-works.md, "The coordinator" (the cache's key) and "Two
objects per ``schedule()``" (the garbage collector).
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import Any, Optional

from tensorflow.python.distribute.coordinator import cluster_coordinator as _tf_cc
from tensorflow.python.distribute.coordinator import coordinator_context as _context
from tensorflow.python.distribute.coordinator import metric_utils as _metric_utils
from tensorflow.python.distribute.coordinator import remote_value as _remote_value
from tensorflow.python.distribute.coordinator import values as _values
from tensorflow.python.eager import context as _eager_context
from tensorflow.python.eager import def_function as _def_function
from tensorflow.python.eager import function as _tf_function
from tensorflow.python.framework import errors as _tf_errors
from tensorflow.python.framework import ops as _ops
from tensorflow.python.ops import array_ops as _array_ops
from tensorflow.python.platform import tf_logging as _tf_logging
from tensorflow.python.saved_model import save_context as _save_context
from tensorflow.python.util import nest as _nest

from .._native import Closure as _NativeClosure
from .._native import Completions
from . import join_checks as _join_checks
from .closure_queue import MAX_SIZE as MAX_QUEUE_SIZE

#: Entries kept per ``tf.function`` (argument structures); the oldest goes first.
MAX_ENTRIES_PER_FUNCTION = 64

_EagerTensor = _ops.EagerTensor
#: Python scalars: TF traces on their type and value.
_SCALARS = frozenset({int, float, bool, str, bytes, type(None)})
#: ``PerWorkerValues`` classes whose type spec is their first value's (TF's property).
_PER_WORKER = frozenset({_values.PerWorkerValues, _values.PerWorkerDistributedIterator})
#: Tensor dtypes whose trace type is more than dtype and shape (handle data).
_DT_RESOURCE = 20
_DT_VARIANT = 21
_READY = _remote_value.RemoteValueStatus.READY
_NOT_READY = _remote_value.RemoteValueStatus.NOT_READY
_ABORTED = _remote_value.RemoteValueStatus.ABORTED


class _Uncacheable(Exception):
    """Raised inside the key walk: this call takes TF's path."""


class _KeyBuilder:
    """One walk over a ``schedule()`` call's arguments (the key: docs/how-it-works.md)."""

    __slots__ = ("keep", "nested_per_worker", "slots")

    def __init__(self) -> None:
        self.keep: list = []  # spec objects whose id is in the key
        self.slots: list = []  # top-level positions and names of PerWorkerValues
        self.nested_per_worker = False

    def leaf(self, x: Any, slot: Any = None) -> Any:
        """The key of ``x``; ``slot``: its top-level position or name, None when nested."""
        t = type(x)
        if t is _EagerTensor:
            dtype = x._datatype_enum()
            if dtype == _DT_RESOURCE or dtype == _DT_VARIANT:
                raise _Uncacheable
            return (t, dtype, x._shape_tuple())
        if t in _SCALARS:
            return (t, x)
        if t in _PER_WORKER:
            spec = x._values[0]._type_spec
            if spec is None:
                raise _Uncacheable  # TF raises its ValueError
            self.keep.append(spec)
            if slot is None:
                self.nested_per_worker = True
            else:
                self.slots.append(slot)
            return (t, id(spec))
        leaf = self.leaf
        if t is tuple or t is list:
            return (t, tuple([leaf(v) for v in x]))
        if t is dict:
            return (t, tuple([(k, leaf(v)) for k, v in x.items()]))
        if isinstance(x, tuple) and hasattr(t, "_fields"):  # a namedtuple
            return (t, tuple([leaf(v) for v in x]))
        raise _Uncacheable


#: ``kwargs=None``, read only.
_NO_KWARGS: dict = {}


def argument_key(args: Any, kwargs: Any) -> Optional[tuple]:
    """``(key, keep, per_worker)`` for a ``schedule()`` call, or None if uncacheable.

    ``keep`` holds the objects whose ``id`` is in ``key``; ``per_worker`` says
    where the ``PerWorkerValues`` are: ``()`` none, a tuple of top-level
    positions (ints) and keyword names (strs), or None when one is nested in
    a container (execution then selects the worker's slice TF's way).
    """
    if args is None:
        args = ()
    if kwargs is None:
        kwargs = _NO_KWARGS
    if type(args) not in (tuple, list) or type(kwargs) is not dict:
        return None
    builder = _KeyBuilder()
    leaf = builder.leaf
    try:
        arg_keys = tuple([leaf(a, i) for i, a in enumerate(args)])
        kw_keys = tuple([(k, leaf(v, k)) for k, v in kwargs.items()])
    except _Uncacheable:
        return None
    per_worker = None if builder.nested_per_worker else tuple(builder.slots)
    return (type(args), arg_keys, kw_keys), builder.keep, per_worker


def context_key(strategy: Any) -> Optional[tuple]:
    """The part of TF's tracing context that can differ between two ``schedule()``
    calls (the eager device scope); None in graph mode, another strategy's scope or a
    SavedModel save."""
    if not _eager_context.executing_eagerly() or _save_context.in_save_context():
        return None
    stack = _ops.get_default_graph()._distribution_strategy_stack
    if stack and stack[-1].strategy is not strategy:
        return None
    return (_eager_context.context().device_name,)


class _Entry:
    """What TF's ``Closure.__init__`` derives for one argument structure; the native
    :class:`Closure` calls back here to make its ``RemoteValue`` and to run."""

    __slots__ = ("_cancelable", "concrete_function", "keep", "output_type_spec", "per_worker")

    def __init__(self, concrete_function, output_type_spec, per_worker, keep) -> None:
        self.concrete_function = concrete_function
        self.output_type_spec = output_type_spec
        self.per_worker = per_worker
        self.keep = keep
        # (cancellation manager, its cancelable wrapper of concrete_function)
        self._cancelable: Optional[tuple] = None

    def cancelable_function(self, manager: Any) -> Any:
        """``manager.get_cancelable_function(concrete_function)``, made once per manager
        (TF makes one per closure; the manager changes only after an error)."""
        pair = self._cancelable
        if pair is None or pair[0] is not manager:
            pair = (manager, manager.get_cancelable_function(self.concrete_function))
            self._cancelable = pair
        return pair[1]

    def new_remote_value(self) -> ClosureRemoteValue:
        """The ``RemoteValue`` a closure's outputs go to (``build_output_remote_value``)."""
        return ClosureRemoteValue(None, self.output_type_spec)

    def execute_on(self, closure: Any, worker: Any) -> None:
        """Runs ``closure`` on ``worker`` and sets its outputs (TF's ``execute_on``,
        same errors and order)."""
        output_values = run_on(closure, self.per_worker, worker)
        remote_value = closure._output_remote_value()
        if remote_value is not None:
            remote_value._set_values(output_values)


class ConcreteFunctionCache:
    """Concrete functions by ``tf.function`` and argument structure.

    Thread-safe: a lock guards the maps (never held while TF runs). Counts
    ``hits``, ``misses`` (TF's path, entry stored) and ``uncacheable`` calls.
    """

    def __init__(self, max_entries_per_function: int = MAX_ENTRIES_PER_FUNCTION) -> None:
        self._max = max_entries_per_function
        self._by_function: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.uncacheable = 0

    def lookup(self, fn: Any, key: tuple) -> Optional[_Entry]:
        try:
            entries = self._by_function.get(fn)
        except TypeError:  # not weak-referenceable: never cached
            return None
        if entries is None:
            return None
        entry = entries.get(key)
        if entry is not None:
            self.hits += 1
        return entry

    def store(self, fn: Any, key: tuple, entry: _Entry) -> None:
        self.misses += 1
        with self._lock:
            try:
                entries = self._by_function.get(fn)
                if entries is None:
                    entries = self._by_function[fn] = {}
            except TypeError:
                return
            entries[key] = entry
            while len(entries) > self._max:
                del entries[next(iter(entries))]

    def entries(self, fn: Any) -> int:
        """How many argument structures of ``fn`` are cached."""
        entries = self._by_function.get(fn)
        return 0 if entries is None else len(entries)

    def clear(self) -> None:
        with self._lock:
            self._by_function.clear()


def _metric_cell(name: str) -> Any:
    """TF's coordinator metric ``name`` (what ``monitored_timer`` adds to), or None."""
    if not _metric_utils.enable_metrics:
        return None
    if not _metric_utils._METRICS_MAPPING:
        _metric_utils._init()
    return _metric_utils._METRICS_MAPPING[name].get_cell()


#: What every :class:`ClosureRemoteValue`'s waiters wait on (``src/python/closure.rs``).
_COMPLETIONS = Completions()
#: Guards the making of a :class:`ClosureRemoteValue`'s fetch lock (on first need).
_MAKING_FETCH_LOCK = threading.Lock()


class ClosureRemoteValue(_values.RemoteValueImpl):
    """TF's ``RemoteValueImpl`` (same fields, methods and errors) without an event or a
    lock of its own (why: docs/how-it-works.md, "Two objects per ``schedule()``").

    A waiter waits for the process's completion count to move (:meth:`_wait`); every
    ``_set_*`` sets the fields, then the status, then advances the count. The fetch
    lock is made only if a ``get()`` has to copy (:func:`complete` copies first).
    """

    #: The fetch lock, once a ``get()`` needed one.
    _fetch_lock: Optional[Any] = None

    def __init__(self, closure: Any, type_spec: Any) -> None:
        self._closure = closure
        self._type_spec = type_spec
        self._values = None
        self._has_fetched_to_local = False
        self._fetched_tensors = None
        self._error = None
        self._status = _NOT_READY

    @property
    def _status_available_event(self) -> _StatusEvent:
        return _StatusEvent(self)

    @property
    def _has_fetched_to_local_lock(self) -> Any:
        lock = self._fetch_lock
        if lock is None:
            with _MAKING_FETCH_LOCK:
                lock = self._fetch_lock
                if lock is None:
                    lock = self._fetch_lock = threading.Lock()
        return lock

    def _wait(self, timeout: Optional[float] = None) -> bool:
        """Blocks until the status is set (True) or ``timeout`` seconds pass (False).

        Without a timeout, on the training thread of an open handler and outside its
        ``run()`` (a ``fetch()`` or ``get()`` in the training loop), the wait makes the
        handler's checks, as ``join()`` does: a termination notice that comes
        meanwhile is acted on here (the closures finish, the checkpoint is saved, the
        process exits) instead of waiting for a closure the save holds back."""
        if self._status is not _NOT_READY:
            return True
        if timeout is None:
            checks = _join_checks.checks_of_this_trainer()
            if checks:
                _join_checks.wait_checked(self._wait_unchecked, checks)
                return True
        return self._wait_unchecked(timeout)

    def _wait_unchecked(self, timeout: Optional[float] = None) -> bool:
        if self._status is not _NOT_READY:
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            seen = _COMPLETIONS.count()
            if self._status is not _NOT_READY:
                return True
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            _COMPLETIONS.wait(seen, left)

    def _finish(self, status: Any, values: Any, error: Any) -> None:
        self._values = values
        self._error = error
        self._status = status
        _COMPLETIONS.advance()

    def _set_aborted(self, error: Any) -> None:
        self._finish(_ABORTED, None, error)

    def _set_values(self, tensors: Any) -> None:
        self._finish(_READY, tensors, None)

    def _set_error(self, error: Any) -> None:
        self._finish(_READY, None, error)

    def _set_fetched_values(self, tensors: Any, fetched: Any) -> None:
        """The values and their copy on the coordinator, ready at once."""
        self._fetched_tensors = fetched
        self._has_fetched_to_local = True
        self._finish(_READY, tensors, None)

    def _get_values(self) -> Any:
        self._wait()
        return self._values

    def _get_error(self) -> Any:
        self._wait()
        return self._error

    def _wait_and_maybe_error(self) -> None:
        self._wait()
        if self._status is _ABORTED:
            raise _tf_errors.CancelledError(
                None,
                None,
                "The corresponding function is aborted. Please reschedule the function.",
            )
        if self._error is not None:
            raise self._error

    def get(self) -> Any:
        """TF's ``get()``: the outputs copied to the coordinator (once)."""
        self._wait_and_maybe_error()
        if not self._has_fetched_to_local:
            with self._has_fetched_to_local_lock:
                if not self._has_fetched_to_local:
                    self._fetched_tensors = self._copy_to_local()
                    self._has_fetched_to_local = True
        return self._fetched_tensors

    def _mark_cancelled(self) -> None:
        """What TF's ``Closure.mark_cancelled`` sets on its output."""
        self._set_error(
            _tf_errors.CancelledError(
                None,
                None,
                "The corresponding function is cancelled. Please reschedule the function.",
            )
        )


class _StatusEvent:
    """A :class:`ClosureRemoteValue`'s status as a ``threading.Event`` (TF's
    ``_status_available_event``): set once the status is not ``NOT_READY``."""

    __slots__ = ("_remote_value",)

    def __init__(self, remote_value: ClosureRemoteValue) -> None:
        self._remote_value = remote_value

    def is_set(self) -> bool:
        return self._remote_value._status is not _NOT_READY

    def wait(self, timeout: Optional[float] = None) -> bool:
        return self._remote_value._wait(timeout)

    def set(self) -> None:
        if self._remote_value._status is _NOT_READY:
            self._remote_value._status = _READY
        _COMPLETIONS.advance()

    def clear(self) -> None:
        self._remote_value._status = _NOT_READY


#: A scheduled call, built from an :class:`_Entry`: ``Closure(entry, cancellation_mgr,
#: args, kwargs)``, with TF's ``Closure`` attributes (``_args``, ``_kwargs``,
#: ``_function``, ``_concrete_function``, ``_output_type_spec``, ``tag``) and methods
#: (``build_output_remote_value``, ``execute_on``, ``mark_cancelled``,
#: ``maybe_call_with_output_remote_value``). Native: see ``src/python/closure.rs``.
Closure = _NativeClosure


def run_on(closure: Any, per_worker: Optional[tuple], worker: Any) -> Any:
    """Calls ``closure._function`` on ``worker``'s slice of the arguments; returns its
    outputs. ``per_worker``: as :func:`argument_key` gives it."""
    args, kwargs = closure._args, closure._kwargs
    index = worker.worker_index
    if per_worker is None:
        # TF's execute_on, step by step.
        args = _tf_cc._select_worker_slice(index, args)
        kwargs = _tf_cc._select_worker_slice(index, kwargs)
        e = _tf_cc._get_error_from_remote_values(args) or _tf_cc._get_error_from_remote_values(
            kwargs
        )
        if e:
            raise e if isinstance(e, _tf_cc.ClosureInputError) else _tf_cc.ClosureInputError(e)
        args = _nest.map_structure(_context.maybe_get_remote_value, args)
        kwargs = _nest.map_structure(_context.maybe_get_remote_value, kwargs)
    elif per_worker:
        args = list(args)
        kwargs = dict(kwargs)
        slots = []
        for slot in per_worker:
            value = (args if type(slot) is int else kwargs)[slot]._values[index]
            slots.append((slot, value))
        # TF: the errors of every input first (wrapped), then the values.
        for _, value in slots:
            e = value._get_error()
            if e:
                raise e if isinstance(e, _tf_cc.ClosureInputError) else _tf_cc.ClosureInputError(e)
        for slot, value in slots:
            (args if type(slot) is int else kwargs)[slot] = _context.maybe_get_remote_value(value)
    function = closure._function
    with _ops.device(worker.device_name):
        with _eager_context.executor_scope(worker.executor):
            with _context.with_dispatch_context(worker):
                cell = _metric_cell("closure_execution")
                start = time.time()
                output_values = function(*args, **kwargs)
                if cell is not None:
                    cell.add(time.time() - start)
    return output_values


def _plain_tensors(values: Any) -> Optional[list]:
    """``values`` flattened when every one is a plain eager tensor, else None."""
    flat = _nest.flatten(values)
    if flat and all(
        type(t) is _EagerTensor and t._datatype_enum() not in (_DT_RESOURCE, _DT_VARIANT)
        for t in flat
    ):
        return flat
    return None


def _copied_to_coordinator(values: Any, flat: list) -> Any:
    """``values`` copied to the coordinator with one ``identity_n`` (TF: one
    ``identity`` per tensor); same values, same device."""
    with _ops.device(f"/job:{_eager_context.get_server_def().job_name}"):
        copied = _array_ops.identity_n(flat)
    return _nest.pack_sequence_as(values, copied)


def copy_to_local(remote_value: Any) -> None:
    """``remote_value.get()`` as the worker thread calls it, with one op for all tensors
    when they are plain eager tensors; anything else takes TF's ``get()``."""
    values = remote_value._values
    if remote_value._status is not _READY or remote_value._error is not None or values is None:
        remote_value.get()
        return
    flat = _plain_tensors(values)
    if flat is None:
        remote_value.get()
        return
    with remote_value._has_fetched_to_local_lock:
        if remote_value._has_fetched_to_local:
            return
        remote_value._fetched_tensors = _copied_to_coordinator(values, flat)
        remote_value._has_fetched_to_local = True


def complete(remote_value: ClosureRemoteValue, values: Any) -> None:
    """Sets ``remote_value``'s values as the worker thread does: with their copy on the
    coordinator when every output is a plain eager tensor, and only then ready (a
    ``get()`` never waits for the copy's lock). Other outputs: TF's order, the values
    set, then ``get()``.
    """
    if values is not None:
        flat = _plain_tensors(values)
        if flat is not None:
            remote_value._set_fetched_values(values, _copied_to_coordinator(values, flat))
            return
    remote_value._set_values(values)
    remote_value.get()


class _Holds:
    """The holds on one worker thread, by reason (a drain, the coordinator's save):
    while any is set, it takes no new closure, but for the passes it was granted
    (:meth:`grant`: the save's queued runs below a finished one). ``idle`` is set by
    the thread while it waits on a hold with no closure in flight, and cleared when it
    takes one: a :meth:`Worker.wait_idle` that sees it knows nothing was taken since.
    ``is_lost``: the thread put its closure back on its worker's failure and waits for
    the worker's recovery."""

    #: Seconds between two looks at the queue while only non-strict holds are set.
    SOFT_SLICE = 0.05
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
        after waiting (without spinning) up to ``slice_`` seconds for the holds to be
        lifted or a pass granted."""
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
        self.go.wait(slice_ if strict else min(slice_, self.SOFT_SLICE))
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

    #: Seconds a worker thread waits for a closure before it looks at its holds again.
    GET_SLICE = 0.5

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
        error, which the next ``schedule()`` or ``join()`` raises."""
        try:
            self._take_closures()
        except BaseException as e:  # noqa: BLE001 - reported to the queue, then the thread ends
            self._report_stopped(e)

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
        fail = getattr(queue, "_fail", None)
        if fail is not None:
            fail(error)

    def _take_closures(self) -> None:
        self._maybe_delay()
        holds = self._holds()
        queue = self._cluster.closure_queue
        while self._should_worker_thread_run:
            turn = holds.wait_turn(queue, self.GET_SLICE)
            if turn == _Holds.WAIT:
                continue
            closure = queue.get(timeout=self.GET_SLICE, tag=self.worker_index)
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
        """A native closure: TF's ``execute_on`` and the copy of its outputs."""
        output_values = run_on(closure, closure._per_worker, self)
        remote_value = closure._output_remote_value()
        if remote_value is not None:
            cell = _metric_cell("remote_value_fetch")
            start = time.time()
            complete(remote_value, output_values)
            if cell is not None:
                cell.add(time.time() - start)
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
        for the worker's recovery and puts the closure back; others are the closure's."""
        return self.failure_handler.wait_on_failure(
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


def is_schedulable(fn: Any) -> bool:
    """What TF's ``schedule()`` accepts: a ``tf.function`` or a concrete function."""
    return isinstance(fn, (_def_function.Function, _tf_function.ConcreteFunction))
