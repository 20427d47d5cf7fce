"""The ``RemoteValue`` of a closure the coordinator's ``schedule()`` made, and the copy of
a closure's outputs to the coordinator.

Why it has no event or lock of its own: docs/how-it-works.md, "Two objects per
``schedule()``" (the garbage collector).
"""

from __future__ import annotations

import threading
from typing import Any, Optional

from tensorflow.python.distribute.coordinator import metric_utils as _metric_utils
from tensorflow.python.distribute.coordinator import remote_value as _remote_value
from tensorflow.python.distribute.coordinator import values as _values
from tensorflow.python.eager import context as _eager_context
from tensorflow.python.framework import errors as _tf_errors
from tensorflow.python.framework import ops as _ops
from tensorflow.python.ops import array_ops as _array_ops
from tensorflow.python.util import nest as _nest

from .._native import Completions
from . import join_checks as _join_checks

EagerTensor = _ops.EagerTensor
#: Tensor dtypes whose trace type is more than dtype and shape (handle data).
DT_RESOURCE = 20
DT_VARIANT = 21
_READY = _remote_value.RemoteValueStatus.READY
_NOT_READY = _remote_value.RemoteValueStatus.NOT_READY
_ABORTED = _remote_value.RemoteValueStatus.ABORTED


def metric_cell(name: str) -> Any:
    """TF's coordinator metric ``name`` (what ``monitored_timer`` adds to), or None."""
    if not _metric_utils.enable_metrics:
        return None
    if not _metric_utils._METRICS_MAPPING:
        _metric_utils._init()
    return _metric_utils._METRICS_MAPPING[name].get_cell()


#: What every :class:`ClosureRemoteValue`'s waiters wait on (``src/python/closure.rs``).
_COMPLETIONS = Completions(_NOT_READY)
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
        return _COMPLETIONS.wait(self, timeout)

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


def _plain_tensors(values: Any) -> Optional[list]:
    """``values`` flattened when every one is a plain eager tensor, else None."""
    flat = _nest.flatten(values)
    if flat and all(
        type(t) is EagerTensor and t._datatype_enum() not in (DT_RESOURCE, DT_VARIANT) for t in flat
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
