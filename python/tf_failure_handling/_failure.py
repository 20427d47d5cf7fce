"""Worker and parameter-server failure classification, on the Rust classifier.

Replaces the private helpers of TensorFlow 2.21's
``tensorflow/python/distribute/coordinator/cluster_coordinator.py`` that the
coordinator's worker threads call on every failed closure:

* :func:`is_worker_failure` replaces ``_is_worker_failure(error)``;
* :func:`is_ps_failure` replaces ``_is_ps_failure(error)``;
* :func:`classify_failure` answers both in one call, ``(is_ps_failure(e),
  is_worker_failure(e))``: what the coordinator asks of a failed closure;
* :func:`extract_failed_ps_instances` replaces ``_extract_failed_ps_instances(err_msg)``;
* :class:`TransientFailures` replaces ``Cluster``'s transient-failure counters:
  its ``record_and_ignore_transient_ps_failure(e)`` and
  ``record_and_ignore_transient_timeouts(e)`` are TF's
  ``Cluster._record_and_ignore_transient_ps_failure`` and
  ``Cluster._record_and_ignore_transient_timeouts``, with the thresholds read
  from ``TF_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES`` (default 3) and
  ``TF_COORDINATOR_IGNORE_TRANSIENT_TIMEOUTS`` (default ``num_workers // 10``)
  at construction, as ``Cluster.__init__`` reads them (keyword arguments
  ``ps_threshold``/``timeouts_threshold`` override them). Thread-safe.

The verdicts are TF's, row for row (the rules are one table in ``src/failure.rs``,
checked against TF's own functions by ``tests/unit/test_failure_classification.py``).
The functions are the native ones, re-exported without a Python wrapper, because
the point is speed: TF's ``_is_worker_failure`` reads and parses
``TF_PS_HANDLE_UNKNOWN_ERROR`` and calls ``str(error)`` up to six times per call.

One difference: TF reads ``TF_PS_HANDLE_UNKNOWN_ERROR`` on every
``_is_worker_failure`` call, so a value ``int()`` rejects raises ``ValueError``
for every error. Here it is read (also per call, never cached) only for an
``UnknownError`` whose message says ``Graph execution error`` -- the only error
whose verdict it can change -- and raises the same ``ValueError`` there.

The error classes are TensorFlow's (``tensorflow.python.framework.errors`` and the
coordinator's ``PSUnavailableError``, ``ClosureInputError``, ``ClosureAbortedError``),
looked up once, at the first classification, never at import. Without TensorFlow,
the stand-ins of :mod:`tf_failure_handling._errors` and the ones below take their
place.
"""

from __future__ import annotations

import functools
from typing import Any

from . import _errors
from ._native import TransientFailures, classify_failure, is_ps_failure, is_worker_failure
from ._native import failed_ps_instances as extract_failed_ps_instances

__all__ = [
    "TransientFailures",
    "classify_failure",
    "extract_failed_ps_instances",
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
