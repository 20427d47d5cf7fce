"""How a failing coordination-service call of the protocol is retried, and named when it
gives up.

The rule is the core's (``src/retry.rs``, the "Failures" table of
``src/step_resolution.rs``): a coordination-service error (any ``OpError``: a transient
failure can look like Unavailable, Internal or Aborted) is retried after a pause that
doubles from ``RETRY_FIRST_PAUSE`` to ``RETRY_MAX_PAUSE``, until the failures have lasted
the bound (``ProtocolCore.retry_bound``) and number at least ``RETRY_MIN_ATTEMPTS``
(so a short burst survives a loaded machine) or, past the bound, one attempt took the
whole bound by itself (its call's own timeout: the service did not answer); then the
last error is raised again, of its own type, naming what failed, how often and for how
long (:meth:`Retrier.named`).
Anything else is a bug and is not retried. A :class:`~._native.Retry` is one run of
failures of one call; this module waits and logs, the core decides.

Two threads retry, each its own way:

* the driver never sleeps: its writes are the core's (``ProtocolCore.handle``, ``poll``,
  ``poll_timeout``; ``src/protocol/driver.rs`` over ``src/writes.rs``), which says which
  one to attempt now (acknowledgements first), when the next is due, and when one is
  retried or given up; until then the driver takes its inputs (``driver.py``);
* the training thread and the readers block between attempts (:meth:`Retrier.call`,
  :meth:`Retrier.wait`).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional, Union

from .. import _errors
from .._native import (  # noqa: F401 - re-exported: the rule's constants
    RETRY_FIRST_PAUSE,
    RETRY_MAX_PAUSE,
    RETRY_MIN_ATTEMPTS,
    TRANSIENT_FAILURE_WINDOW,
    ProtocolCore,
    Retry,
    RetryVerdict,
)
from .state import HandlerState

log = logging.getLogger("tf_failure_handling")


class Retrier:
    """The protocol's calls under the core's retry rule: the bound, the pauses, and the
    error raised when the rule gives up. The bound is the core's (``core.retry``)."""

    def __init__(self, state: HandlerState, core: ProtocolCore) -> None:
        self._state = state
        self._core = core

    def retry(self) -> Retry:
        """A run of failures of one call, starting now, retried for the core's bound (the
        transient-failure window, or the peer timeout or the time left before the leading
        notice's deadline, at least 1 s, when shorter)."""
        return self._core.retry(self._state.clock())

    def named(self, error: BaseException, what: str, attempts: int, seconds: float) -> Any:
        """``error``'s type (TF's), its message prefixed with what failed, how often and
        for how long; ``error`` is its cause."""
        errors = _errors.module()
        name = type(error).__name__ if isinstance(error, errors.OpError) else "UnavailableError"
        try:
            named = _errors.make(
                name,
                f"Worker {self._state.membership.id_in_cluster}: {what} failed {attempts} "
                f"time(s) over {seconds:.1f}s: {getattr(error, 'message', error)}",
            )
        except (AttributeError, TypeError):  # not one of TF's public error classes
            named = _errors.make("UnavailableError", f"{what} failed: {error!r}")
        named.__cause__ = error
        return named

    def after(
        self, verdict: RetryVerdict, attempts: int, what: str, error: BaseException
    ) -> Union[float, BaseException]:
        """The rule's ``verdict`` on a failed attempt of ``what``: the pause before the
        next attempt (the core's, from the failure; logged: a warning the first time), or
        the named error."""
        if isinstance(verdict, RetryVerdict.GiveUp):
            return self.named(error, what, verdict.attempts, verdict.seconds)
        pause = verdict.pause
        (log.warning if attempts == 1 else log.info)(
            "%s failed (%s: %s); retrying in %gs (%.1fs left).",
            what,
            type(error).__name__,
            error,
            pause,
            verdict.left,
        )
        return pause

    def wait(
        self, retry: Retry, what: str, error: BaseException, longest: Optional[float] = None
    ) -> None:
        """A blocking caller's failed attempt: waits the rule's pause (at most
        ``longest`` seconds, and not once closing), or raises the named error from
        ``error`` when the rule gives up."""
        verdict = retry.failed(closing=self._state.closing.is_set())
        pause = self.after(verdict, retry.attempts, what, error)
        if isinstance(pause, BaseException):
            raise pause from error
        self._state.closing.wait(pause if longest is None else min(pause, longest))

    def call(self, what: str, call: Callable[[], Any]) -> Any:
        """``call()``, retried by the rule when it fails with a coordination-service
        error (any ``OpError``); the named error once the rule gives up. Anything else is
        a bug and is raised at once."""
        errors = _errors.module()
        retry = self.retry()
        while True:
            # An attempt that fails after the whole bound (the call's own timeout: the
            # service did not answer) ends the run once the bound has passed.
            retry.attempt()
            try:
                return call()
            except errors.OpError as e:
                self.wait(retry, what, e)
