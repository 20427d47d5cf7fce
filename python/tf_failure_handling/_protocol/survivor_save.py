"""The survivors' save after a worker is lost without notice (issue 62).

Under MultiWorkerMirroredStrategy every worker holds the whole model, so when one dies
the others still hold everything. When the protocol confirms a lost peer
(``Action.PeerLost``, ``reporting``), the survivor it names as the writer (the lowest
worker id that answered the probe: the chief when it lives) saves the **last whole
step**: the variables as the last ``run()`` that returned left them
(``_integrations/tf_last_step.LastStep``, held after every step), with that run count as
``checkpointed_runs``. Then every survivor raises the step's error, as TensorFlow does,
so ``except`` blocks and exit codes are unchanged: the difference is a newer checkpoint
to restart from.

The save:

* goes to the handler's checkpoint folder through a ``CheckpointManager`` of its own,
  named after the writer (``ckpt-survivor<worker>-<run count>``): two writers that both
  think they survived (a network cut) never write the same files, and the state file
  names one whole checkpoint, the last written;
* reads a ``SyncOnRead`` variable's own value on this worker (a warning names them):
  TensorFlow would all-reduce it across the workers, one of which is gone;
* is refused, with an error line, when nothing whole is held (no step returned since
  the start, or holding failed) or when the checkpoint has variables the hold did not
  see;
* is recorded: a ``notice`` line of source ``lost_peer`` naming the lost workers and how
  the loss showed, then ``save_start`` and ``save_end``.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Optional

from .._integrations import tf_last_step
from .._platforms import common
from .checkpoints import Checkpoints, _is_tf_checkpoint, _preemption_save_context
from .context import Context

log = logging.getLogger("tf_failure_handling")

#: ``save`` (the default): the survivors of a worker lost without notice save the last
#: whole step, then raise; ``raise``: they only raise, as TensorFlow's do (nothing is
#: held after each step: no copy of the model, no time).
LOST_WORKER_ENV = "TF_FAILURE_HANDLING_LOST_WORKER"
SAVE, RAISE = "save", "raise"


def lost_worker_saves() -> bool:
    """Whether the survivors save (:data:`LOST_WORKER_ENV`).

    Raises:
      ValueError: a value other than ``save`` or ``raise``, naming the variable.
    """
    raw = common.env(LOST_WORKER_ENV)
    if raw is None:
        return True
    if raw.lower() not in (SAVE, RAISE):
        raise common.bad(
            LOST_WORKER_ENV, os.environ[LOST_WORKER_ENV], "save or raise (or unset: save)"
        )
    return raw.lower() == SAVE


class SurvivorSave:
    """Holds the last whole step after each ``run()``; saves it when a peer is lost."""

    def __init__(
        self, ctx: Context, checkpoints: Checkpoints, checkpoint_dir: Any, saves: bool
    ) -> None:
        """``saves``: :func:`lost_worker_saves`, read once by the handler (which configures
        the core with it)."""
        self._ctx = ctx
        self._checkpoints = checkpoints
        self._checkpoint = getattr(checkpoints.read, "_checkpoint", None)
        self._directory: Optional[str] = getattr(checkpoints.read, "directory", None) or (
            os.fspath(checkpoint_dir) if checkpoint_dir is not None else None
        )
        #: Whether this handler's survivors save: a ``tf.train.Checkpoint`` the handler
        #: saves itself (with a ``save_fn`` the user saves elsewhere, their own way).
        self.enabled = checkpoints.save_fn is None and _is_tf_checkpoint(self._checkpoint)
        #: ``TF_FAILURE_HANDLING_LOST_WORKER`` (the core holds nothing when it is off).
        self.saves = saves
        self.last_step = tf_last_step.LastStep(self._checkpoint)

    def hold(self, run_count: int) -> None:
        """After ``run()`` number ``run_count`` returned: hold the variables."""
        if self.enabled:
            self.last_step.hold(run_count)

    def after_loss(self, action: Any, names: dict) -> None:
        """``Action.PeerLost``: the writer saves the last whole step; never raises (the
        step's error is what ``run()`` raises). ``names``: a label for each worker id."""
        me = self._ctx.state.membership.id_in_cluster
        lost = [names.get(worker, f"worker {worker}") for worker in action.lost]
        if not self.saves:
            log.warning("Worker %s: the survivors do not save (%s=raise).", me, LOST_WORKER_ENV)
            return
        if not self.enabled:
            log.warning(
                "Worker %s: the survivors do not save (a save_fn, or a checkpoint that is "
                "not a tf.train.Checkpoint).",
                me,
            )
            return
        if not action.writes:
            log.warning(
                "Worker %s: the lowest worker that answered saves the last whole step; not "
                "this one.",
                me,
            )
            return
        try:
            self._save(lost, action.detection)
        except Exception as e:  # noqa: BLE001 - the step's error is raised all the same
            log.error("Worker %s: the survivors' save failed: %s: %s", me, type(e).__name__, e)
            self._ctx.records.save_failed(e)

    def _save(self, lost: list, detection: str) -> None:
        import tensorflow as tf

        me = self._ctx.state.membership.id_in_cluster
        held = self.last_step
        runs = held.run_count
        if self._checkpoint is None or self._directory is None or runs is None:
            why = held.broken or "no step returned since the handler started"
            log.error("Worker %s: no last whole step to save (%s): nothing saved.", me, why)
            return
        missing = held.restore()
        if missing:
            log.error(
                "Worker %s: the checkpoint has variables the last whole step was not held for "
                "(%s): nothing saved.",
                me,
                ", ".join(missing[:10]),
            )
            return
        records = self._ctx.records
        records.lost_peer(lost, detection, runs)
        local = tf_last_step.sync_on_read(self._checkpoint)
        if local:
            log.warning(
                "Worker %s: saving this worker's own value of %s (SyncOnRead: TensorFlow "
                "combines every worker's, and one is gone).",
                me,
                ", ".join(local),
            )
        records.save_start("lost_peer", runs)
        manager = tf.train.CheckpointManager(
            self._checkpoint,
            directory=self._directory,
            max_to_keep=getattr(self._checkpoints.read, "_max_to_keep", None) or 1,
            checkpoint_name=f"ckpt-survivor{self._ctx.state.membership.worker_id}",
        )
        self._checkpoints.counter.assign(runs)
        with _preemption_save_context(), tf_last_step.local_reads():
            path = manager.save(checkpoint_number=runs)
        records.save_end(manager)
        log.warning(
            "Worker %s: %s lost without notice (%s): saved the last whole step, run %d, at %s.",
            me,
            ", ".join(lost),
            detection,
            runs,
            path,
        )
