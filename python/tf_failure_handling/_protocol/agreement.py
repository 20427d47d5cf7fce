"""The leader's side of a round: publish the step every worker saves at, and wait until
every worker has acknowledged it.

Runs on the training thread, in the check before a step (``step_check``): the leader
writes ``RUN_TO_CHECKPOINT`` (or ``LAST_RUN_TO_CHECKPOINT``) = its run count + 1 before
it starts that step, so every worker has the step before it can finish it (the step's
collectives keep the workers within one step of each other), and then its own
acknowledgement, so that its wait never depends on its own reader and driver threads.
The wait is bounded by the peer timeout; a worker that did not answer is named in a
``DeadlineExceededError``. The time the round took goes to the grace planner
(``_core.agreement``).
"""

from __future__ import annotations

import logging
from typing import Optional

from .. import _errors
from .._native import ACK_VALUE, AckStep, ProtocolCore
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

    def publish(
        self, round_key: str, step: int, ack_keys: list, own_ack_key: Optional[str]
    ) -> None:
        log.info(
            "Worker %s publishes the %s round: every worker saves after run %d.",
            self._state.membership.id_in_cluster,
            "final" if round_key == LAST_RUN_TO_CHECKPOINT else "first",
            step,
        )
        if self._state.membership.local:
            self._records.agreement(round_key, step)
            return
        start = self._state.clock()
        published = self._retrier.call(
            f"publishing {round_key}={step}",
            lambda: self._state.coordination.set(round_key, str(step)),
        )
        if not published:
            # Another worker published this round first (a tighter notice of its
            # own), or a peer shut down (STOP_WATCHER): the key's value is the step.
            value = self._retrier.call(
                f"reading {round_key}", lambda: self._state.coordination.get(round_key, 1.0)
            )
            log.warning(
                "%s was already set to %s by another worker; not waiting for acknowledgements.",
                round_key,
                value,
            )
            if value is not None:
                self._core.publish_lost(round_key, value)
                if self._core.leading:  # a follower's reader records the key it reads
                    self._records.peer_agreement(round_key, value)
            return
        if own_ack_key is not None:
            self._retrier.call(
                f"acknowledging {round_key}={step} with {own_ack_key}",
                lambda: self._state.coordination.set(own_ack_key, ACK_VALUE),
            )
        self._records.agreement(round_key, step)
        self._await(round_key, step, ack_keys)
        self._core.agreement(self._state.clock() - start)

    def _await(self, round_key: str, step: int, ack_keys: list) -> None:
        """Waits, bounded by the peer timeout, until every worker acknowledged: the core
        (``ProtocolCore.ack_next``, ``src/acks.rs``) says which key to read and for how
        long. A failed read counts as "not yet" until reads have failed, without a read
        that answered, for longer than the core's retry bound (then the named error)."""
        core, state = self._core, self._state
        core.await_acks(list(ack_keys), state.peer_timeout)
        last_error: Optional[BaseException] = None
        while True:
            action = core.ack_next()
            if isinstance(action, AckStep.Done):
                return
            if isinstance(action, AckStep.Over):
                pending = list(action.missing)
                break
            try:
                got = state.coordination.get(action.key, action.timeout)
            except _errors.module().OpError as e:
                # A failed read is retried like a slow peer, but a failure that lasts
                # longer than the bound is the service's (a peer reported an error).
                verdict = core.ack_failed(state.clock(), state.peer_timeout, state.closing.is_set())
                attempts = (core.ack_failing() or (1, 0.0))[0]
                pause = self._retrier.after(verdict, attempts, f"reading {action.key}", e)
                if isinstance(pause, BaseException):
                    raise pause from e
                state.closing.wait(pause)
                last_error = e
                continue
            core.ack_answered(got is not None)
            if got is not None:
                log.info("Acknowledgement %s received.", action.key)
        failing = core.ack_failing()
        if failing is not None and last_error is not None:
            # The wait ended while reads were failing: the service's error, not a
            # silent peer, is what to report.
            attempts, seconds = failing
            raise self._retrier.named(
                last_error, f"reading {pending[0]}", attempts, seconds
            ) from last_error
        # Name every worker still missing, not only the first one waited on.
        missing = []
        for key in pending:
            try:
                if self._state.coordination.get(key, 0.001) is None:
                    missing.append(key)
            except _errors.module().OpError as e:
                last_error = e
                missing.append(key)
        if not missing:
            return
        cause = "" if last_error is None else f" The last read failed: {last_error}."
        workers = ", ".join(k.rsplit("_", 1)[1] for k in missing)
        raise _errors.make(
            "DeadlineExceededError",
            f"Worker {self._state.membership.id_in_cluster} published {round_key}={step} but "
            f"worker(s) "
            f"{workers} did not acknowledge within {self._state.peer_timeout:g}s "
            f"(missing keys: {', '.join(missing)}).{cause} Set "
            f"TerminationConfig(peer_timeout=...) or {PEER_TIMEOUT_ENV} to wait longer.",
        )
