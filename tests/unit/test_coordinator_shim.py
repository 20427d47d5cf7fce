"""The coordinator shim's own logic (the queue and classifier have their own tests;
real ParameterServerStrategy clusters are in tests/integration)."""

import pytest

tf = pytest.importorskip("tensorflow", reason="ClusterCoordinator wraps TensorFlow's coordinator")

import tf_failure_handling as tfh  # noqa: E402
from tf_failure_handling import coordinator  # noqa: E402

from .stop_within import StopWithin  # noqa: E402


@pytest.mark.parametrize(
    "make_strategy",
    [tf.distribute.MirroredStrategy, lambda: tf.distribute.OneDeviceStrategy("/cpu:0")],
    ids=["mirrored", "one_device"],
)
def test_non_ps_strategy_is_refused_with_an_error_tf_code_also_catches(make_strategy):
    strategy = make_strategy()
    with pytest.raises(AttributeError):  # what TF 2.21 actually raises
        tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    with pytest.raises(ValueError, match=r"Only `tf\.distribute\.experimental\.ParameterServer"):
        tfh.ClusterCoordinator(strategy)
    with pytest.raises(AttributeError):
        tfh.ClusterCoordinator(strategy)


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf")])
def test_recovery_timeout_must_be_positive_and_finite(bad):
    with pytest.raises(ValueError, match="worker_recovery_timeout"):
        coordinator._recovery_timeout(bad)


@pytest.mark.parametrize("bad", ["10", True, [1]])
def test_recovery_timeout_must_be_a_number(bad):
    with pytest.raises(TypeError, match="worker_recovery_timeout"):
        coordinator._recovery_timeout(bad)


def _recovery_wait(recovery_timeout):
    """The bound of a worker thread's wait for its worker's recovery, as the coordinator's
    protocol object configured with ``recovery_timeout`` says it."""
    from tf_failure_handling._native import CoordinatorProtocol

    CoordinatorEvent, Lane = CoordinatorProtocol.Event, CoordinatorProtocol.Lane
    protocol, lane = CoordinatorProtocol([], recovery_timeout=recovery_timeout), Lane.Failure(1)
    protocol.handle(CoordinatorEvent.ClosureFailed(1))
    for yes in (False, False, False, True):  # a worker failure, after TF's three questions
        protocol.poll(lane)
        protocol.handle(CoordinatorEvent.FailureAnswered(1, yes))
    return protocol.poll(lane).timeout


def test_recovery_timeout_defaults_to_tfs_and_reads_the_environment(monkeypatch):
    monkeypatch.delenv(coordinator.WORKER_RECOVERY_TIMEOUT_ENV, raising=False)
    assert coordinator._recovery_timeout(None) is None
    assert _recovery_wait(coordinator._recovery_timeout(None)) == 3600.0  # TF's hour
    monkeypatch.setenv(coordinator.WORKER_RECOVERY_TIMEOUT_ENV, "12.5")
    assert coordinator._recovery_timeout(None) == 12.5
    assert coordinator._recovery_timeout(7) == 7.0  # the argument wins
    monkeypatch.setenv(coordinator.WORKER_RECOVERY_TIMEOUT_ENV, "soon")
    with pytest.raises(ValueError, match="soon"):
        coordinator._recovery_timeout(None)
    for bad in ("-1", "0", "inf", "nan"):
        monkeypatch.setenv(coordinator.WORKER_RECOVERY_TIMEOUT_ENV, bad)
        with pytest.raises(ValueError, match=f"{coordinator.WORKER_RECOVERY_TIMEOUT_ENV}='{bad}'"):
            coordinator._recovery_timeout(None)


def test_public_names_are_tensorflows_own_value_classes():
    from tensorflow.python.distribute.coordinator import remote_value, values

    assert tfh.RemoteValue is remote_value.RemoteValue
    assert tfh.PerWorkerValues is values.PerWorkerValues
    assert tfh.PerWorkerValue is values.PerWorkerValues
    assert (
        tfh.experimental_get_current_worker_index
        is tf.distribute.coordinator.experimental_get_current_worker_index
    )
    with pytest.raises(AttributeError):
        tfh.NoSuchName  # noqa: B018


def test_patch_covers_the_coordinator_names():
    originals = (
        tf.distribute.experimental.coordinator.ClusterCoordinator,
        tf.distribute.coordinator.ClusterCoordinator,
    )
    try:
        tfh.patch()
        assert tf.distribute.experimental.coordinator.ClusterCoordinator is tfh.ClusterCoordinator
        assert tf.distribute.coordinator.ClusterCoordinator is tfh.ClusterCoordinator
    finally:
        tfh.unpatch()
    assert (
        tf.distribute.experimental.coordinator.ClusterCoordinator,
        tf.distribute.coordinator.ClusterCoordinator,
    ) == originals


def test_rejected_schedule_does_not_leave_the_strategy_being_scheduled():
    class Extended:
        _being_scheduled = False

    class Strategy:
        _is_parameter_server_strategy_v2 = True
        _cluster_coordinator = None
        extended = Extended()

    # A coordinator object without a cluster: TF's schedule rejects the plain
    # function before touching the cluster; the flag must end up False.
    coord = object.__new__(tfh.ClusterCoordinator)
    coord._strategy = Strategy()
    coord._strategy.extended._being_scheduled = True
    with pytest.raises(TypeError, match=r"tf\.function"):
        coord.schedule(lambda: 1)
    assert coord._strategy.extended._being_scheduled is False


def _recovery_handler():
    """The worker-failure handler's stop-related state only (no cluster)."""
    import threading

    handler = object.__new__(coordinator._WorkerPreemptionHandler)
    handler._cluster_update_lock = threading.Lock()
    handler._cluster_due_for_update_or_finish = threading.Event()
    handler._worker_up_cond = threading.Condition(handler._cluster_update_lock)
    handler._should_preemption_thread_run = True
    handler._protocol = coordinator.CoordinatorProtocol([])
    return handler


def test_stop_wakes_the_recovery_thread():
    handler = _recovery_handler()
    handler.stop()
    assert handler._cluster_due_for_update_or_finish.is_set()
    assert not handler._should_preemption_thread_run
    assert handler._cluster_update_lock.acquire(blocking=False)


def test_stop_does_not_wait_forever_for_a_recovery_that_holds_the_cluster(monkeypatch, caplog):
    # The recovery thread holds the lock while update_server_def waits for a lost worker
    # (or is frozen at interpreter exit): TF's stop waited on it for good.
    handler = _recovery_handler()
    handler._protocol = StopWithin(handler._protocol, 0.1)
    assert handler._cluster_update_lock.acquire()
    handler.stop()
    assert handler._cluster_due_for_update_or_finish.is_set()
    assert not handler._should_preemption_thread_run
    assert "did not let go of the cluster" in caplog.text
