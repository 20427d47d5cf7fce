"""Preemption records on a file system that is not local (issue 33), with real
TensorFlow: ``ram://`` (TensorFlow's in-memory file system, so the whole run is one
process) and a real ``tf.train.Checkpoint``.

Success: the records of a preemption go where the checkpoint goes, as one object
per line under ``<checkpoint_dir>/preemption_records/<job>-<task>/``, nothing is
created on the local disk, ``load`` and ``report`` read them back through
``tf.io.gfile``, and the restart's ``resumed`` line finds the exit.
"""

from __future__ import annotations

import os

import pytest

tf = pytest.importorskip("tensorflow")

from tf_failure_handling import (  # noqa: E402
    PreemptionCheckpointHandler,
    TerminationConfig,
    records,
    report,
)


def _run(directory: str, notice_at: int, calls: list) -> PreemptionCheckpointHandler:
    step = tf.Variable(0, dtype=tf.int64)
    ckpt = tf.train.Checkpoint(step=step)
    h = PreemptionCheckpointHandler(
        None, ckpt, directory, TerminationConfig(exit_fn=lambda: calls.append(int(step.numpy())))
    )
    for _ in range(100):
        if calls:
            break
        if int(step.numpy()) == notice_at and not h._records.current:
            h._notify_termination()
        h.run(lambda: step.assign_add(1))
    return h


def test_records_of_a_ram_checkpoint_are_objects_beside_it(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    directory = f"ram://records-test-{os.getpid()}/ckpt"
    calls: list = []
    h = _run(directory, 5, calls)
    assert calls, "the notice was acted on: exit_fn was called"
    h.close()
    saved = calls[0]
    assert tf.io.gfile.exists(directory + "/checkpoint"), "the checkpoint is in ram://"
    assert os.listdir(tmp_path) == [], "nothing on the local disk"
    folder = directory + "/preemption_records"
    names = tf.io.gfile.listdir(folder + "/local-0")
    assert sorted(n.rsplit("-", 1)[1] for n in names) == sorted(
        ["notice.json", "agreement.json", "save_start.json", "save_end.json", "exit.json"]
    )
    found = records.load(folder)
    assert found.skipped == {}
    [p] = found.preemptions
    assert p.agreed_step == saved and p.exit_code is None, "a custom exit_fn: no code known"
    assert p.notice_time <= p.save_start <= p.save_end <= p.exit_time
    # The restart restores the step and writes `resumed` with nothing lost.
    step = tf.Variable(0, dtype=tf.int64)
    h2 = PreemptionCheckpointHandler(None, tf.train.Checkpoint(step=step), directory)
    assert h2.total_run_calls == saved
    assert h2._records.flush(30)
    [resume] = records.load(directory).resumes
    assert resume.step == saved and resume.lost == 0
    h2.close()
    capsys.readouterr()
    assert report.main([directory]) == 0
    out = capsys.readouterr().out
    assert "1 preemption(s)" in out and "0 step(s) lost" in out
