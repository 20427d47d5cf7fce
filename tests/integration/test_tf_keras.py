"""tf_keras' ``model.fit`` + ``BackupAndRestore(save_before_preemption=True)`` after
``tf_failure_handling.patch()``, on 2 real MultiWorkerMirroredStrategy workers.

Workers run ``tf_keras_worker.py`` on 127.0.0.1 (3 epochs of 6 batches, every batch
the same, so a resumed run must end with exactly the uninterrupted run's weights).
A notice is given when the worker prints that it reached epoch 1, batch 2, and the
worker waits there (bounded) until its handler has handled the notice: by the
protocol the leader then publishes "save after the next run", so every worker saves
after batch 3 of epoch 1, the 10th run, whatever the machine's speed.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import numpy as np
import pytest

from .conftest import Cluster

KERAS_WORKER = Path(__file__).resolve().parent / "tf_keras_worker.py"
EPOCHS = 3
STEPS_PER_EPOCH = 6
TOTAL_STEPS = EPOCHS * STEPS_PER_EPOCH
HOLD_AT = (1, 2)  # (epoch, batch) where the notice is given
#: The agreed run: the leader's next one after the run it was noticed at.
AGREED = (HOLD_AT[0], HOLD_AT[1] + 1)
AGREED_RUNS = AGREED[0] * STEPS_PER_EPOCH + AGREED[1] + 1
#: A bound that only turns a hang into a failure: a whole run of 18 batches with two
#: fresh TF processes took over 120 s beside a loaded make test (load about 20).
HANG = 300.0
DEFAULT_EXIT_CODE = 42
GCE_EXIT_CODE = 143
OURS = "tf_failure_handling.handler"
TFS = "tensorflow.python.distribute.failure_handling.failure_handling"


class KerasCluster(Cluster):
    """Two ``tf_keras_worker.py`` processes; ``ckpt_dir`` is the backup directory."""

    def command(self, index: int) -> list[str]:
        return [
            sys.executable,
            str(KERAS_WORKER),
            "--ports",
            ",".join(str(p) for p in self.ports),
            "--index",
            str(index),
            "--impl",
            self.impl,
            "--backup-dir",
            str(self.ckpt_dir),
            "--epochs",
            str(EPOCHS),
            "--steps-per-epoch",
            str(STEPS_PER_EPOCH),
            *self.extra_args,
            *(str(a) for a in self.worker_args.get(index, ())),
        ]

    def wait_for(self, index: int, kind: str) -> dict:
        """The first ``kind`` event of worker ``index`` (fails if it exits first)."""

        def seen():
            if self.events(index, kind):
                return True
            if self.procs[index].poll() is not None:
                pytest.fail(f"worker {index} exited before {kind!r}\n{self.describe(index)}")
            return False

        self.wait_until(seen, HANG, f"worker {index}'s {kind!r} event")
        return self.events(index, kind)[0]


@pytest.fixture
def keras_cluster(tmp_path):
    """``make(name=..., impl=..., ...)`` -> KerasCluster on ``tmp_path/backup``; killed at
    teardown."""
    clusters: list[KerasCluster] = []

    def make(**kwargs) -> KerasCluster:
        kwargs.setdefault("impl", "ours")
        kwargs.setdefault("ckpt_dir", tmp_path / "backup")
        cluster = KerasCluster(tmp_path, **kwargs)
        clusters.append(cluster)
        return cluster

    yield make
    for cluster in clusters:
        cluster.kill()


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The ``done`` event of an uninterrupted run without tf_failure_handling.

    Off GCP, tf_keras builds no preemption handler at all (``save_before_preemption``
    silently does nothing): checked here, as what ``patch()`` changes.
    """
    workdir = tmp_path_factory.mktemp("keras-reference")
    cluster = KerasCluster(workdir, impl="tf", ckpt_dir=workdir / "backup", name="reference")
    try:
        done = cluster.run_to_completion(timeout=HANG)
        for i in range(cluster.num_workers):
            assert cluster.events(i, "fit_begin")[0]["handler"] is None, cluster.describe(i)
    finally:
        cluster.kill()
    assert done[0]["weights"] == done[1]["weights"]
    assert done[0]["iterations"] == TOTAL_STEPS
    return done[0]


def max_abs_difference(actual: dict, expected: dict) -> float:
    assert sorted(actual) == sorted(expected)
    return max(float(np.max(np.abs(np.subtract(actual[k], expected[k])))) for k in expected)


def preemption_saves(cluster: KerasCluster, index: int) -> list:
    return [s for s in cluster.events(index, "save") if s["preemption"]]


def check_agreed_save(cluster: KerasCluster, codes: list, exit_code: int, fit: int = 0) -> None:
    """Every worker exited with ``exit_code`` right after one save, at the agreed batch,
    in TF's layout (chief in ``backup/chief``, the other in ``backup/workertemp_1``)."""
    details = "\n".join(cluster.describe(i) for i in range(cluster.num_workers))
    assert codes == [exit_code] * cluster.num_workers, f"exit codes {codes}\n{details}"
    backup = cluster.ckpt_dir
    for i, directory in enumerate((backup / "chief", backup / "workertemp_1")):
        saves = preemption_saves(cluster, i)
        assert len(saves) == 1, f"worker {i} made {len(saves)} preemption saves\n{details}"
        (save,) = saves
        assert (save["epoch"], save["batch"], save["runs"]) == (*AGREED, AGREED_RUNS), details
        assert save["directory"] == str(directory), save
        last = cluster.events(i, "batch")[-1]
        assert (last["fit"], last["epoch"], last["batch"]) == (fit, *AGREED), (
            f"worker {i} ran past the agreed batch\n{details}"
        )
        assert cluster.events(i, "exit")[0]["code"] == exit_code


def notice_at_hold(cluster: KerasCluster, held, notify) -> list:
    """Starts the cluster, whose workers ``held`` hold at HOLD_AT; ``notify()`` once they
    are there; returns the exit codes."""
    cluster.start()
    for index in held:
        cluster.wait_for(index, "reached")
    notify()
    return cluster.wait(HANG, "both workers to save and exit after the notice")


# --------------------------------------------------------------------------- SIGTERM
# Backstop above its own bounds in sequence: the module's reference run, the wait for
# the hold, the exit, the restart (+ 60 s for the kills).
@pytest.mark.timeout(4 * HANG + 60)
@pytest.mark.parametrize("target", [0, 1], ids=["chief", "non_chief"])
def test_sigterm_mid_fit_saves_at_one_batch_and_the_restart_ends_as_uninterrupted(
    target, keras_cluster, reference
):
    cluster = keras_cluster(
        name=f"sigterm-{target}",
        worker_args={target: ["--hold-at", f"{HOLD_AT[0]}:{HOLD_AT[1]}"]},
    )
    codes = notice_at_hold(cluster, [target], lambda: cluster.send_signal(target, signal.SIGTERM))
    check_agreed_save(cluster, codes, DEFAULT_EXIT_CODE)
    first_attempt = [len(cluster.events(i, "batch")) for i in range(2)]
    assert first_attempt == [AGREED_RUNS] * 2
    for i in range(2):
        assert cluster.events(i, "fit_begin")[0]["handler"] == OURS

    restart = keras_cluster(name=f"restart-{target}")
    done = restart.run_to_completion(timeout=HANG)
    for i in range(2):
        begin = restart.events(i, "fit_begin")[0]
        assert (begin["epoch"], begin["batch"]) == (AGREED[0], AGREED[1] + 1), begin
        assert done[i]["batches"] + first_attempt[i] == TOTAL_STEPS
        assert done[i]["iterations"] == TOTAL_STEPS, "optimizer steps over both attempts"
        difference = max_abs_difference(done[i]["weights"], reference["weights"])
        assert difference == 0.0, f"worker {i}: max |resumed - uninterrupted| = {difference}"


# --------------------------------------------------------------------------- GCE CPU VM
def gce_environment(server) -> dict:
    # Detection probes the fake server (the harness forces "no cloud" otherwise).
    return {**server.env("gce"), "TF_FAILURE_HANDLING_CLOUD": ""}


# Backstop above its own bounds in sequence: both workers' holds, one after the other,
# and the exit (+ 60 s).
@pytest.mark.timeout(3 * HANG + 60)
def test_gce_cpu_vm_preemption_notice_saves_and_exits_143(keras_cluster):
    from fake_metadata import FakeMetadata

    with FakeMetadata() as server:
        # Both workers see the notice and both hold until they handled it, so whichever
        # wins the claim leads from the same run.
        hold = ["--hold-at", f"{HOLD_AT[0]}:{HOLD_AT[1]}"]
        cluster = keras_cluster(
            name="gce-ours", env=gce_environment(server), worker_args={0: hold, 1: hold}
        )

        def preempt():
            server.gce_preempted = "TRUE"  # what GCE announces to a Spot/preemptible VM

        codes = notice_at_hold(cluster, [0, 1], preempt)
    check_agreed_save(cluster, codes, GCE_EXIT_CODE)
    assert cluster.events(0, "fit_begin")[0]["handler"] == OURS


@pytest.mark.timeout(240)
def test_gce_cpu_vm_tf_handler_crashes_tf_keras_at_the_first_batch(keras_cluster):
    """TensorFlow's defect, asserted as it is: on a GCE CPU VM TF's handler skips its
    set-up (``_run_counter`` included) and tf_keras' ``_run_counter += 1`` fails."""
    from fake_metadata import FakeMetadata

    with FakeMetadata() as server:
        cluster = keras_cluster(name="gce-tf", impl="tf", env=gce_environment(server))
        cluster.start()
        codes = cluster.wait(HANG, "TF's workers to fail")
    details = "\n".join(cluster.describe(i) for i in range(2))
    assert codes == [1, 1], f"expected both to fail (Python's exit code 1)\n{details}"
    for i in range(2):
        assert cluster.events(i, "fit_begin")[0]["handler"] == TFS, details
        (error,) = cluster.events(i, "error")
        assert error["type"] == "AttributeError" and "_run_counter" in error["message"], details
        assert len(cluster.events(i, "batch")) == 1, "failed at the end of the first batch"


# --------------------------------------------------------------------------- two fits
# Backstop above its own bounds in sequence: the hold and the exit (+ 60 s).
@pytest.mark.timeout(2 * HANG + 60)
def test_second_fit_in_one_process_saves_once_at_one_batch(keras_cluster):
    """tf_keras leaves the first fit's handler open; the second fit's handler acts alone."""
    cluster = keras_cluster(
        name="two-fits",
        extra_args=["--fits", "2"],
        worker_args={1: ["--hold-at", f"{HOLD_AT[0]}:{HOLD_AT[1]}"]},
    )
    codes = notice_at_hold(cluster, [1], lambda: cluster.send_signal(1, signal.SIGTERM))
    check_agreed_save(cluster, codes, DEFAULT_EXIT_CODE, fit=1)
    for i in range(2):
        fits = [e["fit"] for e in cluster.events(i, "fit_begin")]
        assert fits == [0, 1], cluster.describe(i)
        assert len(cluster.events(i, "batch")) == TOTAL_STEPS + AGREED_RUNS


# --------------------------------------------------------------------------- errors
@pytest.mark.timeout(240)
def test_error_inside_fit_on_one_worker_ends_the_other_with_an_error(keras_cluster):
    fail_at = 8
    cluster = keras_cluster(name="failing", worker_args={1: ["--fail-at-step", str(fail_at)]})
    cluster.start()
    codes = cluster.wait(HANG, "both workers to fail after worker 1's OpError")
    details = "\n".join(cluster.describe(i) for i in range(2))
    assert codes == [1, 1], f"expected both to end with an exception\n{details}"
    for i in range(2):
        assert not cluster.events(i, "done"), details
    (failing,) = cluster.events(1, "error")
    assert failing["type"] == "InvalidArgumentError", details
    assert "injected failure" in failing["message"], details
    assert len(cluster.events(1, "batch")) == fail_at, details
    (peer,) = cluster.events(0, "error")
    assert peer["type"] == failing["type"], details


# --------------------------------------------------------------------------- lost worker
#: Each batch end sleeps this long: the kill lands at a random moment of training.
LOST_BATCH_SLEEP = 0.2
#: Batches every worker has finished before the kill.
LOST_AFTER = 5


# Backstop above its own bounds in sequence: the reference, the wait for the batches,
# the survivor's exit, the restart (+ 60 s for the kills).
@pytest.mark.timeout(4 * HANG + 60)
@pytest.mark.parametrize("killed", [1, 0], ids=["non_chief", "chief"])
def test_a_worker_lost_in_fit_the_survivor_saves_and_the_restart_ends_as_uninterrupted(
    killed, keras_cluster, reference
):
    """A worker SIGKILLed mid-fit (issue 62): the survivor's train step fails, the loss
    is confirmed, and the survivor that writes saves the last whole batch, N, in the
    backup folder, with N at least L - 1 (L: the most batches any worker finished). It
    raises TensorFlow's error. A restarted cluster resumes fit at batch N and ends with
    exactly the weights of an uninterrupted run."""
    cluster = keras_cluster(
        name=f"lost-{killed}", extra_args=["--batch-sleep", str(LOST_BATCH_SLEEP)]
    )
    cluster.start()
    cluster.wait_until(
        lambda: min(len(cluster.events(i, "batch")) for i in range(2)) >= LOST_AFTER,
        HANG,
        f"{LOST_AFTER} batches on every worker",
    )
    cluster.send_signal(killed, signal.SIGKILL)
    codes = cluster.wait(HANG, f"the survivor to fail after worker {killed}'s SIGKILL")
    survivor = 1 - killed
    details = "\n".join(cluster.describe(i) for i in range(2))
    assert codes[killed] == -signal.SIGKILL, details
    runs = _survivor_saved(cluster, survivor, killed)
    _restart_resumes(keras_cluster, f"lost-restart-{killed}", runs, reference)


#: The coordination service's heartbeat timeout of the paused-worker test: far past the
#: handler's bound and the test's, so only the handler's step watch can end the batch.
LONG_HEARTBEAT = 600.0
#: The handler's own bound on a blocked batch there (TF_FAILURE_HANDLING_PEER_TIMEOUT).
STEP_BOUND = 5.0
#: Batches after which the non-chief SIGSTOPs itself: inside epoch 1 (batch 2 of 6), so
#: the chief blocks in the next batch's all-reduce, inside fit's batch loop.
PAUSE_AFTER = STEPS_PER_EPOCH + 2


@pytest.mark.timeout(4 * HANG + 60)
def test_a_worker_paused_in_fit_the_step_watch_aborts_the_batch_and_the_survivor_saves(
    keras_cluster, reference
):
    """Issue 62, "A hung worker", under tf_keras ``fit``: the non-chief stops (SIGSTOP)
    between two batches, with a heartbeat timeout of 600 s, so TensorFlow aborts nothing
    and the chief's next batch waits in its all-reduce. Success: the chief's step watch
    (inside tf_keras' ``watch_preemption_scope``, by ``_run_counter``) finds the batch
    blocked past the peer timeout (5 s) with worker 1 not answering a health probe and
    aborts the collectives; the chief saves run 8, the last whole batch, raises
    ``UnavailableError`` naming detection "a step blocked past the peer timeout", and
    the restart resumes after run 8 with the uninterrupted run's weights. Without the
    watch the chief waits for the 600 s heartbeat and fails this test's bound."""
    from tf_failure_handling.handler import PEER_TIMEOUT_ENV

    cluster = keras_cluster(
        name="paused",
        extra_args=["--heartbeat-timeout", str(LONG_HEARTBEAT)],
        worker_args={1: ["--pause-after", str(PAUSE_AFTER)]},
        env={PEER_TIMEOUT_ENV: str(STEP_BOUND)},
    )
    cluster.start()
    try:
        cluster.wait_for(1, "pausing")
        code = cluster.chief_aborted_its_collectives(HANG, "worker 1's pause")
        assert code not in (0, 42), cluster.describe(0)
        runs = _survivor_saved(cluster, 0, 1, "a step blocked past the peer timeout")
        assert runs == PAUSE_AFTER, (runs, cluster.describe(0))
    finally:
        cluster.kill()
    _restart_resumes(keras_cluster, "paused-restart", runs, reference)


def _survivor_saved(cluster, survivor: int, lost: int, detection: str = "") -> int:
    """Checks that ``survivor`` lost ``lost`` (shown as ``detection``, when given), raised
    TensorFlow's ``UnavailableError`` and saved the last whole batch, N, once, in the
    backup folder every worker reads, with N at least L - 1; returns N."""
    import re

    details = "\n".join(cluster.describe(i) for i in range(2))
    assert cluster.procs[survivor].poll() not in (None, 0, 42), details
    (error,) = cluster.events(survivor, "error")
    assert error["type"] == "UnavailableError", details
    log = cluster.stderr_paths[survivor].read_text(errors="replace")
    shown = rf" \({re.escape(detection)}," if detection else " "
    assert re.search(rf"Worker {survivor}: lost without notice: worker {lost} .*{shown}", log), (
        details
    )
    saved = re.findall(r"saved the last whole step, run (\d+), at (\S+)\.\n", log)
    assert len(saved) == 1, details
    runs, path = int(saved[0][0]), saved[0][1]
    assert path == str(cluster.ckpt_dir / "chief" / f"ckpt-survivor{survivor}-{runs}"), details
    finished = max(len(cluster.events(i, "batch")) for i in range(2))
    assert finished - 1 <= runs <= finished, (runs, finished, details)
    return runs


def _restart_resumes(keras_cluster, name: str, runs: int, reference) -> None:
    """A restarted cluster resumes fit at batch ``runs`` and ends with exactly the
    uninterrupted run's weights, after as many optimizer steps."""
    restart = keras_cluster(name=name)
    done = restart.run_to_completion(timeout=HANG)
    for i in range(2):
        begin = restart.events(i, "fit_begin")[0]
        assert (begin["epoch"], begin["batch"]) == divmod(runs, STEPS_PER_EPOCH), begin
        assert done[i]["batches"] == TOTAL_STEPS - runs, done[i]
        assert done[i]["iterations"] == TOTAL_STEPS, "optimizer steps over both attempts"
        difference = max_abs_difference(done[i]["weights"], reference["weights"])
        assert difference == 0.0, f"worker {i}: max |resumed - uninterrupted| = {difference}"
