"""Shared helpers for the unit tests: no cluster, no network, no real signals.

* The GCE metadata probe of platform detection is pointed at a closed port on
  127.0.0.1 before any handler is built, so detection is fast and says
  "not GCE" (the platform tests override it with their own fake server).
* :class:`RecordingCheckpoint` is ``testing.FakeCheckpoint`` whose managers
  record the run count of every save and the directory they wrote to.
* ``make_handler`` builds local or cluster handlers and closes them all at
  teardown, so no test leaves a signal handler or a watcher thread behind.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any, Callable, Optional

import pytest
from tf_failure_handling import PreemptionCheckpointHandler, TerminationConfig, testing
from tf_failure_handling._platforms import clouds, kubernetes, slurm
from tf_failure_handling._platforms import platform as _platform


def _closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on right now (connections are refused)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


#: Where platform detection looks for a GCE metadata server in these tests.
NO_METADATA_SERVER = f"127.0.0.1:{_closed_port()}"

#: Put first in a subprocess script that must run without TensorFlow: any import
#: of it fails at once (and the script starts in a fraction of a second).
BLOCK_TENSORFLOW = """
import sys


class _NoTensorFlow:
    def find_spec(self, name, path=None, target=None):
        if name == "tensorflow" or name.startswith("tensorflow."):
            raise ImportError("tensorflow is blocked in this test")
        return None


sys.meta_path.insert(0, _NoTensorFlow())
"""


#: Variables through which the machine running the tests could look like a cloud VM
#: or a scheduler's job; the unit tests see none of them unless they set them.
_PLATFORM_ENV = (
    _platform.CLOUD_ENV,
    clouds.AWS.variable,
    clouds.AZURE.variable,
    kubernetes.GRACE_ENV,
    slurm.END_TIME_ENV,
    "SLURM_JOB_ID",
    "KUBERNETES_SERVICE_HOST",
)


@pytest.fixture(autouse=True, scope="session")
def _no_metadata_server(tmp_path_factory):
    """No GCE server, no DMI vendor strings, no SLURM or Kubernetes: whatever the CI host."""
    saved_env = {k: os.environ.get(k) for k in (clouds.GCE.variable, *_PLATFORM_ENV)}
    saved_sysfs = clouds.SYSFS
    os.environ[clouds.GCE.variable] = NO_METADATA_SERVER
    for name in _PLATFORM_ENV:
        os.environ.pop(name, None)
    # Subprocesses (the signal tests) do not see the module patches below.
    os.environ[_platform.CLOUD_ENV] = "none"
    empty = tmp_path_factory.mktemp("no-dmi")
    clouds.SYSFS = str(empty)
    _platform.detect.cache_clear()
    _platform.environment.cache_clear()
    yield
    clouds.SYSFS = saved_sysfs
    _platform.detect.cache_clear()
    _platform.environment.cache_clear()
    for name, value in saved_env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(autouse=True)
def _no_peer_timeout_env(monkeypatch):
    """A developer's TF_FAILURE_HANDLING_PEER_TIMEOUT must not change these tests."""
    monkeypatch.delenv("TF_FAILURE_HANDLING_PEER_TIMEOUT", raising=False)


#: How long ``wait_until`` waits by default: a bound that only turns a hang into a failure.
HANG = 60.0


def wait_until(
    predicate: Callable[[], Any], timeout: float = HANG, what: str = "condition"
) -> None:
    """Polls ``predicate`` (1 ms) until true; fails the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.001)


def wait_for_attention(handler: Any, timeout: float = HANG) -> None:
    """Waits until the handler's notice watcher has processed a notice."""
    wait_until(lambda: handler._attention, timeout, "the notice to be processed")


class RecordingManager(testing.FakeCheckpointManager):
    """A FakeCheckpointManager that records the run count each save wrote."""

    def __init__(self, checkpoint: Any, directory: str, max_to_keep: int = 1) -> None:
        super().__init__(checkpoint, directory, max_to_keep)
        self.saved_runs: list = []
        self.save_args: list = []

    def save(self, *args: Any, **kwargs: Any) -> str:
        self.saved_runs.append(int(self._checkpoint.checkpointed_runs.numpy()))
        self.save_args.append((args, kwargs))
        return super().save(*args, **kwargs)


class RecordingCheckpoint(testing.FakeCheckpoint):
    """A FakeCheckpoint whose managers are :class:`RecordingManager`\\ s."""

    def __init__(self, **variables: testing.FakeVariable) -> None:
        super().__init__(**variables)
        self.managers: list = []

    def make_manager(self, directory: str, max_to_keep: int = 1) -> RecordingManager:
        manager = RecordingManager(self, directory, max_to_keep)
        self.managers.append(manager)
        return manager

    @property
    def saved_runs(self) -> list:
        """Run counts of every save through any of this checkpoint's managers."""
        return [r for m in self.managers for r in m.saved_runs]


class PublishRecorder(PreemptionCheckpointHandler):
    """Records ``(run count when publishing, step published, round)`` of every publish."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.publishes: list = []
        #: The handler's clock and plan (``_core_state()``) at each publish; the clock is
        #: the one the test configured the protocol object with (``publish_clock``).
        self.publish_times: list = []
        self.publish_clock: Any = time.monotonic
        self.publish_plans: list = []
        super().__init__(*args, **kwargs)
        publish = self._agreement.publish

        def recorded(round_key: str, step: int, *keys: Any) -> None:
            self.publishes.append((self._run_counter, step, round_key))
            self.publish_times.append(self.publish_clock())
            self.publish_plans.append(self._core_state())
            publish(round_key, step, *keys)

        self._agreement.publish = recorded


@pytest.fixture
def make_handler():
    """``make(checkpoint, directory, config=None, resolver=None, cls=...)``; closed at teardown."""
    made: list = []

    def make(
        checkpoint: Any,
        directory: Optional[os.PathLike] = None,
        config: Optional[TerminationConfig] = None,
        resolver: Any = None,
        cls: type = PreemptionCheckpointHandler,
    ) -> Any:
        h = cls(resolver, checkpoint, None if directory is None else os.fspath(directory), config)
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()


@pytest.fixture
def no_exit_config():
    """A TerminationConfig whose exit_fn records its calls instead of exiting."""
    calls: list = []
    config = TerminationConfig(exit_fn=lambda: calls.append(threading.current_thread().name))
    config.calls = calls
    return config
