"""Preemption records (issue 22): written by the handler, read back, reported.

Success for each test is stated in its name: the fields a preemption writes match
what happened (agreed step == the checkpoint's step, save end before exit), a kill
or a cut-off line leaves a readable file, an unwritable folder does not stop
training, and ``report`` answers every bad input in one line with a non-zero exit.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from tf_failure_handling import TerminationConfig, records, report, testing

from .conftest import BLOCK_TENSORFLOW, wait_for_attention, wait_until
from .test_handler_local import _train


def _preempt(make_handler, tmp_path, notice_at: int = 5, config=None):
    w = testing.FakeVariable(0)
    h = make_handler(testing.FakeCheckpoint(w=w), tmp_path / "ckpt", config)
    _train(h, w, notice_at)
    h._notify_termination()
    wait_for_attention(h)
    with pytest.raises(SystemExit) as exc:
        _train(h, w, notice_at + 100)
    assert exc.value.code == 42
    return h, w


def test_a_local_preemption_writes_every_stage_with_the_saved_step(make_handler, tmp_path):
    _, w = _preempt(make_handler, tmp_path, notice_at=5)
    found = records.load(tmp_path / "ckpt" / "preemption_records")
    assert found.skipped == {}
    [p] = found.preemptions
    assert (p.job, p.task) == ("local", 0)
    assert p.source == "a termination source"
    assert p.agreed_step == 6 == w.numpy(), "the agreed step is the checkpoint's step"
    assert p.proposer == "local 0"
    assert p.notice_time <= p.agreement_time <= p.save_start <= p.save_end <= p.exit_time
    assert p.exit_code == 42
    assert p.checkpoint_path and "ckpt" in p.checkpoint_path
    assert p.deadline is None and p.margin is None
    assert p.grace_period == 0.0


def test_the_restart_writes_resumed_with_no_step_lost(make_handler, tmp_path):
    _preempt(make_handler, tmp_path, notice_at=5)
    before = time.time()
    w = testing.FakeVariable(0)
    h2 = make_handler(testing.FakeCheckpoint(w=w), tmp_path / "ckpt")
    assert h2.total_run_calls == 6
    found = records.load(tmp_path / "ckpt" / "preemption_records")
    [resume] = found.resumes
    assert resume.step == 6 and resume.lost == 0
    assert 0 <= resume.downtime <= time.time() - found.preemptions[0].exit_time + 1
    assert resume.time >= before
    # A second handler of the same run (tf_keras makes several) writes no second one.
    make_handler(testing.FakeCheckpoint(w=testing.FakeVariable(0)), tmp_path / "ckpt")
    assert len(records.load(tmp_path / "ckpt" / "preemption_records").resumes) == 1


def test_a_deadline_gives_a_margin(make_handler, tmp_path):
    w = testing.FakeVariable(0)
    h = make_handler(testing.FakeCheckpoint(w=w), tmp_path / "ckpt")
    _train(h, w, 3)
    h._notify_termination(deadline=h._clock() + 30.0)
    wait_for_attention(h)
    with pytest.raises(SystemExit):
        _train(h, w, 100)
    [p] = records.load(tmp_path / "ckpt" / "preemption_records").preemptions
    assert p.deadline is not None
    assert 0 < p.margin <= 30.0, "the save made it: margin >= 0"


def test_records_dir_is_configurable_and_false_turns_records_off(make_handler, tmp_path):
    _preempt(make_handler, tmp_path, config=TerminationConfig(records_dir=tmp_path / "elsewhere"))
    assert len(records.load(tmp_path / "elsewhere").preemptions) == 1
    _preempt(make_handler, tmp_path / "b", config=TerminationConfig(records_dir=False))
    assert not (tmp_path / "b" / "ckpt" / "preemption_records").exists()
    with pytest.raises(TypeError, match="records_dir"):
        TerminationConfig(records_dir=3)


def test_the_environment_variable_sets_the_folder(make_handler, tmp_path, monkeypatch):
    monkeypatch.setenv(records.RECORDS_DIR_ENV, str(tmp_path / "env"))
    _preempt(make_handler, tmp_path)
    assert len(records.load(tmp_path / "env").preemptions) == 1


def test_an_unwritable_folder_warns_and_training_goes_on(make_handler, tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    config = TerminationConfig(records_dir=blocker / "records")
    with caplog.at_level("WARNING", logger="tf_failure_handling"):
        _, w = _preempt(make_handler, tmp_path, config=config)
    assert w.numpy() == 6, "the save and the exit happened all the same"
    assert sum("Cannot write preemption records" in r.message for r in caplog.records) == 1


def test_load_skips_a_cut_off_last_line_and_keeps_newer_fields(tmp_path):
    lines = [
        {
            "schema": 1,
            "stage": "notice",
            "time": 1.0,
            "job": "worker",
            "task": 0,
            "preemption": "a",
            "source": "SIGTERM",
        },
        {
            "schema": 2,
            "stage": "save_end",
            "time": 2.0,
            "job": "worker",
            "task": 0,
            "preemption": "a",
            "path": "/c/ckpt-1",
            "shiny": "new",
        },
    ]
    text = "".join(json.dumps(x) + "\n" for x in lines) + '{"schema": 1, "stage": "ex'
    (tmp_path / "worker-0.jsonl").write_text(text + "\n" + "garbage\n" + '{"schema": 1, "st')
    found = records.load(tmp_path)
    [p] = found.preemptions
    assert p.source == "SIGTERM" and p.save_end == 2.0 and p.extra == {"shiny": "new"}
    assert found.skipped == {str(tmp_path / "worker-0.jsonl"): [3, 4, 5]}


KILLED_WRITER = (
    BLOCK_TENSORFLOW
    + """
import sys
from tf_failure_handling import records
r = records.Recorder(sys.argv[1], "worker", 0)
r.new_preemption()
print("go", flush=True)
i = 0
while True:
    r.write("notice", source="x" * (i % 5000), n=i)
    i += 1
"""
)


def test_a_kill_minus_9_while_writing_leaves_whole_lines(tmp_path):
    path = tmp_path / "worker-0.jsonl"
    with subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True
    ) as proc:
        assert proc.stdout.readline().strip() == "go"
        wait_until(lambda: path.exists() and path.stat().st_size > 2_000_000, 60, "2 MB of records")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    found = records.load(tmp_path)
    [p] = found.preemptions
    assert p.source is not None
    bad = found.skipped.get(str(path), [])
    total = path.read_bytes().count(b"\n")
    assert bad in ([], [total + 1]), "at most the last, cut-off line is skipped"


def _report(*args):
    return subprocess.run(
        [sys.executable, "-m", "tf_failure_handling", "report", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("what", ["missing", "empty", "garbage"])
def test_report_on_bad_input_says_so_in_one_line(tmp_path, what):
    path = tmp_path / "records"
    if what == "empty":
        path.mkdir()
    elif what == "garbage":
        path.write_bytes(os.urandom(300) + b"\nnot json\n")
    done = _report(path)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert str(path) in done.stderr


def test_report_prints_one_row_per_preemption_and_totals(make_handler, tmp_path):
    _preempt(make_handler, tmp_path, notice_at=5)
    make_handler(testing.FakeCheckpoint(w=testing.FakeVariable(0)), tmp_path / "ckpt")
    folder = tmp_path / "ckpt" / "preemption_records"
    done = _report(folder)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split()[:3] == ["when", "(UTC)", "source"]
    assert "a termination source" in lines[1] and " 6 " in lines[1]
    assert "1 preemption(s)" in done.stdout and "0 step(s) lost" in done.stdout
    as_json = json.loads(_report(folder, "--json").stdout)
    [row] = as_json["preemptions"]
    assert row["agreed_step"] == 6 and row["steps_lost"] == 0
    assert row["downtime_seconds"] is not None and row["downtime_seconds"] >= 0
    assert as_json["totals"]["preemptions"] == 1


def test_report_draws_the_timeline(make_handler, tmp_path):
    pytest.importorskip("matplotlib", reason="the plot extra")
    _preempt(make_handler, tmp_path, notice_at=5)
    make_handler(testing.FakeCheckpoint(w=testing.FakeVariable(0)), tmp_path / "ckpt")
    out = tmp_path / "timeline.png"
    done = _report(tmp_path / "ckpt" / "preemption_records", "--plot", out)
    assert done.returncode == 0, done.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert str(out) in done.stderr


def test_report_without_matplotlib_says_how_to_install_it(make_handler, tmp_path, monkeypatch):
    _preempt(make_handler, tmp_path, notice_at=2)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    code = report.main([str(tmp_path / "ckpt" / "preemption_records"), "--plot", "x.png"])
    assert code == 3


def test_last_exit_reads_only_the_tasks_own_preemptions(tmp_path):
    """Issue 32, item 8: a coordinator's file holds the lines it wrote for its tasks. A
    coordinator restarted after a worker's drain must not take the worker's exit for
    its own (its ``resumed`` line had the worker's preemption and downtime)."""
    folder = tmp_path / "preemption_records"
    rec = records.Recorder(str(folder), "chief", 0)
    rec.new_preemption()
    rec.write("notice", source="signal SIGTERM")
    rec.write("exit", code=42, time=100.0)
    rec.write("notice", preemption="worker-1-x", as_job="worker", as_task=1, source="w")
    rec.write("exit", preemption="worker-1-x", as_job="worker", as_task=1, code=42, time=200.0)
    rec.close()
    own = records.last_exit(str(folder), "chief", 0)
    assert own is not None and own.exit_time == 100.0 and own.job == "chief", own
    # Nothing of the chief's own: None, not the worker's.
    rec = records.Recorder(str(tmp_path / "other"), "chief", 0)
    rec.write("exit", preemption="worker-1-y", as_job="worker", as_task=1, code=42)
    rec.close()
    assert records.last_exit(str(tmp_path / "other"), "chief", 0) is None
