"""Harness for the multi-process MultiWorkerMirroredStrategy integration tests.

Each test starts real worker processes (``mwms_worker.py``) on 127.0.0.1 only,
talks to them through signals and files, and reads what they did from the
``EVENT {json}`` lines they print.
"""

from __future__ import annotations

import importlib
import json
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from ci import is_ci

from .forkserver import popen
from .mwms_worker import LIVE_PROCESSES as _LIVE_PROCESSES
from .mwms_worker import (
    child_environment,
    free_ports,
    kill_process,
    parse_events,
    poll_until,
    tail,
    worker_command,
)

WORKER_SCRIPT = Path(__file__).resolve().parent / "mwms_worker.py"

#: Bounds on a cluster's waits. They only turn a hang into a failure: an idle machine
#: starts three TF workers and runs their first steps in about 10 s, but `make test` runs
#: eleven jobs on two cores, and at a load of 13-20 eight MWMS tests once ran out of the
#: 60 s these used to be (cf7312b). pytest-timeout stays the outer bound: each test's
#: mark is at least the sum of the bounds it goes through in sequence, plus a margin.
STARTUP_BOUND = 180.0
EXIT_BOUND = 150.0

_TF_IMPORT_ERROR: str | None = None
_TF_IMPORT_ERROR_KEY = pytest.StashKey[str]()
_TF_CHECKED = False


def _tensorflow_import_error() -> str | None:
    """None if tensorflow imports, else a description of why it does not."""
    global _TF_CHECKED, _TF_IMPORT_ERROR
    if not _TF_CHECKED:
        _TF_CHECKED = True
        try:
            importlib.import_module("tensorflow")
        except Exception as e:  # noqa: BLE001 - any import failure means "no TF"
            _TF_IMPORT_ERROR = f"{type(e).__name__}: {e}"
    return _TF_IMPORT_ERROR


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).resolve().parent
    ours = [item for item in items if here in Path(str(item.fspath)).resolve().parents]
    if not ours:
        return
    error = _tensorflow_import_error()
    if error is None:
        return
    if is_ci():
        # CI has TensorFlow: an import that fails there is a broken build, not a skip.
        for item in ours:
            item.stash[_TF_IMPORT_ERROR_KEY] = error
        return
    marker = pytest.mark.skip(
        reason=f"tensorflow cannot be imported, MWMS integration tests skipped ({error})"
    )
    for item in ours:
        item.add_marker(marker)


def pytest_runtest_setup(item):
    error = item.stash.get(_TF_IMPORT_ERROR_KEY, None)
    if error is not None:
        pytest.fail(f"CI=true and tensorflow cannot be imported: {error}", pytrace=False)


def ours_import_error() -> str | None:
    """None if ``tf_failure_handling`` imports, else the ImportError text."""
    try:
        importlib.import_module("tf_failure_handling")
    except ImportError as e:
        return f"{type(e).__name__}: {e}"
    return None


def require_impl(impl: str) -> str:
    """Fails the calling test when ``impl`` is "ours" and the package does not import."""
    if impl == "ours":
        error = ours_import_error()
        if error is not None:
            pytest.fail(f"tf_failure_handling does not import: {error}")
    return impl


@pytest.fixture(params=["tf", "ours"])
def impl(request) -> str:
    """Which handler classes the workers use: TF's or tf_failure_handling's."""
    return require_impl(request.param)


class Cluster:
    """N ``mwms_worker.py`` processes forming one MWMS cluster on 127.0.0.1."""

    def __init__(
        self,
        workdir: Path,
        *,
        impl: str,
        ckpt_dir: Path,
        num_workers: int = 2,
        steps: int = 60,
        step_sleep: float = 0.03,
        extra_args=(),
        worker_args=None,
        env=None,
        name: str = "cluster",
        cwds=None,
    ):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.impl = impl
        self.ckpt_dir = Path(ckpt_dir)
        self.num_workers = num_workers
        self.steps = steps
        self.step_sleep = step_sleep
        self.extra_args = list(extra_args)
        self.worker_args = worker_args or {}
        self.env = dict(env or {})
        self.name = name
        #: Each worker's working folder, when not ``workdir`` (a relative ckpt_dir then
        #: names another folder on each: folders the workers do not share).
        self.cwds = dict(cwds or {})
        self.ports: list[int] = []
        self.procs: list[subprocess.Popen] = []
        self.returncodes: list[int | None] = [None] * num_workers
        self.stdout_paths = [self.workdir / f"{name}-worker{i}.stdout" for i in range(num_workers)]
        self.stderr_paths = [self.workdir / f"{name}-worker{i}.stderr" for i in range(num_workers)]
        self.signal_times: dict[int, float] = {}
        #: ``time.time()`` by which each worker had ended, as :meth:`wait` saw it (an
        #: upper bound: the workers are waited for one after the other).
        self.ended_by: list[float | None] = [None] * num_workers

    # -- lifecycle ---------------------------------------------------------
    def command(self, index: int) -> list[str]:
        cmd = worker_command(
            WORKER_SCRIPT,
            ports=self.ports,
            index=index,
            impl=self.impl,
            ckpt_dir=self.ckpt_dir,
            steps=self.steps,
            step_sleep=self.step_sleep,
        )
        return [*cmd, *self.extra_args, *(str(a) for a in self.worker_args.get(index, ()))]

    def start(self) -> Cluster:
        assert not self.procs, "cluster already started"
        self.ports = free_ports(self.num_workers)
        env = {**child_environment(), **self.env}
        for i in range(self.num_workers):
            with open(self.stdout_paths[i], "wb") as out, open(self.stderr_paths[i], "wb") as err:
                proc = popen(
                    self.command(i),
                    stdout=out,
                    stderr=err,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    cwd=str(self.cwds.get(i, self.workdir)),
                )
            _LIVE_PROCESSES.add(proc)
            self.procs.append(proc)
        return self

    def kill(self) -> None:
        """Kill whatever is still running (teardown)."""
        for i, proc in enumerate(self.procs):
            kill_process(proc)
            self.returncodes[i] = proc.poll()

    # -- observation -------------------------------------------------------
    def events(self, index: int, kind: str | None = None) -> list[dict]:
        try:
            text = self.stdout_paths[index].read_text(errors="replace")
        except FileNotFoundError:
            return []
        events = parse_events(text)
        if kind is not None:
            events = [e for e in events if e["event"] == kind]
        return events

    def stderr_tail(self, index: int, lines: int = 40) -> str:
        return tail(self.stderr_paths[index], lines)

    def describe(self, index: int) -> str:
        proc = self.procs[index] if index < len(self.procs) else None
        rc = None if proc is None else proc.poll()
        events = self.events(index)
        last = json.dumps(events[-3:])[:1500] if events else "none"
        return (
            f"{self.name} worker {index} (impl={self.impl}, pid="
            f"{None if proc is None else proc.pid}, returncode={rc})\n"
            f"  last events: {last}\n"
            f"  stderr tail:\n{self.stderr_tail(index)}"
        )

    def wait_until(self, predicate, timeout: float, what: str, poll: float = 0.02) -> None:
        """Poll ``predicate()`` until true; fail with ``what`` and the workers' state."""
        if poll_until(predicate, timeout, poll):
            return
        details = "\n".join(self.describe(i) for i in range(self.num_workers))
        pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}\n{details}")

    def progress(self, index: int) -> int:
        """Highest step reported in a ``progress`` event by worker ``index``."""
        steps = [e["step"] for e in self.events(index, "progress")]
        return max(steps, default=-1)

    def wait_for_progress(self, min_step: int, timeout: float = STARTUP_BOUND) -> None:
        def ready():
            for i in range(self.num_workers):
                if self.progress(i) >= min_step:
                    continue
                if self.procs[i].poll() is not None:
                    details = self.describe(i)
                    pytest.fail(f"worker {i} exited before reaching step {min_step}\n{details}")
                return False
            return True

        self.wait_until(
            ready, timeout, f"all {self.num_workers} workers to report progress >= {min_step}"
        )

    def send_signal(self, index: int, sig: int = signal.SIGTERM) -> float:
        """Send ``sig`` to worker ``index``; returns the time.time() it was sent."""
        proc = self.procs[index]
        assert proc.poll() is None, f"worker {index} already exited:\n{self.describe(index)}"
        sent = time.time()
        proc.send_signal(sig)
        self.signal_times[index] = sent
        return sent

    def wait(self, timeout: float = EXIT_BOUND, what: str = "the workers to exit") -> list[int]:
        """Wait (bounded) for every worker to exit; returns their exit codes."""
        deadline = time.monotonic() + timeout
        for i, proc in enumerate(self.procs):
            remaining = max(0.0, deadline - time.monotonic())
            try:
                self.returncodes[i] = proc.wait(timeout=remaining)
                self.ended_by[i] = time.time()
            except subprocess.TimeoutExpired:
                still = [j for j, p in enumerate(self.procs) if p.poll() is None]
                details = "\n".join(self.describe(j) for j in range(self.num_workers))
                self.kill()
                pytest.fail(
                    f"timed out after {timeout:.0f}s waiting for {what}: "
                    f"workers {still} still running (killed)\n{details}"
                )
            _LIVE_PROCESSES.discard(proc)
        return list(self.returncodes)

    def chief_aborted_its_collectives(self, timeout: float, after: str) -> int:
        """Waits (bounded) for the chief to exit ``after`` a fault of worker 1's that
        TensorFlow does not abort (a heartbeat timeout longer than ``timeout``); checks
        that its log says the step watch aborted its collectives, with worker 1 not
        answering. Returns its exit code (the test kills worker 1)."""
        try:
            code = self.procs[0].wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(
                f"the chief did not exit within {timeout:g} s of {after} (TensorFlow's "
                f"heartbeat timeout is longer: only the step watch ends the step)\n"
                f"{self.describe(0)}"
            )
        log = self.stderr_paths[0].read_text(errors="replace")
        assert re.search(
            r"Worker 0: the step is blocked and worker 1 \(.*\) did not answer a health "
            r"probe: aborting this worker's collectives",
            log,
        ), self.describe(0)
        return code

    def run_to_completion(self, timeout: float = 240.0) -> list[dict]:
        """Start (if needed), wait for exit 0 everywhere; return the ``done`` events."""
        if not self.procs:
            self.start()
        codes = self.wait(timeout, "an uninterrupted run to finish")
        details = "\n".join(self.describe(i) for i in range(self.num_workers))
        assert codes == [0] * self.num_workers, f"exit codes {codes}\n{details}"
        done = []
        for i in range(self.num_workers):
            events = self.events(i, "done")
            assert len(events) == 1, f"worker {i} printed no done event\n{details}"
            done.append(events[0])
        return done


@pytest.fixture
def cluster_factory(tmp_path):
    """``make(name=..., impl=..., ckpt_dir=..., ...)`` -> Cluster; all killed at teardown."""
    clusters: list[Cluster] = []

    def make(**kwargs) -> Cluster:
        kwargs.setdefault("ckpt_dir", tmp_path / "train" / "ckpt")
        cluster = Cluster(tmp_path, **kwargs)
        clusters.append(cluster)
        return cluster

    yield make
    for cluster in clusters:
        cluster.kill()
