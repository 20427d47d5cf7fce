"""TensorFlow's error classes, or stand-ins with the same shape when TF is absent.

Errors the handler raises or catches must be TensorFlow's own types, so that a
script's ``except tf.errors.AlreadyExistsError`` keeps working. They are imported
from TF at first use. Without TF (``tf_failure_handling.testing`` on a machine
without it) the stand-ins below carry the same names, codes and constructor.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

_CODES = {
    "CancelledError": 1,
    "UnknownError": 2,
    "InvalidArgumentError": 3,
    "DeadlineExceededError": 4,
    "NotFoundError": 5,
    "AlreadyExistsError": 6,
    "PermissionDeniedError": 7,
    "ResourceExhaustedError": 8,
    "FailedPreconditionError": 9,
    "AbortedError": 10,
    "OutOfRangeError": 11,
    "UnimplementedError": 12,
    "InternalError": 13,
    "UnavailableError": 14,
    "DataLossError": 15,
    "UnauthenticatedError": 16,
}


class OpError(Exception):
    """Stand-in for ``tf.errors.OpError`` when TensorFlow is not installed."""

    error_code = 2

    def __init__(self, node_def: Any, op: Any, message: str, *args: Any) -> None:
        super().__init__(message, *args)
        self._node_def = node_def
        self._op = op
        self._message = message

    @property
    def message(self) -> str:
        return self._message

    def __str__(self) -> str:
        return self._message


def _fallback() -> SimpleNamespace:
    ns = SimpleNamespace(OpError=OpError)
    by_code: dict[int, type] = {}
    for name, code in _CODES.items():
        cls = type(name, (OpError,), {"error_code": code, "__module__": __name__})
        setattr(ns, name, cls)
        by_code[code] = cls
    ns.exception_type_from_error_code = lambda code: by_code.get(code, ns.UnknownError)
    return ns


_resolved: list = []
_resolve_lock = threading.Lock()


def module() -> Any:
    """``tensorflow.python.framework.errors`` if importable, else the stand-ins.

    Resolved once, under a lock: TensorFlow's import is not safe to run from
    several threads at once (simulated workers would otherwise race into it).
    """
    if _resolved:
        return _resolved[0]
    with _resolve_lock:
        if not _resolved:
            try:
                from tensorflow.python.framework import errors
            except ImportError:
                errors = _fallback()
            _resolved.append(errors)
    return _resolved[0]


def make(name: str, message: str) -> BaseException:
    """An instance of error class ``name`` (e.g. ``"InvalidArgumentError"``)."""
    return getattr(module(), name)(None, None, message)


def from_code(code: int, message: str) -> BaseException:
    """The error TF raises for a status ``code`` (``UnknownError`` for unknown codes)."""
    try:
        cls = module().exception_type_from_error_code(code)
    except KeyError:  # TF's table has only the canonical codes
        cls = module().UnknownError
    return cls(None, None, message)
