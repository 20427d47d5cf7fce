"""``tf_failure_handling._slurm`` without a SLURM: parsing, the switches, who requeues."""

from __future__ import annotations

import time

import pytest
from tf_failure_handling import _slurm
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


def test_parse_time_and_seconds():
    stamp = "2026-11-25T16:42:37"
    assert _slurm.parse_time(stamp) == time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S"))
    for value in ("None", "Unknown", "N/A", "", None):
        assert _slurm.parse_time(value) is None
    assert _slurm.parse_seconds("30 sec") == 30
    assert _slurm.parse_seconds("00:00:20") == 20
    assert _slurm.parse_seconds("1-00:00:10") == 86410
    assert _slurm.parse_seconds("20") == 20
    assert _slurm.parse_seconds("UNLIMITED") is None


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


class _Handler:
    def __init__(self, option=None):
        self._slurm_requeue = option
        self._records = None


def test_no_requeue_without_slurm_when_off_or_on_other_tasks(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert _slurm.requeue_after_save(_Handler()) is None
    monkeypatch.setenv("SLURM_JOB_ID", "99")
    assert _slurm.requeue_after_save(_Handler(option=False)) is None
    monkeypatch.setenv("SLURM_PROCID", "1")
    assert _slurm.requeue_after_save(_Handler()) is None


def test_notice_deadline_is_the_end_time_when_nothing_was_read():
    now = time.time()
    assert _slurm.notice_deadline(now + 50, now) == now + 50
    assert _slurm.notice_deadline(now - 1, now) is None
