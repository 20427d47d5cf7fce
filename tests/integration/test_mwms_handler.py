"""PreemptionCheckpointHandler with real 2-worker MultiWorkerMirroredStrategy clusters.

Every test runs for TF's handler ("tf") and for tf_failure_handling's ("ours").
Workers run ``mwms_worker.py`` on 127.0.0.1; see ``conftest.py`` for the harness.
"""

from __future__ import annotations

import os
import re
import signal
import time

import numpy as np
import pytest

from .conftest import STARTUP_BOUND, Cluster, require_impl

NUM_WORKERS = 2
STEPS = 70  # total run calls of the preemption tests
STEP_SLEEP = 0.03  # python-side sleep in each step: ~40 ms steps
SIGNAL_AFTER = 10  # send the notice once every worker reported this step
EXIT_TIMEOUT = 120.0  # bound for "saved and exited" after a notice (a hang bound)
RUN_BOUND = 120.0  # bound for an uninterrupted run (the reference) or a restart to finish
#: A test's whole bound (pytest-timeout), setup included: the module's reference run, a
#: cluster's start, a notice, a restart. It only turns a hang into a failure; at a load of
#: 12-16 (make test with its halves two tests at a time) one test took 240 s. The backstop
#: above the tests' own bounds in sequence (+ 60 s for the kills at teardown).
HANG_BOUND = RUN_BOUND + STARTUP_BOUND + EXIT_TIMEOUT + RUN_BOUND + 60
DEFAULT_EXIT_CODE = 42  # TF's default exit_fn on non-GCE platforms
NON_CHIEF_SAVES_ENV = "TF_FAILURE_HANDLING_NON_CHIEF_SAVES"


def _chief_and_non_chief_dirs(ckpt_dir):
    return ckpt_dir, ckpt_dir.parent / "workertemp_1" / ckpt_dir.name


def _in_memory(directory: str, ckpt_dir) -> bool:
    """Ours by default: the non-chief's copy in TF's ram:// file system, one folder per
    handler (issue 36: the checkpoint's storage gets one copy of the model)."""
    pattern = rf"ram://tf_failure_handling/\d+-\d+/workertemp_1/{re.escape(ckpt_dir.name)}"
    return re.fullmatch(pattern, directory) is not None


@pytest.fixture(scope="module")
def reference_weights(tmp_path_factory):
    """Final weights of one uninterrupted run of STEPS steps (TF's handler)."""
    workdir = tmp_path_factory.mktemp("reference")
    cluster = Cluster(
        workdir,
        impl="tf",
        ckpt_dir=workdir / "train" / "ckpt",
        steps=STEPS,
        step_sleep=0.0,
        name="reference",
    )
    try:
        done = cluster.run_to_completion(timeout=RUN_BOUND)
    finally:
        cluster.kill()
    for event in done[1:]:
        assert_weights_equal(event["weights"], done[0]["weights"], "worker 0 vs other")
    return done[0]["weights"]


def assert_weights_equal(actual: dict, expected: dict, what: str) -> None:
    assert sorted(actual) == sorted(expected), what
    for name in expected:
        a, e = np.asarray(actual[name]), np.asarray(expected[name])
        assert a.shape == e.shape, f"{what}: {name} shape {a.shape} != {e.shape}"
        assert np.allclose(a, e, rtol=1e-6, atol=1e-7), (
            f"{what}: {name} differs from the uninterrupted run\n"
            f"resumed:       {a.tolist()}\nuninterrupted: {e.tolist()}"
        )


def notify_after_progress(cluster: Cluster, targets, min_step=SIGNAL_AFTER) -> tuple[float, int]:
    """Wait until training is under way, then SIGTERM ``targets``.

    Returns (time the first signal was sent, lowest step reported by any worker).
    """
    cluster.wait_for_progress(min_step)
    progress = min(cluster.progress(i) for i in range(cluster.num_workers))
    sent = [cluster.send_signal(i, signal.SIGTERM) for i in targets]
    return min(sent), progress


def check_preemption_exit(cluster: Cluster, exit_code: int, rounds: int = 1) -> list[int]:
    """Both workers exited with ``exit_code`` after saving ``rounds`` times each,
    at the same step in every round; checkpoint layout as TF's.

    Returns the agreed step of each round.
    """
    codes = cluster.wait(EXIT_TIMEOUT, "both workers to save and exit after the notice")
    details = "\n".join(cluster.describe(i) for i in range(cluster.num_workers))
    assert codes == [exit_code] * cluster.num_workers, (
        f"expected every worker to exit with {exit_code}, got {codes}\n{details}"
    )

    saves = [cluster.events(i, "save") for i in range(cluster.num_workers)]
    for i, worker_saves in enumerate(saves):
        assert len(worker_saves) == rounds, (
            f"worker {i} saved {len(worker_saves)} times, expected {rounds}: "
            f"{worker_saves}\n{details}"
        )
    steps_per_worker = [[s["runs"] for s in worker_saves] for worker_saves in saves]
    assert all(steps == steps_per_worker[0] for steps in steps_per_worker), (
        f"workers saved at different steps: {steps_per_worker}"
    )

    chief_dir, non_chief_dir = _chief_and_non_chief_dirs(cluster.ckpt_dir)
    assert all(s["directory"] == str(chief_dir) for s in saves[0]), saves[0]
    if cluster.impl == "ours" and cluster.env.get(NON_CHIEF_SAVES_ENV) != "storage":
        assert all(_in_memory(s["directory"], cluster.ckpt_dir) for s in saves[1]), saves[1]
    else:
        assert all(s["directory"] == str(non_chief_dir) for s in saves[1]), saves[1]
    assert not non_chief_dir.parent.exists(), (
        f"{non_chief_dir.parent} should be deleted before the preemption exit"
    )
    assert (chief_dir / "checkpoint").is_file(), f"no checkpoint in {chief_dir}"
    assert list(chief_dir.glob("ckpt-*.index")), f"no checkpoint data in {chief_dir}"
    return steps_per_worker[0]


def restart_and_check(
    cluster_factory, impl: str, ckpt_dir, saved_step: int, reference: dict, name: str = "restart"
) -> None:
    """Restart both workers on ``ckpt_dir``: they resume at ``saved_step`` and
    end with the uninterrupted run's weights."""
    cluster = cluster_factory(name=name, impl=impl, ckpt_dir=ckpt_dir, steps=STEPS, step_sleep=0.0)
    done = cluster.run_to_completion(timeout=RUN_BOUND)
    for i in range(cluster.num_workers):
        starts = cluster.events(i, "start")
        assert len(starts) == 1, starts
        assert starts[0]["restored"] == saved_step, (
            f"restarted worker {i} restored total_run_calls={starts[0]['restored']}, "
            f"the checkpoint was saved at {saved_step}"
        )
        assert done[i]["total_run_calls"] == STEPS
        assert_weights_equal(
            done[i]["weights"], reference, f"{impl} worker {i} resumed from step {saved_step}"
        )


# --------------------------------------------------------------------------- a
@pytest.mark.timeout(HANG_BOUND)
@pytest.mark.parametrize("targets", [(0,), (1,), (0, 1)], ids=["chief", "non_chief", "both"])
def test_sigterm_saves_at_agreed_step_and_resumes(
    impl, targets, cluster_factory, reference_weights
):
    cluster = cluster_factory(name="preempted", impl=impl, steps=STEPS, step_sleep=STEP_SLEEP)
    cluster.start()
    _, progress = notify_after_progress(cluster, targets)

    (saved_step,) = check_preemption_exit(cluster, DEFAULT_EXIT_CODE)
    assert progress <= saved_step < STEPS, (
        f"saved at step {saved_step}; notice sent after step {progress}"
    )
    if impl == "ours":
        check_records(cluster.ckpt_dir, saved_step, targets, "SIGTERM", DEFAULT_EXIT_CODE)

    restart_and_check(cluster_factory, impl, cluster.ckpt_dir, saved_step, reference_weights)
    if impl == "ours":
        check_resumed(cluster.ckpt_dir, saved_step)


def check_records(ckpt_dir, saved_step: int, targets, source: str, code: int) -> None:
    """Each worker's preemption record matches what happened (issue 22)."""
    from tf_failure_handling import records

    found = records.load(ckpt_dir / "preemption_records")
    assert found.skipped == {}, found.skipped
    by_worker = {p.task: p for p in found.preemptions}
    assert sorted(by_worker) == list(range(NUM_WORKERS)), found.preemptions
    for i, p in by_worker.items():
        assert p.agreed_step == saved_step, f"worker {i}: {p}"
        assert p.save_start <= p.save_end <= p.exit_time, f"worker {i}: {p}"
        assert p.exit_code == code, f"worker {i}: {p}"
        assert p.checkpoint_path, f"worker {i}: {p}"
        if len(targets) == 1:
            expected = source if i in targets else "peer"
            assert expected in p.source, f"worker {i}: expected {expected!r}: {p}"
        else:
            # Each learns of it from its own notice or from the peer's step key first.
            assert source in p.source or p.source == "peer", f"worker {i}: {p}"
    assert any(source in p.source for p in by_worker.values()), found.preemptions


def check_resumed(ckpt_dir, saved_step: int) -> None:
    from tf_failure_handling import records

    found = records.load(ckpt_dir / "preemption_records")
    assert sorted(r.task for r in found.resumes) == list(range(NUM_WORKERS)), found.resumes
    for r in found.resumes:
        assert r.step == saved_step and r.lost == 0, r
        assert r.downtime is not None and r.downtime >= 0, r


# --------------------------------------------------------------------------- b
@pytest.mark.timeout(HANG_BOUND)
def test_watcher_fn_and_custom_exit_fn(impl, cluster_factory, tmp_path, reference_weights):
    notice = tmp_path / "termination-notice"
    exit_code = 7
    cluster = cluster_factory(
        name="watched",
        impl=impl,
        steps=STEPS,
        step_sleep=STEP_SLEEP,
        extra_args=["--watcher-file", str(notice), "--exit-code", str(exit_code)],
    )
    cluster.start()
    cluster.wait_for_progress(SIGNAL_AFTER)
    progress = min(cluster.progress(i) for i in range(NUM_WORKERS))
    notice.touch()

    (saved_step,) = check_preemption_exit(cluster, exit_code)
    assert progress <= saved_step < STEPS, (
        f"saved at step {saved_step}; notice file created after step {progress}"
    )
    if impl == "ours":
        # Every worker's watcher fn sees the file; a custom exit_fn's code is unknown.
        check_records(cluster.ckpt_dir, saved_step, (0, 1), "termination_watcher_fn", None)

    restart_and_check(cluster_factory, impl, cluster.ckpt_dir, saved_step, reference_weights)


# --------------------------------------------------------------------------- c
GRACE = 3.0
GRACE_STEPS = 150  # enough steps to outlast the grace period


@pytest.mark.timeout(HANG_BOUND)
def test_grace_period_saves_twice_the_final_round_as_planned(impl, cluster_factory):
    cluster = cluster_factory(
        name="grace",
        impl=impl,
        steps=GRACE_STEPS,
        step_sleep=STEP_SLEEP,
        extra_args=["--grace", str(GRACE)],
    )
    cluster.start()
    signal_time, _ = notify_after_progress(cluster, (1,))

    first_step, second_step = check_preemption_exit(cluster, DEFAULT_EXIT_CODE, rounds=2)
    assert first_step < second_step < GRACE_STEPS
    saves = [cluster.events(i, "save") for i in range(NUM_WORKERS)]
    first, second = ([s[r] for s in saves] for r in range(2))

    # Saved once at the notice, then again at the end of the grace period.
    assert min(s["t_start"] for s in first) > signal_time
    assert min(s["t_start"] for s in second) > max(s["t_end"] for s in first)
    if impl == "ours":
        check_final_round_planned(second)
    # Whether the final save then ends before the deadline (TF: often not, its planner
    # ignores the save's time) depends on the machine's speed after the plan: a figure
    # for a bench, not a verdict. The plan is checked above.


def check_final_round_planned(final_saves: list) -> None:
    """tf_failure_handling's final round came when planned: every worker with a notice of
    its own plans it for ``planned_deadline - margin``, a margin that holds 1.5 x the
    longest save it measured and two steps; the worker that published it did so when its
    own plan was due. (Workers measure different saves, so their plans differ: the
    earliest one publishes, and the others' plans were not yet due.)"""
    plans = [s["plan"] for s in final_saves if s["plan"] and "final_round_at" in s["plan"]]
    assert plans, f"no worker reported a final-round plan: {final_saves}"
    for plan in plans:
        planned_for = plan["planned_deadline"] - plan["margin"]
        assert plan["final_round_at"] == pytest.approx(planned_for), plan
        assert plan["margin"] >= 1.5 * plan["longest_save"] + 2 * plan["step_estimate"], plan
    publishers = [plan for plan in plans if plan["published_final"]]
    assert publishers, f"no worker with a plan published the final round: {plans}"
    for plan in publishers:
        assert plan["clock"] >= plan["final_round_at"], plan


# --------------------------------------------------------------------------- d
@pytest.mark.timeout(HANG_BOUND)
def test_error_in_one_worker_fails_the_other(impl, cluster_factory):
    fail_at = 20
    cluster = cluster_factory(
        name="failing",
        impl=impl,
        steps=STEPS,
        step_sleep=STEP_SLEEP,
        worker_args={1: ["--fail-at-step", str(fail_at)]},
    )
    cluster.start()
    started = time.monotonic()
    codes = cluster.wait(EXIT_TIMEOUT, "both workers to fail after worker 1's OpError")
    details = "\n".join(cluster.describe(i) for i in range(NUM_WORKERS))
    for i, code in enumerate(codes):
        assert code not in (0, DEFAULT_EXIT_CODE), (
            f"worker {i} exited with {code}, expected a failure\n{details}"
        )
    assert time.monotonic() - started < EXIT_TIMEOUT
    failing_errors = cluster.events(1, "error")
    assert failing_errors and failing_errors[0]["step"] == fail_at, details
    assert "injected failure" in failing_errors[0]["message"], details
    # The peer raises the propagated error rather than dying some other way.
    peer_errors = cluster.events(0, "error")
    assert peer_errors and peer_errors[0]["type"] == failing_errors[0]["type"], details
    assert not cluster.events(0, "done") and not cluster.events(1, "done")


# --------------------------------------------------------------------------- e
@pytest.mark.timeout(HANG_BOUND)
@pytest.mark.parametrize(
    "first,second", [("tf", "ours"), ("ours", "tf")], ids=["tf_then_ours", "ours_then_tf"]
)
def test_checkpoint_cross_compatible(first, second, cluster_factory, reference_weights):
    require_impl(first)
    require_impl(second)
    cluster = cluster_factory(
        name=f"preempted-{first}", impl=first, steps=STEPS, step_sleep=STEP_SLEEP
    )
    cluster.start()
    notify_after_progress(cluster, (1,))
    (saved_step,) = check_preemption_exit(cluster, DEFAULT_EXIT_CODE)

    restart_and_check(
        cluster_factory,
        second,
        cluster.ckpt_dir,
        saved_step,
        reference_weights,
        name=f"restart-{second}",
    )


@pytest.mark.timeout(HANG_BOUND)
def test_non_chief_saves_to_storage_on_request_as_tf(cluster_factory, reference_weights):
    """TF_FAILURE_HANDLING_NON_CHIEF_SAVES=storage: the non-chief's copy goes to
    workertemp_1 beside the checkpoint, as TensorFlow's does, and is removed before the
    exit (check_preemption_exit); the checkpoint resumes as usual."""
    require_impl("ours")
    cluster = cluster_factory(
        name="storage",
        impl="ours",
        steps=STEPS,
        step_sleep=STEP_SLEEP,
        env={NON_CHIEF_SAVES_ENV: "storage"},
    )
    cluster.start()
    notify_after_progress(cluster, (1,))
    (saved_step,) = check_preemption_exit(cluster, DEFAULT_EXIT_CODE)
    restart_and_check(cluster_factory, "ours", cluster.ckpt_dir, saved_step, reference_weights)


@pytest.mark.timeout(HANG_BOUND)
def test_the_workers_write_one_checkpoint_together_on_request(cluster_factory, reference_weights):
    """TF_FAILURE_HANDLING_NON_CHIEF_SAVES=shares: each worker writes a share of the one
    checkpoint (TensorFlow's sharded layout, merged by the chief): two data files, one
    index, no temporary folder left, no copy in workertemp_1 (the non-chief's manager in
    memory: check_preemption_exit) nor in its record; TensorFlow's own handler
    resumes from it at the saved step and ends with the uninterrupted run's weights."""
    require_impl("ours")
    cluster = cluster_factory(
        name="shares",
        impl="ours",
        steps=STEPS,
        step_sleep=STEP_SLEEP,
        env={NON_CHIEF_SAVES_ENV: "shares"},
    )
    cluster.start()
    notify_after_progress(cluster, (1,))
    (saved_step,) = check_preemption_exit(cluster, DEFAULT_EXIT_CODE)
    chief_dir = cluster.ckpt_dir
    (index,) = chief_dir.glob("ckpt-*.index")
    prefix = str(index)[: -len(".index")]
    data = sorted(p.name for p in chief_dir.glob("ckpt-*.data-*"))
    name = os.path.basename(prefix)
    assert data == [f"{name}.data-00000-of-00002", f"{name}.data-00001-of-00002"], data
    assert all((chief_dir / d).stat().st_size > 0 for d in data), "a worker wrote no share"
    assert not list(chief_dir.glob("*_temp")), list(chief_dir.iterdir())
    # The non-chief wrote its share and no whole copy: its save_end names no copy (a
    # saver no share can be cut from writes one whole: copy memory or storage).
    from .test_save_memory import _save_end_lines

    [line] = _save_end_lines(chief_dir, 1)
    assert "copy" not in line, line
    restart_and_check(
        cluster_factory, "tf", chief_dir, saved_step, reference_weights, name="restart-tf"
    )
