"""The leader's side of a round: publish the step every worker saves at, and wait until
every worker has acknowledged it.

Runs on the training thread, in the check before a step (``step_check``): the leader
writes ``RUN_TO_CHECKPOINT`` (or ``LAST_RUN_TO_CHECKPOINT``) = its run count + 1 before
it starts that step, so every worker has the step before it can finish it (the step's
collectives keep the workers within one step of each other), and then its own
acknowledgement, so that its wait never depends on its own reader and driver threads.
The wait is bounded by the peer timeout; a worker that did not answer is named in a
``DeadlineExceededError``.

The round is the core's (``src/protocol/agree.rs``): after the ``before_step`` that
published it, the core says each call to make (``Action.Set``/``Get``, with its
timeout), each pause of the retry rule, when the round is recorded, agreed or lost to
another worker's publish, and what it fails with; this module makes the calls, reports
their outcomes (``Event.Set``/``Got``/``CallFailed``), waits and logs, and raises.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from .. import _errors
from .._native import Action, Event, ProtocolCore
from .keys import LAST_RUN_TO_CHECKPOINT, PEER_TIMEOUT_ENV
from .records_hooks import StageRecords
from .retries import Retrier
from .state import HandlerState

log = logging.getLogger("tf_failure_handling")


class Agreement:
    """Publishes the agreed step and awaits the acknowledgements (the leader)."""

    def __init__(
        self, state: HandlerState, core: ProtocolCore, retrier: Retrier, records: StageRecords
    ) -> None:
        self._state = state
        self._core = core
        self._retrier = retrier
        self._records = records

    def publish(self, round_key: str, step: int) -> None:
        """The round the last ``before_step`` published, performed as the core says."""
        log.info(
            "Worker %s publishes the %s round: every worker saves after run %d.",
            self._state.membership.id_in_cluster,
            "final" if round_key == LAST_RUN_TO_CHECKPOINT else "first",
            step,
        )
        state, core = self._state, self._core
        #: The last failed call's error: the core's verdict names it.
        last_error: Optional[BaseException] = None
        event: Any = Event.Resume()
        while True:
            action = core.handle(event)
            if isinstance(action, Action.Agreed):
                return
            if isinstance(action, (Action.Set, Action.Get)):
                event, error = self._call(action)
                last_error = error or last_error
            elif isinstance(action, Action.Pause):
                self._retrier.retrying(
                    action.what, last_error, action.attempts, action.seconds, action.left
                )
                state.closing.wait(action.seconds)
                event = Event.Resume()
            elif isinstance(action, Action.Published):
                self._records.agreement(action.round, action.step)
                last_error = None  # the wait for the acknowledgements starts
                event = Event.Resume()
            elif isinstance(action, Action.Lost):
                log.warning(
                    "%s was already set to %s by another worker; not waiting for acknowledgements.",
                    action.round,
                    action.value,
                )
                # A follower's reader records the key it reads.
                if action.value is not None and core.state()["leading"]:
                    self._records.peer_agreement(action.round, action.value)
                return
            elif isinstance(action, Action.GaveUp):
                raise self._retrier.named(
                    last_error, action.what, action.attempts, action.seconds
                ) from last_error
            else:
                raise self._missing(action, last_error)

    def _call(self, action: Any) -> tuple:
        """One call the core asked for: the event that reports it, and its error."""
        coordination = self._state.coordination
        try:
            if isinstance(action, Action.Set):
                written = coordination.set(action.key, action.value, action.timeout)
                return Event.Set(bool(written)), None
            got = coordination.get(action.key, action.timeout)
        except _errors.module().OpError as e:
            return Event.CallFailed(self._state.closing.is_set()), e
        if got is not None and action.ack:
            log.info("Acknowledgement %s received.", action.key)
        return Event.Got(got), None

    def _missing(self, action: Any, last_error: Optional[BaseException]) -> BaseException:
        """The peer timeout passed with acknowledgements missing: every worker still
        missing named (``Action.Missing``)."""
        cause = "" if last_error is None else f" The last read failed: {last_error}."
        workers = ", ".join(k.rsplit("_", 1)[1] for k in action.missing)
        return _errors.make(
            "DeadlineExceededError",
            f"Worker {self._state.membership.id_in_cluster} published "
            f"{action.round}={action.step} but worker(s) "
            f"{workers} did not acknowledge within {self._core.state()['peer_timeout']:g}s "
            f"(missing keys: {', '.join(action.missing)}).{cause} Set "
            f"TerminationConfig(peer_timeout=...) or {PEER_TIMEOUT_ENV} to wait longer.",
        )
