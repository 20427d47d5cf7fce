"""TensorFlow's platform hooks (``_platforms/tf_hooks.py``): a ``detect_platform`` that
someone replaced (as TensorFlow's GCE tests do with ``mock.patch.object``) is honoured as
TensorFlow honours it; TensorFlow's own is never called."""

from __future__ import annotations

from unittest import mock

import pytest

tf = pytest.importorskip("tensorflow", reason="TensorFlow's failure_handling_util")

from tensorflow.python.distribute.failure_handling import failure_handling_util as util  # noqa: E402
from tf_failure_handling._platforms import common, platform, tf_hooks  # noqa: E402


def _complete(watcher_fn=None, exit_fn=None, grace_period=None):
    return platform.complete(platform.environment(), watcher_fn, exit_fn, grace_period, None)


def test_tensorflows_own_detect_platform_is_not_called():
    with mock.patch.object(util, "request_compute_metadata", side_effect=AssertionError):
        assert tf_hooks.gce_watcher() is None
    d = _complete()
    assert d.device is None and d.watcher_fn is None


@pytest.mark.parametrize("device, grace", [("GCE_GPU", 3600), ("GCE_CPU", 0)])
def test_a_replaced_detect_platform_that_says_gce_brings_tfs_gce_watcher(device, grace):
    def watcher():
        return False

    with (
        mock.patch.object(util, "termination_watcher_function_gce", watcher),
        mock.patch.object(util, "detect_platform", lambda: util.PlatformDevice[device]),
    ):
        d = _complete()
        assert d.watcher_fn is watcher
        assert d.device is platform.PlatformDevice[device]
        assert common.exit_code(d.exit_fn) == 143  # TF's gce_exit_fn's
        assert d.grace_period == grace
        # The user's values win, a grace period of 0 included.
        mine = _complete(watcher_fn=bool, grace_period=0)
        assert mine.watcher_fn is bool and mine.grace_period == 0
    assert tf_hooks.gce_watcher() is None, "the patch is gone: nothing is honoured"


def test_a_replaced_detect_platform_that_says_internal_changes_nothing():
    with mock.patch.object(util, "detect_platform", lambda: util.PlatformDevice.INTERNAL_CPU):
        d = _complete()
    assert d.device is None and d.watcher_fn is None


def test_a_replaced_detect_platform_that_raises_leaves_the_packages_detection():
    with mock.patch.object(util, "detect_platform", mock.Mock(side_effect=OSError("boom"))):
        assert tf_hooks.gce_watcher() is None


def test_a_newer_handler_stops_the_earlier_ones_watcher_fn(make_handler, tmp_path):
    """The watcher fn is the handler's own configuration (TensorFlow's GCE tests give each
    handler a mock bound to its own test): once a newer handler of the worker takes over,
    the earlier one's is no longer polled, and nothing it says reaches the newer one."""
    import threading

    from tf_failure_handling import TerminationConfig, testing

    calls = {"a": 0, "b": 0}
    polled = threading.Event()

    def watcher_a():
        calls["a"] += 1
        polled.set()
        return False

    def watcher_b():
        calls["b"] += 1
        return False

    def ckpt():
        return testing.FakeCheckpoint(w=testing.FakeVariable(0))

    a = make_handler(ckpt(), tmp_path / "a", TerminationConfig(termination_watcher_fn=watcher_a))
    assert polled.wait(60), "the first handler's watcher fn was never polled"
    poller = a._ownership.sources._poller
    make_handler(ckpt(), tmp_path / "b", TerminationConfig(termination_watcher_fn=watcher_b))
    poller.join(60)
    assert not poller.is_alive(), "the earlier handler's watcher fn is still polled"
