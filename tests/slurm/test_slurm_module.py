"""``_platforms/slurm.py`` and the core's SLURM job (``src/sources/slurm/job.rs``)
without a SLURM: the read, the notices, the switches, who requeues and how."""

from __future__ import annotations

import subprocess
import time

import pytest
from tf_failure_handling._platforms import slurm as _slurm
from tf_failure_handling.handler import TerminationConfig


class _FakeScontrol:
    """``scontrol`` answering from a script: ``show job`` prints ``job`` (its
    ``Restarts`` as ``restarts`` once ``requeue`` was called; an exception is
    raised), ``show partition`` its ``GraceTime`` (none when None), ``show config``
    its ``KillWait``, and ``requeue`` the next of ``answers`` (``(code, said)``)."""

    def __init__(self, job=None, answers=(), restarts=None, grace="20", kill_wait="10 sec"):
        self.job = {"JobId": "7", "Partition": "low"} if job is None else job
        self.answers = list(answers)
        self.restarts = restarts
        self.grace, self.kill_wait = grace, kill_wait
        self.requeues = 0
        self.calls = []

    def __call__(self, *args, timeout):
        assert timeout > 0
        self.calls.append((args, timeout))
        out = ""
        if args[:2] == ("show", "job"):
            if isinstance(self.job, Exception):
                raise self.job
            job = dict(self.job)
            if self.restarts is not None and self.requeues:
                job["Restarts"] = self.restarts
            out = " ".join(f"{k}={v}" for k, v in job.items()) + "\n"
        elif args[:2] == ("show", "partition"):
            grace = "" if self.grace is None else f" GraceTime={self.grace}"
            out = f"PartitionName={args[-1]}{grace} State=UP"
        elif args[:2] == ("show", "config"):
            out = f"KillWait                = {self.kill_wait}\n"
        else:
            assert args[0] == "requeue" and timeout >= 1.0
            self.requeues += 1
            code, said = self.answers.pop(0)
            return subprocess.CompletedProcess(args, code, "", said)
        return subprocess.CompletedProcess(args, 0, out, "")


def _job(monkeypatch, fake, read=True):
    """The process's job (``SLURM_JOB_ID`` 7) performed against ``fake``, its limits
    read first when ``read``."""
    monkeypatch.setattr(_slurm, "_scontrol", fake)
    monkeypatch.setattr(_slurm, "_job", None)
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    job = _slurm.the_job()
    if read:
        job._read()
    return job


def test_fields_of_scontrol_one_line_output(monkeypatch):
    """A value runs up to the next ``Key=`` (it may hold spaces): the core's read of
    the job's fields."""
    job = {
        "JobId": "7",
        "JobName": "tfh train",
        "UserId": "root(0)",
        "JobState": "RUNNING",
        "Requeue": "1",
        "Partition": "low",
        "Command": "/x/one node.sbatch",
        "EndTime": "None",
    }
    fake = _FakeScontrol(job)
    read = _job(monkeypatch, fake).limits
    assert (read.partition, read.requeue, read.end_time, read.error) == ("low", True, None, None)
    assert [args for args, _ in fake.calls] == [
        ("show", "job", "-o", "7"),
        ("show", "partition", "-o", "low"),
        ("show", "config"),
    ]


def _read(monkeypatch, end: str, grace: str, kill_wait: str):
    """The core's read of a job whose scontrol prints these."""
    fake = _FakeScontrol({"JobId": "7", "Partition": "low", "EndTime": end, "Requeue": "1"})
    fake.grace, fake.kill_wait = grace, kill_wait
    return _job(monkeypatch, fake).limits


def test_parse_time_and_seconds(monkeypatch):
    """SLURM's local timestamps and durations as the core reads them."""
    stamp = "2026-11-25T16:42:37"
    read = _read(monkeypatch, stamp, "30 sec", "00:00:20")
    assert read.end_time == time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S"))
    assert (read.grace_time, read.kill_wait, read.partition, read.requeue) == (30, 20, "low", True)
    for value in ("None", "Unknown", "N/A", ""):
        assert _read(monkeypatch, value, "20", "20").end_time is None
    assert _read(monkeypatch, stamp, "1-00:00:10", "UNLIMITED").grace_time == 86410
    assert _read(monkeypatch, stamp, "20", "UNLIMITED").kill_wait is None
    assert _read(monkeypatch, stamp, "20", "UNLIMITED").error is None


def test_a_job_that_cannot_be_read_ends_the_read(monkeypatch):
    """The job refused or its call failing: the read ends, naming why; no deadline
    comes of it."""
    read = _job(monkeypatch, _FakeScontrol(OSError("no scontrol"))).limits
    assert read.error == "OSError: no scontrol" and read.end_time is None


def test_requeue_switches(monkeypatch):
    monkeypatch.delenv(_slurm.REQUEUE_ENV, raising=False)
    assert _slurm.requeue_enabled(None) is True
    for off in ("0", "false", "OFF", "no"):
        monkeypatch.setenv(_slurm.REQUEUE_ENV, off)
        assert _slurm.requeue_enabled(None) is False
        assert _slurm.requeue_enabled(True) is True  # the config wins
    monkeypatch.setenv(_slurm.REQUEUE_ENV, "1")
    assert _slurm.requeue_enabled(False) is False
    assert TerminationConfig(slurm_requeue=False).slurm_requeue is False
    assert TerminationConfig().slurm_requeue is None
    with pytest.raises(TypeError):
        TerminationConfig(slurm_requeue="no")


def test_no_requeue_without_slurm_when_off_or_on_other_tasks(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert _slurm.requeue_after_save(None, None) is None
    monkeypatch.setenv("SLURM_JOB_ID", "99")
    assert _slurm.requeue_after_save(False, None) is None
    monkeypatch.setenv("SLURM_PROCID", "1")
    assert _slurm.requeue_after_save(None, None) is None


def test_notice_deadline_is_the_end_time_when_nothing_was_read(monkeypatch):
    """Nothing read of the job: no KillWait, so no kill is stated (none is assumed)."""
    _job(monkeypatch, _FakeScontrol(), read=False)
    now = time.time()
    assert _slurm.notice_deadlines(now + 50, now) == (now + 50, None)
    assert _slurm.notice_deadlines(now - 1, now) == (None, None)
    monkeypatch.delenv("SLURM_JOB_ID")
    assert _slurm.notice_deadlines(now + 50, now) == (now + 50, None), "not under SLURM"


def test_a_bad_requeue_variable_is_an_error_at_construction(monkeypatch, tmp_path):
    monkeypatch.setenv(_slurm.REQUEUE_ENV, "maybe")
    with pytest.raises(ValueError, match=_slurm.REQUEUE_ENV):
        _slurm.requeue_from_env()
    import tensorflow as tf
    from tf_failure_handling import PreemptionCheckpointHandler

    with pytest.raises(ValueError, match="maybe"):
        PreemptionCheckpointHandler(None, tf.train.Checkpoint(), str(tmp_path))
    for value, expected in (("YES", True), ("on", True), ("Off", False), ("", None)):
        monkeypatch.setenv(_slurm.REQUEUE_ENV, value)
        assert _slurm.requeue_from_env() is expected


def _read_job(monkeypatch, grace="20", kill_wait="10", end=None):
    """The job read with these limits; its ``show job`` prints ``fake.job`` after."""
    stamp = "Unknown" if end is None else _stamp(end)
    fake = _FakeScontrol({"JobId": "7", "Partition": "low", "EndTime": stamp}, grace=grace)
    fake.kill_wait = "UNLIMITED" if kill_wait is None else kill_wait
    _job(monkeypatch, fake)
    return fake


def _notice(end, at, sigterms):
    """``(deadline, kill)`` the job answers a notice at ``at`` with, ``sigterms`` the
    SIGTERMs this process caught so far (the event states them; ``notice_deadlines``
    leaves the count to the core)."""
    notice = _slurm.SlurmEvent.Notice(at, end, sigterms, _slurm.in_srun_step())
    return _slurm._deadlines(_slurm.the_job(), notice)


class _Sigterms:
    """Notices as the signals' thread makes them, each stating how many SIGTERMs this
    process caught so far (``notice_deadlines`` leaves that count to the core)."""

    def __init__(self) -> None:
        self.count = 0

    def new(self, end, at):
        """A notice of a new SIGTERM."""
        self.count += 1
        return _notice(end, at, self.count)

    def again(self, end, at):
        """A notice with no new SIGTERM (a SIGUSR1, the time limit's warning)."""
        return _notice(end, at, self.count)


def _stamp(unix: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(unix))


def test_sigterm_deadline_per_launch_form_and_cause(monkeypatch):
    now = float(int(time.time()))
    fake = _read_job(monkeypatch, grace="20", kill_wait="10")
    shown = fake.job = {"JobId": "7"}
    term = _Sigterms().new

    # The batch step: SIGTERM comes when the grace time is over; KillWait is left.
    monkeypatch.delenv("SLURM_STEP_ID", raising=False)
    shown.update(PreemptTime=_stamp(now - 20), StartTime=_stamp(now - 100))
    assert term(None, now) == (now + 10, now + 10)

    # An srun task of a preempted job: the grace time starts with the SIGTERM.
    monkeypatch.setenv("SLURM_STEP_ID", "0")
    shown.update(PreemptTime=_stamp(now), StartTime=_stamp(now - 100))
    # SLURM's second SIGTERM ends the grace time; its SIGKILL comes KillWait later.
    assert term(None, now) == (now + 20, now + 30)
    # ... read within the core's short bound.
    (args, timeout) = fake.calls[-1]
    assert args == ("show", "job", "-o", "7") and 0 < timeout <= 2
    # ... capped by the job's end (and its SIGKILL, KillWait after it).
    assert term(now + 15, now) == (now + 15, now + 25)

    # An srun task and a user's scancel (no PreemptTime, or one from an earlier run).
    shown.update(PreemptTime="None")
    assert term(None, now) == (now + 10, now + 10)
    shown.update(PreemptTime=_stamp(now - 500))
    assert term(None, now) == (now + 10, now + 10)

    # The job cannot be read in time: KillWait, the bound that always holds.
    fake.job = subprocess.TimeoutExpired("scontrol show job", 2)
    assert term(None, now) == (now + 10, now + 10)

    # A partition without a GraceTime is not read at all.
    fake = _read_job(monkeypatch, grace=None, kill_wait="10")
    calls = len(fake.calls)
    assert _Sigterms().new(None, now) == (now + 10, now + 10)
    assert len(fake.calls) == calls


def test_a_sigterm_seen_before_is_no_new_notice(monkeypatch):
    """The same SIGTERM count twice: the second notice is not a SIGTERM's (the job's
    end only)."""
    now = float(int(time.time()))
    _read_job(monkeypatch, end=now + 90)
    monkeypatch.delenv("SLURM_STEP_ID", raising=False)
    sigterms = _Sigterms()
    assert sigterms.new(None, now) == (now + 10, now + 10)
    assert sigterms.again(None, now) == (now + 90, now + 100)


def test_sigusr1_deadline_is_the_job_end(monkeypatch):
    now = float(int(time.time()))
    fake = _read_job(monkeypatch, end=now + 90)
    usr1 = _Sigterms().again
    # SLURM's SIGKILL comes KillWait (10 s) after the job's end: the kill.
    assert usr1(None, now) == (now + 90, now + 100)
    # The warning reads the job's end as it is now, within the notice's short bound: a
    # time limit changed since the start (scontrol update TimeLimit=) counts, and the
    # job's end as read wins over SLURM_JOB_END_TIME, which the update leaves as it was.
    (args, timeout) = fake.calls[-1]
    assert args == ("show", "job", "-o", "7") and 0 < timeout <= 2
    fake.job = dict(fake.job, EndTime=_stamp(now + 40))
    assert usr1(None, now) == (now + 40, now + 50)
    assert usr1(now + 60, now) == (now + 40, now + 50)
    # Unreadable: SLURM_JOB_END_TIME, else the end read at the start.
    fake.job = subprocess.TimeoutExpired("scontrol show job", 2)
    assert usr1(now + 60, now) == (now + 60, now + 70)
    assert usr1(None, now) == (now + 90, now + 100)
    _read_job(monkeypatch, end=now + 90, kill_wait=None)
    assert usr1(None, now) == (now + 90, None), "no KillWait: no kill"


def test_resume_fields_name_the_restart(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert _slurm.PLATFORM.resume_fields(None) == {}
    monkeypatch.setenv("SLURM_JOB_ID", "12")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    assert _slurm.PLATFORM.resume_fields(None) == {"slurm_job_id": "12", "slurm_restart_count": 2}


BUSY = "slurm_requeue error: Socket timed out on send/recv operation"
#: Preempted in this run.
PREEMPTED = {"JobId": "7", "Restarts": "0", "PreemptTime": "2026-11-25T16:42:37"}


def _requeue(monkeypatch, fake):
    """The core's requeue by task 0 (no time-limit signal), performed against
    ``fake``: the ``Requeued`` outcome."""
    job = _job(monkeypatch, fake, read=False)
    return _slurm._perform(job.core, _slurm.SlurmEvent.Requeue(True, None, False))


@pytest.mark.parametrize(
    "answers, restarts, expected, calls",
    [
        # The controller did not answer in time, then did: requeued by the second call.
        ([(1, BUSY), (0, "")], "0", True, 2),
        # It did not answer, but acted on the request: the job shows requeued.
        ([(1, BUSY)], "1", True, 1),
        # A refusal is final: not tried again.
        ([(1, "slurm_requeue error: Invalid job id specified")], "0", False, 1),
    ],
)
def test_requeue_tries_again_while_the_controller_is_busy(
    monkeypatch, answers, restarts, expected, calls
):
    fake = _FakeScontrol(dict(PREEMPTED), answers, restarts)
    done = _requeue(monkeypatch, fake)
    assert (done.requeued, fake.requeues) == (expected, calls), done.message
    if restarts == "1":
        assert "all the same" in done.message


def test_requeue_gives_up_on_a_busy_controller_within_its_bound(monkeypatch):
    """The core's bound (30 s, ``src/sources/slurm.rs``; its table of attempts and
    pauses is ``RequeueRun``'s Rust tests): a controller that stays busy is given up
    on once it passed, with scontrol's last message."""
    fake = _FakeScontrol(dict(PREEMPTED), [(1, BUSY)] * 1000, "0")
    started = time.monotonic()
    done = _requeue(monkeypatch, fake)
    took = time.monotonic() - started
    assert done.requeued is False and "Socket timed out" in done.message and fake.requeues >= 4
    assert 29.0 < took < 45.0, took


def test_a_requeue_that_cannot_run_is_not_tried_again(monkeypatch):
    """``scontrol`` cannot be started: not requeued, once."""

    class Missing(_FakeScontrol):
        def __call__(self, *args, timeout):
            if args[0] == "requeue":
                self.requeues += 1
                raise FileNotFoundError("scontrol is not on PATH")
            return super().__call__(*args, timeout=timeout)

    fake = Missing(dict(PREEMPTED))
    done = _requeue(monkeypatch, fake)
    assert (done.requeued, fake.requeues) == (False, 1)
    assert "could not run" in done.message and "not on PATH" in done.message


class _Records:
    """A recorder that keeps the ``requeue`` line it is given."""

    def __init__(self):
        self.lines = []

    def write(self, kind, **fields):
        self.lines.append((kind, fields))

    def close(self):
        pass


@pytest.mark.parametrize(
    "job, usr1, requeues, expected, reason, said",
    [
        # A preemption (PreemptTime set): scontrol requeue.
        ({"PreemptTime": "2026-11-25T16:42:37", "Requeue": "1"}, 0, 1, True, "preemption", ""),
        # The time limit's SIGUSR1 names the reason first.
        ({"PreemptTime": "2026-11-25T16:42:37"}, 1, 1, True, "time limit (SIGUSR1)", ""),
        # SLURM requeued the job itself: Restarts is past this run's count.
        ({"Restarts": "1"}, 0, 0, True, "preemption", "already requeued"),
        # A user's scancel: neither.
        ({"Requeue": "1"}, 0, 0, False, None, "neither"),
        # Submitted without --requeue.
        (
            {"PreemptTime": "2026-11-25T16:42:37", "Requeue": "0"},
            0,
            0,
            False,
            "preemption",
            "Requeue=0",
        ),
    ],
)
def test_the_cores_requeue_decision_is_carried_out(
    monkeypatch, job, usr1, requeues, expected, reason, said
):
    """Each decision of the core (``src/sources/slurm.rs``, ``requeue``) as task 0
    carries it out: whether ``scontrol requeue`` runs, the outcome, and the record."""
    fake = _FakeScontrol({"JobId": "7", "JobState": "RUNNING", **job}, [(0, "")])
    the_job = _job(monkeypatch, fake, read=False)
    monkeypatch.delenv("SLURM_PROCID", raising=False)
    records = _Records()
    # Task 0 (no SLURM_PROCID), the requeue on; whether a SIGUSR1 was caught stated.
    requeue = _slurm.SlurmEvent.Requeue(True, None, usr1 > 0)
    assert _slurm._requeued(the_job, requeue, records)[0] is expected
    assert fake.requeues == requeues
    ((kind, fields),) = records.lines
    assert kind == "requeue" and fields["requeued"] is expected and fields["reason"] == reason
    assert said in (fields["message"] or "")
    assert fields["job_state"] == "RUNNING"
