"""Worker and parameter-server failure classification, on the Rust classifier.

Re-exports the native replacements of TensorFlow 2.21's ``_is_worker_failure``,
``_is_ps_failure`` and ``Cluster``'s transient-failure counters (``TransientFailures``);
``classify_failure(e)`` answers ``(is_ps_failure(e), is_worker_failure(e))`` in one call.
docs/how-it-works.md, "The coordinator", tells why. (``_extract_failed_ps_instances``'s
replacement, ``_native.failed_ps_instances``, is only the tests'.)
"""

from __future__ import annotations

import functools
from typing import Any

from . import _errors
from ._native import TransientFailures, classify_failure, is_ps_failure, is_worker_failure

__all__ = [
    "TransientFailures",
    "classify_failure",
    "is_ps_failure",
    "is_worker_failure",
]

# The TF error classes the classifier tells apart, in the order of the Rust
# `ErrorKind` (`src/failure.rs`), before the coordinator's three and TypeError.
_OP_ERROR_NAMES = (
    "CancelledError",
    "UnknownError",
    "InvalidArgumentError",
    "DeadlineExceededError",
    "NotFoundError",
    "AbortedError",
    "UnavailableError",
)


class _ClosureInputError(Exception):
    """Stand-in for the coordinator's ``ClosureInputError`` when TensorFlow is absent."""

    def __init__(self, original_exception: BaseException) -> None:
        if isinstance(original_exception, (_ClosureInputError, _ClosureAbortedError)):
            original_exception = original_exception.original_exception
        self.original_exception = original_exception
        super().__init__(
            f"Input has an error, the original exception is {original_exception!r}, "
            f"error message is {original_exception}."
        )


class _ClosureAbortedError(Exception):
    """Stand-in for the coordinator's ``ClosureAbortedError`` when TensorFlow is absent."""

    def __init__(self, original_exception: BaseException) -> None:
        if isinstance(original_exception, (_ClosureInputError, _ClosureAbortedError)):
            original_exception = original_exception.original_exception
        self.original_exception = original_exception
        super().__init__(
            "Other function has an execution error, as a result, the current value is "
            f"not available. The original exception is {original_exception!r}, "
            f"error message is {original_exception}."
        )


def _ps_unavailable_stand_in(errors: Any) -> type:
    """Stand-in for ``PSUnavailableError``: an ``UnavailableError`` wrapping another."""

    def __init__(self: Any, original_exception: BaseException) -> None:
        assert isinstance(original_exception, errors.UnavailableError)
        self.original_exception = original_exception
        errors.UnavailableError.__init__(self, None, None, original_exception.message)

    return type(
        "PSUnavailableError",
        (errors.UnavailableError,),
        {
            "__init__": __init__,
            "__module__": __name__,
            "__doc__": "Stand-in for the coordinator's ``PSUnavailableError``.",
        },
    )


@functools.cache
def _error_classes() -> tuple:
    """The classes the native classifier checks ``isinstance`` against, in its order.

    Called by the extension at the first classification: TensorFlow's classes
    when it is importable, else the stand-ins. Cached, so that every caller
    sees the same stand-in classes.
    """
    errors = _errors.module()
    try:
        from tensorflow.python.distribute.coordinator import cluster_coordinator as cc

        coordinator = (cc.PSUnavailableError, cc.ClosureInputError, cc.ClosureAbortedError)
    except ImportError:
        coordinator = (_ps_unavailable_stand_in(errors), _ClosureInputError, _ClosureAbortedError)
    return (*(getattr(errors, name) for name in _OP_ERROR_NAMES), *coordinator, TypeError)
