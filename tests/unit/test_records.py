"""Preemption records (issue 22): written by the handler, read back, reported.

Success for each test is stated in its name: the fields a preemption writes match
what happened (agreed step == the checkpoint's step, save end before exit), a kill
or a cut-off line leaves a readable file, an unwritable folder does not stop
training, and ``report`` answers every bad input in one line with a non-zero exit.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Optional

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tf_failure_handling import TerminationConfig, _record_paths, records, report, testing

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
    h._notify_termination(deadline=time.monotonic() + 30.0)
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


# ------------------------------------------------------------------ issue 33


class FakeStore:
    """A dict-backed object store in the shape of ``tf.io.gfile`` (no append): what
    ``records`` writes to ``mem://`` goes here. ``gate``, when set, holds every write
    until it is opened."""

    def __init__(self) -> None:
        self.objects: dict = {}
        self.folders: set = set()
        self.gate: Optional[threading.Event] = None
        self.writes = 0

    def makedirs(self, path):
        self.folders.add(path.rstrip("/"))

    def exists(self, path):
        return path in self.objects or self.isdir(path)

    def isdir(self, path):
        path = path.rstrip("/")
        return path in self.folders or any(k.startswith(path + "/") for k in self.objects)

    def listdir(self, path):
        path = path.rstrip("/") + "/"
        if not self.isdir(path):
            raise OSError(f"not found: {path}")
        return sorted({k[len(path) :].split("/")[0] for k in self.objects if k.startswith(path)})

    def GFile(self, path, mode="rb"):
        store = self

        class _F(io.BytesIO):
            def __exit__(self, *exc):
                if "w" in mode:
                    if store.gate is not None:
                        assert store.gate.wait(30), "the test never opened the gate"
                    store.objects[path] = self.getvalue()
                    store.writes += 1
                return super().__exit__(*exc)

        if "w" in mode:
            return _F()
        if path not in self.objects:
            raise OSError(f"not found: {path}")
        return _F(self.objects[path])


@pytest.fixture
def store(monkeypatch):
    s = FakeStore()
    # The one place both the writer (records) and the reader (_record_reading) reach
    # tf.io.gfile through.
    monkeypatch.setattr(_record_paths, "_gfile", lambda: s)
    return s


def test_a_path_with_a_scheme_writes_objects_there_and_nothing_local(
    make_handler, tmp_path, store, monkeypatch
):
    """Item 1: before, ``mem://bucket/r`` made ``./mem:/bucket/r`` on the local disk."""
    monkeypatch.chdir(tmp_path)
    config = TerminationConfig(records_dir="mem://bucket/run/preemption_records")
    _, w = _preempt(make_handler, tmp_path, notice_at=5, config=config)
    assert not (tmp_path / "mem:").exists(), "nothing on the local disk"
    names = sorted(store.objects)
    assert names and all(
        n.startswith("mem://bucket/run/preemption_records/local-0/") for n in names
    )
    stages = [n.rsplit("-", 1)[1] for n in names]
    assert stages == [
        "notice.json",
        "agreement.json",
        "save_start.json",
        "save_end.json",
        "exit.json",
    ], "one object per line, named in write order, each whole"
    found = records.load("mem://bucket/run/preemption_records")
    assert found.skipped == {}
    [p] = found.preemptions
    assert p.agreed_step == 6 == w.numpy() and p.exit_code == 42
    # The restart reads the objects and writes `resumed` (on the writer thread).
    h2 = make_handler(testing.FakeCheckpoint(w=testing.FakeVariable(0)), tmp_path / "ckpt", config)
    assert h2._records.flush(10)
    [resume] = records.load("mem://bucket/run/preemption_records").resumes
    assert resume.step == 6 and resume.lost == 0


def test_the_default_folder_follows_a_checkpoint_path_with_a_scheme():
    assert records.folder_for("gs://b/ckpt") == "gs://b/ckpt/preemption_records"
    assert records.folder_for("gs://b/ckpt/") == "gs://b/ckpt/preemption_records"
    assert not records.is_local("gs://b/x") and not records.is_local("ram://x")
    assert records.is_local("/tmp/x") and records.is_local("file:///tmp/x")


def test_a_local_line_is_fsynced_before_write_returns(tmp_path, monkeypatch):
    """Item 2: each line is on the disk (fsync) when ``write`` returns, and the new
    file's name is made durable in its folder."""
    synced: list = []
    real = os.fsync

    def fsync(fd):
        synced.append(os.fstat(fd).st_size if not os.path.isdir(f"/proc/self/fd/{fd}") else "dir")
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    rec = records.Recorder(str(tmp_path / "r"), "worker", 0)
    rec.new_preemption()
    rec.write("notice", source="SIGTERM")
    size = (tmp_path / "r" / "worker-0.jsonl").stat().st_size
    assert synced == ["dir", size], "the folder once, then the line with all its bytes"
    rec.write("exit", code=42)
    assert synced[-1] == (tmp_path / "r" / "worker-0.jsonl").stat().st_size
    rec.close()


def test_an_object_store_line_never_waits_and_close_waits_for_it(store, caplog, monkeypatch):
    """Item 2 on an object store: the stage does not wait for the store; ``close``
    (before ``exit_fn``) waits until every line is a complete object, within its bound."""
    store.gate = threading.Event()
    rec = records.Recorder("mem://b/r", "worker", 1)
    rec.new_preemption()
    rec.write("notice", source="SIGTERM")
    rec.write("save_start", step=3)
    assert store.writes == 0, "write returned before the store took the line"
    closer = threading.Thread(target=rec.close)
    closer.start()
    closer.join(0.2)
    assert closer.is_alive(), "close waits for the queued lines"
    store.gate.set()
    closer.join(30)
    assert not closer.is_alive() and store.writes == 2
    assert [p.agreed_step for p in records.load("mem://b/r").preemptions] == [3]
    # A store that never answers: close gives up at its bound and says so.
    store.gate = threading.Event()
    # The core's bound is 10 s (src/records.rs): the test's wait is cut to 0.2 s.
    monkeypatch.setattr(records, "_bound", lambda timeout=None: 0.2)
    rec.write("exit", code=42)
    with caplog.at_level("WARNING", logger="tf_failure_handling"):
        rec.close()
    assert any("not written to mem://b/r within" in r.message for r in caplog.records)
    store.gate.set()


def test_an_object_store_that_fails_warns_once_and_training_goes_on(store, caplog):
    def broken(path):
        raise OSError("permission denied")

    store.makedirs = broken
    rec = records.Recorder("mem://b/r", "worker", 0)
    with caplog.at_level("WARNING", logger="tf_failure_handling"):
        rec.write("notice")
        rec.write("exit", code=42)
        rec.close()
    assert sum("Cannot write preemption records" in r.message for r in caplog.records) == 1


BAD_LINES = [
    {"task": [0]},
    {"time": "x"},
    {"time": None},
    {"time": float("nan")},
    {"time": 1e300},
    {"time": -5},
    {"time": True},
    {"job": 3},
    {"job": None},
    {"step": "6"},
    {"step": 6.5},
    {"deadline": "soon"},
    {"grace_period": -1},
    {"downtime": [1]},
    {"code": [42]},
    {"pid": "1"},
    {"source": {"a": 1}},
]


def _line(**changes):
    line = {
        "schema": 1,
        "stage": "exit",
        "time": 1_700_000_000.0,
        "job": "worker",
        "task": 0,
        "preemption": "p",
        "code": 42,
    }
    line.update(changes)
    return {k: v for k, v in line.items() if v is not _DROP}


_DROP = object()


@pytest.mark.parametrize("change", BAD_LINES, ids=lambda c: json.dumps(c, default=str))
def test_a_line_of_the_wrong_shape_is_skipped_and_counted(tmp_path, change):
    """Item 3: valid JSON with wrong types made ``load`` raise ``TypeError``."""
    good = _line(stage="notice", time=1_699_999_990.0)
    text = json.dumps(good) + "\n" + json.dumps(_line(**change)) + "\n" + json.dumps(_line()) + "\n"
    (tmp_path / "worker-0.jsonl").write_text(text)
    found = records.load(tmp_path)
    assert found.skipped == {str(tmp_path / "worker-0.jsonl"): [2]}
    [p] = found.preemptions
    assert p.exit_code == 42 and p.notice_time == 1_699_999_990.0
    assert report.main([str(tmp_path)]) == 0


def test_lines_that_are_not_records_are_skipped(tmp_path):
    bad = [b"[1, 2]", b"null", b'"text"', b"[" * 100_000 + b"]" * 100_000, b"\xff\xfe{", b"{}"]
    bad.append(json.dumps(_line(stage=_DROP)).encode())
    bad.append(json.dumps(_line(task=_DROP)).encode())
    (tmp_path / "worker-0.jsonl").write_bytes(b"\n".join(bad) + b"\n")
    found = records.load(tmp_path)
    assert found.skipped == {str(tmp_path / "worker-0.jsonl"): list(range(1, len(bad) + 1))}
    assert found.preemptions == [] and found.resumes == []


def test_a_handler_is_built_whatever_its_record_file_holds(make_handler, tmp_path):
    """Item 3: the resume record read a file that raised ``TypeError`` at construction."""
    folder = tmp_path / "ckpt" / "preemption_records"
    folder.mkdir(parents=True)
    lines = [_line(stage="exit", time="x"), _line(task=[0]), {"stage": "exit", "job": "local"}]
    (folder / "local-0.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    w = testing.FakeVariable(0)
    h = make_handler(testing.FakeCheckpoint(w=w), tmp_path / "ckpt")
    _train(h, w, 3)
    assert records.load(folder).resumes == [], "nothing of the bad lines was taken for an exit"


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    lines=st.lists(
        st.one_of(
            st.fixed_dictionaries(
                {
                    "stage": st.sampled_from([*records.STAGES, "other", 3, None]),
                    "time": st.one_of(st.floats(), st.integers(), st.text(max_size=3), st.none()),
                    "job": st.one_of(st.text(max_size=5), st.integers(), st.none()),
                    "task": st.one_of(st.integers(), st.text(max_size=3), st.lists(st.integers())),
                },
                optional={
                    name: st.recursive(
                        st.none()
                        | st.booleans()
                        | st.floats()
                        | st.integers()
                        | st.text(max_size=5),
                        lambda inner: (
                            st.lists(inner, max_size=3)
                            | st.dictionaries(st.text(max_size=3), inner, max_size=3)
                        ),
                        max_leaves=5,
                    )
                    for name in [*records.FIELDS, "extra_field"]
                    if name not in ("stage", "time", "job", "task")
                },
            ).map(json.dumps),
            st.binary(max_size=40).map(lambda b: b.decode("latin-1")),
        ),
        max_size=12,
    ),
    ending=st.sampled_from(["\n", "", '\n{"sta']),
)
def test_report_never_raises_for_any_line(tmp_path_factory, lines, ending, capsys):
    """Item 3: ``report`` and ``load`` end in a table or one line, for any lines."""
    folder = tmp_path_factory.mktemp("r")
    text = "\n".join(line.replace("\n", " ") for line in lines) + ending
    (folder / "worker-0.jsonl").write_bytes(text.encode("utf-8", "surrogatepass"))
    for args in ([str(folder)], [str(folder), "--json"]):
        code = report.main(args)
        out, err = capsys.readouterr()
        assert code in (0, 1), (code, err)
        if code == 1:
            assert out == "" and len(err.strip().splitlines()) == 1, err
        else:
            assert "report:" not in out


def test_a_short_write_does_not_swallow_the_restarts_first_line(make_handler, tmp_path):
    """Item 4: a process killed in a write leaves a line without its newline; the
    restarted process's ``resumed`` line was appended to it and lost."""
    _preempt(make_handler, tmp_path, notice_at=5)
    path = tmp_path / "ckpt" / "preemption_records" / "local-0.jsonl"
    with open(path, "ab") as f:
        f.write(b'{"schema": 1, "stage": "err')  # the cut-off line of a killed write
    make_handler(testing.FakeCheckpoint(w=testing.FakeVariable(0)), tmp_path / "ckpt")
    found = records.load(path.parent)
    [resume] = found.resumes
    assert resume.step == 6 and resume.lost == 0
    total = path.read_bytes().count(b"\n")
    assert found.skipped == {str(path): [total - 1]}, "only the cut-off line is skipped"


def test_report_reads_the_records_inside_a_checkpoint_folder(make_handler, tmp_path):
    """Item 5: ``report <checkpoint folder>`` said "no preemption records"."""
    _preempt(make_handler, tmp_path, notice_at=5)
    done = _report(tmp_path / "ckpt")
    assert done.returncode == 0, done.stderr
    assert "1 preemption(s)" in done.stdout


def test_report_reads_past_whatever_else_is_in_the_records_folder(make_handler, tmp_path):
    """Item 3: a folder named like a file, a FIFO (reading it would block), a device, a
    binary object: each is one unreadable entry, and the real records are reported."""
    _preempt(make_handler, tmp_path, notice_at=5)
    folder = tmp_path / "ckpt" / "preemption_records"
    (folder / "worker-0.jsonl").mkdir()
    os.mkfifo(folder / "worker-1.jsonl")
    os.symlink("/dev/zero", folder / "worker-2.jsonl")
    (folder / "worker-3").mkdir()
    (folder / "worker-3" / "1-1-1-notice.json").write_bytes(bytes(range(128, 192)) + b"\n")
    (folder / "worker-3" / "2-1-1-exit.json").mkdir()
    found = records.load(folder)
    assert len(found.preemptions) == 1
    assert {k: v for k, v in found.skipped.items() if v == [0]}.keys() == {
        str(folder / "worker-0.jsonl"),
        str(folder / "worker-1.jsonl"),
        str(folder / "worker-2.jsonl"),
        str(folder / "worker-3" / "2-1-1-exit.json"),
    }
    done = _report(folder)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines() == ["report: skipped 5 unreadable line(s) in 5 file(s)"]


def test_a_line_is_stamped_as_it_is_built_and_a_resumed_line_gets_its_downtime(tmp_path):
    """The binding stamps each line (Python reads no time): its ``time`` is the wall
    clock then unless given, a ``resumed`` line's ``downtime`` the seconds from the exit
    it names (``exited``); a value that is not a number never stops the line."""
    rec = records.Recorder(str(tmp_path), "worker", 0)
    rec.new_preemption()
    before = time.time()
    rec.write("notice", source="SIGTERM")
    rec.write("resumed", step=3, exited=before - 50.0)
    rec.write("error", time="not a number", exited=1.0, error="x")
    rec.close()
    lines = [json.loads(x) for x in (tmp_path / "worker-0.jsonl").read_text().splitlines()]
    assert before <= lines[0]["time"] <= time.time()
    assert lines[1]["downtime"] == pytest.approx(lines[1]["time"] - (before - 50.0))
    assert "exited" not in lines[1] and "exited" not in lines[2]
    assert lines[2]["time"] == "not a number" and "downtime" not in lines[2]
