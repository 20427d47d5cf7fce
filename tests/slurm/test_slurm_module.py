"""``tf_failure_handling._slurm`` without a SLURM: parsing, the switches, who requeues."""

from __future__ import annotations

import collections
import subprocess
import time

import pytest
from tf_failure_handling._platforms import slurm as _slurm
from tf_failure_handling.handler import TerminationConfig


def test_parse_fields_of_scontrol_one_line_output():
    line = (
        "JobId=7 JobName=tfh train UserId=root(0) JobState=RUNNING Reason=None "
        "Requeue=1 Restarts=2 EndTime=2026-11-25T16:42:37 PreemptTime=None "
        "Command=/x/one node.sbatch WorkDir=/tmp"
    )
    f = _slurm.parse_fields(line)
    assert f["JobId"] == "7" and f["JobName"] == "tfh train"
    assert f["Requeue"] == "1" and f["Restarts"] == "2" and f["PreemptTime"] == "None"
    assert f["Command"] == "/x/one node.sbatch" and f["WorkDir"] == "/tmp"


_Read = collections.namedtuple("_Read", "end_time partition grace_time kill_wait requeue error")


def _read(end: str, grace: str, kill_wait: str):
    """The core's read of a job whose scontrol prints these (``slurm_job_read``)."""
    answers = [
        f"JobId=7 Partition=low EndTime={end} Requeue=1",
        f"PartitionName=low GraceTime={grace}",
        f"KillWait                = {kill_wait}\n",
    ]

    outputs = []
    while True:
        call, facts = _slurm.slurm_job_read("7", outputs)
        if call is None:
            return _Read(*facts)
        args, timeout = call
        assert args[:2] in (["show", "job"], ["show", "partition"], ["show", "config"])
        assert timeout > 0
        outputs.append((0, answers.pop(0), ""))


def test_parse_time_and_seconds():
    """SLURM's local timestamps and durations as the core reads them."""
    stamp = "2026-11-25T16:42:37"
    read = _read(stamp, "30 sec", "00:00:20")
    assert read.end_time == time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S"))
    assert (read.grace_time, read.kill_wait, read.partition, read.requeue) == (30, 20, "low", True)
    for value in ("None", "Unknown", "N/A", ""):
        assert _read(value, "20", "20").end_time is None
    assert _read(stamp, "1-00:00:10", "UNLIMITED").grace_time == 86410
    assert _read(stamp, "20", "UNLIMITED").kill_wait is None
    assert _read(stamp, "20", "UNLIMITED").error is None


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
    monkeypatch.setattr(_slurm, "_info", None)
    now = time.time()
    assert _slurm.notice_deadlines(now + 50, now) == (now + 50, None)
    assert _slurm.notice_deadlines(now - 1, now) == (None, None)


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


def _read_job(grace=20.0, kill_wait=10.0, end=None):
    info = _slurm.JobInfo("7")
    info.grace_time, info.kill_wait, info.end_time = grace, kill_wait, end
    info.done.set()
    return info


@pytest.fixture
def sigterms(monkeypatch):
    """A new SIGTERM for each notice_deadlines call; the job as read is settable."""
    count = {"term": 0}

    def deliveries(signum):
        if signum == _slurm.signal.SIGTERM:
            count["term"] += 1
            return count["term"]
        return 0

    monkeypatch.setattr(_slurm, "_deliveries", deliveries)
    monkeypatch.setattr(_slurm, "_seen_term", 0)
    return monkeypatch


def _stamp(unix: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(unix))


def test_sigterm_deadline_per_launch_form_and_cause(sigterms):
    now = float(int(time.time()))
    shown = {}
    sigterms.setattr(_slurm, "show_job", lambda jid, timeout: dict(shown))
    sigterms.setattr(_slurm, "_info", _read_job(grace=20.0, kill_wait=10.0))

    # The batch step: SIGTERM comes when the grace time is over; KillWait is left.
    sigterms.delenv("SLURM_STEP_ID", raising=False)
    shown.update(PreemptTime=_stamp(now - 20), StartTime=_stamp(now - 100))
    assert _slurm.notice_deadlines(None, now) == (now + 10, now + 10)

    # An srun task of a preempted job: the grace time starts with the SIGTERM.
    sigterms.setenv("SLURM_STEP_ID", "0")
    shown.update(PreemptTime=_stamp(now), StartTime=_stamp(now - 100))
    # SLURM's second SIGTERM ends the grace time; its SIGKILL comes KillWait later.
    assert _slurm.notice_deadlines(None, now) == (now + 20, now + 30)
    # ... capped by the job's end (and its SIGKILL, KillWait after it).
    assert _slurm.notice_deadlines(now + 15, now) == (now + 15, now + 25)

    # An srun task and a user's scancel (no PreemptTime, or one from an earlier run).
    shown.update(PreemptTime="None")
    assert _slurm.notice_deadlines(None, now) == (now + 10, now + 10)
    shown.update(PreemptTime=_stamp(now - 500))
    assert _slurm.notice_deadlines(None, now) == (now + 10, now + 10)

    # The job cannot be read in time: KillWait, the bound that always holds.
    def unreadable(jid, timeout):
        raise TimeoutError("scontrol show job")

    sigterms.setattr(_slurm, "show_job", unreadable)
    assert _slurm.notice_deadlines(None, now) == (now + 10, now + 10)

    # A partition without a GraceTime is not read at all.
    sigterms.setattr(_slurm, "_info", _read_job(grace=None, kill_wait=10.0))
    assert _slurm.notice_deadlines(None, now) == (now + 10, now + 10)


def test_sigusr1_deadline_is_the_job_end(sigterms):
    now = time.time()
    sigterms.setattr(_slurm, "_info", _read_job(end=now + 90))
    sigterms.setattr(_slurm, "_deliveries", lambda signum: 0)
    # SLURM's SIGKILL comes KillWait (10 s) after the job's end: the kill.
    assert _slurm.notice_deadlines(None, now) == (now + 90, now + 100)
    assert _slurm.notice_deadlines(now + 60, now) == (now + 60, now + 70)  # SLURM_JOB_END_TIME wins
    sigterms.setattr(_slurm, "_info", _read_job(end=now + 90, kill_wait=None))
    assert _slurm.notice_deadlines(None, now) == (now + 90, None), "no KillWait: no kill"


def test_resume_fields_name_the_restart(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert _slurm.PLATFORM.resume_fields(None) == {}
    monkeypatch.setenv("SLURM_JOB_ID", "12")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    assert _slurm.PLATFORM.resume_fields(None) == {"slurm_job_id": "12", "slurm_restart_count": 2}


class _FakeScontrol:
    """``scontrol requeue`` answering from a script; ``show_job`` from ``restarts``."""

    def __init__(self, answers, restarts="0"):
        self.answers = list(answers)
        self.restarts = restarts
        self.requeues = 0

    def __call__(self, *args, timeout):
        assert args[0] == "requeue" and timeout >= 1.0
        self.requeues += 1
        code, said = self.answers.pop(0)
        return subprocess.CompletedProcess(args, code, "", said)

    def show_job(self, jid, timeout):
        # Preempted in this run; Restarts as set once scontrol requeue was called.
        restarts = self.restarts if self.requeues else "0"
        return {"JobId": jid, "Restarts": restarts, "PreemptTime": "2026-11-25T16:42:37"}


BUSY = "slurm_requeue error: Socket timed out on send/recv operation"


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
    fake = _FakeScontrol(answers, restarts)
    monkeypatch.setattr(_slurm, "_scontrol", fake)
    monkeypatch.setattr(_slurm, "show_job", fake.show_job)
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    requeued, message, *_ = _slurm._requeue("7", False, None)
    assert (requeued, fake.requeues) == (expected, calls), message
    if restarts == "1":
        assert "all the same" in message


def test_requeue_gives_up_on_a_busy_controller_within_its_bound(monkeypatch):
    """The core's bound (30 s, ``src/sources/slurm.rs``; its table of attempts and
    pauses is ``RequeueRun``'s Rust tests): a controller that stays busy is given up
    on once it passed, with scontrol's last message."""
    fake = _FakeScontrol([(1, BUSY)] * 1000)
    monkeypatch.setattr(_slurm, "_scontrol", fake)
    monkeypatch.setattr(_slurm, "show_job", fake.show_job)
    started = time.monotonic()
    requeued, message, *_ = _slurm._requeue("7", False, None)
    took = time.monotonic() - started
    assert requeued is False and "Socket timed out" in message and fake.requeues >= 4
    assert 29.0 < took < 45.0, took


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
    fake = _FakeScontrol([(0, "")])
    monkeypatch.setattr(_slurm, "_scontrol", fake)
    monkeypatch.setattr(_slurm, "show_job", lambda jid, timeout: {"JobId": jid, **job})
    monkeypatch.setattr(_slurm, "_deliveries", lambda signum: usr1)
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.delenv("SLURM_PROCID", raising=False)
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    monkeypatch.delenv(_slurm.REQUEUE_ENV, raising=False)
    records = _Records()
    assert _slurm.requeue_after_save(None, records) is expected
    assert fake.requeues == requeues
    ((kind, fields),) = records.lines
    assert kind == "requeue" and fields["requeued"] is expected and fields["reason"] == reason
    assert said in (fields["message"] or "")
