"""Every input element once across preemptions, on every stack (issue 49).

Real TensorFlow processes (``input_worker.py``): 64 element ids, shuffled with a seed and
reshuffled each epoch, global batch 8, 3 epochs. A worker sends itself SIGTERM mid-epoch
(and, in the two-preemption tests, again after the restart); every worker saves at the
agreed step and exits 42; the relaunched workers finish. Success: every id was trained
exactly as often as in an uninterrupted run (``counts``, 3 each), in the same order
(``trace``, a hash of every id in the order trained), on every worker. Without the input
position (TensorFlow's handler, and ours before) the resumed epoch trains its first
batches again and never its last: the counts differ.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from .mwms_worker import LIVE_PROCESSES, child_environment, free_ports, kill_process

HERE = Path(__file__).resolve().parent
WORKER = HERE / "input_worker.py"
#: Bound on one attempt of a cluster (start to exit), to turn a hang into a failure.
ATTEMPT_TIMEOUT = 240.0
EXIT_AFTER_SAVE = 42
EPOCHS = 3


def run_cluster(
    tmp_path: Path, name: str, workers: int, args: list[str], env: dict | None = None
) -> list:
    """Runs ``workers`` processes of ``input_worker.py`` (no strategy when 0) to their
    end; returns ``[(exit code, output or None, stderr)]`` per worker."""
    ports = free_ports(workers) if workers else []
    procs = []
    for index in range(max(1, workers)):
        out = tmp_path / f"{name}-{index}.json"
        out.unlink(missing_ok=True)
        err = open(tmp_path / f"{name}-{index}.err", "w")
        command = [
            sys.executable,
            str(WORKER),
            "--ports",
            ",".join(map(str, ports)),
            "--index",
            str(index),
            "--ckpt-dir",
            str(tmp_path / "ckpt"),
            "--out",
            str(out),
            *args,
        ]
        proc = subprocess.Popen(
            command,
            cwd=HERE,
            env={**child_environment(), **(env or {})},
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
        LIVE_PROCESSES.add(proc)
        procs.append((proc, out, err))
    results = []
    try:
        for proc, out, err in procs:
            try:
                code = proc.wait(timeout=ATTEMPT_TIMEOUT)
            except subprocess.TimeoutExpired:
                pytest.fail(f"{name}: a worker did not end within {ATTEMPT_TIMEOUT}s")
            err.close()
            data = json.loads(out.read_text()) if out.exists() else None
            results.append((code, data, Path(err.name).read_text()))
    finally:
        for proc, _, _ in procs:
            kill_process(proc)
    return results


def tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.splitlines()[-lines:])


def finished(results: list, what: str) -> list:
    for code, data, err in results:
        assert code == 0 and data is not None, f"{what}: exit {code}\n{tail(err)}"
    return [data for _, data, _ in results]


def preempted(results: list, what: str) -> None:
    for code, _, err in results:
        assert code == EXIT_AFTER_SAVE, f"{what}: exit {code}, not the save's\n{tail(err)}"


def attempts(
    tmp_path: Path, workers: int, args: list, preempt_at: list, restart_workers=None, env=None
):
    """Preempts at each run count of ``preempt_at`` in turn (one attempt each), then
    runs to the end; returns the last attempt's outputs and every attempt's stderr."""
    logs = []
    for n, at in enumerate(preempt_at):
        results = run_cluster(
            tmp_path, f"attempt{n}", workers, [*args, "--preempt-at", str(at)], env
        )
        preempted(results, f"attempt {n} (preempted at step {at})")
        logs.append([err for _, _, err in results])
        workers = restart_workers if restart_workers is not None else workers
    results = run_cluster(tmp_path, "last", workers, args, env)
    logs.append([err for _, _, err in results])
    return finished(results, "the last attempt"), logs


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """Uninterrupted runs, one per (stack, input options), made once."""
    made: dict = {}

    def reference(workers: int, args: list) -> dict:
        key = (workers, tuple(args))
        if key not in made:
            path = tmp_path_factory.mktemp("reference")
            outputs = finished(run_cluster(path, "reference", workers, args), "reference")
            first = outputs[0]
            assert first["counts"] == [EPOCHS] * 64, "the uninterrupted run trains each id 3x"
            assert all(o == first for o in outputs), "workers agree on what was trained"
            made[key] = first
        return made[key]

    return reference


def check_as_uninterrupted(outputs: list, reference: dict) -> None:
    for worker, output in enumerate(outputs):
        assert output["counts"] == reference["counts"], (
            f"worker {worker}: ids trained {output['counts']}, uninterrupted {reference['counts']}"
        )
        assert output["trace"] == reference["trace"], (
            f"worker {worker}: the ids were trained in another order than uninterrupted"
        )


#: One iterator over the repeated input spans the epochs: 2 epochs of 12 steps, 3 passes.
REPEATED = ["--repeat", "--epochs", "2", "--steps-per-epoch", "12"]
#: The stacks of the issue: TensorFlow's docstring loop under MWMS and with no strategy,
#: tf_keras fit (MWMS: tf_keras saves before a preemption only there) and Keras 3 fit.
STACKS = [
    pytest.param(2, ["--stack", "custom"], id="custom-mwms"),
    pytest.param(0, ["--stack", "custom"], id="custom-no-strategy"),
    pytest.param(2, ["--stack", "tf_keras"], id="tf_keras-mwms"),
    pytest.param(2, ["--stack", "keras3"], id="keras3-mwms"),
]
#: fit's other way of making iterators (one over a repeated input spans the epochs),
#: and Keras 3 with no strategy: one preemption each.
VARIANTS = [
    pytest.param(2, ["--stack", "tf_keras", *REPEATED], id="tf_keras-mwms-repeat"),
    pytest.param(0, ["--stack", "keras3", *REPEATED], id="keras3-no-strategy-repeat"),
    # cache() before the shuffle: every epoch its own order, positioned (issue 60).
    pytest.param(
        0, ["--stack", "custom", "--input", "cache-shuffle"], id="custom-no-strategy-cache"
    ),
]


@pytest.mark.timeout(6 * ATTEMPT_TIMEOUT)
@pytest.mark.parametrize("workers,args", STACKS + VARIANTS)
def test_a_preemption_mid_epoch_trains_every_element_as_uninterrupted(
    tmp_path, references, workers, args
):
    # Step 12: the middle of epoch 2 (8 steps per epoch; with 12, the first's end).
    outputs, _ = attempts(tmp_path, workers, args, [12])
    check_as_uninterrupted(outputs, references(workers, args))


@pytest.mark.timeout(8 * ATTEMPT_TIMEOUT)
@pytest.mark.parametrize("workers,args", STACKS)
def test_two_preemptions_in_one_run_train_every_element_as_uninterrupted(
    tmp_path, references, workers, args
):
    # Step 6 (mid epoch 1), then 16 (an epoch's last step with 8 per epoch).
    outputs, _ = attempts(tmp_path, workers, args, [6, 16])
    check_as_uninterrupted(outputs, references(workers, args))


@pytest.mark.timeout(6 * ATTEMPT_TIMEOUT)
def test_a_restore_with_another_worker_count_warns_and_resumes_by_global_batch(
    tmp_path, references
):
    """2 workers save, 1 restores: each global batch was split between the workers
    (AutoShardPolicy.DATA), so resuming after the same number of global batches gives
    the uninterrupted run's elements and order, and a warning names the change."""
    args = ["--stack", "custom"]
    outputs, logs = attempts(tmp_path, 2, args, [12], restart_workers=1)
    assert "saved by 2 worker(s), this run has 1" in logs[-1][0]
    check_as_uninterrupted(outputs, references(2, args))


#: (killed worker, workers of the restart): the non-chief, then the chief (its
#: coordination service goes with it) with a restart of one worker.
LOST = [pytest.param(1, 2, id="non_chief"), pytest.param(0, 1, id="chief-restart_with_1")]


@pytest.mark.timeout(3 * ATTEMPT_TIMEOUT)
@pytest.mark.parametrize("killed,restart_workers", LOST)
def test_a_worker_lost_without_notice_the_survivor_saves_the_input_position_too(
    tmp_path, references, killed, restart_workers
):
    """Issue 62: a worker SIGKILLs itself after step 12 of 24 (no notice). The survivor
    saves the last whole step with its input position, and raises. The restart resumes
    at the step saved (L - 1 or later: no step is trained twice, none skipped) and
    trains every id as often and in the same order as an uninterrupted run; a restart
    with one worker warns and resumes by global batch, as after a preemption's save."""
    args = ["--stack", "custom"]
    results = run_cluster(
        tmp_path, "lost", 2, [*args, "--kill-at", "12", "--preempt-worker", str(killed)]
    )
    survivor = 1 - killed
    assert results[killed][0] == -signal.SIGKILL, tail(results[killed][2])
    code, _, log = results[survivor]
    assert code not in (0, EXIT_AFTER_SAVE), f"the survivor raises: exit {code}\n{tail(log)}"
    saved = re.findall(r"saved the last whole step, run (\d+), at ", log)
    assert len(saved) == 1 and int(saved[0]) in (11, 12), tail(log)
    restart = run_cluster(tmp_path, "last", restart_workers, args)
    outputs = finished(restart, "the restart")
    total = EPOCHS * (64 // 8)
    assert [o["steps"] for o in outputs] == [total - int(saved[0])] * restart_workers
    if restart_workers == 1:
        assert "saved by 2 worker(s), this run has 1" in restart[0][2], tail(restart[0][2])
    check_as_uninterrupted(outputs, references(2, args))


@pytest.mark.timeout(6 * ATTEMPT_TIMEOUT)
def test_input_that_cannot_be_positioned_warns_and_starts_again_at_its_first_element(
    tmp_path, references
):
    """A Python generator: a warning naming why, at track_input, and today's behaviour
    (the resumed epoch's input starts at its first element: ids trained unevenly)."""
    args = ["--stack", "custom", "--input", "generator"]
    outputs, logs = attempts(tmp_path, 0, args, [12])
    for log in logs:
        assert "is not saved: it runs Python code (Dataset.from_generator" in log[0]
    assert outputs[0]["counts"] != [EPOCHS] * 64, "the resumed epoch started again"
    assert sum(outputs[0]["counts"]) == 12 * 8 + 12 * 8, "192 element-steps, as planned"


@pytest.mark.timeout(6 * ATTEMPT_TIMEOUT)
@pytest.mark.parametrize("mode", ["storage", "shares"])
def test_the_position_is_restored_whatever_the_non_chief_saves(tmp_path, references, mode):
    """The default (memory) is every test above; storage writes each non-chief's copy to
    disk, shares has each worker write part of the chief's checkpoint (one of them the
    position): every worker's position is the same, so each way restores it."""
    args = ["--stack", "custom"]
    env = {"TF_FAILURE_HANDLING_NON_CHIEF_SAVES": mode}
    outputs, _ = attempts(tmp_path, 2, args, [12], env=env)
    check_as_uninterrupted(outputs, references(2, args))


#: shuffle(seed) then cache() in memory (issue 60), on a custom loop and on both fits.
CACHED_AFTER_SHUFFLE = [
    pytest.param(0, ["--stack", "custom"], id="custom-no-strategy"),
    pytest.param(0, ["--stack", "keras3"], id="keras3-no-strategy"),
    pytest.param(2, ["--stack", "tf_keras"], id="tf_keras-mwms"),
]


@pytest.mark.timeout(6 * ATTEMPT_TIMEOUT)
@pytest.mark.parametrize("workers,args", CACHED_AFTER_SHUFFLE)
def test_a_cache_after_the_shuffle_warns_and_starts_again_at_its_first_element(
    tmp_path, workers, args
):
    """``shuffle(seed)`` then ``cache()``: every epoch repeats the first one's order (the
    cache's), which a restart does not make (its earlier iterators, made unpulled, fill
    no cache). Success: every worker of every attempt warns, naming why, that the
    position is not saved, and the input behaves as documented for such input (the
    resumed epoch starts again at its first element: ids trained unevenly, the steps
    as planned). Before issue 60 it was positioned with no warning, and wrong."""
    args = [*args, "--input", "shuffle-cache"]
    outputs, logs = attempts(tmp_path, workers, args, [12])
    for attempt in logs:
        for log in attempt:
            assert "is not saved: it keeps in a cache() in memory" in log, tail(log)
    for output in outputs:
        assert output["counts"] != [EPOCHS] * 64, "the resumed epoch started again"
        assert sum(output["counts"]) == 12 * 8 + 12 * 8, "192 element-steps, as planned"
