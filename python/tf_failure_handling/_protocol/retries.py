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

* the driver never sleeps: its writes are queued in the core's protocol (``Protocol``'s
  writes, ``src/protocol.rs`` over ``src/writes.rs``), which says which one to attempt
  now (acknowledgements first), when the next is due and for how long each is retried,
  and until then the driver takes its inputs (:meth:`WriteQueue.attempt`);
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
    WriteKind,
)
from .state import HandlerState

log = logging.getLogger("tf_failure_handling")


class Write:
    """One coordination-service write of the driver, as the driver's log names it.

    What it sets, when and how often it is attempted, and what follows it (the announce
    after a won claim) are the core's (``Protocol``'s writes, ``src/protocol.rs``;
    ``WriteCall``): ``id`` is its handle there. ``subject`` is what it is about, for
    the log: the notice's source (a claim, an announce), or the step key read
    (``key=value``, an acknowledgement); ``key`` and ``value`` are what it sets.
    """

    def __init__(self, what: str, kind: WriteKind, subject: str, key: str, value: str) -> None:
        self.what = what
        self.kind = kind
        self.subject = subject
        self.key = key
        self.value = value
        self.id: int = -1


class Attempt:
    """What one attempt of a write came to: ``finished`` (False: the core retries it
    later); ``result``, the call's (a claim: True when this worker wrote the key
    first); ``error``, the named error once the rule gave up, or a bug's; ``then``, the
    write the core queued after it (the announce of a won claim)."""

    def __init__(
        self,
        finished: bool,
        result: Any = None,
        error: Optional[BaseException] = None,
        then: Optional[Write] = None,
    ) -> None:
        self.finished = finished
        self.result = result
        self.error = error
        self.then = then


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
        return self._core.retry(self._state.clock(), self._state.peer_timeout)

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


class WriteQueue:
    """The driver's writes: the core's protocol (``ProtocolCore``: ``push_write``,
    ``poll_write``, ``write_wait``; ``Protocol``'s writes in ``src/protocol.rs``) says
    which is due, when the next one is and how long each is retried; this holds each
    one's call and makes its attempts."""

    def __init__(self, retrier: Retrier, state: HandlerState, core: ProtocolCore) -> None:
        #: The retry rule the writes are made under (the step-key reader's too).
        self.retrier = self._retrier = retrier
        self._state = state
        self._core = core
        self._pending: dict = {}

    def push(
        self,
        what: str,
        kind: WriteKind,
        subject: str,
        key: str,
        value: str,
        announce: Optional[str] = None,
    ) -> Write:
        """A write of ``key`` = ``value`` queued in the core, due at once, retried for the
        core's bound, its call bounded as the core says for its ``kind``. A claim names
        the message its announce writes once it is won (``announce``)."""
        write = Write(what, kind, subject, key, value)
        write.id = self._core.push_write(
            kind, key, value, self._state.clock(), self._state.peer_timeout, announce=announce
        )
        self._pending[write.id] = write
        return write

    @property
    def busy(self) -> bool:
        """A notice's write (claim or announce) is pending: the next notice waits."""
        return self._core.writes_busy

    def wait(self) -> Optional[float]:
        """Seconds until the next write is due (0: one is), or None with none pending."""
        return self._core.write_wait()

    def due(self) -> Optional[Write]:
        """The write to attempt now (acknowledgements first), if any is due."""
        call = self._core.poll_write()
        return None if call is None else self._pending[call.id]

    def abandon(self, write: Write) -> None:
        """``write``'s attempt raised something the driver hands on: the core forgets it
        (a claim: this worker does not lead)."""
        self._core.write_abandoned(write.id)

    def close(self) -> tuple:
        """The handler closes: ``(last attempts, dropped claim or None)``, as handles."""
        return self._core.close_writes()

    def pop(self, handle: int) -> Write:
        return self._pending.pop(handle)

    def discard(self, write: Write) -> None:
        self._pending.pop(write.id, None)

    def attempt(self, write: Write) -> Attempt:
        """One attempt of ``write``, reported to the core.

        A coordination-service error (any ``OpError``) goes to the core, which makes
        the write due again when the rule says; once it gives up, the attempt carries
        the named error. Anything else is a bug: the write ends with it at once. A claim's
        result goes to the core (``claim_done``), which queues the announce of a won
        one: the attempt's ``then``.
        """
        core = self._core
        call = core.write_call(write.id)
        if call is None:  # not pending (a stale handle): nothing to attempt
            return Attempt(True)
        try:
            result = self._state.coordination.set(call.key, call.value, call.timeout)
        except _errors.module().OpError as e:
            verdict = core.write_failed(write.id, closing=self._state.closing.is_set())
            if verdict is None:  # not pending (a stale handle): nothing to retry
                return Attempt(True)
            pause = self._retrier.after(verdict, core.write_attempts(write.id), write.what, e)
            if isinstance(pause, BaseException):
                return Attempt(True, error=pause)
            return Attempt(False)
        except Exception as e:  # noqa: BLE001 - a bug: handed on at once
            core.write_abandoned(write.id)
            return Attempt(True, error=e)
        if write.kind != WriteKind.Claim:
            core.write_done(write.id)
            return Attempt(True, result)
        then = core.claim_done(write.id, result, self._state.clock(), self._state.peer_timeout)
        return Attempt(True, result, then=None if then is None else self._follow(then, write))

    def _follow(self, handle: int, claim: Write) -> Write:
        """The announce the core queued after ``claim`` was won (handle ``handle``)."""
        call = self._core.write_call(handle)
        write = Write(
            f"publishing {call.key}", WriteKind.Announce, claim.subject, call.key, call.value
        )
        write.id = handle
        self._pending[handle] = write
        return write
