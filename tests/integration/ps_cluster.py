"""Harness for the ParameterServerStrategy / ClusterCoordinator integration tests.

A cluster is 2 worker servers and 1 PS server, each a ``tf.distribute.Server`` in its
own process (this file run as a script, see ``serve``), plus the coordinator (chief)
in another process (``ps_coordinator_script.py``). Every address is on 127.0.0.1.
pytest's own process never connects its TF context to the cluster: it starts, kills
and restarts processes and reads the ``EVENT {json}`` lines they print.

Server mode::

    python ps_cluster.py serve --cluster '{"chief": [...], "worker": [...], "ps": [...]}' \
        --job worker --task 1
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

try:  # imported by the tests
    from .forkserver import popen
    from .mwms_worker import LIVE_PROCESSES as _LIVE
    from .mwms_worker import (
        child_environment,
        emit,
        free_ports,
        last_traceback,
        parse_events,
        poll_until,
        require_loopback,
        tail,
    )
except ImportError:  # run as a script (server mode): only the stdlib and TF are needed
    from forkserver import popen
    from mwms_worker import LIVE_PROCESSES as _LIVE
    from mwms_worker import (
        child_environment,
        emit,
        free_ports,
        last_traceback,
        parse_events,
        poll_until,
        require_loopback,
        tail,
    )

HERE = Path(__file__).resolve().parent
COORDINATOR_SCRIPT = HERE / "ps_coordinator_script.py"
NUM_WORKERS = 2
NUM_PS = 1
#: Bound on the "ours" probe (``ours_status``, once a process: a fixture's setup): an
#: import of TensorFlow, which took over 120 s on a machine loaded 14 times over its
#: cores. Only a hang's bound.
OURS_PROBE_BOUND = 600.0
#: Bound on the coordinator's exit after its ``done`` event (``wait_done``).
DONE_EXIT_BOUND = 30.0
# What tf_failure_handling must export for the "ours" runs.
OURS_REQUIRED = (
    "ClusterCoordinator",
    "RemoteValue",
    "PerWorkerValues",
    "experimental_get_current_worker_index",
)


# ----------------------------------------------------------------------------- server mode
def serve(argv=None) -> int:
    """Run one ``tf.distribute.Server`` until killed."""
    p = argparse.ArgumentParser(description="one TF server of the PS cluster")
    p.add_argument("--cluster", required=True)
    p.add_argument("--job", required=True, choices=("worker", "ps"))
    p.add_argument("--task", type=int, required=True)
    args = p.parse_args(argv)
    cluster = json.loads(args.cluster)
    require_loopback(cluster)
    import tensorflow as tf

    server = tf.distribute.Server(
        tf.train.ClusterSpec(cluster),
        job_name=args.job,
        task_index=args.task,
        protocol="grpc",
        start=True,
    )
    emit("serving", job=args.job, task=args.task, pid=os.getpid(), target=server.target)
    server.join()
    return 0


# ----------------------------------------------------------------------------- test side
def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


_ours_status: tuple[str, str] | None = None
_OURS_PROBE = """
import json
try:
    import tf_failure_handling as t
except ModuleNotFoundError as e:
    if e.name != "tf_failure_handling":
        raise
    print(json.dumps(["not-installed", str(e)]))
else:
    missing = [n for n in REQUIRED if not hasattr(t, n)]
    print(json.dumps(["missing", ", ".join(missing)] if missing else ["ok", ""]))
"""


def ours_status() -> tuple[str, str]:
    """Whether tf_failure_handling can run the "ours" coordinator tests.

    ``("ok", "")``, or ``("broken", why)`` when the package is not installed, lacks
    part of the coordinator API (a renamed export) or fails to import: the tests of
    "ours" then fail, they are never skipped. Probed once, in a subprocess, so this
    process's imports stay as they are.
    """
    global _ours_status
    if _ours_status is None:
        code = f"REQUIRED = {list(OURS_REQUIRED)!r}\n{_OURS_PROBE}"
        try:
            proc = subprocess.run(
                [sys.executable, "-c", code],
                capture_output=True,
                text=True,
                env=child_environment(),
                timeout=OURS_PROBE_BOUND,
            )
        except subprocess.TimeoutExpired:
            _ours_status = (
                "broken",
                f"importing tf_failure_handling's coordinator API did not end within "
                f"{OURS_PROBE_BOUND:.0f}s",
            )
            return _ours_status
        lines = proc.stdout.strip().splitlines()
        if proc.returncode != 0 or not lines:
            err = "\n".join(proc.stderr.strip().splitlines()[-8:])
            _ours_status = ("broken", f"tf_failure_handling's coordinator API fails:\n{err}")
        else:
            kind, detail = json.loads(lines[-1])
            if kind == "ok":
                _ours_status = ("ok", "")
            elif kind == "missing":
                _ours_status = ("broken", f"tf_failure_handling does not export {detail}")
            else:
                _ours_status = ("broken", f"tf_failure_handling is not installed ({detail})")
    return _ours_status


class Proc:
    """One child process with its stdout/stderr files."""

    def __init__(self, name: str, cmd: list[str], workdir: Path, incarnation: int = 0):
        suffix = f".{incarnation}" if incarnation else ""
        self.name = name
        self.stdout_path = workdir / f"{name}{suffix}.stdout"
        self.stderr_path = workdir / f"{name}{suffix}.stderr"
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.popen = popen(
                cmd,
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                env=child_environment(),
                cwd=str(workdir),
            )
        _LIVE.add(self.popen)

    def events(self, kind: str | None = None) -> list[dict]:
        try:
            text = self.stdout_path.read_text(errors="replace")
        except FileNotFoundError:
            return []
        events = parse_events(text)
        return events if kind is None else [e for e in events if e["event"] == kind]

    def describe(self) -> str:
        events = self.events()
        last = json.dumps(events[-3:])[:2000] if events else "none"
        code = self.popen.poll()
        # Why it exited first: the log below can be long enough to be cut off.
        raised = last_traceback(self.stderr_path) if code not in (None, 0) else ""
        return (
            f"{self.name} (pid={self.popen.pid}, returncode={code})\n"
            + (f"  its last traceback:\n{raised}\n" if raised else "")
            + f"  last events: {last}\n"
            f"  the package's last log lines:\n{self.package_log()}\n"
            f"  stderr tail ({self.stderr_path}):\n{tail(self.stderr_path)}"
        )

    def package_log(self, lines: int = 40) -> str:
        """The last ``lines`` lines tf_failure_handling logged (and TensorFlow's
        coordinator's recovery lines): what the process saw, which TensorFlow's exit
        noise at the end of the stderr tail can hide."""
        try:
            text = self.stderr_path.read_text(errors="replace")
        except OSError as e:
            return f"<cannot read {self.stderr_path}: {e}>"
        ours = [
            line
            for line in text.splitlines()
            if ":tf_failure_handling:" in line or "recovered" in line or "server def" in line
        ]
        return "\n".join(ours[-lines:]) or "<none>"

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        try:
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            return
        _LIVE.discard(self.popen)


class PsCluster:
    """2 workers (or ``num_workers``) + 1 PS (``tf.distribute.Server`` processes) + the
    coordinator process."""

    def __init__(self, workdir: Path, *, impl: str, name: str, num_workers: int = NUM_WORKERS):
        self.workdir = Path(workdir) / name
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.impl = impl
        self.name = name
        self.num_workers = num_workers
        chief, *workers, ps = free_ports(1 + num_workers + NUM_PS)
        self.ports = {"chief": [chief], "worker": workers, "ps": [ps]}
        self.spec = {
            job: [f"127.0.0.1:{port}" for port in ports] for job, ports in self.ports.items()
        }
        self.servers: dict[tuple[str, int], Proc] = {}
        self.dead: list[Proc] = []  # killed incarnations (for diagnostics)
        self.coordinator: Proc | None = None

    # -- lifecycle ---------------------------------------------------------
    def start_server(self, job: str, task: int) -> Proc:
        incarnation = sum(p.name == f"{job}{task}" for p in self.dead)
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "serve",
            "--cluster",
            json.dumps(self.spec),
            "--job",
            job,
            "--task",
            str(task),
        ]
        proc = Proc(f"{job}{task}", cmd, self.workdir, incarnation)
        self.servers[(job, task)] = proc
        return proc

    def start(self, scenario: str, *coordinator_args) -> PsCluster:
        """Start the servers and the coordinator at once (it waits for the servers)."""
        for task in range(self.num_workers):
            self.start_server("worker", task)
        for task in range(NUM_PS):
            self.start_server("ps", task)
        cmd = [
            sys.executable,
            str(COORDINATOR_SCRIPT),
            "--cluster",
            json.dumps(self.spec),
            "--impl",
            self.impl,
            "--scenario",
            scenario,
            "--control-dir",
            str(self.workdir),
            *[str(a) for a in coordinator_args],
        ]
        self.coordinator = Proc("coordinator", cmd, self.workdir)
        return self

    def kill_server(self, job: str, task: int) -> None:
        """SIGKILL one server and wait (bounded) until it is gone."""
        proc = self.servers[(job, task)]
        assert proc.popen.poll() is None, f"{job}{task} already exited\n{self.describe()}"
        proc.popen.send_signal(signal.SIGKILL)
        try:
            proc.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"{job}{task} survived SIGKILL for 10s\n{proc.describe()}"
            ) from None
        self.dead.append(proc)

    def wait_serving(self, job: str, task: int, timeout: float) -> None:
        proc = self.servers[(job, task)]
        port = self.ports[job][task]

        def ready():
            if proc.popen.poll() is not None:
                raise AssertionError(f"{job}{task} exited while starting\n{proc.describe()}")
            return bool(proc.events("serving")) and port_open(port)

        self.wait_until(ready, timeout, f"{job}{task} to serve on 127.0.0.1:{port}")

    def kill(self) -> None:
        """Kill everything still running (teardown)."""
        procs = [*self.servers.values()]
        if self.coordinator is not None:
            procs.insert(0, self.coordinator)
        for proc in procs:
            proc.kill()

    # -- observation -------------------------------------------------------
    def events(self, kind: str | None = None) -> list[dict]:
        return [] if self.coordinator is None else self.coordinator.events(kind)

    def describe(self) -> str:
        parts = [f"cluster {self.name} (impl={self.impl}, spec={self.spec})"]
        if self.coordinator is not None:
            parts.append(self.coordinator.describe())
        parts += [p.describe() for p in self.servers.values()]
        parts += [f"[killed] {p.describe()}" for p in self.dead]
        return "\n".join(parts)

    def wait_until(self, predicate, timeout: float, what: str, poll: float = 0.05) -> None:
        """Poll ``predicate()`` until true; fail with ``what`` and every process's state."""
        if poll_until(predicate, timeout, poll):
            return
        raise AssertionError(
            f"timed out after {timeout:.0f}s waiting for {what}\n{self.describe()}"
        )

    def wait_event(self, predicate, timeout: float, what: str) -> dict:
        """The first coordinator event matching ``predicate``; fails early if it exits."""
        found: list[dict] = []

        def ready():
            for e in self.events():
                if e["event"] == "error":
                    raise AssertionError(
                        f"coordinator failed while waiting for {what}: {e['type']}: "
                        f"{e['message']}\n{e.get('traceback', '')}\n{self.describe()}"
                    )
                if predicate(e):
                    found.append(e)
                    return True
            if self.coordinator.popen.poll() is not None:
                raise AssertionError(f"coordinator exited before {what}\n{self.describe()}")
            return False

        self.wait_until(ready, timeout, what)
        return found[0]

    def wait_done(self, timeout: float) -> list[dict]:
        """Wait (bounded) for the coordinator to print ``done`` and exit 0."""
        self.wait_event(lambda e: e["event"] == "done", timeout, "the coordinator's done event")
        try:
            code = self.coordinator.popen.wait(timeout=DONE_EXIT_BOUND)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"coordinator did not exit after done\n{self.describe()}"
            ) from None
        assert code == 0, f"coordinator exit code {code}\n{self.describe()}"
        return self.events()

    def summary(self, phase: str) -> dict:
        found = [e for e in self.events("summary") if e["phase"] == phase]
        assert len(found) == 1, f"expected one {phase!r} summary, got {found}\n{self.describe()}"
        return found[0]


if __name__ == "__main__":
    if sys.argv[1:2] != ["serve"]:
        sys.exit(f"usage: {sys.argv[0]} serve --cluster JSON --job JOB --task N")
    sys.exit(serve(sys.argv[2:]))
