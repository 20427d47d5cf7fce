"""How a failing coordination-service call of the protocol is named when the retry rule
gives up.

The rule is the core's (``src/retry.rs``, the "Failures" table of
``src/step_resolution.rs``): a coordination-service error (any ``OpError``: a transient
failure can look like Unavailable, Internal or Aborted) is retried after a pause that
doubles, until the failures have lasted the bound (the transient-failure window, or the
peer timeout or the time left before the leading notice's deadline when shorter) and
number a minimum of attempts, or one attempt took the whole bound by itself; then the
last error is raised again, of its own type, naming what failed, how often and for how
long (:meth:`Retrier.named`). Anything else is a bug and is not retried.

Each thread's calls are the core's actions (one ``Action`` type,
``src/protocol/answer.rs``), and so are their pauses and the verdict: the driver's
writes (``Action.Write``/``Retrying``/``WriteGaveUp``, ``src/protocol/driver.rs``), the
leader's round (``Action.Set``/``Get``/``Pause``/``GaveUp``, ``src/protocol/agree.rs``)
and the step-key reader (``Action.Read``/``Pause``/``GaveUp``,
``src/protocol/reader.rs``). Python waits, logs and raises.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from .. import _errors
from .._native import ProtocolCore
from .state import HandlerState

log = logging.getLogger("tf_failure_handling")


class Retrier:
    """The error raised when the core's retry rule gives up on a call."""

    def __init__(self, state: HandlerState, core: ProtocolCore) -> None:
        self._state = state
        self._core = core

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

    def retrying(
        self, what: str, error: Optional[BaseException], attempts: int, pause: float, left: float
    ) -> None:
        """Logs a failed call the core will try again after ``pause`` seconds (``left`` of
        its bound remained): a warning the first time, then info."""
        (log.warning if attempts == 1 else log.info)(
            "%s failed (%s: %s); retrying in %gs (%.1fs left).",
            what,
            type(error).__name__,
            error,
            pause,
            left,
        )
