"""SLURM: the job's deadlines, and the job back in the queue after the save.

What SLURM sends and when, the deadline and the kill each notice carries
(:func:`notice_deadlines`, decided by the core: ``src/sources/slurm.rs``) and when the
job is requeued (:func:`requeue_after_save`) are told once, in
docs/getting-started/slurm.md, and checked on a real SLURM by ``tests/slurm``.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import threading
from typing import Any, Optional

from .._native import SLURM_NOTICE_READ_TIMEOUT as NOTICE_READ_TIMEOUT
from .._native import SLURM_READ_TIMEOUT as READ_TIMEOUT
from .._native import SLURM_REQUEUE_TIMEOUT as REQUEUE_TIMEOUT
from .._native import (
    Deadline,
    Retry,
    RetryVerdict,
    Stopwatch,
    slurm_config_value,
    slurm_controller_busy,
    slurm_decides_requeue,
    slurm_kill_after_requeue,
    slurm_requeue,
    slurm_signal_deadlines,
)
from .._native import slurm_fields as parse_fields
from .._native import slurm_seconds as parse_seconds
from .._native import slurm_time as parse_time
from . import common

log = logging.getLogger("tf_failure_handling")

#: Set by SLURM >= 23.02: the job's end time, in Unix seconds.
END_TIME_ENV = "SLURM_JOB_END_TIME"
#: ``0``, ``false``, ``off`` or ``no`` turns the requeue off (scripts left unchanged).
REQUEUE_ENV = "TF_FAILURE_HANDLING_SLURM_REQUEUE"
# REQUEUE_TIMEOUT, READ_TIMEOUT and NOTICE_READ_TIMEOUT are the core's
# (src/sources/slurm.rs says what each means).


def job_id() -> Optional[str]:
    return common.env("SLURM_JOB_ID")


def restart_count() -> int:
    try:
        return int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    except ValueError:
        return 0


def _scontrol(*args: str, timeout: float = READ_TIMEOUT) -> subprocess.CompletedProcess:
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


def show_job(jid: Optional[str] = None, timeout: float = READ_TIMEOUT) -> dict:
    """``scontrol show job -o JOB`` as a dict. Raises OSError, TimeoutExpired, or
    RuntimeError (scontrol's message) when it cannot be read."""
    jid = jid or job_id()
    out = _scontrol("show", "job", "-o", str(jid), timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError((out.stderr or out.stdout).strip() or f"exit {out.returncode}")
    return parse_fields(out.stdout.splitlines()[0] if out.stdout else "")


class JobInfo:
    """What ``scontrol`` says about this job, read once in a daemon thread."""

    def __init__(self, jid: str) -> None:
        self.job_id = jid
        self.done = threading.Event()
        #: ``EndTime`` (Unix seconds), None when unlimited or unknown.
        self.end_time: Optional[float] = None
        self.partition: Optional[str] = None
        #: The partition's ``GraceTime`` and the cluster's ``KillWait``, seconds.
        self.grace_time: Optional[float] = None
        self.kill_wait: Optional[float] = None
        self.requeue: Optional[bool] = None
        self.error: Optional[str] = None
        self.took: Optional[float] = None
        self._thread = threading.Thread(target=self._read, name="tfh-slurm-job", daemon=True)

    def start(self) -> JobInfo:
        self._thread.start()
        return self

    def _read(self) -> None:
        reading = Stopwatch()
        try:
            job = show_job(self.job_id)
            self.end_time = parse_time(job.get("EndTime"))
            self.partition = job.get("Partition")
            self.requeue = job.get("Requeue") == "1" if "Requeue" in job else None
            if self.partition:
                out = _scontrol("show", "partition", "-o", self.partition)
                if out.returncode == 0:
                    self.grace_time = parse_seconds(parse_fields(out.stdout).get("GraceTime"))
            out = _scontrol("show", "config")
            if out.returncode == 0:
                self.kill_wait = parse_seconds(slurm_config_value(out.stdout, "KillWait"))
        except Exception as e:  # noqa: BLE001 - a job we cannot read has no deadline
            self.error = f"{type(e).__name__}: {e}"
            log.info("SLURM job %s: cannot read its EndTime (%s).", self.job_id, self.error)
        finally:
            self.took = reading.seconds()
            self.done.set()
        # Info: the limits every later deadline comes from (tests/slurm waits for it).
        log.info(
            "SLURM job %s read: EndTime %s, partition %s (GraceTime %s), KillWait %s, in %.3f s.",
            self.job_id,
            self.end_time,
            self.partition,
            self.grace_time,
            self.kill_wait,
            self.took,
        )


_lock = threading.Lock()
_info: Optional[JobInfo] = None
#: Signal deliveries already accounted for by :func:`notice_deadlines`.
_seen_term = 0


def start_reading_job() -> Optional[JobInfo]:
    """Starts (once per process and job) the daemon thread that reads the job."""
    global _info
    jid = job_id()
    if jid is None:
        return None
    with _lock:
        if _info is None or _info.job_id != jid:
            _info = JobInfo(jid).start()
        return _info


def job_info() -> Optional[JobInfo]:
    """The job's information once read, else None (never waits)."""
    info = _info
    return info if info is not None and info.done.is_set() else None


def _deliveries(signum: int) -> int:
    try:
        from .._native import signal_deliveries

        return int(signal_deliveries(int(signum)))
    except Exception:  # noqa: BLE001 - no native module: no signal was caught by it
        return 0


def in_srun_step() -> bool:
    """Whether this process is a task ``srun`` started (``SLURM_STEP_ID`` is set for
    those and not for the batch step)."""
    return os.environ.get("SLURM_STEP_ID", "").strip().isdigit()


def preempt_time(info: JobInfo, timeout: float = NOTICE_READ_TIMEOUT) -> Optional[float]:
    """The job's ``PreemptTime`` (Unix seconds) if it is being preempted in this run,
    read now with ``scontrol show job`` (bounded by ``timeout``); None when it is
    not, or when the job cannot be read in time."""
    try:
        job = show_job(info.job_id, timeout=timeout)
    except Exception as e:  # noqa: BLE001 - unreadable: treated as no preemption
        log.info("SLURM job %s: cannot read its PreemptTime (%s).", info.job_id, e)
        return None
    preempted = parse_time(job.get("PreemptTime"))
    started = parse_time(job.get("StartTime"))
    if preempted is None or (started is not None and preempted < started):
        return None
    return preempted


def notice_deadlines(end_time: Optional[float], unix_now: float) -> tuple:
    """``(deadline, kill)`` of the signal that just arrived, Unix times or None
    (docs/getting-started/slurm.md has the rule per launch form; the core decides:
    ``slurm_signal_deadlines``). ``end_time`` is ``SLURM_JOB_END_TIME`` if set, else
    the job's ``EndTime`` once read. The kill needs ``KillWait``: none is assumed.
    Never raises.
    """
    global _seen_term
    try:
        info = job_info()
        end = end_time if end_time is not None else (info.end_time if info else None)
        term = _deliveries(signal.SIGTERM)
        new_term = term > _seen_term
        _seen_term = term
        sigterm = new_term and info is not None
        grace_end = None
        if sigterm and in_srun_step() and info.grace_time:
            preempted = preempt_time(info)
            if preempted is not None:
                grace_end = preempted + info.grace_time
        return slurm_signal_deadlines(
            unix_now,
            end=end,
            sigterm=sigterm,
            grace_end=grace_end,
            kill_wait=info.kill_wait if info else None,
        )
    except Exception:  # noqa: BLE001 - see the docstring
        return (end_time if end_time is not None and end_time > unix_now else None), None


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


def _int(value: Optional[str]) -> int:
    try:
        return int(value or 0)
    except ValueError:
        return 0


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
    after it (``slurm_kill_after_requeue``); None when not requeued here or
    ``KillWait`` is unknown. Never raises."""
    attempt: list = []
    try:
        requeued = _requeue_after_save(option, recorder, attempt)
    except Exception as e:  # noqa: BLE001 - the exit must happen whatever goes wrong here
        log.warning("SLURM requeue: unexpected error %r; exiting without requeue.", e)
        return False, None
    info = job_info()
    if not requeued or not attempt or info is None:
        return requeued, None
    left = slurm_kill_after_requeue(attempt[0].seconds(), info.kill_wait)
    if left is not None:
        log.info(
            "SLURM job %s: the requeue ends this run's tasks; SLURM's SIGKILL comes %.1fs "
            "from now at the soonest (KillWait %s after the requeue).",
            info.job_id,
            left,
            info.kill_wait,
        )
    return requeued, left


def _requeue(jid: str, attempt: Optional[list] = None) -> tuple:
    """``scontrol requeue jid``: whether the job went back to the queue, and what
    scontrol said. A failure is tried again (the core's retry rule, for
    :data:`REQUEUE_TIMEOUT` in all) while it reads as a controller too busy to answer
    (scontrol's ``MessageTimeout`` passes while slurmctld still acts on the request);
    after each failure the job is read again, and one that shows this run's requeue
    counts as requeued. ``attempt``, if given, ends up holding the ``Stopwatch``
    started with the last ``scontrol requeue`` (the one that requeued the job)."""
    deadline, retry = Deadline(REQUEUE_TIMEOUT), Retry(REQUEUE_TIMEOUT)
    pause = threading.Event()  # set by nothing: the pause between two attempts
    while True:
        left = max(1.0, deadline.left())
        if attempt is not None:
            attempt[:] = [Stopwatch()]
        try:
            out = _scontrol("requeue", jid, timeout=left)
            said = (out.stderr or out.stdout).strip()
            if out.returncode == 0:
                return True, said
            message = said or f"scontrol requeue exited with {out.returncode}"
        except subprocess.TimeoutExpired:
            message = f"scontrol requeue did not finish within {left:g} s"
        except OSError as e:
            return False, f"scontrol requeue could not run: {e}"
        try:
            if _int(show_job(jid).get("Restarts")) > restart_count():
                return True, f"{message}; the job shows requeued all the same"
        except Exception:  # noqa: BLE001 - the failure above is what counts then
            pass
        verdict = retry.failed()
        if isinstance(verdict, RetryVerdict.GiveUp) or not slurm_controller_busy(message):
            return False, message
        log.info("SLURM job %s: scontrol requeue failed (%s); trying again.", jid, message)
        pause.wait(verdict.pause)


def _requeue_after_save(option: Optional[bool], records: Any, attempt: list) -> Optional[bool]:
    """Reads what the core's requeue decision needs, and carries the decision out
    (``src/sources/slurm.rs``, ``requeue`` and ``decides_requeue``)."""
    jid = job_id()
    enabled = requeue_enabled(option)
    if jid is not None and not enabled:
        log.info("SLURM job %s: requeue turned off; not requeued.", jid)
    procid = os.environ.get("SLURM_PROCID")
    if not slurm_decides_requeue(under_slurm=jid is not None, enabled=enabled, procid=procid):
        return None
    requeuing = Stopwatch()
    message = ""
    try:
        job = show_job(jid)
    except Exception as e:  # noqa: BLE001 - then only SIGUSR1 can tell
        job = {}
        message = f"scontrol show job failed: {e}"
    what, reason = slurm_requeue(
        time_limit_signal=_deliveries(signal.SIGUSR1) > 0,
        preempted=parse_time(job.get("PreemptTime")) is not None,
        restarts=max(0, _int(job.get("Restarts"))),
        restart_count=max(0, restart_count()),
        requeueable=None if "Requeue" not in job else job["Requeue"] != "0",
    )
    requeued: Optional[bool]
    if what == "already":
        requeued = True
        message = "SLURM already requeued the job"
        log.info("SLURM job %s (%s): %s.", jid, reason, message)
    elif what == "no_reason":
        requeued = False
        message = message or "the notice was neither SLURM's time limit nor a preemption"
        log.info("SLURM job %s: not requeued: %s (a user's scancel?).", jid, message)
    elif what == "not_requeueable":
        requeued = False
        message = "the job is not requeueable (Requeue=0): submit it with sbatch --requeue"
        log.warning("SLURM job %s (%s): not requeued: %s.", jid, reason, message)
    else:
        requeued, message = _requeue(jid, attempt)
        if requeued:
            log.info(
                "SLURM job %s (%s): requeued after the checkpoint (scontrol requeue, %.2f s).",
                jid,
                reason,
                requeuing.seconds(),
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
            job_state=job.get("JobState"),
        )
        records.close()
    return requeued


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
