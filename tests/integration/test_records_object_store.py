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

from .gcs_emulator import CLIENT_BOUND, LIFETIME_BOUND  # noqa: E402
from .mwms_worker import poll_until  # noqa: E402

# The notice is taken by the handler's driver thread; a loaded machine can run many
# steps before it does. The tests wait for it (bounded) instead of racing the steps.
NOTICE_TAKEN_BOUND = 120.0
#: Bound on each TensorFlow process of the gs:// test.
GS_RUN_BOUND = 300.0


def _wait_for_the_notice(h: PreemptionCheckpointHandler) -> None:
    assert poll_until(lambda: h._attention, NOTICE_TAKEN_BOUND, 0.001), (
        f"the handler did not take the notice within {NOTICE_TAKEN_BOUND:g} s"
    )


def _run(directory: str, notice_at: int, calls: list) -> PreemptionCheckpointHandler:
    step = tf.Variable(0, dtype=tf.int64)
    ckpt = tf.train.Checkpoint(step=step)
    h = PreemptionCheckpointHandler(
        None, ckpt, directory, TerminationConfig(exit_fn=lambda: calls.append(int(step.numpy())))
    )
    for _ in range(notice_at):
        h.run(lambda: step.assign_add(1))
    h._notify_termination()
    _wait_for_the_notice(h)
    for _ in range(3):  # the agreed step is the next run: it saves, then exit_fn
        if calls:
            break
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


# ------------------------------------------------------------ gs:// (emulator)

GS_RUN = """
import json, sys, time
import tensorflow as tf
from tf_failure_handling import PreemptionCheckpointHandler, records

directory, notice_at, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
notice_bound = float(sys.argv[4])
step = tf.Variable(0, dtype=tf.int64)
h = PreemptionCheckpointHandler(None, tf.train.Checkpoint(step=step), directory)
print(json.dumps({"restored": h.total_run_calls}), flush=True)
while int(step.numpy()) < steps:
    if int(step.numpy()) == notice_at:
        h._notify_termination()  # exits 42 (TF's default exit_fn) after the save
        # Taken by the handler's thread: wait for it rather than race the steps.
        bound = time.monotonic() + notice_bound
        while not h._attention:
            if time.monotonic() > bound:
                sys.exit(f"the handler did not take the notice within {notice_bound:g} s")
            time.sleep(0.001)
    h.run(lambda: step.assign_add(1))
flushed = h._records.flush(60)
h.close()
print(json.dumps({"finished": int(step.numpy()), "flushed": flushed}), flush=True)
"""

QUIET_TF = {"TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}


@pytest.fixture(scope="module")
def gcs():
    from .gcs_emulator import require_gcs_emulator

    with require_gcs_emulator() as emu:
        yield emu


# Backstop above its own bounds in sequence: the module's emulator, three processes,
# three client calls (+ 60 s).
@pytest.mark.timeout(LIFETIME_BOUND + 3 * GS_RUN_BOUND + 3 * CLIENT_BOUND + 60)
def test_records_of_a_gs_checkpoint_are_in_the_bucket_and_survive_the_machine(gcs, tmp_path):
    """Through TensorFlow's own GCS file system against a local emulator: the first run
    is preempted at step 5 and exits 42 with its lines in the bucket (the exit line
    included: the process waits for it); the restart resumes with nothing lost; the
    report reads the bucket."""
    import json
    import sys

    directory = f"gs://{gcs.bucket}/run/ckpt"
    first = gcs.run(
        [sys.executable, "-c", GS_RUN, directory, "5", "10", str(NOTICE_TAKEN_BOUND)],
        env=QUIET_TF,
        cwd=tmp_path,
        timeout=GS_RUN_BOUND,
    )
    assert first.returncode == 42, first.stdout[-1000:] + first.stderr[-3000:]
    assert list(tmp_path.iterdir()) == [], "nothing written to the local disk"
    # Without the folder markers that makedirs writes (names ending in "/").
    objects = [o for o in gcs.list_objects("run/ckpt/preemption_records/") if o.endswith(".json")]
    stages = [o.rsplit("-", 1)[1] for o in objects]
    assert stages == [
        "notice.json",
        "agreement.json",
        "save_start.json",
        "save_end.json",
        "exit.json",
    ], objects
    last = json.loads(gcs.read_object(objects[-1]))
    assert last["stage"] == "exit" and last["code"] == 42

    second = gcs.run(
        [sys.executable, "-c", GS_RUN, directory, "-1", "10", str(NOTICE_TAKEN_BOUND)],
        env=QUIET_TF,
        cwd=tmp_path,
        timeout=GS_RUN_BOUND,
    )
    assert second.returncode == 0, second.stdout[-1000:] + second.stderr[-3000:]
    lines = [json.loads(x) for x in second.stdout.splitlines() if x.startswith("{")]
    restored = lines[0]["restored"]
    assert lines[-1] == {"finished": 10, "flushed": True}
    resumed = [o for o in gcs.list_objects("run/ckpt/preemption_records/") if "resumed" in o]
    assert len(resumed) == 1, "one resumed line, in the bucket"

    done = gcs.run(
        [sys.executable, "-m", "tf_failure_handling", "report", directory, "--json"],
        env=QUIET_TF,
        cwd=tmp_path,
        timeout=GS_RUN_BOUND,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    [row] = json.loads(done.stdout)["preemptions"]
    assert row["agreed_step"] == restored and row["steps_lost"] == 0
    assert row["exit_codes"] == ["42"]
