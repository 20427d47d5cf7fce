"""The step watch: a step blocked on a peer that is gone, when TensorFlow does not abort
it (issue 62, "A hung worker").

A worker that stops without dying (SIGSTOP, a frozen host) resets no connection, and
TensorFlow's collectives have no timeout of their own: a survivor's step waits until the
coordination service's heartbeat timeout aborts it, or forever when the service has none.
One thread per handler of a cluster's worker (``tfh-step-watch-<id>``) looks at the step
in progress once a second; the protocol decides (``Event.Watch``,
``src/protocol/watch.rs``): a step still in its ``run()`` past the handler's bound (its
peer timeout) has its peers probed, once a second until it returns, and when a peer does
not answer, the watch aborts this worker's collectives (``Action.Abort``). The step then
raises, and its failure takes the lost-peer path (``reporting``: probe, the survivors'
save, raise). This module probes, aborts and waits.

A library that counts its own steps instead of calling ``run()`` is watched inside the
handler's ``watch_preemption_scope`` (:meth:`StepWatch.scope`, ``Event.Scope``): tf_keras
``fit`` opens one around each epoch's batch loop and adds to ``_run_counter`` after each
batch, so a batch that has not ended past the bound is a blocked step. Outside both,
nothing is watched (TensorFlow's heartbeat timeout is the bound).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Iterator, Optional

from .._cluster import membership as _membership
from .._native import Action, Event
from .context import Context

log = logging.getLogger("tf_failure_handling")


class StepWatch:
    """The step watch's thread (:meth:`start`, stopped with the handler's ``closing``)."""

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx
        self.thread: Optional[threading.Thread] = None

    def start(self) -> StepWatch:
        """Starts the thread, unless the protocol has nothing to watch (local mode, a
        single worker)."""
        if isinstance(self._ctx.core.handle(Event.Watch()), Action.Done):
            return self
        self.thread = threading.Thread(
            target=self._watch,
            name=f"tfh-step-watch-{self._ctx.state.membership.id_in_cluster}",
            daemon=True,
        )
        self.thread.start()
        return self

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        """A block whose steps the watch follows by the run count (``Event.Scope``)."""
        core = self._ctx.core
        core.handle(Event.Scope(True))
        try:
            yield
        finally:
            core.handle(Event.Scope(False))

    def stop(self, join: bool = True) -> None:
        """After the handler's ``closing`` is set: joins the thread for the core's bound."""
        thread, self.thread = self.thread, None
        if join and thread is not None and thread is not threading.current_thread():
            _, bound = self._ctx.core.handle(Event.Shutdown())
            thread.join(bound)

    def _watch(self) -> None:
        ctx = self._ctx
        state, core = ctx.state, ctx.core
        try:
            while not state.closing.is_set():
                action = core.handle(Event.Watch())
                if isinstance(action, Action.Look):
                    state.closing.wait(action.seconds)
                elif isinstance(action, Action.Probe):
                    self._probe()
                else:  # Done: nothing to watch
                    return
        except BaseException as e:  # noqa: BLE001 - handed to the next run()
            ctx.errors.fail_in_background("the step watch", e)

    def _probe(self) -> None:
        ctx = self._ctx
        state = ctx.state
        unreachable = (
            _membership.unreachable_peers(
                state.coordination.service, state.cluster_resolver, state.membership
            )
            or []
        )
        action = ctx.core.handle(Event.WatchProbed([peer.worker_id for peer in unreachable]))
        if not isinstance(action, Action.Abort):
            return
        names = ", ".join(f"{p.label} ({p.address}: {p.why})" for p in unreachable)
        log.warning(
            "Worker %s: the step is blocked and %s did not answer a health probe: aborting "
            "this worker's collectives (%s).",
            state.membership.id_in_cluster,
            names,
            action.message,
        )
        if not state.coordination.abort_collectives(action.message):
            log.error(
                "Worker %s: cannot abort the collectives here.", state.membership.id_in_cluster
            )
