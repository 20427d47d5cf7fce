"""The public ``tf_failure_handling.testing`` module: service, fakes, simulated cluster."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
from tf_failure_handling import _errors, testing
from tf_failure_handling._cluster import coordination as _coordination

#: A bound that only turns a hang into a failure.
HANG = 60.0
#: The cluster timeout of the tests of that timeout: long enough for a worker that
#: returns at once to be done on a loaded machine (the tests take this long).
SHORT_CLUSTER_TIMEOUT = 5.0


def _errs():
    return _errors.module()


def _in_thread(fn, *args):
    """Runs ``fn`` in a thread; returns ``(thread, box)`` with box = [("ok", v) | ("error", e)]."""
    box: list = []

    def target():
        try:
            box.append(("ok", fn(*args)))
        except BaseException as e:  # noqa: BLE001 - handed to the test
            box.append(("error", e))

    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t, box


# ------------------------------------------------- InMemoryCoordinationService


def test_set_then_get():
    s = testing.InMemoryCoordinationService()
    s.set_config_key_value("k", "v")
    assert s.get_config_key_value("k") == "v"
    assert s.get_config_key_value("k", 10) == "v"
    assert s.value("k") == "v"
    assert s.value("missing") is None
    assert s.keys() == ["k"]


def test_values_are_strings():
    s = testing.InMemoryCoordinationService()
    s.set_config_key_value("n", 5)
    assert s.get_config_key_value("n", 10) == "5"


def test_set_existing_key_is_already_exists_and_keeps_the_value():
    s = testing.InMemoryCoordinationService()
    s.set_config_key_value("TERMINATED_WORKER", "0")
    with pytest.raises(_errs().AlreadyExistsError):
        s.set_config_key_value("TERMINATED_WORKER", "1")
    assert s.value("TERMINATED_WORKER") == "0"


def test_errors_are_tfs_own_classes_when_tf_is_installed():
    tf = pytest.importorskip("tensorflow", reason="compares with tf.errors")
    s = testing.InMemoryCoordinationService()
    s.set_config_key_value("k", "v")
    with pytest.raises(tf.errors.AlreadyExistsError):
        s.set_config_key_value("k", "v")
    with pytest.raises(tf.errors.DeadlineExceededError):
        s.get_config_key_value("missing", 1)


def test_get_blocks_until_another_thread_sets():
    s = testing.InMemoryCoordinationService()
    t, box = _in_thread(s.get_config_key_value, "k", 5000)
    time.sleep(0.1)
    assert box == [], "get returned before the key was set"
    s.set_config_key_value("k", "late")
    t.join(HANG)
    assert box == [("ok", "late")]


@pytest.mark.parametrize("timeout_ms", [1, 50, 200])
def test_get_timeout_is_deadline_exceeded(timeout_ms):
    s = testing.InMemoryCoordinationService()
    start = time.monotonic()
    with pytest.raises(_errs().DeadlineExceededError, match="missing"):
        s.get_config_key_value("missing", timeout_ms)
    elapsed = time.monotonic() - start
    assert elapsed >= timeout_ms / 1000 * 0.9
    assert elapsed < timeout_ms / 1000 + HANG


def test_timeout_zero_means_forever():
    s = testing.InMemoryCoordinationService()
    t, box = _in_thread(s.get_config_key_value, "k", 0)
    time.sleep(0.3)
    assert box == [], "timeout_in_ms=0 did not wait"
    s.set_config_key_value("k", "v")
    t.join(HANG)
    assert box == [("ok", "v")]


def test_default_timeout_is_forever():
    s = testing.InMemoryCoordinationService()
    t, box = _in_thread(s.get_config_key_value, "k")
    time.sleep(0.2)
    assert box == []
    s.set_config_key_value("k", "v")
    t.join(HANG)
    assert box == [("ok", "v")]


def test_delete_then_set_again():
    s = testing.InMemoryCoordinationService()
    s.set_config_key_value("k", "1")
    s.delete_config_key_value("k")
    assert s.value("k") is None
    s.delete_config_key_value("never-set")
    s.set_config_key_value("k", "2")
    assert s.get_config_key_value("k", 10) == "2"


def test_keys_are_sorted():
    s = testing.InMemoryCoordinationService()
    for k in ["b", "a", "RUN_TO_CHECKPOINT", "c"]:
        s.set_config_key_value(k, "x")
    assert s.keys() == sorted(["b", "a", "RUN_TO_CHECKPOINT", "c"])


@pytest.mark.parametrize(
    ("code", "name"),
    [
        (3, "InvalidArgumentError"),
        (14, "UnavailableError"),
        (10, "AbortedError"),
        (1, "CancelledError"),
    ],
)
def test_report_error_fails_blocked_gets_with_the_codes_type(code, name):
    s = testing.InMemoryCoordinationService()
    waiters = [_in_thread(s.get_config_key_value, f"k{i}", 0) for i in range(3)]
    time.sleep(0.05)
    assert all(box == [] for _, box in waiters)
    s.report_error_to_cluster(code, "worker 1 failed")
    for t, box in waiters:
        t.join(HANG)
        assert not t.is_alive()
        kind, error = box[0]
        assert kind == "error"
        assert type(error) is getattr(_errs(), name)
        assert error.message == "worker 1 failed"
    assert s.error == (code, "worker 1 failed")
    # Later gets fail too.
    with pytest.raises(getattr(_errs(), name)):
        s.get_config_key_value("other", 10)


def test_first_reported_error_wins():
    s = testing.InMemoryCoordinationService()
    assert s.error is None
    s.report_error_to_cluster(3, "first")
    s.report_error_to_cluster(14, "second")
    assert s.error == (3, "first")


# Regression test for a bug these unit tests found (fixed; formerly a strict xfail).
def test_unknown_error_code_is_unknown_error():
    pytest.importorskip("tensorflow", reason="the fallback without TF already maps it")
    s = testing.InMemoryCoordinationService()
    s.report_error_to_cluster(999, "weird")
    with pytest.raises(_errs().UnknownError):
        s.get_config_key_value("k", 10)


def test_fail_next_set_fails_once_and_sets_nothing():
    s = testing.InMemoryCoordinationService()
    s.fail_next_set("k")
    with pytest.raises(_errs().UnavailableError, match="injected"):
        s.set_config_key_value("k", "1")
    assert s.value("k") is None
    s.set_config_key_value("other", "x")  # other keys unaffected
    s.set_config_key_value("k", "2")
    assert s.value("k") == "2"


def test_fail_next_get_fails_once_even_if_the_key_exists():
    s = testing.InMemoryCoordinationService()
    s.set_config_key_value("k", "v")
    s.fail_next_get("k")
    with pytest.raises(_errs().UnavailableError, match="injected"):
        s.get_config_key_value("k", 10)
    assert s.get_config_key_value("k", 10) == "v"


def test_injected_faults_accumulate():
    s = testing.InMemoryCoordinationService()
    s.fail_next_set("k")
    s.fail_next_set("k")
    s.fail_next_get("k")
    for _ in range(2):
        with pytest.raises(_errs().UnavailableError):
            s.set_config_key_value("k", "1")
    s.set_config_key_value("k", "1")
    with pytest.raises(_errs().UnavailableError):
        s.get_config_key_value("k", 10)
    assert s.get_config_key_value("k", 10) == "1"


def test_use_coordination_service_is_per_thread_and_nests():
    a, b = testing.InMemoryCoordinationService(), testing.InMemoryCoordinationService()
    seen = []
    with testing.use_coordination_service(a):
        assert _coordination.current() is a
        with testing.use_coordination_service(b):
            assert _coordination.current() is b
            t = threading.Thread(
                target=lambda: seen.append(getattr(_coordination._local, "service", None))
            )
            t.start()
            t.join()
        assert _coordination.current() is a
    assert seen == [None]
    assert getattr(_coordination._local, "service", None) is None


def test_client_adapter_turns_exists_and_timeout_into_values():
    s = testing.InMemoryCoordinationService()
    c = _coordination.Client(s)
    assert c.set("k", "v") is True
    assert c.set("k", "w") is False
    assert c.get("k", 0.01) == "v"
    start = time.monotonic()
    assert c.get("missing", 0.0) is None  # 0 s must not mean "forever"
    assert time.monotonic() - start < HANG
    s.fail_next_get("k")
    with pytest.raises(_errs().UnavailableError):
        c.get("k", 0.01)


# ------------------------------------------------------------ fake checkpoints


def test_fake_variable():
    v = testing.FakeVariable(1)
    assert v.assign_add(2) is v
    assert v.numpy() == 3
    assert v.assign(10).numpy() == 10
    assert "10" in repr(v)


def test_fake_checkpoint_rejects_non_variables():
    with pytest.raises(TypeError, match="w"):
        testing.FakeCheckpoint(w=3)


def test_fake_manager_save_and_restore(tmp_path):
    w = testing.FakeVariable(1.5)
    ckpt = testing.FakeCheckpoint(w=w, step=testing.FakeVariable(7))
    m = ckpt.make_manager(str(tmp_path / "c"))
    assert m.latest_checkpoint is None
    assert m.restore_or_initialize() is None
    path = m.save()
    assert path == os.path.join(str(tmp_path / "c"), "ckpt-1.json")
    assert m.latest_checkpoint == path
    assert json.loads(Path(path).read_text()) == {"w": 1.5, "step": 7}

    w2 = testing.FakeVariable(0)
    ckpt2 = testing.FakeCheckpoint(
        w=w2, step=testing.FakeVariable(0), extra=testing.FakeVariable(9)
    )
    assert ckpt2.make_manager(str(tmp_path / "c")).restore_or_initialize() == path
    assert w2.numpy() == 1.5
    assert ckpt2.step.numpy() == 7
    assert ckpt2.extra.numpy() == 9  # not in the file: left as is


@pytest.mark.parametrize("max_to_keep", [1, 2, 3])
def test_fake_manager_max_to_keep(tmp_path, max_to_keep):
    w = testing.FakeVariable(0)
    m = testing.FakeCheckpoint(w=w).make_manager(str(tmp_path), max_to_keep=max_to_keep)
    for i in range(5):
        w.assign(i)
        m.save()
    files = sorted(f for f in os.listdir(tmp_path) if f.endswith(".json"))
    assert files == sorted(f"ckpt-{n}.json" for n in range(6 - max_to_keep, 6))
    assert m.saves == 5
    assert m.latest_checkpoint.endswith("ckpt-5.json")


def test_fake_manager_keeps_all_without_max_to_keep(tmp_path):
    m = testing.FakeCheckpoint(w=testing.FakeVariable(0)).make_manager(
        str(tmp_path), max_to_keep=None
    )
    for _ in range(4):
        m.save()
    assert len([f for f in os.listdir(tmp_path) if f.endswith(".json")]) == 4


def test_fake_manager_explicit_checkpoint_number(tmp_path):
    w = testing.FakeVariable(0)
    m = testing.FakeCheckpoint(w=w).make_manager(str(tmp_path))
    assert m.save(checkpoint_number=40).endswith("ckpt-40.json")
    assert m.save().endswith("ckpt-41.json")
    assert sorted(os.listdir(tmp_path)) == ["checkpoint", "ckpt-41.json"]


# Regression test for a bug these unit tests found (fixed; formerly a strict xfail).
def test_fake_manager_max_to_keep_counts_recent_saves(tmp_path):
    m = testing.FakeCheckpoint(w=testing.FakeVariable(0)).make_manager(str(tmp_path), max_to_keep=1)
    m.save(checkpoint_number=5)
    m.save(checkpoint_number=3)
    assert sorted(os.listdir(tmp_path)) == ["checkpoint", "ckpt-3.json"]


def _crash_on_fsync(monkeypatch, which):
    calls = []
    real = os.fsync

    def fsync(fd):
        calls.append(fd)
        if len(calls) == which:
            raise OSError("simulated crash")
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)


@pytest.mark.parametrize("crash_at", [1, 2], ids=["writing-data", "writing-index"])
def test_fake_manager_crash_during_save_leaves_the_previous_checkpoint(
    tmp_path, monkeypatch, crash_at
):
    w = testing.FakeVariable("old")
    m = testing.FakeCheckpoint(w=w).make_manager(str(tmp_path))
    first = m.save()
    w.assign("new")
    _crash_on_fsync(monkeypatch, crash_at)
    with pytest.raises(OSError, match="simulated crash"):
        m.save()
    monkeypatch.undo()
    assert m.latest_checkpoint == first
    w2 = testing.FakeVariable(None)
    assert testing.FakeCheckpoint(w=w2).make_manager(str(tmp_path)).restore_or_initialize() == first
    assert w2.numpy() == "old"
    # Whatever the crash left is never a file in use: the index names a complete checkpoint.
    assert json.loads(Path(first).read_text()) == {"w": "old"}


def test_fake_manager_save_leaves_no_temporary_files(tmp_path):
    m = testing.FakeCheckpoint(w=testing.FakeVariable(0)).make_manager(str(tmp_path))
    for _ in range(3):
        m.save()
    assert sorted(os.listdir(tmp_path)) == ["checkpoint", "ckpt-3.json"]


def test_fake_manager_index_pointing_at_a_missing_file(tmp_path):
    m = testing.FakeCheckpoint(w=testing.FakeVariable(0)).make_manager(str(tmp_path))
    m.save()
    os.remove(tmp_path / "ckpt-1.json")
    assert m.latest_checkpoint is None
    assert m.restore_or_initialize() is None


def test_fake_checkpoint_counter():
    ckpt = testing.FakeCheckpoint()
    c = ckpt.make_counter()
    assert isinstance(c, testing.FakeVariable)
    assert c.numpy() == 0


# ------------------------------------------------------------ SimpleClusterResolver


def test_simple_cluster_resolver():
    r = testing.SimpleClusterResolver({"chief": ["c:1"], "worker": ("a:1", "b:1")}, "worker", 1)
    assert r.task_type == "worker"
    assert r.task_id == 1
    spec = r.cluster_spec()
    assert spec.jobs == ["chief", "worker"]
    assert spec.as_dict() == {"chief": ["c:1"], "worker": ["a:1", "b:1"]}
    spec.as_dict()["worker"].append("x")  # a copy
    assert spec.as_dict()["worker"] == ["a:1", "b:1"]


# ------------------------------------------------------------ SimulatedCluster


@pytest.mark.parametrize("bad", [0, -1, 2.0, "3", None], ids=repr)
def test_simulated_cluster_rejects_bad_sizes(bad):
    with pytest.raises(ValueError, match="num_workers"):
        testing.SimulatedCluster(bad)


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_all_reduce_sums_in_lock_step(n):
    cluster = testing.SimulatedCluster(n, timeout=HANG)

    def worker(ctx):
        return [ctx.all_reduce(float(ctx.index + 1) * r) for r in range(1, 6)]

    results = cluster.run(worker)
    total = n * (n + 1) / 2
    for r in results:
        assert r.finished, r
        assert r.value == [total * k for k in range(1, 6)]


def test_all_reduce_waits_for_the_slowest_worker():
    cluster = testing.SimulatedCluster(3, timeout=HANG)

    waiting = threading.Event()

    def worker(ctx):
        start = time.monotonic()
        if ctx.index == 0:
            waiting.set()
        if ctx.index == 2:
            waiting.wait(HANG)  # joins at least 0.2 s after worker 0 started waiting
            time.sleep(0.2)
        total = ctx.all_reduce(1.0)
        return total, time.monotonic() - start

    results = cluster.run(worker)
    assert all(r.value[0] == 3.0 for r in results)
    assert results[0].value[1] >= 0.2


def test_results_record_value_exit_code_and_error():
    cluster = testing.SimulatedCluster(4, timeout=HANG)

    def worker(ctx):
        if ctx.index == 1:
            raise SystemExit(42)
        if ctx.index == 2:
            raise SystemExit("message")
        if ctx.index == 3:
            raise KeyError("bad")
        return "done"

    r = cluster.run(worker)
    assert [x.index for x in r] == [0, 1, 2, 3]
    assert r[0].value == "done" and r[0].finished
    assert r[1].exit_code == 42 and not r[1].finished
    assert r[2].exit_code == 1
    assert isinstance(r[3].error, KeyError) and not r[3].finished
    assert all(x.seconds >= 0 for x in r)


@pytest.mark.timeout(120)
def test_timeout_names_the_hung_worker():
    release = threading.Event()
    cluster = testing.SimulatedCluster(3, timeout=SHORT_CLUSTER_TIMEOUT)

    def worker(ctx):
        if ctx.index == 1:
            release.wait(HANG)
        return ctx.index

    try:
        with pytest.raises(TimeoutError) as exc:
            cluster.run(worker)
        assert "simulated-worker-1" in str(exc.value)
        assert "simulated-worker-0" not in str(exc.value)
        assert "simulated-worker-2" not in str(exc.value)
        # The timeout is reported to the cluster, so waits on the service end.
        assert cluster.service.error is not None
    finally:
        release.set()


@pytest.mark.timeout(120)
def test_timeout_aborts_a_collective_that_never_completes():
    cluster = testing.SimulatedCluster(2, timeout=SHORT_CLUSTER_TIMEOUT)

    def worker(ctx):
        if ctx.index == 0:
            return ctx.all_reduce(1.0)  # worker 1 never joins
        return None

    # The collective's own timeout and the cluster's deadline are the same: either ends
    # the wait, and neither may hang or blame the wrong worker.
    try:
        results = cluster.run(worker)
    except TimeoutError as e:
        assert "simulated-worker-0" in str(e)
        assert "simulated-worker-1" not in str(e)
    else:
        assert isinstance(results[0].error, _errs().UnavailableError)
        assert "collective aborted" in str(results[0].error)
        assert results[1].finished


def test_error_reported_to_the_cluster_aborts_the_collective_with_that_error():
    cluster = testing.SimulatedCluster(3, timeout=HANG)

    def worker(ctx):
        if ctx.index == 0:
            time.sleep(0.05)
            from tf_failure_handling._cluster import coordination

            coordination.current().report_error_to_cluster(9, "precondition")
            return None
        return ctx.all_reduce(1.0)

    results = cluster.run(worker)
    for r in results[1:]:
        assert type(r.error) is _errs().FailedPreconditionError
        assert r.error.message == "precondition"


def test_each_run_is_a_fresh_service_and_counts_attempts(tmp_path):
    cluster = testing.SimulatedCluster(2, root=tmp_path, timeout=HANG)
    services = []

    def worker(ctx):
        if ctx.index == 0:
            _coordination.current().set_config_key_value("k", str(ctx.attempt))
            services.append(_coordination.current())
        return ctx.attempt

    assert [r.value for r in cluster.run(worker)] == [0, 0]
    first = cluster.service
    assert [r.value for r in cluster.run(worker)] == [1, 1]
    assert cluster.service is not first
    assert services == [first, cluster.service]
    assert cluster.service.value("k") == "1"
    assert cluster.attempts == 2
    assert cluster.checkpoint_dir == os.path.join(str(tmp_path), "ckpt")


def test_resolvers_of_each_layout():
    def worker(ctx):
        r = ctx.cluster_resolver
        return r.task_type, r.task_id, r.cluster_spec().as_dict()

    plain = testing.SimulatedCluster(3, timeout=HANG).run(worker)
    assert [(r.value[0], r.value[1]) for r in plain] == [
        ("worker", 0),
        ("worker", 1),
        ("worker", 2),
    ]
    assert plain[0].value[2] == {"worker": ["localhost:0", "localhost:1", "localhost:2"]}
    chief = testing.SimulatedCluster(3, timeout=HANG, chief=True).run(worker)
    assert [(r.value[0], r.value[1]) for r in chief] == [("chief", 0), ("worker", 0), ("worker", 1)]
    assert chief[0].value[2] == {"chief": ["localhost:0"], "worker": ["localhost:1", "localhost:2"]}


def test_run_a_subset_of_workers():
    cluster = testing.SimulatedCluster(4, timeout=HANG)
    results = cluster.run(lambda ctx: ctx.all_reduce(float(ctx.index)), workers=[1, 3])
    assert [r.index for r in results] == [1, 3]
    assert [r.value for r in results] == [4.0, 4.0]


def test_no_root_means_no_checkpoint_dir():
    cluster = testing.SimulatedCluster(1, timeout=HANG)
    assert cluster.checkpoint_dir is None
    assert cluster.run(lambda ctx: ctx.checkpoint_dir)[0].value is None


def test_handlers_are_closed_when_a_worker_ends(tmp_path):
    cluster = testing.SimulatedCluster(2, root=tmp_path, timeout=HANG)
    handlers = []

    def worker(ctx):
        h = ctx.handler(testing.FakeCheckpoint(w=testing.FakeVariable(0)), ctx.checkpoint_dir)
        handlers.append(h)
        return h._id_in_cluster

    assert sorted(r.value for r in cluster.run(worker)) == ["0", "1"]
    assert all(h._closed for h in handlers)


# Regression test for a bug these unit tests found (fixed; formerly a strict xfail).
# Backstop above its own bound: one cluster run of HANG (+ 30 s).
@pytest.mark.timeout(HANG + 30)
def test_preempting_a_worker_that_already_finished_is_harmless(tmp_path):
    cluster = testing.SimulatedCluster(2, root=tmp_path, timeout=HANG)
    handlers = {}

    def worker(ctx):
        handlers[ctx.index] = ctx.handler(
            testing.FakeCheckpoint(w=testing.FakeVariable(0)), ctx.checkpoint_dir
        )
        if ctx.index == 0:
            return "done"
        deadline = time.monotonic() + HANG
        while not handlers.get(0) or not handlers[0]._closed:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        ctx.cluster.preempt(0)
        return "preempted a finished peer"

    results = cluster.run(worker)
    assert [r.error for r in results] == [None, None]
    assert [r.value for r in results] == ["done", "preempted a finished peer"]


class _SlowToAdd(float):
    """A value whose addition is slow in worker 0: it arrives last at the step's final barrier."""

    def __radd__(self, other):
        if threading.current_thread().name == "simulated-worker-0":
            time.sleep(0.05)
        return float(self) + other


# Regression test for a bug these unit tests found (fixed; formerly a strict xfail).
def test_exit_after_a_completed_all_reduce_does_not_fail_peers():
    def worker(ctx):
        total = ctx.all_reduce(_SlowToAdd(1.0) if ctx.index == 0 else 1.0)
        if ctx.index == 0:
            raise SystemExit(42)
        return total

    for _ in range(3):
        results = testing.SimulatedCluster(2, timeout=HANG).run(worker)
        assert results[0].exit_code == 42
        assert results[1].error is None, results[1].error
        assert results[1].value == 2.0
