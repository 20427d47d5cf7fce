"""The records hooks: each stage of a preemption, as the protocol reaches it, becomes one
line of the task's preemption records (``records``).

The protocol calls a hook at each stage and knows nothing of the lines' fields:

=============================  ==============================================  ===========
hook                           called when                                     line
=============================  ==============================================  ===========
``_record_resume``             the handler is built after a preemption exit    ``resumed``
``_record_notice``             this worker's own notice is taken               ``notice``
``_record_agreement``          this worker, leading, publishes the step        ``agreement``
``_record_peer_agreement``     a leader's step key is read                     ``notice``,
                                                                               ``agreement``
``_record_save_start``         the save at the agreed step starts              ``save_start``
``_record_save_failed``        that save raised                                ``error``
``_record_save_end``           that save is written                            ``save_end``
``_record_exit``               the worker exits after its last save            ``exit``
``_record_task_notice``        a PS or worker task of a PS cluster has one     ``notice``
``_record_task_release``       the coordinator released that task              ``exit``
=============================  ==============================================  ===========

A stage that opens a preemption (a notice, a peer's step, a save with neither before it)
starts a new one. The coordinator of a PS cluster writes its tasks' lines too: it is the
process that knows the records folder (beside its checkpoints).
"""

from __future__ import annotations

import time
from typing import Optional

from .. import records
from .._platforms import platform as _platform


class RecordsHooks:
    """Writes the preemption records of each stage of the protocol.

    Owns ``_records`` (a ``records.Recorder``, built with the handler) and
    ``_remote_preemptions``; reads ``_records_label``, ``_state.grace_period``,
    ``_run_counter``, ``_exit_fn`` and ``_write_checkpoint_manager``.
    """

    def _record_resume(self) -> None:
        """A ``resumed`` line when this task exited after a preemption and has not
        resumed since (a second handler of the same run writes nothing). The records
        are read on the writer thread of an object store (construction never waits
        for a bucket), at once on a local folder; a record file that cannot be read
        or makes no sense writes nothing and never stops the handler."""
        rec = self._records
        step = self._run_counter
        built = time.time()

        def resume() -> None:
            last = records.last_exit(rec.folder, rec.job, rec.task)
            if last is None or not records.claim_resume(rec.folder, rec.job, rec.task, last.id):
                return
            rec.write(
                "resumed",
                preemption=last.id,
                step=step,
                lost=None if last.agreed_step is None else last.agreed_step - step,
                downtime=built - last.exit_time,
                time=built,
                **_platform.resume_fields(self._state.environment),
            )

        rec.defer(resume)

    def _record_notice(self, source: str, deadline: Optional[float]) -> None:
        """This worker's own notice (``deadline``: Unix time, or None); it opens a
        preemption unless one is open already."""
        if self._records.current is None:
            self._records.new_preemption()
            self._records.write(
                "notice",
                source=source,
                deadline=deadline,
                grace_period=self._state.grace_period,
            )

    def _record_agreement(self, round_key: str, step: int) -> None:
        """This worker leads the round: it publishes ``step``."""
        self._records.write("agreement", step=step, proposer=self._records_label, round=round_key)

    def _record_peer_agreement(self, round_key: str, value: str) -> None:
        """A leader's step key was read (this worker does not lead); with no preemption
        open, a ``notice`` from the peer opens one."""
        if self._records.current is None:
            self._records.new_preemption()
            self._records.write("notice", source="peer", grace_period=self._state.grace_period)
        try:
            step = int(value)
        except ValueError:
            step = None
        self._records.write("agreement", step=step, proposer="peer", round=round_key)

    def _record_save_start(self, round_key: str) -> None:
        if self._records.current is None:
            self._records.new_preemption()
        self._records.write(
            "save_start", step=self._run_counter, round=round_key, **self._ps_save_fields()
        )

    def _record_save_failed(self, error: BaseException) -> None:
        self._records.write("error", error=f"save failed: {error!r}")

    def _record_save_end(self) -> None:
        self._records.write("save_end", path=self._saved_path())

    def _saved_path(self) -> Optional[str]:
        manager = self._write_checkpoint_manager
        path = getattr(manager, "latest_checkpoint", None)
        return path if isinstance(path, str) else getattr(manager, "directory", None)

    def _record_exit(self) -> None:
        """The worker exits after its last save: the line is written, and the file
        closed, before ``exit_fn`` (one that calls ``os._exit`` leaves no later moment)."""
        self._records.write("exit", code=_platform.exit_code(self._exit_fn))
        self._records.close()

    def _record_task_notice(
        self, job: str, task: int, source: str, deadline: Optional[float]
    ) -> None:
        """A PS or worker task's notice, seen by its coordinator."""
        preemption = f"{job}-{task}-{int(time.time() * 1000)}"
        self._remote_preemptions[(job, task)] = preemption
        self._records.write(
            "notice",
            preemption=preemption,
            as_job=job,
            as_task=task,
            source=source,
            deadline=deadline,
            observer=self._records_label,
        )

    def _record_task_release(self, job: str, task: int, reason: str) -> None:
        """The coordinator released a PS or worker task (it exits with the restart code)."""
        self._records.write(
            "exit",
            preemption=self._remote_preemptions.get((job, task)),
            as_job=job,
            as_task=task,
            code=_platform.DEFAULT_EXIT_CODE,
            released=reason,
            observer=self._records_label,
        )
