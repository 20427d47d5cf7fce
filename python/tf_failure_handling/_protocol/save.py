"""The save at the agreed step, and the exit after the last one.

Runs on the training thread, in the check before the agreed step (``step_check``). A
parameter-server coordinator first lets the scheduled closures finish (``ps_steps``);
then the checkpoint is saved (``Checkpoints.save``) and
the resolver says what follows (``Event.Saved``): **exit**, after the last round, or
**countdown**, training on through the grace period until the final round. The exit
stops the step-key reader, removes a non-chief's temporary checkpoint folder, releases
the parameter servers, writes the ``exit`` record, puts a SLURM job back in the queue,
arms the exit guard (``exit_guard``: an exit still running just before the deadline ends
with the code) and calls ``exit_fn``. Each stage is recorded through ``StageRecords``
(``records_hooks``).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional

from .._native import Action, Event
from .._platforms import platform as _platform
from . import exit_guard as _exit_guard
from .checkpoints import Checkpoints
from .chief_checkpoint import ChiefCheckpoint
from .context import Context
from .ps_steps import PsSteps
from .step_keys import StepKeys

log = logging.getLogger("tf_failure_handling")

# UNMERGED_EXIT_CODE is the core's (src/shares.rs): the exit code of a worker whose save
# in shares (``TF_FAILURE_HANDLING_NON_CHIEF_SAVES=shares``) did not become the checkpoint
# the state file names: a part or the merge failed, the chief did not start the merge
# (it would not end before the deadline), or, on a non-chief, the chief did not report
# it in time. Not the restart code (42, GCE 143), which says the checkpoint is saved.


class SaveAndExit:
    """Saves at the agreed step; after the last round, exits."""

    def __init__(
        self,
        ctx: Context,
        checkpoints: Checkpoints,
        ps: PsSteps,
        step_keys: StepKeys,
    ) -> None:
        self._ctx = ctx
        self._state, self._core = ctx.state, ctx.core
        self._errors, self._records = ctx.errors, ctx.records
        self._checkpoints = checkpoints
        self._ps = ps
        self._step_keys = step_keys
        self._chief_checkpoint = ChiefCheckpoint(ctx, checkpoints)
        #: The handler's ``_exit_fn`` (a view: set there, it is the one called); the
        #: configured one (or the platform's default) until then.
        self.exit_fn: Callable[[], Any] = ctx.state.settings.exit_fn

    def _scheduler_step(self) -> Any:
        """The scheduler's step after the save (SLURM: the job back in the queue): the
        seconds from now until the scheduler ends this process, or None."""
        state = self._state
        return _platform.after_save(
            state.environment, state.settings.platform_options, self._records.recorder
        )

    def _guard_exit(self, code: int, ends_in: Optional[float] = None) -> None:
        """Arms the exit guard for the moment the platform ends this worker, as the
        platform stated it (the core's answer to ``Event.Exiting``, in seconds from now;
        ``ends_in``: the scheduler's later statement; ``exit_guard``). A grace period
        alone or an assumed deadline (Kubernetes without the pod's grace period) arms
        nothing: nothing is known to end the process then."""
        _exit_guard.arm(self._core.handle(Event.Exiting(ends_in)), 0.0, code)

    def _unmerged_exit(self, error: BaseException, code: int) -> None:
        """A worker whose save in shares did not become the checkpoint the state file
        names (a part or the merge failed, the merge was not started in time, or the
        chief did not report it): not the restart code, which says "checkpoint saved",
        but ``code`` (``Action.ExitUnmerged``'s, the core's unmerged exit code), on
        the chief as on the others."""
        if isinstance(error, (SystemExit, KeyboardInterrupt)):
            return
        self._step_keys.stop_reader()
        self._checkpoints.remove_worker_temp(self._state.membership.is_chief)
        log.error(
            "The checkpoint the workers wrote in shares was not saved (%s): the checkpoint "
            "before it stays; exiting with %d, not the restart code.",
            error,
            code,
        )
        self._records.exit(code, reason=f"shares not merged: {type(error).__name__}: {error}")
        self._guard_exit(code)
        raise SystemExit(code) from error

    def exit_after_loss(self) -> None:
        """A worker was lost without notice and ``lost_worker`` is ``exit``: the
        survivors' save is over (written, or not this worker's), and this worker exits
        with the restart code, through ``exit_fn`` as after a preemption's save."""
        self._step_keys.stop_reader()
        code = _platform.exit_code(self.exit_fn)
        self._records.exit(code)
        self.exit_fn()

    def save_at(self, action: Any, args: tuple, kwargs: dict) -> None:
        """The save the core asked for (``Action.Save``: its round, step, and how
        long a PS coordinator's closures in flight may take first)."""
        round_key, step = action.round, action.step
        self._ps.before_save(action.drain)
        log.info("Saving a checkpoint at the agreed step %d (%s).", step, round_key)
        self._records.save_start(round_key, self._core.run_counter, **self._ps.save_fields())
        try:
            self._checkpoints.save(self._core.run_counter, args, kwargs)
        except BaseException as e:
            self._ps.training_goes_on()
            after = self._core.handle(Event.SaveFailed(self._checkpoints.shared_by > 1))
            self._records.save_failed(e)
            if isinstance(after, Action.ExitUnmerged):
                self._unmerged_exit(e, after.code)
            raise
        self._records.save_end(self._checkpoints.write, **self._checkpoints.save_fields())
        after = self._core.handle(Event.Saved(round_key))
        if isinstance(after, Action.Exit):
            # A non-chief's round is saved once the chief's checkpoint is there.
            self._chief_checkpoint.confirm()
            # The signal watch stays: until close(), a further notice is absorbed,
            # not handed back to whatever was installed before (which could kill
            # a worker that exit_fn chose to keep running).
            self._step_keys.stop_reader()
            self._checkpoints.remove_worker_temp(self._state.membership.is_chief)
            self._ps.after_save()
            log.info("PreemptionCheckpointHandler: checkpoint saved. Exiting.")
            code = _platform.exit_code(self.exit_fn)
            # Written before exit_fn: one that calls os._exit leaves no later moment.
            self._records.exit(code)
            # The scheduler's step (SLURM: the job back in the queue, which moves the
            # moment SLURM ends this process: the guard's, below).
            ends_in = self._scheduler_step()
            if code is not None:  # a default exit_fn: its code is the records'
                self._guard_exit(code, ends_in)
            elif ends_in is not None:
                self._core.handle(Event.Exiting(ends_in))
            self.exit_fn()
            self._ps.training_goes_on()
            # TF carries on silently here; say what state the worker is in.
            log.warning(
                "exit_fn returned instead of ending the process: training continues, the "
                "checkpoint of run %d is complete, and this handler absorbs further notices "
                "until close().",
                step,
            )
        else:
            self._ps.training_goes_on()
            state = self._core.state()
            if state["leading"]:
                log.info(
                    "Continue training for the grace period; the final round starts %.2fs "
                    "before the deadline (save, steps and acknowledgements as measured).",
                    state["margin"],
                )
            else:
                log.info("Continue training for the grace period.")
