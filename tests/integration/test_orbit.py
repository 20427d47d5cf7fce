"""orbit's ``SaveCheckpointIfPreempted`` with our handler, in one process.

orbit (``orbit/`` of tensorflow/models) builds
``tf.distribute.experimental.PreemptionCheckpointHandler`` itself and calls
``save_checkpoint_if_preempted(checkpoint_number=global_step, check_interval=False)``
after every train loop. The tests install orbit's real package (the Makefile installs
``tf-models-official`` without its dependencies, which would replace TF 2.21) and run
``orbit_worker.py`` after ``tf_failure_handling.patch()``. A SIGTERM is sent when the
process prints that it reached a global step, and it waits there (bounded) until its
handler has handled the notice, so the step the checkpoint is taken at is fixed: as
with TF's handler (local mode included), the one after the call that found the
notice.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from .test_tf_keras import KerasCluster, max_abs_difference

pytest.importorskip("orbit", reason="orbit comes with tf-models-official (make build)")

ORBIT_WORKER = Path(__file__).resolve().parent / "orbit_worker.py"
STEPS = 12
HANG = 120.0
DEFAULT_EXIT_CODE = 42


class OrbitProcess(KerasCluster):
    """One ``orbit_worker.py`` process (the harness's single-worker cluster)."""

    def __init__(self, workdir, name: str, args=()):
        super().__init__(
            workdir, impl="ours", ckpt_dir=Path(workdir) / "model", num_workers=1, name=name
        )
        self.args = [str(a) for a in args]

    def command(self, index: int) -> list[str]:
        return [
            sys.executable,
            str(ORBIT_WORKER),
            "--model-dir",
            str(self.ckpt_dir),
            "--steps",
            str(STEPS),
            *self.args,
        ]

    def preemption_saves(self) -> list:
        return [s for s in self.events(0, "save") if s["preemption"]]

    def signal_at(self, step: int) -> None:
        """Waits for the ``reached`` event of ``step``; sends SIGTERM."""
        self.wait_until(
            lambda: (
                any(e["step"] == step for e in self.events(0, "reached"))
                or self.procs[0].poll() is not None
            ),
            HANG,
            f"the process to reach step {step}",
        )
        self.send_signal(0, signal.SIGTERM)


@pytest.fixture
def orbit_process(tmp_path):
    processes: list[OrbitProcess] = []

    def make(name: str, *args) -> OrbitProcess:
        process = OrbitProcess(tmp_path, name, args)
        processes.append(process)
        return process

    yield make
    for process in processes:
        process.kill()


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    process = OrbitProcess(tmp_path_factory.mktemp("orbit-reference"), "reference")
    try:
        (done,) = process.run_to_completion(timeout=HANG)
    finally:
        process.kill()
    assert done["global_step"] == STEPS and not process.preemption_saves()
    return done


# Backstop above its own bounds in sequence: the module's reference run, the start
# event, the step, the exit, the restart (+ 60 s for the kills).
@pytest.mark.timeout(5 * HANG + 60)
def test_sigterm_saves_at_the_global_step_exits_42_and_the_restart_restores(
    orbit_process, reference
):
    preempted = orbit_process("preempted", "--hold-at", 5).start()
    assert preempted.wait_for(0, "start")["restored"] == 0
    preempted.signal_at(5)
    assert preempted.wait(HANG, "the process to save and exit") == [DEFAULT_EXIT_CODE]
    assert preempted.events(0, "reached")[0]["handler"] == "tf_failure_handling.handler"
    (save,) = preempted.preemption_saves()
    assert save["number"] == 6 and save["path"].endswith("ckpt-6"), save
    assert preempted.events(0, "step")[-1]["step"] == 6

    restart = orbit_process("restart")
    (done,) = restart.run_to_completion(timeout=HANG)
    assert restart.events(0, "start")[0]["restored"] == 6
    assert done["steps"] == STEPS - 6 and done["global_step"] == STEPS
    assert max_abs_difference(done["weights"], reference["weights"]) == 0.0


# Backstop above its own bounds in sequence: the module's reference run, two steps, the
# run to completion (+ 60 s for the kills).
@pytest.mark.timeout(4 * HANG + 60)
def test_keep_running_after_save_saves_once_and_absorbs_a_second_sigterm(orbit_process, reference):
    process = orbit_process("keep-running", "--keep-running-after-save", "--hold-at", "4,8")
    process.start()
    process.signal_at(4)
    process.signal_at(8)
    (done,) = process.run_to_completion(timeout=HANG)
    (save,) = process.preemption_saves()
    assert save["number"] == 5, save
    assert done["steps"] == STEPS and done["global_step"] == STEPS
    assert max_abs_difference(done["weights"], reference["weights"]) == 0.0
