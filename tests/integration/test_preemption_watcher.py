"""PreemptionWatcher with real TensorFlow: 2-worker MultiWorkerMirroredStrategy clusters
on 127.0.0.1, and one local-mode process.

Each process runs ``watcher_script.py``, which builds the strategy, then the watcher,
prints ``ready``, and prints ``message`` (exit 0) once ``preemption_message`` is set, or
``no_message`` (exit 3) after a bounded wait. The last test records what TensorFlow's
own ``tf.distribute.experimental.PreemptionWatcher`` does in the same cluster: it
supports Borg TPUs only, so it warns and never sets a message.
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest

from .conftest import Cluster, require_impl

SCRIPT = Path(__file__).resolve().parent / "watcher_script.py"
#: Bound for building the strategy and the watcher (TF's import included).
READY_TIMEOUT = 60.0
#: Bound for "every watcher reported the notice". It only turns a lost notice into a
#: failure: ours takes milliseconds plus the one-second poll of a
#: ``termination_watcher_fn``; how fast a notice crosses the cluster is measured by
#: ``benches/bench_notice.py``, not asserted here.
NOTICE_LATENCY = 30.0
#: What TensorFlow's own SIGTERM notifier writes to ``TF_DEFAULT_PREEMPTION_NOTICE_KEY``
#: for worker 1. TF installs it in every MWMS worker; a watcher only observes, so it
#: chains the handler installed before it, and TF's write and ours race for the key
#: (the first value stays).
TF_NATIVE_NOTICE_WORKER_1 = "/job:worker/task:1"
#: Bound for the processes to exit on their own after the notice.
EXIT_TIMEOUT = 30.0
TF_UNSUPPORTED_WARNING = "Preemption watcher does not support environment"


class WatcherCluster(Cluster):
    """``watcher_script.py`` processes: an MWMS cluster, or one local process (``local``)."""

    def __init__(self, workdir: Path, *, impl: str, local: bool = False, **kwargs):
        kwargs.setdefault("num_workers", 1 if local else 2)
        super().__init__(workdir, impl=impl, ckpt_dir=Path(workdir) / "ckpt", **kwargs)
        self.local = local

    def command(self, index: int) -> list[str]:
        cmd = [sys.executable, str(SCRIPT), "--index", str(index), "--impl", self.impl]
        if not self.local:
            cmd += ["--ports", ",".join(str(p) for p in self.ports)]
        cmd += ["--ckpt-dir", str(self.ckpt_dir), *self.extra_args]
        return cmd + [str(a) for a in self.worker_args.get(index, ())]

    def wait_ready(self) -> list[dict]:
        """Every process built its watcher; returns their ``ready`` events."""

        def ready():
            for i, proc in enumerate(self.procs):
                if self.events(i, "ready"):
                    continue
                if proc.poll() is not None:
                    pytest.fail(f"process {i} exited before it was ready\n{self.describe(i)}")
                return False
            return True

        self.wait_until(ready, READY_TIMEOUT, "every watcher to be built")
        return [self.events(i, "ready")[0] for i in range(self.num_workers)]

    def message(self, index: int) -> dict:
        events = self.events(index, "message")
        assert len(events) == 1, f"no message event\n{self.describe(index)}"
        return events[0]


@pytest.fixture
def start(tmp_path):
    """``start(name=..., impl=..., ...)`` -> a started WatcherCluster; killed at teardown."""
    clusters: list[WatcherCluster] = []

    def make(**kwargs) -> WatcherCluster:
        cluster = WatcherCluster(tmp_path, **kwargs)
        clusters.append(cluster)
        return cluster.start()

    yield make
    for cluster in clusters:
        cluster.kill()


def _details(cluster: Cluster) -> str:
    return "\n".join(cluster.describe(i) for i in range(cluster.num_workers))


@pytest.mark.timeout(120)
def test_sigterm_on_worker_1_reaches_both_workers_watchers(start):
    require_impl("ours")
    cluster = start(name="sigterm", impl="ours")
    ready = cluster.wait_ready()
    assert [r["coordinated"] for r in ready] == [True, True], ready
    assert [(r["platform"], r["has_platform"]) for r in ready] == [("INTERNAL_CPU", True)] * 2
    sent = cluster.send_signal(1, signal.SIGTERM)

    codes = cluster.wait(EXIT_TIMEOUT, "both workers to see the message and exit")
    assert codes == [0, 0], f"exit codes {codes}\n{_details(cluster)}"
    messages = [cluster.message(i) for i in range(2)]
    ours = messages[1]["message"]
    # Worker 1 reports its own notice, unless TF's notifier wrote the key first and
    # worker 1's key watch read it before its signal watch reported.
    if ours != TF_NATIVE_NOTICE_WORKER_1:
        assert ours.startswith("worker worker:1: termination notice from signal SIGTERM at "), ours
    # Worker 0 reports the key's one value: worker 1's message or TF's, both naming worker 1.
    assert messages[0]["message"] in (ours, TF_NATIVE_NOTICE_WORKER_1), messages
    latencies = [m["t"] - sent for m in messages]
    assert all(0 <= s < NOTICE_LATENCY for s in latencies), latencies


@pytest.mark.timeout(120)
def test_handler_notice_on_worker_0_reaches_worker_1s_watcher(start, tmp_path):
    require_impl("ours")
    notice = tmp_path / "notice-{index}"  # worker i's termination_watcher_fn checks notice-i
    cluster = start(
        name="handler",
        impl="ours",
        extra_args=["--watcher-file", str(notice), "--close"],
    )
    cluster.wait_ready()
    created = time.time()
    (tmp_path / "notice-0").touch()

    codes = cluster.wait(EXIT_TIMEOUT, "both workers to see the message and exit")
    assert codes == [0, 0], f"exit codes {codes}\n{_details(cluster)}"
    messages = [cluster.message(i) for i in range(2)]
    text = messages[0]["message"]
    assert text.startswith("worker 0: termination notice from termination_watcher_fn at "), text
    assert messages[1]["message"] == text, "worker 1 did not get worker 0's handler's notice"
    latencies = [m["t"] - created for m in messages]
    assert all(0 <= s < NOTICE_LATENCY for s in latencies), latencies


# Backstop above its own bounds in sequence: ready, then the exit (+ 30 s for the kill).
@pytest.mark.timeout(READY_TIMEOUT + EXIT_TIMEOUT + 30)
def test_local_mode_sigterm_sets_the_message_and_the_process_lives(start):
    require_impl("ours")
    cluster = start(name="local", impl="ours", local=True)
    (ready,) = cluster.wait_ready()
    assert ready["coordinated"] is False, ready
    sent = cluster.send_signal(0, signal.SIGTERM)

    (code,) = cluster.wait(EXIT_TIMEOUT, "the process to see the message and exit")
    assert code == 0, f"exit code {code}\n{_details(cluster)}"
    message = cluster.message(0)
    assert message["message"].startswith("worker local: termination notice from signal SIGTERM")
    assert 0 <= message["t"] - sent < NOTICE_LATENCY


@pytest.mark.timeout(120)
def test_tensorflows_watcher_never_sets_a_message_in_mwms(start):
    """Documents the difference. TF's watcher supports Borg TPUs only: it warns and stays
    None. SIGTERM does not end TF's worker either: TF's C++ preemption notifier (started
    with the coordination service) catches it and logs "SIGTERM caught at"."""
    window = 5.0
    cluster = start(
        name="tf",
        impl="tf",
        extra_args=["--wait", str(window)],
        env={"TF_CPP_MIN_LOG_LEVEL": "1"},  # TF logs the caught SIGTERM as a warning
    )
    ready = cluster.wait_ready()
    assert [(r["platform"], r["has_platform"]) for r in ready] == [("INTERNAL_CPU", False)] * 2
    for i in range(2):
        assert TF_UNSUPPORTED_WARNING in cluster.stderr_paths[i].read_text(errors="replace")
    sent = cluster.send_signal(1, signal.SIGTERM)

    codes = cluster.wait(EXIT_TIMEOUT, "TF's workers to end their wait")
    assert codes == [3, 3], f"exit codes {codes}\n{_details(cluster)}"
    for i in range(2):
        assert not cluster.events(i, "message"), _details(cluster)
    (quiet,) = cluster.events(1, "no_message")
    # Worker 1 kept watching for most of the window after its SIGTERM.
    assert quiet["t"] - sent >= window - 2.0, (quiet, sent)
    assert "SIGTERM caught at" in cluster.stderr_paths[1].read_text(errors="replace")
