"""How a failing coordination-service call of the protocol is retried, and named when it
gives up.

The rule is the core's (``src/retry.rs``, the "Failures" table of
``src/step_resolution.rs``): a coordination-service error (any ``OpError``: a transient
failure can look like Unavailable, Internal or Aborted) is retried after a pause that
doubles from ``RETRY_FIRST_PAUSE`` to ``RETRY_MAX_PAUSE``, until the failures have lasted
the bound (``ProtocolCore.retry_bound``) and number at least ``RETRY_MIN_ATTEMPTS``
(so a short burst survives a loaded machine); then the last error is raised again, of its
own type, naming what failed, how often and for how long (:meth:`Retries._named`).
Anything else is a bug and is not retried. A :class:`~._native.Retry` is one run of
failures of one call; this module waits and logs, the core decides.

Two threads retry, each its own way:

* the driver never sleeps: its writes are queued in the core's ``Writes``
  (``src/writes.rs``), which says which one to attempt now (acknowledgements first) and
  when the next is due, and until then the driver takes its inputs
  (:meth:`Retries._attempt`);
* the training thread and the readers block between attempts (:meth:`Retries._retrying`,
  :meth:`Retries._wait_to_retry`).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Optional, Union

from .. import _errors
from .._native import (  # noqa: F401 - re-exported: the rule's constants
    RETRY_FIRST_PAUSE,
    RETRY_MAX_PAUSE,
    RETRY_MIN_ATTEMPTS,
    TRANSIENT_FAILURE_WINDOW,
    Retry,
    RetryVerdict,
    WriteKind,
)

log = logging.getLogger("tf_failure_handling")


class Write:
    """One coordination-service write of the driver: what it is and how to perform it.

    When and how often it is attempted is the core's (``Writes``, ``src/writes.rs``):
    ``id`` is its handle there. ``on_done(result)`` and ``on_failed(error)`` return the
    write that follows (the announce after a won claim), or None.
    """

    def __init__(
        self,
        what: str,
        call: Callable[[], Any],
        kind: WriteKind,
        on_done: Callable[[Any], Optional[Write]],
        on_failed: Callable[[BaseException], Optional[Write]],
    ) -> None:
        self.what = what
        self.call = call
        self.kind = kind
        self.on_done = on_done
        self.on_failed = on_failed
        self.id: int = -1


class Retries:
    """The protocol's calls under the core's retry rule: the bound, the pauses, and the
    error raised when the rule gives up.

    Reads ``_id_in_cluster`` and, of ``_state``, the peer timeout, the clock and the
    closing flag; the bound is the core's (``_core.retry_bound``).
    """

    def _retry_bound(self) -> float:
        """Seconds a failing protocol call is retried from now (the core's rule: the
        transient-failure window, or the peer timeout or the time left before the leading
        notice's deadline, at least 1 s, when shorter)."""
        return self._core.retry_bound(self._state.clock(), self._state.peer_timeout)

    def _retry(self) -> Retry:
        """A run of failures of one call, starting now."""
        return Retry(self._retry_bound(), time.monotonic())

    def _named(self, error: BaseException, what: str, attempts: int, seconds: float) -> Any:
        """``error``'s type (TF's), its message prefixed with what failed, how often and
        for how long; ``error`` is its cause."""
        errors = _errors.module()
        name = type(error).__name__ if isinstance(error, errors.OpError) else "UnavailableError"
        try:
            named = _errors.make(
                name,
                f"Worker {self._id_in_cluster}: {what} failed {attempts} time(s) over "
                f"{seconds:.1f}s: {getattr(error, 'message', error)}",
            )
        except (AttributeError, TypeError):  # not one of TF's public error classes
            named = _errors.make("UnavailableError", f"{what} failed: {error!r}")
        named.__cause__ = error
        return named

    def _pause_after(
        self, retry: Retry, what: str, error: BaseException
    ) -> Union[float, BaseException]:
        """An attempt of ``what`` failed with ``error``: the seconds to wait before the
        next one (logged: a warning the first time), or, when the rule gives up, the named
        error to raise (:meth:`_named`)."""
        now = time.monotonic()
        verdict = retry.failed(now, self._state.closing.is_set())
        return self._after(verdict, retry.attempts, now, what, error)

    def _after(
        self, verdict: RetryVerdict, attempts: int, now: float, what: str, error: BaseException
    ) -> Union[float, BaseException]:
        """The rule's ``verdict`` on a failed attempt of ``what`` at ``now``: the pause
        before the next attempt (logged), or the named error to raise."""
        if isinstance(verdict, RetryVerdict.GiveUp):
            return self._named(error, what, verdict.attempts, verdict.seconds)
        pause = max(0.0, verdict.at - now)
        (log.warning if attempts == 1 else log.info)(
            "%s failed (%s: %s); retrying in %gs (%.1fs left).",
            what,
            type(error).__name__,
            error,
            pause,
            verdict.left,
        )
        return pause

    def _wait_to_retry(
        self, retry: Retry, what: str, error: BaseException, longest: Optional[float] = None
    ) -> None:
        """A blocking caller's failed attempt: waits the rule's pause (at most
        ``longest`` seconds, and not once closing), or raises the named error from
        ``error`` when the rule gives up."""
        pause = self._pause_after(retry, what, error)
        if isinstance(pause, BaseException):
            raise pause from error
        self._state.closing.wait(pause if longest is None else min(pause, longest))

    def _retrying(self, what: str, call: Callable[[], Any]) -> Any:
        """``call()``, retried by the rule when it fails with a coordination-service
        error (any ``OpError``); the named error once the rule gives up. Anything else is
        a bug and is raised at once."""
        errors = _errors.module()
        retry = self._retry()
        while True:
            try:
                return call()
            except errors.OpError as e:
                self._wait_to_retry(retry, what, e)

    def _attempt(self, write: Write) -> tuple:
        """One attempt of ``write``: ``(finished, next write)``.

        A coordination-service error (any ``OpError``) goes to the core's ``Writes``,
        which makes the write due again when the rule says; once it gives up,
        ``write.on_failed`` gets the named error. Anything else is a bug and goes to
        ``on_failed`` at once.
        """
        writes = self._writes
        try:
            result = write.call()
        except _errors.module().OpError as e:
            now = time.monotonic()
            verdict = writes.failed(write.id, now, self._state.closing.is_set())
            if verdict is None:  # not pending (a stale handle): nothing to retry
                return True, None
            pause = self._after(verdict, writes.attempts(write.id), now, write.what, e)
            if isinstance(pause, BaseException):
                return True, write.on_failed(pause)
            return False, None
        except Exception as e:  # noqa: BLE001 - a bug: handed on at once
            writes.done(write.id)
            return True, write.on_failed(e)
        writes.done(write.id)
        return True, write.on_done(result)

    def _write(
        self,
        what: str,
        call: Callable[[], Any],
        on_done: Callable[[Any], Optional[Write]],
        on_failed: Callable[[BaseException], Optional[Write]],
        kind: WriteKind = WriteKind.Acknowledge,
    ) -> Write:
        """A write queued in the driver's ``Writes``, retried from now and due at once."""
        write = Write(what, call, kind, on_done, on_failed)
        write.id = self._writes.push(kind, self._retry_bound(), time.monotonic())
        self._pending_writes[write.id] = write
        return write
