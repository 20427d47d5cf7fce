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

from .._native import slurm_decides_requeue, slurm_job_read, slurm_notice, slurm_requeue
from .._native import slurm_fields as parse_fields
from . import common

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


def show_job(jid: str, timeout: float) -> dict:
    """``scontrol show job -o JOB`` as a dict, within ``timeout`` seconds (the core's
    bound of the step that asks for it). Raises OSError, TimeoutExpired, or
    RuntimeError (scontrol's message) when it cannot be read."""
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
        self._thread = threading.Thread(target=self._read, name="tfh-slurm-job", daemon=True)

    def start(self) -> JobInfo:
        self._thread.start()
        return self

    def _read(self) -> None:
        """Performs the core's read (``slurm_job_read``: which ``scontrol`` calls, their
        bounds, what their output says); a call that raises ends it (a job we cannot
        read has no deadline)."""
        outputs: list = []
        try:
            while True:
                call, facts = slurm_job_read(self.job_id, outputs)
                (
                    self.end_time,
                    self.partition,
                    self.grace_time,
                    self.kill_wait,
                    self.requeue,
                    self.error,
                ) = facts
                if call is None:
                    break
                args, timeout = call
                try:
                    out = _scontrol(*args, timeout=timeout)
                except Exception as e:  # noqa: BLE001 - reported: the read ends
                    outputs.append((None, "", f"{type(e).__name__}: {e}"))
                else:
                    outputs.append((out.returncode, out.stdout or "", out.stderr or ""))
            if self.error is not None:
                log.info("SLURM job %s: cannot read its EndTime (%s).", self.job_id, self.error)
        finally:
            self.done.set()
        # Info: the limits every later deadline comes from (tests/slurm waits for it).
        log.info(
            "SLURM job %s read: EndTime %s, partition %s (GraceTime %s), KillWait %s.",
            self.job_id,
            self.end_time,
            self.partition,
            self.grace_time,
            self.kill_wait,
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


def notice_deadlines(end_time: Optional[float], unix_now: float) -> tuple:
    """``(deadline, kill)`` of the signal that just arrived, Unix times or None
    (docs/getting-started/slurm.md has the rule per launch form; the core decides:
    ``slurm_notice``, which may first ask for the job's ``PreemptTime``, read within
    its bound). ``end_time`` is ``SLURM_JOB_END_TIME`` if set, else the
    job's ``EndTime`` once read. The kill needs ``KillWait``: none is assumed. Never
    raises.
    """
    global _seen_term
    try:
        info = job_info()
        term = _deliveries(signal.SIGTERM)
        new_term = term > _seen_term
        _seen_term = term
        facts = {
            "end": end_time if end_time is not None else (info.end_time if info else None),
            "sigterm": new_term and info is not None,
            "srun_step": in_srun_step(),
            "grace_time": info.grace_time if info else None,
            "kill_wait": info.kill_wait if info else None,
        }
        deadline, kill, read = slurm_notice(unix_now, **facts)
        if read is not None:
            try:
                job = show_job(info.job_id, timeout=read)
            except Exception as e:  # noqa: BLE001 - unreadable: treated as no preemption
                log.info("SLURM job %s: cannot read its PreemptTime (%s).", info.job_id, e)
            else:
                deadline, kill, _ = slurm_notice(unix_now, **facts, job=job)
        return deadline, kill
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
    after it (the core's ``slurm_requeue``); None when not requeued here or
    ``KillWait`` is unknown. Never raises."""
    try:
        requeued, left = _requeue_after_save(option, recorder)
    except Exception as e:  # noqa: BLE001 - the exit must happen whatever goes wrong here
        log.warning("SLURM requeue: unexpected error %r; exiting without requeue.", e)
        return False, None
    info = job_info()
    if left is not None and info is not None:
        log.info(
            "SLURM job %s: the requeue ends this run's tasks; SLURM's SIGKILL comes %.1fs "
            "from now at the soonest (KillWait %s after the requeue).",
            info.job_id,
            left,
            info.kill_wait,
        )
    return requeued, left


def _requeue(jid: str, time_limit_signal: bool, kill_wait: Optional[float]) -> tuple:
    """Performs the core's requeue (``slurm_requeue``: ``src/sources/slurm.rs``'s
    ``RequeueRun`` decides, retries a busy controller, pauses between attempts and
    gives up): ``scontrol show job`` and ``scontrol requeue jid``, each within the
    timeout the core gives. Returns ``(requeued, message, what, reason, took, kill_in,
    job)`` (``slurm_requeue`` says what each is)."""

    def requeue(timeout: float) -> tuple:
        try:
            out = _scontrol("requeue", jid, timeout=timeout)
        except subprocess.TimeoutExpired:
            return None, None
        except OSError as e:
            return None, str(e)
        return out.returncode, (out.stderr or out.stdout).strip()

    return slurm_requeue(
        jid,
        time_limit_signal=time_limit_signal,
        restart_count=max(0, restart_count()),
        kill_wait=kill_wait,
        show_job=lambda timeout: show_job(jid, timeout),
        requeue=requeue,
    )


def _requeue_after_save(option: Optional[bool], records: Any) -> tuple:
    """Carries out the core's requeue (``src/sources/slurm.rs``, ``decides_requeue``,
    ``requeue`` and ``RequeueRun``): whether the job was requeued, and the seconds
    until SLURM's SIGKILL when this process's ``scontrol requeue`` did it."""
    jid = job_id()
    enabled = requeue_enabled(option)
    if jid is not None and not enabled:
        log.info("SLURM job %s: requeue turned off; not requeued.", jid)
    procid = os.environ.get("SLURM_PROCID")
    if not slurm_decides_requeue(under_slurm=jid is not None, enabled=enabled, procid=procid):
        return None, None
    info = job_info()
    requeued, message, what, reason, took, kill_in, job = _requeue(
        jid, _deliveries(signal.SIGUSR1) > 0, info.kill_wait if info is not None else None
    )
    if what == "already":
        log.info("SLURM job %s (%s): %s.", jid, reason, message)
    elif what == "no_reason":
        log.info("SLURM job %s: not requeued: %s (a user's scancel?).", jid, message)
    elif what == "not_requeueable":
        log.warning("SLURM job %s (%s): not requeued: %s.", jid, reason, message)
    elif requeued:
        log.info(
            "SLURM job %s (%s): requeued after the checkpoint (scontrol requeue, %.2f s).",
            jid,
            reason,
            took,
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
    return requeued, kill_in


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
