"""SLURM: the job's deadlines, and the job back in the queue after the save.

What SLURM sends and when, the deadline and the kill each notice carries
(:func:`notice_deadlines`) and when the job is requeued (:func:`requeue_after_save`)
are told once, in docs/getting-started/slurm.md, and checked on a real SLURM by
``tests/slurm``. The job is one protocol object of the core (``SlurmJob``,
``src/sources/slurm/job.rs``), which decides all of it; each thread here reports an
event and runs the ``scontrol`` calls it answers with (:func:`_perform`).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import threading
from typing import Any, Optional

from .._native import SlurmJob
from . import common

SlurmEvent = SlurmJob.Event
SlurmAction = SlurmJob.Action

log = logging.getLogger("tf_failure_handling")

#: Set by SLURM >= 23.02: the job's end time, in Unix seconds.
END_TIME_ENV = "SLURM_JOB_END_TIME"
#: ``0``, ``false``, ``off`` or ``no`` turns the requeue off (scripts left unchanged).
REQUEUE_ENV = "TF_FAILURE_HANDLING_SLURM_REQUEUE"


def job_id() -> Optional[str]:
    return common.env("SLURM_JOB_ID")


def restart_count() -> int:
    try:
        return int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    except ValueError:
        return 0


def _scontrol(*args: str, timeout: float) -> subprocess.CompletedProcess:
    exe = shutil.which("scontrol")
    if exe is None:
        raise FileNotFoundError("scontrol is not on PATH")
    return subprocess.run(
        [exe, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def _perform(job: SlurmJob, event: Any) -> Any:
    """This thread's loop with the job (``src/sources/slurm/job.rs``): reports
    ``event``, runs each ``scontrol`` call the core answers with, within the timeout
    it carries, and reports how it ended, until the answer is an outcome (which it
    returns). The requeue's pauses are waited inside ``handle``."""
    while True:
        action = job.handle(event)
        if not isinstance(action, SlurmAction.Scontrol):
            return action
        try:
            out = _scontrol(*action.args, timeout=action.timeout)
        except Exception as e:  # noqa: BLE001 - reported: the core decides what it means
            why = f"{type(e).__name__}: {e}"
            timed_out = isinstance(e, subprocess.TimeoutExpired)
            event = SlurmEvent.NotRun(action.call, why, timed_out)
        else:
            event = SlurmEvent.Exited(
                action.call, out.returncode, out.stdout or "", out.stderr or ""
            )


class _Job:
    """The job this process runs in: the core's object (``SlurmJob``) and the daemon
    thread that reads its limits when the handler starts."""

    def __init__(self, jid: str) -> None:
        self.id = jid
        self.core = SlurmJob(jid, max(0, restart_count()))
        #: The read's outcome (``SlurmAction.Read``) once over: for its log line.
        self.limits: Any = None
        self._reader: Optional[threading.Thread] = None

    def start_reading(self) -> None:
        if self._reader is None:
            self._reader = threading.Thread(target=self._read, name="tfh-slurm-job", daemon=True)
            self._reader.start()

    def _read(self) -> None:
        read = _perform(self.core, SlurmEvent.Read())
        if read.error is not None:
            log.info("SLURM job %s: cannot read its EndTime (%s).", self.id, read.error)
        self.limits = read
        # Info: the limits every later deadline comes from (tests/slurm waits for it).
        log.info(
            "SLURM job %s read: EndTime %s, partition %s (GraceTime %s), KillWait %s.",
            self.id,
            read.end_time,
            read.partition,
            read.grace_time,
            read.kill_wait,
        )


_lock = threading.Lock()
_job: Optional[_Job] = None


def the_job() -> Optional[_Job]:
    """The job this process runs in (one per process and job), None when not under
    SLURM."""
    global _job
    jid = job_id()
    if jid is None:
        return None
    with _lock:
        if _job is None or _job.id != jid:
            _job = _Job(jid)
        return _job


def start_reading_job() -> Optional[_Job]:
    """Starts (once per process and job) the daemon thread that reads the job."""
    job = the_job()
    if job is not None:
        job.start_reading()
    return job


def job_limits() -> Any:
    """The read of the job's limits (``SlurmAction.Read``) once over, else None (never
    waits)."""
    job = _job
    return job.limits if job is not None else None


def in_srun_step() -> bool:
    """Whether this process is a task ``srun`` started (``SLURM_STEP_ID`` is set for
    those and not for the batch step)."""
    return os.environ.get("SLURM_STEP_ID", "").strip().isdigit()


def notice_deadlines(end_time: Optional[float], at: float) -> tuple:
    """``(deadline, kill)`` of the signal that arrived at ``at``, Unix times or None
    (docs/getting-started/slurm.md has the rule per launch form; the core decides,
    and may first have the job read, within its bound: its ``PreemptTime`` at a
    SIGTERM, its ``EndTime`` as it is now at the time limit's warning).
    ``end_time`` is ``SLURM_JOB_END_TIME`` if set (else the core uses the job's
    ``EndTime`` once read). The kill needs ``KillWait``: none is assumed. Never
    raises.
    """
    try:
        job = the_job()
        if job is None:
            raise LookupError("not under SLURM")
        # None: the core counts the SIGTERMs this process caught itself.
        return _deadlines(job, SlurmEvent.Notice(at, end_time, None, in_srun_step()))
    except Exception:  # noqa: BLE001 - see the docstring
        return (end_time if end_time is not None and end_time > at else None), None


def _deadlines(job: _Job, notice: Any) -> tuple:
    """``(deadline, kill)`` that the core answers ``notice`` (``SlurmEvent.Notice``)
    with, once the reads it asks for are performed."""
    told = _perform(job.core, notice)
    if told.unread is not None:
        log.info("SLURM job %s: cannot read the job (%s).", job.id, told.unread)
    return told.deadline, told.kill


# ------------------------------------------------------------------ requeue


def requeue_from_env() -> Optional[bool]:
    """:data:`REQUEUE_ENV` as True/False, None when unset or empty. Raises ValueError
    for anything else (``common.env_flag``)."""
    return common.env_flag(REQUEUE_ENV, "on under SLURM")


def requeue_enabled(option: Optional[bool]) -> bool:
    """``TerminationConfig(slurm_requeue=...)`` if given, else the environment
    variable (off with ``0``/``false``/``off``/``no``), else on."""
    if option is not None:
        return bool(option)
    try:
        from_env = requeue_from_env()
    except ValueError:
        return True  # rejected at the handler's construction already
    return True if from_env is None else from_env


def requeue_after_save(option: Optional[bool], recorder: Any) -> Optional[bool]:
    """Puts the job back in the queue when it ends by SLURM's time limit or a
    preemption, unless ``option`` (``TerminationConfig.slurm_requeue``) or
    :data:`REQUEUE_ENV` turns it off; the outcome is a ``requeue`` line of
    ``recorder``'s records. Returns whether it was requeued (None when not under
    SLURM, turned off, or not this task's to do). Never raises."""
    return requeue_and_kill(option, recorder)[0]


def requeue_and_kill(option: Optional[bool], recorder: Any) -> tuple:
    """:func:`requeue_after_save`, and the seconds from now until SLURM's SIGKILL when
    this process requeued the job: the requeue ends the job's steps, ``KillWait``
    after it (the core's ``Requeued.kill_in``); None when not requeued here or
    ``KillWait`` is unknown. Never raises."""
    try:
        return _requeue_after_save(option, recorder)
    except Exception as e:  # noqa: BLE001 - the exit must happen whatever goes wrong here
        log.warning("SLURM requeue: unexpected error %r; exiting without requeue.", e)
        return False, None


def _requeue_after_save(option: Optional[bool], records: Any) -> tuple:
    """Carries out the core's requeue (``src/sources/slurm/job.rs``: whether this
    task decides, the decision, ``scontrol requeue`` retried while the controller is
    busy, the pauses and the give-up): whether the job was requeued, and the seconds
    until SLURM's SIGKILL when this process's ``scontrol requeue`` did it."""
    jid = job_id()
    enabled = requeue_enabled(option)
    if jid is not None and not enabled:
        log.info("SLURM job %s: requeue turned off; not requeued.", jid)
    job = the_job()
    if job is None:
        return None, None
    # None: the core knows from its own count whether a SIGUSR1 (the time limit's
    # warning) was caught.
    requeue = SlurmEvent.Requeue(enabled, os.environ.get("SLURM_PROCID"), None)
    return _requeued(job, requeue, records)


def _requeued(job: _Job, requeue: Any, records: Any) -> tuple:
    """Performs the core's answer to ``requeue`` (``SlurmEvent.Requeue``), logs and
    records its outcome: whether the job was requeued, and the seconds until SLURM's
    SIGKILL when this process's ``scontrol requeue`` did it."""
    jid = job.id
    done = _perform(job.core, requeue)
    if not isinstance(done, SlurmAction.Requeued):
        return None, None
    requeued, message, reason = done.requeued, done.message, done.reason
    if done.what == "already":
        log.info("SLURM job %s (%s): %s.", jid, reason, message)
    elif done.what == "no_reason":
        log.info("SLURM job %s: not requeued: %s (a user's scancel?).", jid, message)
    elif done.what == "not_requeueable":
        log.warning("SLURM job %s (%s): not requeued: %s.", jid, reason, message)
    elif requeued:
        log.info(
            "SLURM job %s (%s): requeued after the checkpoint (scontrol requeue, %.2f s).",
            jid,
            reason,
            done.took,
        )
    else:
        log.warning(
            "SLURM job %s (%s): scontrol requeue failed: %s. Exiting with the restart "
            "code all the same; resubmit the job to resume.",
            jid,
            reason,
            message or "no message",
        )
    if records is not None:
        records.write(
            "requeue",
            job_id=jid,
            requeued=requeued,
            reason=reason,
            message=message or None,
            restart_count=restart_count(),
            job_state=done.job_state,
        )
        records.close()
    if done.kill_in is not None:
        log.info(
            "SLURM job %s: the requeue ends this run's tasks; SLURM's SIGKILL comes %.1fs "
            "from now at the soonest (KillWait %s after the requeue).",
            jid,
            done.kill_in,
            done.kill_wait,
        )
    return requeued, done.kill_in


class Slurm(common.Platform):
    NAME = "slurm"

    def check(self) -> Optional[float]:
        """:data:`END_TIME_ENV`, or None."""
        return common.seconds(END_TIME_ENV)

    def detect(self, checked: Any) -> bool:
        """Under SLURM: ``SLURM_JOB_ID`` is set."""
        return job_id() is not None

    def defaults(self, env: Any) -> dict:
        """SIGUSR1 too, what ``--signal`` usually sends before the time limit."""
        return {"signals": (signal.SIGUSR1,)}

    def start(self, env: Any) -> None:
        start_reading_job()

    def deadlines(self, env: Any, unix_now: float) -> tuple:
        return notice_deadlines(env.settings.get(self.NAME), unix_now)

    def attach(self, env: Any, config: Any) -> Optional[bool]:
        """The requeue option (``config.slurm_requeue``; a bad :data:`REQUEUE_ENV` is an
        error now, under SLURM or not), and under SLURM the log line of a requeued run."""
        requeue_from_env()
        if job_id() is not None:
            start_reading_job()
            if restart_count() > 0:
                log.info(
                    "SLURM job %s was requeued: this is restart %d (SLURM_RESTART_COUNT).",
                    job_id(),
                    restart_count(),
                )
        return config.slurm_requeue

    def after_save(self, env: Any, options: Any, recorder: Any) -> Optional[float]:
        """The job back in the queue; the seconds until SLURM's SIGKILL when that
        moved it (:func:`requeue_and_kill`)."""
        return requeue_and_kill(options, recorder)[1]

    def resume_fields(self, env: Any) -> dict:
        """The job and ``SLURM_RESTART_COUNT`` (empty when not under SLURM)."""
        jid = job_id()
        return {} if jid is None else {"slurm_job_id": jid, "slurm_restart_count": restart_count()}


PLATFORM = Slurm()
