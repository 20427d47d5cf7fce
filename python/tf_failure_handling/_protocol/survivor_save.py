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

* goes to the handler's checkpoint folder under a name of the writer's own
  (``ckpt-survivor<worker>-<run count>``), so two writers that both think they survived
  (a network cut) never write the same files; the writers then agree through the
  folder (``survivor_folder``; the protocol decides, ``src/protocol/lost.rs``): a
  writer that a newer job, or a claim naming it lost, says was paused does not write,
  and the state file ends naming one whole checkpoint, of the most runs;
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
from typing import Any, Callable, Optional

from .._integrations import tf_last_step
from .._native import Action, Event
from .._platforms import common
from .._record_paths import _join
from .._termination_config import LOST_WORKER_MODES
from . import survivor_folder
from .checkpoints import Checkpoints, _is_tf_checkpoint, _preemption_save_context
from .context import Context
from .survivor_folder import SurvivorFolder

log = logging.getLogger("tf_failure_handling")

#: What the survivors of a worker lost without notice do, unless
#: ``TerminationConfig(lost_worker=...)`` says: ``save`` (the default) the last whole
#: step, then raise; ``exit``: save, then exit with the restart code (``exit_fn``);
#: ``raise``: only raise, as TensorFlow's do (nothing is held after each step: no copy
#: of the model, no time).
LOST_WORKER_ENV = "TF_FAILURE_HANDLING_LOST_WORKER"
SAVE, EXIT, RAISE = LOST_WORKER_MODES


def lost_worker_mode(option: Optional[str]) -> str:
    """``option`` (``TerminationConfig.lost_worker``, checked there) if given, else
    :data:`LOST_WORKER_ENV`, else ``save``.

    Raises:
      ValueError: a value of the variable other than the modes, naming the variable.
    """
    if option is not None:
        return option
    raw = common.env(LOST_WORKER_ENV)
    if raw is None:
        return SAVE
    if raw.lower() not in LOST_WORKER_MODES:
        raise common.bad(
            LOST_WORKER_ENV,
            os.environ[LOST_WORKER_ENV],
            f"{', '.join(LOST_WORKER_MODES)} (or unset: {SAVE})",
        )
    return raw.lower()


class SurvivorSave:
    """Holds the last whole step after each ``run()``; saves it when a peer is lost."""

    def __init__(
        self,
        ctx: Context,
        checkpoints: Checkpoints,
        checkpoint_dir: Any,
        mode: str,
        exit: Callable[[], None],
    ) -> None:
        """``mode``: :func:`lost_worker_mode`, read once by the handler (which configures
        the core with it); ``exit``: the handler's exit with the restart code, for
        ``exit``."""
        self._ctx = ctx
        self._checkpoints = checkpoints
        self._checkpoint = getattr(checkpoints.read, "_checkpoint", None)
        #: The folder when the read manager names none.
        self._given_dir = os.fspath(checkpoint_dir) if checkpoint_dir is not None else None
        #: Whether this handler's survivors save: a ``tf.train.Checkpoint`` the handler
        #: saves itself (with a ``save_fn`` the user saves elsewhere, their own way).
        self.enabled = checkpoints.save_fn is None and _is_tf_checkpoint(self._checkpoint)
        #: ``save``, ``exit`` or ``raise`` (the core holds nothing for ``raise``).
        self.mode = mode
        self._exit = exit
        self.last_step = tf_last_step.LastStep(self._checkpoint)
        #: Where the writers agree (:meth:`_folder`; None: no folder to save to).
        self.folder: Optional[SurvivorFolder] = None
        #: Whether this worker reads the job's mark at its first held step.
        self._reads_mark = False
        #: Whether steps are held (the core's answer, as ``run()`` reads it natively):
        #: for libraries that count their own steps (:meth:`hold_counted`).
        self.holding = False
        folder = self._folder()
        if self.enabled and folder is not None:
            start = ctx.core.handle(Event.Job())
            self.holding = isinstance(start, (Action.MarkJob, Action.ReadJob))
            if isinstance(start, Action.MarkJob):
                try:
                    folder.mark()
                except Exception as e:  # noqa: BLE001 - only the fence is weaker
                    log.warning("Could not mark %s for this job: %s", folder.directory, e)
            self._reads_mark = isinstance(start, Action.ReadJob)

    def _folder(self) -> Optional[SurvivorFolder]:
        """The folder of the checkpoints the handler reads, where the survivors save:
        the read manager's (tf_keras sets its ``_read_checkpoint_manager`` after the
        handler is built; a non-chief's write manager is a temporary folder)."""
        directory = getattr(self._checkpoints.read, "directory", None) or self._given_dir
        if directory is None:
            return None
        if self.folder is None or self.folder.directory != directory:
            self.folder = SurvivorFolder(directory)
        return self.folder

    def directory(self) -> Optional[str]:
        """The folder the survivors save to (None: none)."""
        folder = self._folder()
        return None if folder is None else folder.directory

    def hold(self, run_count: int) -> None:
        """After ``run()`` number ``run_count`` returned: hold the variables."""
        if self.enabled:
            if self._reads_mark:
                self._read_mark()
            self.last_step.hold(run_count)

    def _read_mark(self) -> None:
        """The first held step of a worker that is not the chief: the job's token."""
        folder = self._folder()
        if folder is None:
            return
        self._reads_mark = False
        try:
            folder.read_mark()
        except Exception as e:  # noqa: BLE001 - only the fence is weaker
            log.warning("Could not read this job's mark in %s: %s", folder.directory, e)

    def hold_counted(self, run_count: int) -> None:
        """A library that counts its own steps (tf_keras' ``_run_counter += 1``) ended
        step ``run_count``: held as after a ``run()``, when steps are held."""
        if self.holding:
            self.hold(run_count)

    def after_loss(self, action: Any, names: dict, then_exit: bool = True) -> None:
        """``Action.PeerLost``: recorded; the writer saves the last whole step; with
        ``exit``, every survivor then exits with the restart code. Raises only what
        ``exit_fn`` raises (the default's ``SystemExit``): else the step's error is what
        ``run()`` raises. ``names``: a label for each worker id. ``then_exit``: False
        when the caller exits anyway (after a preemption's round: ``chief_checkpoint``)."""
        me = self._ctx.state.membership.id_in_cluster
        lost = [names.get(worker, f"worker {worker}") for worker in action.lost]
        self._ctx.records.lost_peer(lost, action.detection, self.last_step.run_count)
        if self.mode == RAISE:
            log.warning("Worker %s: the survivors do not save (lost_worker: raise).", me)
            return
        self._save_if_writer(action, lost, me)
        if self.mode == EXIT and then_exit:
            log.warning("Worker %s: exiting with the restart code (lost_worker: exit).", me)
            self._exit()

    def _save_if_writer(self, action: Any, lost: list, me: Any) -> None:
        if not self.enabled:
            log.warning(
                "Worker %s: the survivors do not save (a save_fn, or a checkpoint that is "
                "not a tf.train.Checkpoint).",
                me,
            )
            return
        if not action.writes:
            log.warning(
                "Worker %s: the lowest worker that answered this worker's probe saves the last "
                "whole step; not this one.",
                me,
            )
            return
        try:
            self._save(lost, list(action.lost), action.detection)
        except Exception as e:  # noqa: BLE001 - the step's error is raised all the same
            log.error("Worker %s: the survivors' save failed: %s: %s", me, type(e).__name__, e)
            self._ctx.records.save_failed(e)

    def _save(self, lost: list, lost_ids: list, detection: str) -> None:
        me = self._ctx.state.membership.id_in_cluster
        held = self.last_step
        runs = held.run_count
        folder = self._folder()
        if folder is None:
            log.error("Worker %s: no checkpoint folder to save the last whole step to.", me)
            return
        if runs is None:
            why = held.broken or "no step returned since the handler started"
            log.error("Worker %s: no last whole step to save (%s): nothing saved.", me, why)
            return
        if folder.token is None:
            log.warning(
                "Worker %s: this job's mark in %s was not read: a worker paused across a "
                "restart would not be told apart.",
                me,
                folder.directory,
            )
        writer = self._ctx.state.membership.worker_id
        agreed = survivor_folder.agree(
            self._ctx.core,
            folder,
            writer,
            runs,
            lost_ids,
            lambda: self._write(folder.directory, lost, detection, runs, writer),
        )
        if agreed is None:
            return
        records = self._ctx.records
        if isinstance(agreed.end, Action.Refuse):
            log.error("Worker %s: the survivors' save is not written: %s.", me, agreed.end.why)
            if agreed.path is not None:
                records.save_failed(RuntimeError(agreed.end.why))
        elif agreed.end.discard:
            named = agreed.named
            records.save_end(named["checkpoint"], written_by=named["writer"], discarded=agreed.path)
            log.warning(
                "Worker %s: worker %d saved a later step (run %d, at %s): this worker's save "
                "of run %d is discarded.",
                me,
                named["writer"],
                named["runs"],
                named["checkpoint"],
                runs,
            )
        else:
            records.save_end(agreed.path)
            log.warning(
                "Worker %s: %s lost without notice (%s): saved the last whole step, run %d, at %s.",
                me,
                ", ".join(lost),
                detection,
                runs,
                agreed.path,
            )

    def _write(
        self, directory: str, lost: list, detection: str, runs: int, writer: int
    ) -> Optional[str]:
        """Writes the last whole step's checkpoint into ``directory`` under this writer's
        own name; its path, or None when the checkpoint has variables the hold did not
        see."""
        me = self._ctx.state.membership.id_in_cluster
        missing = self.last_step.restore()
        if missing:
            log.error(
                "Worker %s: the checkpoint has variables the last whole step was not held for "
                "(%s): nothing saved.",
                me,
                ", ".join(missing[:10]),
            )
            return None
        records = self._ctx.records
        local = tf_last_step.sync_on_read(self._checkpoint)
        if local:
            log.warning(
                "Worker %s: saving this worker's own value of %s (SyncOnRead: TensorFlow "
                "combines every worker's, and one is gone).",
                me,
                ", ".join(local),
            )
        records.save_start("lost_peer", runs)
        self._checkpoints.counter.assign(runs)
        # As tf.train.CheckpointManager.save counts its saves, when the checkpoint has
        # counted any: its property would make the counter, inside a strategy's scope a
        # variable whose creation broadcasts from the chief (a collective, with a peer gone).
        counter = getattr(self._checkpoint, "_save_counter", None)
        if counter is not None:
            counter.assign_add(1)
        name = f"{tf_last_step.SURVIVORS_PREFIX}{writer}-{runs}"
        prefix = _join(directory, name)
        with _preemption_save_context(), tf_last_step.local_reads():
            return self._checkpoint.write(prefix)
