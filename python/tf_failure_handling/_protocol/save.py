"""The save at the agreed step, and the exit after the last one.

Runs on the training thread, in the check before the agreed step (``step_check``). A
parameter-server coordinator first lets the scheduled closures finish (``ps_steps``);
then the checkpoint is saved (``_save_checkpoint``, TF's private method of that name) and
the resolver says what follows (``_core.saved``): **exit**, after the last round, or
**countdown**, training on through the grace period until the final round. The exit
stops the step-key reader, removes a non-chief's temporary checkpoint folder, releases
the parameter servers, writes the ``exit`` record, puts a SLURM job back in the queue,
and calls ``exit_fn``. Each stage is recorded through ``StageRecords``
(``records_hooks``).
"""

from __future__ import annotations

import logging

from .._native import SaveAction
from .._platforms import platform as _platform

log = logging.getLogger("tf_failure_handling")


class SaveAndExit:
    """Saves at the agreed step; after the last round, exits.

    Reads ``_state.clock``, ``_checkpoints``, ``_is_chief`` and ``_exit_fn``; saves through
    ``_save_checkpoint`` (the handler's, TF's name).
    """

    def _save_checkpoint_at(self, round_key: str, step: int, args: tuple, kwargs: dict) -> None:
        self._ps_before_save()
        log.info("Saving a checkpoint at the agreed step %d (%s).", step, round_key)
        self._stage_records.save_start(round_key, self._run_counter, **self._ps_save_fields())
        start = self._state.clock()
        try:
            self._save_checkpoint(*args, **kwargs)
        except BaseException as e:
            self._ps_training_goes_on()
            self._core.save_failed()
            self._stage_records.save_failed(e)
            raise
        self._stage_records.save_end(self._write_checkpoint_manager)
        after = self._core.saved(round_key, self._state.clock() - start)
        if after == SaveAction.Exit:
            # The signal watch stays: until close(), a further notice is absorbed,
            # not handed back to whatever was installed before (which could kill
            # a worker that exit_fn chose to keep running).
            self._stop_peer_watcher()
            self._checkpoints.remove_worker_temp(self._is_chief)
            self._ps_after_save()
            log.info("PreemptionCheckpointHandler: checkpoint saved. Exiting.")
            # Written before exit_fn: one that calls os._exit leaves no later moment.
            self._stage_records.exit(_platform.exit_code(self._exit_fn))
            # The scheduler's step (SLURM: the job back in the queue).
            _platform.after_save(
                self._state.environment, self._platform_options, self._stage_records.recorder
            )
            self._exit_fn()
            self._ps_training_goes_on()
            # TF carries on silently here; say what state the worker is in.
            log.warning(
                "exit_fn returned instead of ending the process: training continues, the "
                "checkpoint of run %d is complete, and this handler absorbs further notices "
                "until close().",
                step,
            )
        else:
            self._ps_training_goes_on()
            if self._core.leading:
                log.info(
                    "Continue training for the grace period; the final round starts %.2fs "
                    "before the deadline (save, steps and acknowledgements as measured).",
                    self._core.state()["margin"],
                )
            else:
                log.info("Continue training for the grace period.")
