"""PreemptionCheckpointHandler on simulated multi-worker clusters (testing.SimulatedCluster)."""

from __future__ import annotations

import os
import random
import re
import tempfile
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reliability.simulation import VirtualClock
from tf_failure_handling import TerminationConfig, _errors, testing
from tf_failure_handling._protocol.step_keys import StepKeys

from . import rust_constants as rust
from .conftest import RecordingCheckpoint, wait_until

STEPS = 40
#: A bound that only turns a hang into a failure.
CLUSTER_TIMEOUT = 60.0


def _expected_keys(n: int) -> set:
    # TF's keys, plus the notice key PreemptionWatchers read (written by the leader).
    return {
        "TERMINATED_WORKER",
        "RUN_TO_CHECKPOINT",
        "LAST_RUN_TO_CHECKPOINT",
        "TF_DEFAULT_PREEMPTION_NOTICE_KEY",
    } | {f"RECEIVED_SIGNAL_RUN_TO_CHECKPOINT_{i}" for i in range(n)}


def make_worker(notices, steps=STEPS, config=None, record=None, before_step=None):
    """A worker function: ``steps`` all-reduced steps, notices ``{index: step}`` on attempt 0.

    Each step adds ``index + 1`` summed over the cluster to ``w``; returns ``w``.
    ``record[index]`` receives the worker's RecordingCheckpoint and handler.
    """

    def worker(ctx):
        return train(ctx)

    def train(ctx):
        w = testing.FakeVariable(0.0)
        ckpt = RecordingCheckpoint(w=w)
        cfg = config(ctx) if callable(config) else config
        handler = ctx.handler(ckpt, ctx.checkpoint_dir, cfg)
        if record is not None:
            record[ctx.index] = (ckpt, handler)
        while handler._run_counter < steps:
            step = handler._run_counter
            if ctx.attempt == 0 and notices.get(ctx.index) == step:
                ctx.cluster.preempt(ctx.index)
                wait_for_notice(handler)
            if before_step is not None:
                before_step(ctx, handler, step)
            handler.run(lambda: w.assign_add(ctx.all_reduce(float(ctx.index + 1))))
        return w.numpy()

    return worker


def wait_for_notice(handler):
    """Waits until the handler's notice watcher has handled the notice (claimed or stood down).

    Waiting for that makes the step at which the leader publishes deterministic (its next
    check) without depending on peers.
    """
    wait_until(lambda: handler._notices_handled >= 1, what="the notice to be handled")


def uninterrupted_value(n: int, steps: int = STEPS) -> float:
    return steps * n * (n + 1) / 2


def assert_one_agreed_save(cluster, record, results, notices):
    """Every worker exited 42 after exactly one save, all at the agreed step."""
    n = cluster.num_workers
    service = cluster.service
    assert [r.exit_code for r in results] == [42] * n, results
    assert all(r.error is None for r in results), results
    leader = int(service.value("TERMINATED_WORKER"))
    assert leader in notices, f"leader {leader} was never noticed ({notices})"
    step = int(service.value("RUN_TO_CHECKPOINT"))
    # The first notice in step order wins (ties: any of them), and its worker publishes
    # at its next check: run count + 1.
    assert notices[leader] == min(notices.values())
    assert step == notices[leader] + 1
    for i in range(n):
        ckpt, handler = record[i]
        assert ckpt.saved_runs == [step], f"worker {i} saved {ckpt.saved_runs}, agreed {step}"
        assert handler._run_counter == step
        assert service.value(f"RECEIVED_SIGNAL_RUN_TO_CHECKPOINT_{i}") == "1"
    assert set(service.keys()) == _expected_keys(n)
    assert service.value("LAST_RUN_TO_CHECKPOINT") == "STOP_WATCHER"
    assert service.error is None
    return step


def assert_layout_after_exit(cluster, record):
    """Non-chiefs wrote to workertemp_<task_id> and removed it; the chief's checkpoint remains."""
    root = cluster.root
    assert sorted(os.listdir(root)) == ["ckpt"], os.listdir(root)
    assert os.path.exists(os.path.join(root, "ckpt", "checkpoint"))
    for i, (_ckpt, handler) in record.items():
        directory = handler._write_checkpoint_manager.directory
        if i == 0:
            assert handler._is_chief
            assert directory == cluster.checkpoint_dir
        else:
            assert not handler._is_chief
            task_id = i - 1 if cluster._chief else i
            assert directory == os.path.join(root, f"workertemp_{task_id}", "ckpt")


# ------------------------------------------------------------ preemption


@pytest.mark.parametrize("chief", [False, True], ids=["no-chief", "chief"])
@pytest.mark.parametrize("seed", range(6))
def test_random_notices_save_once_at_the_same_step(tmp_path, chief, seed):
    rng = random.Random(seed)
    n = rng.randrange(2, 9)
    noticed = rng.sample(range(n), rng.randrange(1, min(n, 3) + 1))
    notices = {i: rng.randrange(0, 25) for i in noticed}
    cluster = testing.SimulatedCluster(n, root=tmp_path, timeout=CLUSTER_TIMEOUT, chief=chief)
    record = {}
    results = cluster.run(make_worker(notices, record=record))
    assert_one_agreed_save(cluster, record, results, notices)
    assert_layout_after_exit(cluster, record)

    # Restart: every worker restores the agreed step; the result equals an uninterrupted run.
    step = int(cluster.service.value("RUN_TO_CHECKPOINT"))
    record2 = {}
    results2 = cluster.run(make_worker(notices, record=record2, before_step=_restored_at(step)))
    assert all(r.finished for r in results2), results2
    assert [r.value for r in results2] == [uninterrupted_value(n)] * n
    assert all(r[0].saved_runs == [] for r in record2.values())


def _restored_at(step):
    def check(ctx, handler, current):
        assert handler._run_counter >= step, "worker did not restore the agreed step"

    return check


@settings(
    max_examples=20,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    n=st.integers(2, 8),
    chief=st.booleans(),
    data=st.data(),
)
def test_property_any_notices_one_leader_one_save_per_worker(n, chief, data):
    noticed = data.draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=n), label="noticed")
    notices = {i: data.draw(st.integers(0, 15), label=f"step of {i}") for i in sorted(noticed)}
    with tempfile.TemporaryDirectory() as root:
        cluster = testing.SimulatedCluster(n, root=root, timeout=CLUSTER_TIMEOUT, chief=chief)
        record = {}
        results = cluster.run(make_worker(notices, steps=25, record=record))
        step = assert_one_agreed_save(cluster, record, results, notices)
        assert_layout_after_exit(cluster, record)
        results2 = cluster.run(make_worker(notices, steps=25))
        assert [r.value for r in results2] == [uninterrupted_value(n, 25)] * n
        assert step <= 25


def test_simultaneous_notices_on_every_worker_have_one_leader(tmp_path):
    n = 6
    notices = dict.fromkeys(range(n), 5)
    cluster = testing.SimulatedCluster(n, root=tmp_path, timeout=CLUSTER_TIMEOUT)
    record = {}
    results = cluster.run(make_worker(notices, record=record))
    assert_one_agreed_save(cluster, record, results, notices)


def test_notice_before_the_handler_exists_is_delivered(tmp_path):
    n = 3
    cluster = testing.SimulatedCluster(n, root=tmp_path, timeout=CLUSTER_TIMEOUT)
    record = {}

    def wait_at_0(ctx, handler, step):
        if ctx.index == 2 and step == 0:
            wait_for_notice(handler)

    train = make_worker({}, record=record, before_step=wait_at_0)

    def worker(ctx):
        if ctx.index == 2:
            ctx.cluster.preempt(2)  # pending until the handler is built
        return train(ctx)

    results = cluster.run(worker)
    assert_one_agreed_save(cluster, record, results, {2: 0})
    assert cluster.service.value("TERMINATED_WORKER") == "2"


def test_keys_have_tf_names_and_values(tmp_path):
    n = 4
    cluster = testing.SimulatedCluster(n, root=tmp_path, timeout=CLUSTER_TIMEOUT, chief=True)
    record = {}
    results = cluster.run(make_worker({3: 10}, record=record))
    assert [r.exit_code for r in results] == [42] * n
    service = cluster.service
    assert service.value("TERMINATED_WORKER") == "3"
    assert re.fullmatch(r"[0-9]+", service.value("RUN_TO_CHECKPOINT"))
    for i in range(n):
        assert service.value(f"RECEIVED_SIGNAL_RUN_TO_CHECKPOINT_{i}") == "1"
    assert service.value("LAST_RUN_TO_CHECKPOINT") == "STOP_WATCHER"
    assert set(service.keys()) == _expected_keys(n)
    assert [record[i][1]._id_in_cluster for i in range(n)] == ["0", "1", "2", "3"]


def test_the_leaders_claim_line_says_the_run_count_tf_handler_suite_reads(tmp_path, caplog):
    """The claim's log line keeps TF's message and adds where training was when the claim
    was won, in the form TensorFlow's handler suite reads (``evidence._OURS_CLAIMED``):
    its notice check tells a notice that came too late to save at from a missed save."""
    from tf_handler_suite import evidence

    caplog.set_level("INFO", logger="tf_failure_handling")
    cluster = testing.SimulatedCluster(2, root=tmp_path, timeout=CLUSTER_TIMEOUT)
    results = cluster.run(make_worker({1: 10}))
    assert [r.exit_code for r in results] == [42, 42]
    claims = [
        m for r in caplog.records if (m := evidence._OURS_CLAIMED.match(r.getMessage())) is not None
    ]
    assert len(claims) == 1, [r.getMessage() for r in caplog.records]
    assert evidence._TF_NOTICE.match(claims[0].group(0))
    # The worker waits for its notice to be taken at run count 10; the step agreed is
    # published at a check after the claim, so the claim's run count is below it.
    step = int(cluster.service.value("RUN_TO_CHECKPOINT"))
    assert 10 <= int(claims[0].group(1)) < step


@pytest.mark.parametrize("chief", [False, True], ids=["no-chief", "chief"])
def test_workertemp_is_removed_before_exit_fn_runs(tmp_path, chief):
    n = 3
    cluster = testing.SimulatedCluster(n, root=tmp_path, timeout=CLUSTER_TIMEOUT, chief=chief)
    seen = {}

    def config(ctx):
        def exit_fn():
            h = record[ctx.index][1]
            write_dir = h._write_checkpoint_manager.directory
            seen[ctx.index] = {
                "write_dir_exists": os.path.exists(write_dir),
                "parent_exists": os.path.exists(os.path.dirname(write_dir)),
                "saved_there": record[ctx.index][0].saved_runs,
            }
            raise SystemExit(42)

        return TerminationConfig(exit_fn=exit_fn)

    record = {}
    results = cluster.run(make_worker({1: 4}, config=config, record=record))
    assert [r.exit_code for r in results] == [42] * n, results
    assert seen[0]["write_dir_exists"] is True  # the chief's checkpoint stays
    for i in range(1, n):
        assert seen[i]["saved_there"] == [5]
        assert seen[i]["write_dir_exists"] is False, f"worker {i}'s workertemp still there"
        assert seen[i]["parent_exists"] is False
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]


def test_uninterrupted_run_writes_only_stop_watcher_keys(tmp_path):
    n = 3
    cluster = testing.SimulatedCluster(n, root=tmp_path, timeout=CLUSTER_TIMEOUT)
    record = {}
    results = cluster.run(make_worker({}, steps=10, record=record))
    assert [r.value for r in results] == [uninterrupted_value(n, 10)] * n
    # Nobody was noticed; closing the handlers released the blocked peer watchers.
    assert cluster.service.keys() == ["LAST_RUN_TO_CHECKPOINT", "RUN_TO_CHECKPOINT"]
    assert cluster.service.value("RUN_TO_CHECKPOINT") == "STOP_WATCHER"
    assert all(not h._step_keys.thread for _, h in record.values())
    assert all(c.saved_runs == [] for c, _ in record.values())


# Backstop above its own bounds in sequence: two cluster runs (+ 30 s).
@pytest.mark.timeout(2 * CLUSTER_TIMEOUT + 30)
@pytest.mark.parametrize("chief", [False, True], ids=["no-chief", "chief"])
def test_grace_period_rounds(tmp_path, chief):
    """The first save at the notice, training through the grace period, the last save.

    No verdict depends on the machine's speed: every handler reads one virtual clock
    that worker 1 (the one noticed, so the leader that plans) advances by ``TICK``
    before each of its steps, and the steps are all-reduced, so the grace period is
    ``grace / tick`` (300) steps whatever the load. Saves and agreements take no
    virtual time, so the planner publishes ``2 * step + SLACK`` (about 10 ticks) and
    the exit's reserve before the deadline. (With real time, a save and a round that
    took the whole 3 s under ``make test``'s load left 2 steps: a verdict decided by
    load.) The step
    estimate is the one real-time part (the native check times steps): with 30 s, only
    steps of seconds each, not a loaded machine, could move the plan outside the bounds
    below or make the final round due at the first round's step."""
    n = 3
    grace = 30.0
    tick = 0.1
    clock = VirtualClock()
    cluster = testing.SimulatedCluster(n, root=tmp_path, timeout=CLUSTER_TIMEOUT, chief=chief)
    record = {}
    noticed_at = {}

    def before_step(ctx, handler, step):
        handler._core.configure(clock=clock.now)
        if ctx.index == 1:
            if step == 5:
                noticed_at["t"] = clock.now()
            clock.advance(tick)

    results = cluster.run(
        make_worker(
            {1: 5},
            steps=100_000,
            config=TerminationConfig(grace_period=grace),
            record=record,
            before_step=before_step,
        )
    )
    service = cluster.service
    assert [r.exit_code for r in results] == [42] * n, results
    first = int(service.value("RUN_TO_CHECKPOINT"))
    last = int(service.value("LAST_RUN_TO_CHECKPOINT"))
    assert first == 6
    # The notice came before step 5's tick; the deadline is 300 ticks later. The
    # leader publishes about 12 ticks, the planner's slack and the exit's reserve before
    # it, and everyone runs one step more.
    grace_steps = round(grace / tick)
    slack_steps = round((rust.GRACE_SLACK + rust.EXIT_RESERVE) / tick)
    assert first + grace_steps - slack_steps - 20 <= last <= first + grace_steps, (first, last)
    for i in range(n):
        ckpt, handler = record[i]
        assert ckpt.saved_runs == [first, last], f"worker {i}"
        assert handler._run_counter == last
        assert service.value(f"RECEIVED_SIGNAL_RUN_TO_CHECKPOINT_{i}") == "1"
        assert service.value(f"RECEIVED_SIGNAL_LAST_RUN_TO_CHECKPOINT_{i}") == "1"
    assert service.value("TERMINATED_WORKER") == "1"
    assert clock.now() - noticed_at["t"] < grace, "the last save ended after the deadline"
    assert_layout_after_exit(cluster, record)
    # Restart from the final save.
    results2 = cluster.run(make_worker({}, steps=last + 5))
    assert [r.value for r in results2] == [uninterrupted_value(n, last + 5)] * n


def test_notice_to_a_second_worker_during_the_round_changes_nothing(tmp_path):
    n = 4
    cluster = testing.SimulatedCluster(n, root=tmp_path, timeout=CLUSTER_TIMEOUT)
    record = {}

    late = []

    def before_step(ctx, handler, step):
        # Right after worker 0 published (its run 4 is still ahead), worker 3 is noticed too.
        if ctx.index == 0 and step == 3:
            handler._check_preemption_and_maybe_checkpoint()
            assert handler._core_state()["agreed_step"] == 4
            ctx.cluster.preempt(3)
            late.append(step)

    results = cluster.run(make_worker({0: 3}, record=record, before_step=before_step))
    assert late == [3]
    step = assert_one_agreed_save(cluster, record, results, {0: 3})
    assert step == 4
    assert cluster.service.value("TERMINATED_WORKER") == "0"


# ------------------------------------------------------------ step errors


@pytest.mark.parametrize(
    "error_name", ["InvalidArgumentError", "ResourceExhaustedError", "InternalError"]
)
@pytest.mark.parametrize("chief", [False, True], ids=["no-chief", "chief"])
def test_op_error_in_one_worker_fails_every_worker_with_that_type(tmp_path, error_name, chief):
    n = 4
    errors = _errors.module()
    error_cls = getattr(errors, error_name)
    cluster = testing.SimulatedCluster(n, root=tmp_path, timeout=CLUSTER_TIMEOUT, chief=chief)

    def before_step(ctx, handler, step):
        if ctx.index == 2 and step == 7:

            def failing():
                raise _errors.make(error_name, "step 7 failed on worker 2")

            handler.run(failing)

    start = time.monotonic()
    results = cluster.run(make_worker({}, record={}, before_step=before_step))
    # Ended by the propagated error, not by the collectives' own timeout (the cluster's).
    assert time.monotonic() - start < CLUSTER_TIMEOUT / 2
    assert cluster.service.error == (
        error_cls(None, None, "").error_code,
        "step 7 failed on worker 2",
    )
    for r in results:
        assert r.exit_code is None
        assert type(r.error) is error_cls, (r.index, r.error)
        assert isinstance(r.error, errors.OpError)
    assert results[2].error.message == "step 7 failed on worker 2"


def test_tf_error_class_is_reported_with_its_code(tmp_path):
    tf = pytest.importorskip("tensorflow", reason="raises tf.errors classes directly")
    n = 2
    cluster = testing.SimulatedCluster(n, root=tmp_path, timeout=CLUSTER_TIMEOUT)

    def before_step(ctx, handler, step):
        if ctx.index == 0 and step == 3:

            def failing():
                raise tf.errors.InvalidArgumentError(None, None, "bad shape")

            handler.run(failing)

    results = cluster.run(make_worker({}, before_step=before_step))
    assert cluster.service.error == (3, "bad shape")
    assert all(isinstance(r.error, tf.errors.InvalidArgumentError) for r in results)


def test_non_op_error_is_not_reported_but_releases_the_peers(tmp_path):
    n = 3
    cluster = testing.SimulatedCluster(n, root=tmp_path, timeout=CLUSTER_TIMEOUT)

    def before_step(ctx, handler, step):
        if ctx.index == 1 and step == 2:
            raise KeyError("python bug")

    results = cluster.run(make_worker({}, before_step=before_step))
    assert isinstance(results[1].error, KeyError)
    # Only the peers' own UnavailableError (from the aborted collective) was reported.
    code, message = cluster.service.error
    assert code == 14
    assert "collective aborted" in message
    for i in (0, 2):
        assert isinstance(results[i].error, _errors.module().UnavailableError)


# ------------------------------------------------------------ missing peers


# Backstop above its own bound: one cluster run (+ 30 s).
@pytest.mark.timeout(CLUSTER_TIMEOUT + 30)
def test_peer_that_never_acknowledges_makes_the_leader_raise_deadline_exceeded(tmp_path):
    n = 3
    errors = _errors.module()
    cluster = testing.SimulatedCluster(n, root=tmp_path, timeout=CLUSTER_TIMEOUT)
    config = TerminationConfig(peer_timeout=0.5)

    def slow_driver(ctx, handler, step):
        # The leader's own driver acknowledges only after the peer timeout: the leader
        # wrote its acknowledgement with the step key, so it is not named (in CI its
        # threads were once that slow, and the error named worker 0 itself).
        if step == 0:
            acknowledge = handler._step_keys.acknowledge

            def late(*args):
                time.sleep(1.0)
                return acknowledge(*args)

            handler._step_keys.acknowledge = late

    start = time.monotonic()
    # Only worker 0 runs: workers 1 and 2 never build a handler, so never acknowledge.
    worker = make_worker({0: 2}, config=config, before_step=slow_driver)
    results = cluster.run(worker, workers=[0])
    elapsed = time.monotonic() - start
    error = results[0].error
    assert type(error) is errors.DeadlineExceededError, results
    assert "worker(s) 1, 2 did not acknowledge" in str(error)
    assert "RECEIVED_SIGNAL_RUN_TO_CHECKPOINT_1" in str(error)
    assert "RECEIVED_SIGNAL_RUN_TO_CHECKPOINT_0" not in str(error)
    assert elapsed >= 0.5  # (an unbounded wait would be the cluster's TimeoutError)
    assert cluster.service.value("RUN_TO_CHECKPOINT") == "3"


# Backstop above its own bound: one cluster run (+ 30 s).
@pytest.mark.timeout(CLUSTER_TIMEOUT + 30)
def test_peer_timeout_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("TF_FAILURE_HANDLING_PEER_TIMEOUT", "0.3")
    cluster = testing.SimulatedCluster(2, root=tmp_path, timeout=CLUSTER_TIMEOUT)
    start = time.monotonic()
    results = cluster.run(make_worker({0: 1}), workers=[0])
    assert type(results[0].error) is _errors.module().DeadlineExceededError
    assert "worker(s) 1 did not acknowledge within 0.3s" in str(results[0].error)
    assert time.monotonic() - start >= 0.3


@pytest.fixture
def worker_2_never_acknowledges(monkeypatch):
    """Worker 2's peer watcher is gone (a hung process): it never acknowledges.

    (A failed acknowledgement is retried; test_protocol_faults.py covers those.)
    """
    original = StepKeys._watch_until_done

    def watch(self):
        if self._state.membership.id_in_cluster != "2":
            original(self)

    monkeypatch.setattr(StepKeys, "_watch_until_done", watch)


# Backstop above its own bound: one cluster run (+ 30 s).
@pytest.mark.timeout(CLUSTER_TIMEOUT + 30)
def test_lost_acknowledgement_names_only_the_missing_worker_and_nobody_hangs(
    tmp_path, worker_2_never_acknowledges
):
    n = 3
    errors = _errors.module()
    cluster = testing.SimulatedCluster(n, root=tmp_path, timeout=CLUSTER_TIMEOUT)
    # Worker 1 answers (its reader and driver threads) well within 5 s on a loaded
    # machine; at 0.5 s, a CI run could name it as well.
    config = TerminationConfig(peer_timeout=5.0)
    results = cluster.run(make_worker({0: 3}, config=config))
    leader_error = results[0].error
    assert type(leader_error) is errors.DeadlineExceededError, results
    assert "worker(s) 2 did not acknowledge" in str(leader_error)
    assert "RECEIVED_SIGNAL_RUN_TO_CHECKPOINT_2" in str(leader_error)
    for r in results:
        assert r.exit_code is None and r.error is not None, results
        assert isinstance(r.error, errors.OpError)


# Regression test for a bug these unit tests found (fixed; formerly a strict xfail).
# Backstop above its own bound: one cluster run (+ 30 s).
@pytest.mark.timeout(CLUSTER_TIMEOUT + 30)
def test_leaders_deadline_error_is_reported_to_the_cluster(tmp_path, worker_2_never_acknowledges):
    n = 3
    errors = _errors.module()
    cluster = testing.SimulatedCluster(n, root=tmp_path, timeout=CLUSTER_TIMEOUT)
    config = TerminationConfig(peer_timeout=0.5)
    results = cluster.run(make_worker({0: 3}, config=config))
    assert type(results[0].error) is errors.DeadlineExceededError
    assert cluster.service.error is not None
    assert cluster.service.error[0] == 4
    for r in results:
        assert type(r.error) is errors.DeadlineExceededError, (r.index, r.error)


# ------------------------------------------------------------ misc


def test_closing_a_peer_before_the_notice_does_not_hang_the_leader(tmp_path):
    """A worker that closed its handler wrote STOP_WATCHER: the leader does not wait for it."""
    n = 2
    cluster = testing.SimulatedCluster(n, root=tmp_path, timeout=CLUSTER_TIMEOUT)
    record = {}
    closed = threading.Event()

    def before_step(ctx, handler, step):
        if ctx.index == 1 and step == 1:
            handler.close()
            closed.set()
        if ctx.index == 0 and step == 2:
            assert closed.wait(CLUSTER_TIMEOUT)
            ctx.cluster.preempt(0)
            wait_until(lambda: handler._attention)

    results = cluster.run(
        make_worker(
            {},
            steps=10,
            config=TerminationConfig(peer_timeout=CLUSTER_TIMEOUT * 2),
            record=record,
            before_step=before_step,
        )
    )
    # A leader that waited for the closed peer would end with DeadlineExceededError
    # (or the cluster's TimeoutError), not exit 42.
    assert results[0].exit_code == 42
    assert record[0][0].saved_runs == [3]


def test_workers_have_tf_ids(tmp_path):
    cluster = testing.SimulatedCluster(3, root=tmp_path, timeout=CLUSTER_TIMEOUT, chief=True)
    record = {}
    cluster.run(make_worker({}, steps=1, record=record))
    assert [record[i][1]._id_in_cluster for i in range(3)] == ["0", "1", "2"]
    assert [record[i][1]._is_chief for i in range(3)] == [True, False, False]
    assert [record[i][1]._local_mode for i in range(3)] == [False] * 3
