"""The coordination service as the handler sees it.

In production that is TensorFlow's ``context.context()`` (the key-value store
and error reporting of the multi-worker coordination service). Tests and
``tf_failure_handling.testing`` install another object with the same four
methods for the current thread; :func:`current` returns whichever applies.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Iterator, Optional

from . import _errors

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


class Client:
    """Thin adapter: TF's exceptions for "exists" and "timed out" become values."""

    def __init__(self, service: Any) -> None:
        self._service = service

    def set(self, key: str, value: str) -> bool:
        """Sets ``key``; False when it already exists (TF's AlreadyExistsError)."""
        try:
            self._service.set_config_key_value(key, value)
        except _errors.module().AlreadyExistsError:
            return False
        return True

    def get(self, key: str, timeout: float) -> Optional[str]:
        """The value of ``key``, waiting up to ``timeout`` seconds; None if not set by then."""
        # TF treats 0 as "wait forever": never pass it.
        millis = max(1, int(timeout * 1000))
        try:
            return self._service.get_config_key_value(key, millis)
        except _errors.module().DeadlineExceededError:
            return None

    def report_error(self, code: int, message: str) -> None:
        self._service.report_error_to_cluster(code, message)
