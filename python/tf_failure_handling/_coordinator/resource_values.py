"""The ``RemoteValue`` of a per-worker resource our coordinator makes (a per-worker
dataset or its iterator, a per-worker variable, a distributed table's copies), whose
waits make the handler's checks on the training thread.

TensorFlow's ``ResourceClosure`` gives its resource a ``RemoteValueImpl`` that waits on
its ``threading.Event`` alone. After a notice with no grace period our coordinator holds
its workers (they take no new closure) until the save, which a handler's check makes: a
``fetch()`` or ``get()`` of a resource created after the notice (its closure is held)
waited forever for that check. :class:`ResourceValue` and :class:`ResourceVariable` are
TensorFlow's classes (same fields, event, lock, results and errors) whose waits, on the
training thread of an open handler and outside its ``run()``, make the handler's checks
as ``join()`` and ``ClosureRemoteValue`` do (``join_checks.wait_checked``). Only our
``Worker`` makes them (:func:`resource_closure`); TensorFlow's own coordinator in the
same process keeps TensorFlow's classes.
"""

from __future__ import annotations

from typing import Any

from tensorflow.python.distribute.coordinator import cluster_coordinator as _tf_cc
from tensorflow.python.distribute.coordinator import values as _values

from . import join_checks as _join_checks


def wait_status(event: Any) -> None:
    """``event.wait()`` (a remote value's status), with the handler's checks between
    slices when this is the training thread of an open handler outside its ``run()``."""
    if event.is_set():
        return
    checks = _join_checks.checks_of_this_trainer()
    if checks:
        _join_checks.wait_checked(event.wait, checks)
    else:
        event.wait()


class _CheckedWaits:
    """TensorFlow's three waits of a ``RemoteValueImpl``, made by :func:`wait_status`;
    what follows each wait is TensorFlow's."""

    _status_available_event: Any

    def _get_values(self) -> Any:
        wait_status(self._status_available_event)
        return super()._get_values()  # type: ignore[misc]

    def _get_error(self) -> Any:
        wait_status(self._status_available_event)
        return super()._get_error()  # type: ignore[misc]

    def _wait_and_maybe_error(self) -> None:
        wait_status(self._status_available_event)
        super()._wait_and_maybe_error()  # type: ignore[misc]


class ResourceValue(_CheckedWaits, _values.RemoteValueImpl):
    """TensorFlow's ``RemoteValueImpl`` of a ``ResourceClosure``, with checked waits."""


class ResourceVariable(_CheckedWaits, _values.RemoteVariable):
    """TensorFlow's ``RemoteVariable`` (a per-worker variable), with checked waits."""


class ResourceClosure(_tf_cc.ResourceClosure):
    """TensorFlow's ``ResourceClosure`` whose remote value is a :class:`ResourceValue`."""

    def _init_remote_value(self) -> ResourceValue:
        return ResourceValue(self, self._output_type_spec)


class PerWorkerVariableClosure(_tf_cc.PerWorkerVariableClosure):
    """TensorFlow's ``PerWorkerVariableClosure`` whose remote value is a
    :class:`ResourceVariable`."""

    def _init_remote_value(self) -> ResourceVariable:
        return ResourceVariable(self, self._output_type_spec)


def resource_closure(
    worker: Any, closure_class: type, function: Any, args: Any, kwargs: Any
) -> Any:
    """TensorFlow's ``Worker.create_resource`` / ``create_variable_resource`` with
    ``closure_class``: the closure on the cluster's resource cancellation manager,
    registered for rebuilding on the worker's recovery and scheduled on its queue."""
    closure = closure_class(
        function, worker._cluster.resource_cancellation_mgr, args=args, kwargs=kwargs
    )
    return worker._register_and_schedule_resource_closure(closure)
