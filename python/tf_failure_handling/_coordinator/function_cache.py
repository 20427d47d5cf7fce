"""The concrete-function cache ``schedule()`` looks a call's arguments up in, its
entries, the closure made from one, and the run of a closure on a worker.

What the cache spares TensorFlow's ``schedule()``, and when two calls share an entry:
docs/how-it-works.md, "The coordinator" (the cache's key).
"""

from __future__ import annotations

import sys
import threading
import weakref
from typing import Any, Optional

from tensorflow.python.distribute.coordinator import cluster_coordinator as _tf_cc
from tensorflow.python.distribute.coordinator import coordinator_context as _context
from tensorflow.python.distribute.coordinator import values as _values
from tensorflow.python.eager import context as _eager_context
from tensorflow.python.eager import def_function as _def_function
from tensorflow.python.eager import function as _tf_function
from tensorflow.python.framework import ops as _ops
from tensorflow.python.saved_model import save_context as _save_context
from tensorflow.python.util import nest as _nest

from .._native import Timed
from .remote_values import DT_RESOURCE, DT_VARIANT, ClosureRemoteValue, EagerTensor, metric_cell

#: Entries kept per ``tf.function`` (argument structures); the oldest goes first.
MAX_ENTRIES_PER_FUNCTION = 64

#: Python scalars: TF traces on their type and value.
_SCALARS = frozenset({int, float, bool, str, bytes, type(None)})
#: ``PerWorkerValues`` classes whose type spec is their first value's (TF's property).
_PER_WORKER = frozenset({_values.PerWorkerValues, _values.PerWorkerDistributedIterator})


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
        if t is EagerTensor:
            dtype = x._datatype_enum()
            if dtype == DT_RESOURCE or dtype == DT_VARIANT:
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


#: What :class:`Closure` holds for an output ``RemoteValue`` not built yet.
_NOT_BUILT = object()


class Closure:
    """A scheduled call: TF's ``Closure`` as data (its attributes and methods, by TF's
    names), made from an :class:`_Entry`, which holds what every closure of one argument
    structure shares and runs it.

    One object for the garbage collector (``__slots__``, no ``__dict__``, no weak
    reference): why it matters, docs/how-it-works.md, "Two objects per ``schedule()``".
    TF holds the output ``RemoteValue`` through a weak reference (one more object); this
    closure holds it strongly until it is finished (values or error set, or cancelled)
    and answers "is it still wanted" from its reference count, as the weak reference
    would: a ``RemoteValue`` the caller dropped is neither filled nor fetched.
    """

    __slots__ = ("_args", "_entry", "_function", "_kwargs_given", "_output", "_tfh_run", "tag")

    def __init__(self, entry: _Entry, cancellation_mgr: Any, args: Any = None, kwargs: Any = None):
        self._entry = entry
        #: What the worker calls: the concrete function wrapped by the manager (the
        #: entry's, made once per manager).
        pair = entry._cancelable
        if pair is not None and pair[0] is cancellation_mgr:
            self._function = pair[1]
        else:
            self._function = entry.cancelable_function(cancellation_mgr)
        self._args = args or ()
        # None for no keyword arguments: a call without them allocates no dict.
        self._kwargs_given = kwargs or None
        #: The queue's tag (a worker index, or None), set by ``ClosureQueue.put``.
        self.tag = None
        #: The index of the handler's ``run()`` that scheduled it, or None.
        self._tfh_run: Optional[int] = None
        # _NOT_BUILT, the RemoteValue (held until finished), or None (finished).
        self._output: Any = _NOT_BUILT

    @property
    def _kwargs(self) -> dict:
        kwargs = self._kwargs_given
        return {} if kwargs is None else kwargs  # TF's fresh {} for none

    @property
    def _concrete_function(self) -> Any:
        return self._entry.concrete_function

    @property
    def _output_type_spec(self) -> Any:
        return self._entry.output_type_spec

    @property
    def _per_worker(self) -> Optional[tuple]:
        """Where the ``PerWorkerValues`` are among the arguments (:func:`argument_key`)."""
        return self._entry.per_worker

    @property
    def _output_remote_value_ref(self) -> Any:
        """TF's attribute: a weak reference to the output ``RemoteValue`` while the
        closure holds it, else None."""
        output = self._output
        return None if output is _NOT_BUILT or output is None else weakref.ref(output)

    def build_output_remote_value(self) -> Any:
        """The ``RemoteValue`` the outputs go to; ValueError the second time, as TF."""
        if self._output is not _NOT_BUILT:
            raise ValueError("The output of the Closure cannot be built more than once.")
        output = self._output = self._entry.new_remote_value()
        return output

    def _output_remote_value(self) -> Any:
        """The output ``RemoteValue`` while the closure holds it and its caller still
        refers to it, else None."""
        output = self._output
        if output is _NOT_BUILT or output is None or _refcount(output) <= _HELD_ALONE:
            return None
        return output

    def _release(self) -> Any:
        """Lets the output ``RemoteValue`` go; returns it if it is still wanted."""
        output = self._output_remote_value()
        if self._output is not _NOT_BUILT:
            self._output = None
        return output

    def _set_output_error(self, e: BaseException) -> None:
        """Finishes with error ``e``: the output ``RemoteValue`` (if still wanted) gets
        it, and the closure lets it go (an error's traceback may refer to the closure)."""
        output = self._release()
        if output is not None:
            output._set_error(e)

    def _release_output_remote_value(self) -> None:
        """Lets the output ``RemoteValue`` go (the closure succeeded; its values are set)."""
        if self._output is not _NOT_BUILT:
            self._output = None

    def mark_cancelled(self) -> None:
        """TF's: the output ``RemoteValue``, if still wanted, gets TF's CancelledError."""
        output = self._release()
        if output is not None:
            output._mark_cancelled()

    def maybe_call_with_output_remote_value(self, method: Any) -> Any:
        """TF's: ``method(remote_value)`` if the output is still wanted, else None."""
        output = self._output_remote_value()
        return None if output is None else method(output)

    def execute_on(self, worker: Any) -> None:
        """TF's: runs the closure on ``worker`` and sets its outputs."""
        self._entry.execute_on(self, worker)


_refcount = sys.getrefcount


def _held_alone() -> int:
    """What ``sys.getrefcount`` says, in :meth:`Closure._output_remote_value`, of an
    output that only its closure refers to (read the same way, on this interpreter)."""

    class Probe:
        __slots__ = ("_output",)

        def count(self) -> int:
            output = self._output
            return _refcount(output)

    probe = Probe()
    probe._output = object()
    return probe.count()


#: See :func:`_held_alone`.
_HELD_ALONE = _held_alone()


def run_on(closure: Any, per_worker: Optional[tuple], worker: Any) -> Any:
    """Calls ``closure._function`` on ``worker``'s slice of the arguments; returns its
    outputs. ``per_worker``: as :func:`argument_key` gives it."""
    args, kwargs = closure._args, closure._kwargs_given or _NO_KWARGS
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
                cell = metric_cell("closure_execution")
                timer = None if cell is None else Timed(cell)
                output_values = function(*args, **kwargs)
                if timer is not None:
                    timer.add()
    return output_values


def is_schedulable(fn: Any) -> bool:
    """What TF's ``schedule()`` accepts: a ``tf.function`` or a concrete function."""
    return isinstance(fn, (_def_function.Function, _tf_function.ConcreteFunction))
