"""Errors reach whoever must know: a step's error the cluster, a thread's error ``run()``.

* A step's ``OpError`` (raised in ``run()``, or inside ``watch_preemption_scope``) is
  reported to every worker through the coordination service, as TensorFlow does, so
  that no peer waits for a worker that failed. The protocol says first whether the
  error can come from a peer that is gone (``Event.StepFailed``; ``src/protocol/lost.rs``):
  then the peers are probed, those that do not answer are named in the error raised in
  its place (same type), and the probe's answer (``Event.Probed``) says whether a peer
  was lost without notice (``Action.PeerLost``: logged, naming the lost workers and how
  the loss showed). The report is skipped when the service's leader is among them: TF's
  report would block, holding the GIL, until the leader answers.
* An error a background thread of the handler cannot handle (the driver's, the
  reader's) is kept and raised by the next ``run()``, as TF's ``UnavailableError`` naming
  what failed: no thread of the handler ends without the handler learning of it.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from .. import _errors
from .._cluster import membership as _membership
from .._native import Action, Event, ProtocolCore
from .state import HandlerState

log = logging.getLogger("tf_failure_handling")


class ErrorReports:
    """Reports a step's error to the cluster; keeps a background thread's for ``run()``
    (``pending``, which the check before a step raises)."""

    def __init__(self, state: HandlerState, core: ProtocolCore) -> None:
        self._state = state
        self._core = core
        #: An error a background thread met; raised by the next run().
        self.pending: Optional[BaseException] = None
        #: What saves the last whole step when a peer is lost (``survivor_save``).
        self.survivors: Any = None

    def raise_pending(self) -> None:
        """Raises (once) the error a background thread met, if any."""
        error = self.pending
        if error is not None:
            self.pending = None
            self._core.handle(Event.Pending(False))
            raise error

    def step_failed(self, error: BaseException) -> Any:
        """Tells the protocol a step raised ``error`` (``Event.StepFailed``, with TF's
        canonical code when it is an ``OpError``): its answer, ``Action.Probe`` or
        ``Action.Raise``."""
        code = getattr(error, "error_code", None)
        if not isinstance(error, _errors.module().OpError) or not isinstance(code, int):
            code = None
        message = getattr(error, "message", None)
        return self._core.handle(
            Event.StepFailed(code, message if isinstance(message, str) else str(error))
        )

    def reported(self, error: BaseException, action: Any = None) -> Optional[BaseException]:
        """Reports ``error`` to the cluster (outside local mode); the error to raise in
        its place, or None to raise ``error`` itself. ``action``: the protocol's answer to
        the step's failure (:meth:`step_failed`), when it was asked already."""
        if self._state.membership.local:
            return None
        try:
            return self.propagate(error, action)
        except Exception as e:  # noqa: BLE001 - the step's own error wins
            log.error("Reporting %r to the cluster failed: %r", error, e)
            return None

    def _probe(self, error: BaseException) -> tuple:
        """The protocol asked for a probe of the peers: ``(replacement, unreachable)``,
        the error naming the peers that did not answer (None: no better message) and
        those peers (None: no probe made)."""
        replacement, unreachable = None, None
        try:
            unreachable = _membership.unreachable_peers(
                self._state.coordination.service,
                self._state.cluster_resolver,
                self._state.membership,
            )
            replacement = _membership.with_unreachable_named(
                error, unreachable, self._state.membership
            )
        except Exception as e:  # noqa: BLE001 - only a better message is at stake
            log.info("Could not probe the peers after %r: %s", error, e)
        after = self._core.handle(Event.Probed([peer.worker_id for peer in unreachable or ()]))
        if isinstance(after, Action.PeerLost):
            names = {p.worker_id: f"{p.label} ({p.address})" for p in unreachable or ()}
            lost = ", ".join(names.get(worker, f"worker {worker}") for worker in after.lost)
            log.warning(
                "Worker %s: lost without notice: %s (%s, and no answer to a health probe).",
                self._state.membership.id_in_cluster,
                lost,
                after.detection,
            )
            if self.survivors is not None:
                self.survivors.after_loss(after, names)
        return replacement, unreachable

    def propagate(self, error: BaseException, action: Any = None) -> Optional[BaseException]:
        """Reports a step's ``OpError`` to every worker; never raises.

        Returns the error ``run()`` raises instead, or None for ``error`` itself: when
        the protocol asks for a probe of the peers (the error can come from one that is
        gone: an aborted collective, a deadline, an unavailable task), those that do not
        answer are named in its message (same type; TF's message often names nobody).
        """
        if self._state.membership.local or not isinstance(error, _errors.module().OpError):
            return None
        if action is None:
            action = self.step_failed(error)
        replacement, unreachable = None, None
        if isinstance(action, Action.Probe):
            replacement, unreachable = self._probe(error)
        leader = _membership.coordination_leader(self._state.cluster_resolver)
        if unreachable and any(peer.task == leader for peer in unreachable):
            # TF's report_error_to_cluster blocks, holding the GIL, until the
            # service's leader answers: with the leader cut off, never.
            log.warning(
                "Not reporting %r to the cluster: the coordination service's leader (%s) "
                "does not answer.",
                error,
                leader,
            )
            return replacement
        log.info("Propagating error to cluster: %r: %s", error, error)
        try:
            self._state.coordination.report_error(
                error.error_code, error.message, self._core.handle(Event.ErrorReport())
            )
        except Exception as e:  # noqa: BLE001 - the step's own error matters more
            log.warning("Could not report the error to the cluster: %r: %s", e, e)
        return replacement

    def fail_in_background(self, what: str, error: BaseException) -> None:
        """A background thread met an error it cannot handle: the next ``run()`` raises it.

        The error is TF's ``UnavailableError`` naming what failed and why (the
        original is its ``__cause__``), so no thread ends without the handler
        learning of it.
        """
        log.error("PreemptionCheckpointHandler: %s failed: %r", what, error)
        if self._state.closing.is_set():
            return
        if isinstance(error, _errors.module().OpError):
            raised = error
        else:
            raised = _errors.make(
                "UnavailableError",
                f"worker {self._state.membership.id_in_cluster}: {what} failed: {error!r}",
            )
            raised.__cause__ = error
        if self.pending is None:
            self.pending = raised
        self._core.handle(Event.Pending(True))
