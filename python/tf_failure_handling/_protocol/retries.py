"""How a failing coordination-service call of the protocol is retried, and named when it
gives up.

Every call the protocol makes to the coordination service follows one rule when it fails
(the "Failures" table of ``src/step_resolution.rs``): a coordination-service error (any
``OpError``: a transient failure can look like Unavailable, Internal or Aborted) is
retried after a pause that grows from :data:`RETRY_FIRST_PAUSE` to
:data:`RETRY_MAX_PAUSE`, within a bound (:meth:`Retries._retry_bound`); after it the last
error is raised again, of its own type, naming what failed, how often and for how long
(:meth:`Retries._named`). Anything else is a bug and is not retried.

Two threads retry, each its own way:

* the driver never sleeps: each write is a :class:`Write` whose ``due`` is when its next
  attempt may start, and until then the driver takes its inputs (:func:`first_due`,
  :func:`time_to_next`, :meth:`Retries._attempt`);
* the training thread blocks in :meth:`Retries._retrying` (publishing a step key).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any, Callable, Optional

from .. import _errors

log = logging.getLogger("tf_failure_handling")

#: A failed coordination-service call of the protocol is retried after this pause,
#: doubled after each failure up to :data:`RETRY_MAX_PAUSE`, until the protocol's bound
#: has passed: :data:`TRANSIENT_FAILURE_WINDOW`, or less when the peer timeout or the
#: time left before the notice's deadline is shorter.
RETRY_FIRST_PAUSE = 0.05
RETRY_MAX_PAUSE = 1.0
#: Seconds of failing calls after which a failure is not transient. A cluster whose
#: service is in an error state (a peer reported an error) fails every call for good:
#: that error must reach the worker promptly, with its own type, not after the peer
#: timeout (300 s by default).
TRANSIENT_FAILURE_WINDOW = 10.0


class Write:
    """One coordination-service write of the driver, retried within ``bound`` seconds.

    The driver never sleeps between attempts: ``due`` is when the next attempt may
    start, and until then the driver takes its inputs (``ProtocolDriver._drive``).
    ``on_done(result)`` and ``on_failed(error)`` return the write that follows (the
    announce after a won claim), or None.
    """

    def __init__(
        self,
        what: str,
        call: Callable[[], Any],
        bound: float,
        on_done: Callable[[Any], Optional[Write]],
        on_failed: Callable[[BaseException], Optional[Write]],
        notice: bool,
    ) -> None:
        self.what = what
        self.call = call
        self.bound = bound
        self.on_done = on_done
        self.on_failed = on_failed
        #: Part of handling a notice (claim, announce), not an acknowledgement.
        self.notice = notice
        #: Gets one last attempt at ``close()`` instead of being dropped (the announce:
        #: the claim was won, and peers' watchers learn of the notice only from it).
        self.finish_on_close = False
        self.start = time.monotonic()
        self.due = self.start
        self.pause = RETRY_FIRST_PAUSE
        self.attempts = 0


def first_due(acks: deque, current: Optional[Write]) -> Optional[Write]:
    """The write to attempt now: the oldest due acknowledgement, else the notice's."""
    now = time.monotonic()
    for write in acks:
        if write.due <= now:
            return write
    if current is not None and current.due <= now:
        return current
    return None


def time_to_next(acks: deque, current: Optional[Write]) -> Optional[float]:
    """Seconds until the next write is due (0: one is due now), None with none pending."""
    dues = [w.due for w in acks]
    if current is not None:
        dues.append(current.due)
    if not dues:
        return None
    return max(0.0, min(dues) - time.monotonic())


class Retries:
    """The retry rule of the protocol's calls: its bound, its attempts, and the error it
    raises when it gives up.

    Reads ``_peer_timeout``, ``_clock``, ``_closing`` and ``_id_in_cluster`` of the
    handler, and the core's state (``deadline``).
    """

    def _retry_bound(self) -> float:
        """Seconds a failing protocol call is retried: :data:`TRANSIENT_FAILURE_WINDOW`, or
        the peer timeout or the time left before the leading notice's deadline (at least
        1 s) when shorter (a machine that is gone cannot be waited for)."""
        bound = min(self._peer_timeout, TRANSIENT_FAILURE_WINDOW)
        deadline = self._core_state().get("deadline")
        if deadline is not None:
            bound = min(bound, max(1.0, deadline - self._clock()))
        return bound

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

    def _retrying(self, what: str, call: Callable[[], Any]) -> Any:
        """``call()``, retrying a failed coordination-service call within the bound.

        Coordination-service errors (any ``OpError``: a transient failure can look like
        Unavailable, Internal or Aborted) are retried after growing pauses; once the
        bound has passed, the last error is raised again, of its own type, naming what
        failed (:meth:`_named`). Anything else is a bug and is raised at once.
        """
        errors = _errors.module()
        bound = self._retry_bound()
        start = time.monotonic()
        pause = RETRY_FIRST_PAUSE
        attempts = 0
        while True:
            attempts += 1
            try:
                return call()
            except errors.OpError as e:
                left = start + bound - time.monotonic()
                if left <= 0 or self._closing.is_set():
                    raise self._named(e, what, attempts, time.monotonic() - start) from e
                (log.warning if attempts == 1 else log.info)(
                    "%s failed (%s: %s); retrying in %gs (%.1fs left).",
                    what,
                    type(e).__name__,
                    e,
                    min(pause, left),
                    left,
                )
                self._closing.wait(min(pause, left))
                pause = min(pause * 2, RETRY_MAX_PAUSE)

    def _attempt(self, write: Write) -> tuple:
        """One attempt of ``write``: ``(finished, next write)``.

        A coordination-service error (any ``OpError``) schedules the next attempt after
        a growing pause while the bound lasts; after it, ``write.on_failed`` gets the
        last error, of its own type, naming what failed (:meth:`_named`). Anything else
        is a bug and goes to ``on_failed`` at once.
        """
        write.attempts += 1
        try:
            result = write.call()
        except _errors.module().OpError as e:
            now = time.monotonic()
            left = write.start + write.bound - now
            if left <= 0 or self._closing.is_set():
                named = self._named(e, write.what, write.attempts, now - write.start)
                return True, write.on_failed(named)
            (log.warning if write.attempts == 1 else log.info)(
                "%s failed (%s: %s); retrying in %gs (%.1fs left).",
                write.what,
                type(e).__name__,
                e,
                min(write.pause, left),
                left,
            )
            write.due = now + min(write.pause, left)
            write.pause = min(write.pause * 2, RETRY_MAX_PAUSE)
            return False, None
        except Exception as e:  # noqa: BLE001 - a bug: handed on at once
            return True, write.on_failed(e)
        return True, write.on_done(result)

    def _write(
        self,
        what: str,
        call: Callable[[], Any],
        on_done: Callable[[Any], Optional[Write]],
        on_failed: Callable[[BaseException], Optional[Write]],
        notice: bool = False,
    ) -> Write:
        """A write for the driver to attempt, bounded by the retry bound as it is now."""
        return Write(what, call, self._retry_bound(), on_done, on_failed, notice)
