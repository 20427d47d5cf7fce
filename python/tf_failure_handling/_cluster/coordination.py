"""The coordination service as the handler sees it.

In production that is TensorFlow's ``context.context()`` (the key-value store
and error reporting of the multi-worker coordination service). Tests and
``tf_failure_handling.testing`` install another object with the same four
methods for the current thread; :func:`current` returns whichever applies.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional

from .. import _errors
from .._bounded_call import BoundedCall
from .._native import coordination_bounds

_local = threading.local()


def current() -> Any:
    """The service for this thread: a test's override, else TF's context."""
    override = getattr(_local, "service", None)
    if override is not None:
        return override
    from tensorflow.python.eager import context

    return context.context()


@contextmanager
def use(service: Any) -> Iterator[Any]:
    """Makes ``service`` this thread's coordination service inside the block."""
    previous = getattr(_local, "service", None)
    _local.service = service
    try:
        yield service
    finally:
        _local.service = previous


def _bounded(fn: Callable[[], Any], timeout: float, what: str) -> Any:
    """``fn()``, or ``DeadlineExceededError`` if it has not returned after ``timeout`` s.

    TF's ``set_config_key_value`` and ``report_error_to_cluster`` take no timeout and
    never return while the service's leader is cut off; the second holds the GIL, so
    its bound is not enforced (docs/how-it-works.md, "What is bounded").
    """
    call = BoundedCall(fn, f"tfh-coordination-{what}")
    if not call.wait(timeout):
        raise _errors.make(
            "DeadlineExceededError",
            f"The coordination service did not answer {what} within {timeout:g}s "
            "(its leader, worker 0, may be cut off from this worker).",
        )
    return call.result()


class Client:
    """Thin adapter: TF's exceptions for "exists" and "timed out" become values.

    Writes are bounded by ``write_timeout`` seconds (``DeadlineExceededError``
    after that; None: the core's bound, ``coordination_bounds``); reads are
    bounded by the timeout each get is given.
    """

    def __init__(self, service: Any, write_timeout: Optional[float] = None) -> None:
        self._service = service
        self._write_timeout = coordination_bounds(write_timeout)["write"]

    @property
    def service(self) -> Any:
        """The wrapped service (TF's context in production)."""
        return self._service

    def set(self, key: str, value: str, timeout: Optional[float] = None) -> bool:
        """Sets ``key``; False when it already exists (TF's AlreadyExistsError)."""
        try:
            _bounded(
                lambda: self._service.set_config_key_value(key, value),
                self._write_timeout if timeout is None else timeout,
                f"set({key})",
            )
        except _errors.module().AlreadyExistsError:
            return False
        return True

    def get(self, key: str, timeout: float) -> Optional[str]:
        """The value of ``key``, waiting up to ``timeout`` seconds; None if not set by then."""
        try:
            # TF's milliseconds, never its 0 ("wait forever"): the core converts.
            millis = coordination_bounds(get=timeout)["get_ms"]
            return self._service.get_config_key_value(key, millis)
        except _errors.module().DeadlineExceededError:
            return None

    def report_error(self, code: int, message: str, timeout: Optional[float] = None) -> None:
        _bounded(
            lambda: self._service.report_error_to_cluster(code, message),
            self._write_timeout if timeout is None else timeout,
            "report_error_to_cluster",
        )

    def abort_collectives(self, message: str) -> bool:
        """Aborts this worker's collectives (TF's ``abort_collective_ops``, code
        UNAVAILABLE): the step blocked in one raises ``message``. False when the service
        cannot (a test's stand-in without it). It returns at once: it only marks the
        collective executor aborted and cancels what waits in it."""
        abort = getattr(self._service, "abort_collective_ops", None)
        if abort is None:
            return False
        abort(_errors.module().UNAVAILABLE, message)
        return True
