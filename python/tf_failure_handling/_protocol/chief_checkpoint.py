"""A non-chief's look for the chief's checkpoint before it exits (issue 62).

After a preemption's last round, every worker saves and exits with the restart code.
A non-chief writes no checkpoint of its own (its copy goes to memory, or nowhere): the
round is saved only once the chief's checkpoint is in the folder. A chief that dies or
freezes inside its save leaves nothing, and a non-chief that exits at once leaves the
job to restart from the checkpoint before.

So a non-chief that survivors' saves protect (``SurvivorSave.holding``) looks for the
chief's checkpoint of the round (the folder's state file naming the checkpoint its own
save named: the two count their saves together) before it exits, and probes the peers
while it waits. The protocol decides (``Event.Confirm``, ``src/protocol/lost.rs``): seen,
it exits; the chief not answering and its checkpoint not there, the survivors save the
round's step, which every survivor holds as its last whole step (``survivor_save``),
then exit as after the round; the chief answering past the peer timeout (or the
platform's stated end), it exits without, as before. This module looks, probes and
waits.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Optional

from .._cluster import membership as _membership
from .._native import Action, Event
from .checkpoints import Checkpoints
from .context import Context

log = logging.getLogger("tf_failure_handling")


class ChiefCheckpoint:
    """Looks for the chief's checkpoint of the round this non-chief saved."""

    def __init__(self, ctx: Context, checkpoints: Checkpoints) -> None:
        self._ctx = ctx
        self._checkpoints = checkpoints

    def _own_name(self) -> Optional[str]:
        """The checkpoint's name this worker's save gave it (``ckpt-<n>``), or None."""
        latest = getattr(self._checkpoints.write, "latest_checkpoint", None)
        return os.path.basename(latest) if latest else None

    @staticmethod
    def _named(directory: str, name: str) -> bool:
        """Whether the state file in ``directory`` names checkpoint ``name``: the chief's
        manager writes it after the checkpoint's files."""
        from tensorflow.python.checkpoint import checkpoint_management

        try:
            state = checkpoint_management.get_checkpoint_state(directory)
        except Exception as e:  # noqa: BLE001 - unreadable now: not seen, looked at again
            log.info("Could not read the checkpoint state in %s: %s", directory, e)
            return False
        return state is not None and os.path.basename(state.model_checkpoint_path) == name

    def _probe(self) -> list:
        state = self._ctx.state
        return (
            _membership.unreachable_peers(
                state.coordination.service, state.cluster_resolver, state.membership
            )
            or []
        )

    def confirm(self) -> None:
        """Before the exit after the last round: until the chief's checkpoint is seen,
        or the survivors saved without it, or the wait's bound passed (the core's)."""
        if self._checkpoints.shared_by > 1:
            return  # a save in shares: the chief reports its merge (checkpoint_shares)
        ctx = self._ctx
        survivors: Any = ctx.errors.survivors
        name = self._own_name()
        directory = survivors.directory() if survivors is not None else None
        if not (survivors is not None and survivors.holding and name and directory):
            return
        me = ctx.state.membership.id_in_cluster
        event = Event.Confirm(self._named(directory, name), None)
        unreachable: list = []
        while True:
            action = ctx.core.handle(event)
            if isinstance(action, Action.Proceed):
                return
            if isinstance(action, Action.Look):
                if ctx.state.closing.wait(action.seconds):
                    return
                event = Event.Confirm(self._named(directory, name), None)
            elif isinstance(action, Action.Probe):
                unreachable = self._probe()
                ids = [peer.worker_id for peer in unreachable]
                # The look after the probe: a chief that named its checkpoint and then
                # ended between a look and the probe is seen.
                event = Event.Confirm(self._named(directory, name), ids)
            elif isinstance(action, Action.PeerLost):
                names = {p.worker_id: f"{p.label} ({p.address})" for p in unreachable}
                log.warning(
                    "Worker %s: the chief did not answer and its checkpoint %s of the round "
                    "is not in %s (%s): the survivors save the round's step.",
                    me,
                    name,
                    directory,
                    action.detection,
                )
                survivors.after_loss(action, names, then_exit=False)
                return
            elif isinstance(action, Action.GaveUp):
                log.error(
                    "Worker %s: %s: the chief still answers, but %s is not named in %s after "
                    "%.1fs; exiting without it.",
                    me,
                    action.what,
                    name,
                    directory,
                    action.seconds,
                )
                return
            else:
                raise RuntimeError(f"unexpected answer to Event.Confirm: {action!r}")
