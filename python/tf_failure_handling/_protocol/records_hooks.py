"""Each stage of a preemption, as the protocol reaches it, becomes one line of the task's
preemption records (``records``): :class:`StageRecords`, one method a stage, named after
its line. The protocol passes what a line says; it knows nothing of the fields.

A stage that opens a preemption (a notice, a peer's step, a save with neither before it)
starts a new one. The coordinator of a PS cluster writes its tasks' lines too: it is the
process that knows the records folder (beside its checkpoints).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any, Iterator, Optional

from .. import records
from .._native import records_bound
from .._platforms import platform as _platform
from .state import HandlerState

log = logging.getLogger("tf_failure_handling")

# How long a stage of the training thread waits for the notice line being written (the
# core took the notice, the notice thread writes its line) before it writes its own is
# the core's: NOTICE_LINE_BOUND in src/records.rs (``records_bound(notice_line=True)``).


class StageRecords:
    """The preemption records of one handler: ``recorder`` (``records.Recorder``) writes
    them; ``label`` (``"worker 1"``) names this task in the lines of others."""

    def __init__(self, recorder: records.Recorder, state: HandlerState, label: str) -> None:
        self.recorder = recorder
        self._state = state
        self.label = label
        #: (job, task) -> the record id of a PS or worker task's preemption.
        self._remote: dict = {}
        #: Whether the open preemption has its ``notice`` line.
        self._noticed = False
        #: Held by the notice thread from the moment the core takes a notice until its
        #: line is written (:meth:`taking_notice`): the training thread can reach the
        #: agreement or the save in between (the core answers first), and its lines wait
        #: (bounded) for the notice's, so the notice's line comes first.
        self._notice_line = threading.RLock()

    @contextlib.contextmanager
    def taking_notice(self) -> Iterator[None]:
        """Around the core's taking of a notice and the writing of its line."""
        with self._notice_line:
            yield

    def _open(self) -> None:
        """Opens a preemption unless one is open, after the notice line being written."""
        bound = records_bound(notice_line=True)
        if self._notice_line.acquire(timeout=bound):
            self._notice_line.release()
        else:
            log.warning(
                "The notice's record line was not written within %gs; the next line is "
                "written before it.",
                bound,
            )
        if self.recorder.current is None:
            self.recorder.new_preemption()
            self._noticed = False

    def resumed(self, step: int) -> None:
        """A ``resumed`` line when this task exited after a preemption and has not
        resumed since (a second handler of the same run writes nothing). The records
        are read on the writer thread of an object store (construction never waits
        for a bucket), at once on a local folder; a record file that cannot be read
        or makes no sense writes nothing and never stops the handler. The line's time
        is when it is built (then: the records are read), its downtime the seconds
        from the exit to then."""
        rec = self.recorder
        environment = self._state.environment

        def resume() -> None:
            last = records.last_exit(rec.folder, rec.job, rec.task)
            if last is None or not records.claim_resume(rec.folder, rec.job, rec.task, last.id):
                return
            rec.write(
                "resumed",
                preemption=last.id,
                step=step,
                lost=None if last.agreed_step is None else last.agreed_step - step,
                exited=last.exit_time,
                **_platform.resume_fields(environment),
            )

        rec.defer(resume)

    def notice(
        self,
        source: str,
        deadline: Optional[float],
        fits: Optional[str] = None,
        replan: bool = False,
        runs: Optional[int] = None,
        in_run: Optional[bool] = None,
    ) -> None:
        """This worker's own notice (``deadline``: Unix time, or None; ``fits``: what
        the core said still fits, ``both``, ``one_save``, ``neither`` or ``unknown``;
        ``runs``: the ``run()`` calls completed then, ``in_run``: whether one was under
        way, its check already made). It opens a preemption unless one is open already,
        and then writes nothing unless it ends earlier than the one planned for
        (``replan``: a line with ``replan`` set)."""
        if self.recorder.current is not None and self._noticed and not replan:
            return
        self._open()
        self._noticed = True
        self.recorder.write(
            "notice",
            source=source,
            deadline=deadline,
            grace_period=self._state.grace_period,
            replan=replan or None,
            fits=fits,
            runs=runs,
            in_run=in_run,
        )

    def lost_peer(self, lost: list, detection: str, runs: Optional[int]) -> None:
        """Peers lost without notice (``lost``: their names, ``detection``: how it
        showed); this survivor saves the last whole step, run ``runs``. It opens a
        preemption of source ``lost_peer``."""
        self._open()
        self._noticed = True
        self.recorder.write("notice", source="lost_peer", lost=lost, detection=detection, runs=runs)

    def agreement(self, round_key: str, step: int) -> None:
        """This worker leads the round: it publishes ``step``."""
        self._open()
        self.recorder.write("agreement", step=step, proposer=self.label, round=round_key)

    def peer_agreement(self, round_key: str, value: str) -> None:
        """A leader's step key was read (this worker does not lead); with no preemption
        open, a ``notice`` from the peer opens one."""
        if self.recorder.current is None:
            self._open()
            self._noticed = True
            self.recorder.write("notice", source="peer", grace_period=self._state.grace_period)
        try:
            step = int(value)
        except ValueError:
            step = None
        self.recorder.write("agreement", step=step, proposer="peer", round=round_key)

    def save_start(self, round_key: str, step: int, **fields: Any) -> None:
        """The save at the agreed step starts (``fields``: a PS coordinator's account
        of the closures it left unfinished)."""
        self._open()
        self.recorder.write("save_start", step=step, round=round_key, **fields)

    def save_failed(self, error: BaseException) -> None:
        # TensorFlow's errors have an empty repr: the type and the message, as said.
        self.recorder.write("error", error=f"save failed: {type(error).__name__}: {error}")

    def save_end(self, manager: Any, **fields: Any) -> None:
        """The save through ``manager`` (or to the checkpoint path ``manager``) is
        written: the line names its checkpoint (``fields``: how a non-chief's copy was
        written, ``Checkpoints.save_fields``)."""
        path = manager if isinstance(manager, str) else getattr(manager, "latest_checkpoint", None)
        path = path if isinstance(path, str) else getattr(manager, "directory", None)
        self.recorder.write("save_end", path=path, **fields)

    def exit(self, code: int, reason: Optional[str] = None) -> None:
        """The worker exits after its last save: the line is written, and the file
        closed, before ``exit_fn`` (one that calls ``os._exit`` leaves no later moment).
        ``reason``: why it exits without its save (then ``code`` is not the restart code)."""
        fields = {} if reason is None else {"reason": reason}
        self.recorder.write("exit", code=code, **fields)
        self.recorder.close()

    def task_notice(self, job: str, task: int, source: str, deadline: Optional[float]) -> None:
        """A PS or worker task's notice, seen by its coordinator."""
        preemption = records.task_preemption(job, task)
        self._remote[(job, task)] = preemption
        self.recorder.write(
            "notice",
            preemption=preemption,
            as_job=job,
            as_task=task,
            source=source,
            deadline=deadline,
            observer=self.label,
        )

    def task_release(self, job: str, task: int, reason: str) -> None:
        """The coordinator released a PS or worker task (it exits with the restart code)."""
        self.recorder.write(
            "exit",
            preemption=self._remote.get((job, task)),
            as_job=job,
            as_task=task,
            code=_platform.DEFAULT_EXIT_CODE,
            released=reason,
            observer=self.label,
        )
