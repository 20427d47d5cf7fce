"""Wrong arguments fail fast with the documented exception, and leave nothing running."""

from __future__ import annotations

import math
import signal
import threading
from fractions import Fraction

import numpy as np
import pytest
from tf_failure_handling import PreemptionCheckpointHandler, TerminationConfig, _errors, testing
from tf_failure_handling._cluster import membership as _membership

from .conftest import wait_for_attention


def _watcher_threads() -> list:
    return [
        t
        for t in threading.enumerate()
        if t.name.startswith(("WorkerTerminationSignalWatcher", "PeerTerminationWatcher"))
    ]


@pytest.fixture
def no_leak():
    """Asserts that a failed construction started no watcher thread."""
    before = set(_watcher_threads())
    yield
    assert set(_watcher_threads()) - before == set()


def _fake():
    return testing.FakeCheckpoint(w=testing.FakeVariable(0))


# ------------------------------------------------------------ TerminationConfig

NOT_CALLABLE = [1, "exit", True, [], object()]


def _id(value) -> str:
    """A test id that is the same in every process (``repr(object())`` holds an address,
    and pytest-xdist's workers must collect the same ids)."""
    return "object()" if type(value) is object else repr(value)


@pytest.mark.parametrize("name", ["termination_watcher_fn", "exit_fn", "save_fn"])
@pytest.mark.parametrize("value", NOT_CALLABLE, ids=lambda v: type(v).__name__)
def test_non_callable_functions_are_type_errors(name, value):
    with pytest.raises(TypeError, match=name):
        TerminationConfig(**{name: value})


@pytest.mark.parametrize("name", ["termination_watcher_fn", "exit_fn", "save_fn"])
def test_callables_and_none_are_accepted(name):
    class Callable:
        def __call__(self):
            return False

    for value in (None, print, lambda: None, Callable()):
        assert getattr(TerminationConfig(**{name: value}), name) is value


def test_positional_arguments_are_tfs_order():
    watcher, exit_fn, save_fn = (lambda: False), (lambda: None), (lambda: None)
    config = TerminationConfig(watcher, exit_fn, 7, save_fn)
    assert config.termination_watcher_fn is watcher
    assert config.exit_fn is exit_fn
    assert config.grace_period == 7
    assert config.save_fn is save_fn


@pytest.mark.parametrize("name", ["grace_period", "peer_timeout"])
@pytest.mark.parametrize("value", [-1, -0.001, float("-inf"), np.float64(-2)])
def test_negative_seconds_are_value_errors(name, value):
    with pytest.raises(ValueError, match=name):
        TerminationConfig(**{name: value})


@pytest.mark.parametrize("name", ["grace_period", "peer_timeout"])
def test_nan_seconds_are_value_errors(name):
    with pytest.raises(ValueError, match=name):
        TerminationConfig(**{name: float("nan")})
    with pytest.raises(ValueError, match=name):
        TerminationConfig(**{name: np.float32("nan")})


@pytest.mark.parametrize("name", ["grace_period", "peer_timeout"])
@pytest.mark.parametrize("value", ["10", b"1", True, False, [1], {}, 1j, object()], ids=_id)
def test_non_numbers_are_type_errors(name, value):
    with pytest.raises(TypeError, match=name):
        TerminationConfig(**{name: value})


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, None), (0, 0.0), (3, 3.0), (2.5, 2.5), (np.int64(4), 4.0), (Fraction(1, 4), 0.25)],
)
def test_valid_seconds_are_floats(value, expected):
    config = TerminationConfig(grace_period=value, peer_timeout=value)
    assert config.grace_period == expected
    assert config.peer_timeout == expected
    if expected is not None:
        assert type(config.grace_period) is float


def test_signals_are_converted_to_ints():
    config = TerminationConfig(signals=[signal.SIGUSR1, int(signal.SIGTERM)])
    assert config.signals == (int(signal.SIGUSR1), int(signal.SIGTERM))
    assert all(type(s) is int for s in config.signals)


@pytest.mark.parametrize("signals", [["SIGTERM"], [None], [1.5j]], ids=repr)
def test_signals_that_are_not_numbers_are_rejected(signals):
    with pytest.raises((TypeError, ValueError)):
        TerminationConfig(signals=signals)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP, 0, 1000, -3], ids=repr)
def test_uncatchable_signals_fail_at_construction(make_handler, tmp_path, no_leak, sig):
    with pytest.raises(ValueError, match="cannot be watched"):
        make_handler(_fake(), tmp_path / "ckpt", TerminationConfig(signals=[sig]))


def test_infinite_grace_period_is_rejected_by_the_handler(make_handler, tmp_path, no_leak):
    with pytest.raises(ValueError, match="grace_period"):
        make_handler(_fake(), tmp_path / "ckpt", TerminationConfig(grace_period=math.inf))


# ------------------------------------------------------- termination_config


@pytest.mark.parametrize("config", ["config", 5, {}, {"exit_fn": None}, object()], ids=_id)
def test_termination_config_of_the_wrong_type_is_a_type_error(
    make_handler, tmp_path, no_leak, config
):
    with pytest.raises(TypeError, match="termination_config"):
        make_handler(_fake(), tmp_path / "ckpt", config)


def test_tfs_own_termination_config_is_accepted(make_handler, tmp_path):
    tf = pytest.importorskip("tensorflow", reason="uses TF's TerminationConfig")
    exits = []
    saves = []
    config = tf.distribute.experimental.TerminationConfig(
        exit_fn=lambda: exits.append(1), grace_period=0, save_fn=lambda: saves.append(1)
    )
    h = make_handler(_fake(), tmp_path / "ckpt", config)
    assert h._grace_period == 0
    h._notify_termination()
    wait_for_attention(h)
    for _ in range(3):
        h.run(lambda: None)
    assert saves == [1]
    assert exits == [1]


def test_tfs_termination_config_with_bad_fields_is_rejected(make_handler, tmp_path, no_leak):
    tf = pytest.importorskip("tensorflow", reason="uses TF's TerminationConfig")
    with pytest.raises(TypeError, match="exit_fn"):
        make_handler(
            _fake(), tmp_path / "ckpt", tf.distribute.experimental.TerminationConfig(exit_fn=3)
        )
    with pytest.raises(ValueError, match="grace_period"):
        make_handler(
            _fake(),
            tmp_path / "ckpt",
            tf.distribute.experimental.TerminationConfig(grace_period=-5),
        )


def test_duck_typed_config_is_accepted(make_handler, tmp_path):
    class Config:
        termination_watcher_fn = None
        exit_fn = None
        grace_period = 2
        save_fn = None

    h = make_handler(_fake(), tmp_path / "ckpt", Config())
    assert h._grace_period == 2


# ------------------------------------------------------------ cluster_resolver


@pytest.mark.parametrize(
    "resolver",
    ["localhost:2222", 42, {"worker": ["a:1"]}, ["worker"], object()],
    ids=_id,
)
def test_cluster_resolver_of_the_wrong_type_is_a_type_error(
    make_handler, tmp_path, no_leak, resolver
):
    with pytest.raises(TypeError, match="cluster_resolver"):
        make_handler(_fake(), tmp_path / "ckpt", resolver=resolver)


def test_cluster_spec_of_the_wrong_type_is_a_type_error(make_handler, tmp_path, no_leak):
    class Resolver:
        task_type, task_id = "worker", 0

        def cluster_spec(self):
            return ["worker", "a:1"]

    with pytest.raises(TypeError, match="cluster_spec"):
        make_handler(_fake(), tmp_path / "ckpt", resolver=Resolver())


def test_cluster_spec_may_be_a_plain_dict(make_handler, tmp_path):
    class Resolver:
        task_type, task_id = "worker", 1

        def cluster_spec(self):
            return {"worker": ["a:1", "b:1", "c:1"]}

    with testing.use_coordination_service(testing.InMemoryCoordinationService()):
        h = make_handler(_fake(), tmp_path / "ckpt", resolver=Resolver())
    assert h._id_in_cluster == "1"
    assert h._is_chief is False


@pytest.mark.parametrize("task_type", ["worker", "ps"])
def test_handler_on_a_ps_or_worker_task_of_a_ps_cluster_is_a_value_error(
    make_handler, tmp_path, no_leak, task_type
):
    spec = {"chief": ["c:1"], "worker": ["a:1", "b:1"], "ps": ["p:1"]}
    resolver = testing.SimpleClusterResolver(spec, task_type, 0)
    with pytest.raises(ValueError, match=r"serve\(server\)"):
        make_handler(_fake(), tmp_path / "ckpt", resolver=resolver)


@pytest.mark.parametrize("task_type", ["chief", None])
def test_the_coordinator_of_a_ps_cluster_is_the_deciding_task(task_type):
    spec = {"chief": ["c:1"], "worker": ["a:1", "b:1"], "ps": ["p:1"]}
    member = _membership.membership(testing.SimpleClusterResolver(spec, task_type, 0))
    assert member.ps_coordinator is True
    assert member.local is True, "the coordinator decides alone (local mode of the protocol)"
    assert member.is_chief is True


def test_tf_cluster_resolver_of_a_ps_worker_is_a_value_error(make_handler, tmp_path, no_leak):
    tf = pytest.importorskip("tensorflow", reason="uses TF's ClusterSpec")
    spec = tf.train.ClusterSpec({"worker": ["a:1", "b:1"], "ps": ["p:1"]})
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        spec, task_type="worker", task_id=0
    )
    with pytest.raises(ValueError, match="ParameterServerStrategy"):
        make_handler(_fake(), tmp_path / "ckpt", resolver=resolver)


@pytest.mark.parametrize("task_type", ["ps", "foo", "", None, "Worker"])
def test_task_type_without_an_id_is_a_value_error(make_handler, tmp_path, no_leak, task_type):
    resolver = testing.SimpleClusterResolver({"worker": ["a:1", "b:1"]}, task_type, 0)
    with pytest.raises(ValueError, match="task_type"):
        make_handler(_fake(), tmp_path / "ckpt", resolver=resolver)


@pytest.mark.parametrize(
    ("task_type", "task_id"),
    [("worker", 2), ("worker", -1), ("worker", 10**9), ("chief", 1), ("chief", -1)],
)
def test_task_id_out_of_range_is_a_value_error(make_handler, tmp_path, no_leak, task_type, task_id):
    spec = {"chief": ["c:1"], "worker": ["a:1", "b:1"]}
    resolver = testing.SimpleClusterResolver(spec, task_type, task_id)
    with pytest.raises(ValueError, match="not in the cluster"):
        make_handler(_fake(), tmp_path / "ckpt", resolver=resolver)


def test_task_type_missing_from_the_cluster_is_a_value_error(make_handler, tmp_path, no_leak):
    resolver = testing.SimpleClusterResolver({"worker": ["a:1", "b:1"]}, "chief", 0)
    with pytest.raises(ValueError, match="not in the cluster"):
        make_handler(_fake(), tmp_path / "ckpt", resolver=resolver)


@pytest.mark.parametrize("task_id", ["0", 0.0, None, True], ids=repr)
def test_task_id_not_an_int_is_a_type_error(make_handler, tmp_path, no_leak, task_id):
    resolver = testing.SimpleClusterResolver({"worker": ["a:1", "b:1"]}, "worker", task_id)
    with pytest.raises(TypeError, match="task_id"):
        make_handler(_fake(), tmp_path / "ckpt", resolver=resolver)


# ------------------------------------------------------- checkpoint arguments


def test_real_tf_checkpoint_without_dir_is_invalid_argument(make_handler, no_leak):
    tf = pytest.importorskip("tensorflow", reason="uses a real tf.train.Checkpoint")
    ckpt = tf.train.Checkpoint(v=tf.Variable(1.0))
    with pytest.raises(tf.errors.InvalidArgumentError, match="checkpoint_dir"):
        make_handler(ckpt, None)
    with pytest.raises(tf.errors.InvalidArgumentError):
        make_handler(ckpt, "")


@pytest.mark.parametrize("directory", [None, ""], ids=repr)
def test_fake_checkpoint_without_dir_is_invalid_argument(make_handler, no_leak, directory):
    errors = _errors.module()
    with pytest.raises(errors.InvalidArgumentError) as exc:
        PreemptionCheckpointHandler(None, _fake(), directory)
    assert isinstance(exc.value, errors.OpError)
    assert exc.value.error_code == 3


@pytest.mark.parametrize(
    "obj",
    [object(), "ckpt", None, 3, {"w": 1}, testing.FakeVariable(0)],
    ids=lambda o: type(o).__name__,
)
def test_neither_checkpoint_nor_manager_is_a_type_error(tmp_path, no_leak, obj):
    with pytest.raises(TypeError, match="checkpoint_or_checkpoint_manager"):
        PreemptionCheckpointHandler(None, obj, str(tmp_path / "ckpt"))


def test_partial_manager_protocol_is_a_type_error(tmp_path, no_leak):
    class HalfManager:
        directory = str(tmp_path)

        def save(self):
            pass

    with pytest.raises(TypeError, match="checkpoint_or_checkpoint_manager"):
        PreemptionCheckpointHandler(None, HalfManager(), None)


@pytest.mark.parametrize("directory", [123, b"/tmp/x", ["a"], 1.5], ids=repr)
def test_checkpoint_dir_not_a_string_is_a_type_error(no_leak, directory):
    with pytest.raises(TypeError, match="checkpoint_dir"):
        PreemptionCheckpointHandler(None, _fake(), directory)


def test_nothing_is_written_when_construction_fails(tmp_path, no_leak):
    with pytest.raises(ValueError):
        PreemptionCheckpointHandler(
            testing.SimpleClusterResolver({"worker": ["a:1"]}, "worker", 5),
            _fake(),
            str(tmp_path / "c"),
        )
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------ environment


@pytest.mark.parametrize("raw", ["abc", "-1", "nan", "1s", "-inf"])
def test_invalid_peer_timeout_env_is_a_value_error(
    make_handler, tmp_path, monkeypatch, no_leak, raw
):
    monkeypatch.setenv("TF_FAILURE_HANDLING_PEER_TIMEOUT", raw)
    with pytest.raises(ValueError, match="TF_FAILURE_HANDLING_PEER_TIMEOUT"):
        make_handler(_fake(), tmp_path / "ckpt")


def test_peer_timeout_env_and_config_precedence(make_handler, tmp_path, monkeypatch):
    monkeypatch.setenv("TF_FAILURE_HANDLING_PEER_TIMEOUT", "12.5")
    assert make_handler(_fake(), tmp_path / "a")._peer_timeout == 12.5
    h = make_handler(_fake(), tmp_path / "b", TerminationConfig(peer_timeout=3))
    assert h._peer_timeout == 3.0
    monkeypatch.setenv("TF_FAILURE_HANDLING_PEER_TIMEOUT", "")
    assert make_handler(_fake(), tmp_path / "c")._peer_timeout == 300.0


# ------------------------------------------------------------ run() arguments


@pytest.mark.parametrize("fn", [None, 3, "step"], ids=repr)
def test_run_with_a_non_callable_is_a_type_error_and_not_counted(make_handler, tmp_path, fn):
    h = make_handler(_fake(), tmp_path / "ckpt")
    with pytest.raises(TypeError):
        h.run(fn)
    assert h._run_counter == 0


def test_run_without_a_function_is_a_type_error(make_handler, tmp_path):
    h = make_handler(_fake(), tmp_path / "ckpt")
    with pytest.raises(TypeError):
        h.run()
    assert h._run_counter == 0
