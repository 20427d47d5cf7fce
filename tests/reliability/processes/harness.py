"""The harness of the real-process trials: worker processes, and what they printed.

:class:`Workers` is one life of a 2-worker MWMS cluster of ``trial_worker.py mwms``
processes; :class:`PsTrialCluster` a ParameterServerStrategy cluster whose chief is
``trial_worker.py ps-coordinator``. Both read what the processes did from the
``EVENT`` lines they print (``mwms_worker.py`` documents them); the functions below
turn those events into the protocol's windows (when the agreed step was published,
acknowledged, saved) and wait, bounded, for a moment of it.

The protocol's key names and the peer-timeout variable are the package's own.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

from integration import ps_cluster
from integration.forkserver import popen as start_process
from integration.mwms_worker import (
    LIVE_PROCESSES,
    child_environment,
    free_ports,
    kill_process,
    parse_events,
    poll_until,
    tail,
    worker_command,
)
from tf_failure_handling import _native
from tf_failure_handling.handler import PEER_TIMEOUT_ENV

from .plans import NUM_WORKERS

TRIAL_WORKER = Path(__file__).resolve().parent.parent / "trial_worker.py"

EXIT_CODE = 42  # the handler's default exit code off GCE
STEPS = 150  # run calls of every MWMS life (outlasts notice + grace period)
STEP_SLEEP = 0.02  # python-side sleep inside each step
START_TIMEOUT = 240.0  # process start + TF import + cluster set-up, 2 busy cores
EXIT_TIMEOUT = 60.0  # notice -> every worker saved and exited
RUN_TIMEOUT = 150.0  # a whole uninterrupted life
#: Peer bound of the handlers in the MWMS trials without a partition (acks are
#: delayed by at most 0.4 s there; the bound only catches a hang).
PEER_TIMEOUT = 30.0
#: Bound on waiting for a moment of the protocol (a hang bound).
MOMENT_TIMEOUT = 60.0

ACK_PREFIX = _native.ACK_PREFIX
RUN_TO_CHECKPOINT = _native.RUN_TO_CHECKPOINT
LAST_RUN_TO_CHECKPOINT = _native.LAST_RUN_TO_CHECKPOINT
STOP_WATCHER = _native.STOP_WATCHER


class Workers:
    """One life of an MWMS cluster of ``trial_worker.py mwms`` processes (2 workers
    unless ``num_workers`` says).

    ``hosts[i]`` is worker ``i``'s address (127.0.0.1 unless a partition trial put
    it on a veth address); ``netns[i]`` the network namespace it runs in (None: this
    one). ``trial_args`` go to ``trial_worker.py``, ``worker_args`` to every worker's
    ``mwms_worker.py``.
    """

    def __init__(
        self,
        workdir: Path,
        name: str,
        *,
        ckpt_dir,
        impl: str = "ours",
        steps: int = STEPS,
        step_sleep: float = STEP_SLEEP,
        hosts=None,
        netns=None,
        trial_args=(),
        worker_args=(),
        env=None,
        num_workers: int = NUM_WORKERS,
    ):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.name = name
        #: A local folder, or a ``gs://`` URL (kept as text: a Path would fold its ``//``).
        self.ckpt_dir = ckpt_dir if "://" in str(ckpt_dir) else Path(ckpt_dir)
        self.impl = impl
        self.steps = steps
        self.step_sleep = step_sleep
        self.num_workers = num_workers
        self.hosts = list(hosts or ["127.0.0.1"] * num_workers)
        self.netns = list(netns or [None] * num_workers)
        self.trial_args = [str(a) for a in trial_args]
        self.worker_args = [str(a) for a in worker_args]
        self.env = dict(env or {})
        self.procs: list = []
        self.stdout = [self.workdir / f"{name}-worker{i}.stdout" for i in range(num_workers)]
        self.stderr = [self.workdir / f"{name}-worker{i}.stderr" for i in range(num_workers)]
        self.sent: list = []  # (time.time(), worker, signal name)

    def command(self, index: int, ports: list) -> list:
        cmd = worker_command(
            TRIAL_WORKER,
            ports=ports,
            index=index,
            impl=self.impl,
            ckpt_dir=self.ckpt_dir,
            steps=self.steps,
            step_sleep=self.step_sleep,
        )
        # trial_worker.py's "mwms" subcommand comes before the worker's options.
        cmd[2:2] = ["mwms", "--hosts", ",".join(self.hosts), *self.trial_args]
        cmd += ["--progress-every", "1", *self.worker_args]
        if self.netns[index] is not None:
            cmd = ["ip", "netns", "exec", self.netns[index], *cmd]
        return cmd

    def start(self) -> Workers:
        ports = free_ports(self.num_workers)
        env = {**child_environment(), **self.env}
        for i in range(self.num_workers):
            with open(self.stdout[i], "wb") as out, open(self.stderr[i], "wb") as err:
                popen = start_process(
                    self.command(i, ports),
                    stdout=out,
                    stderr=err,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    cwd=str(self.workdir),
                )
            LIVE_PROCESSES.add(popen)
            self.procs.append(popen)
        return self

    # -- observation ---------------------------------------------------------
    def events(self, index: int, kind: Optional[str] = None) -> list:
        try:
            text = self.stdout[index].read_text(errors="replace")
        except FileNotFoundError:
            return []
        events = parse_events(text)
        return events if kind is None else [e for e in events if e["event"] == kind]

    def progress(self, index: int) -> int:
        return max((e["step"] for e in self.events(index, "progress")), default=-1)

    def returncode(self, index: int) -> Optional[int]:
        return self.procs[index].poll()

    def describe(self, index: int, lines: int = 25) -> str:
        popen = self.procs[index] if index < len(self.procs) else None
        events = self.events(index)
        shown = [e for e in events if e["event"] != "progress"][-8:]
        return (
            f"--- {self.name} worker {index} (pid {None if popen is None else popen.pid}, "
            f"returncode {None if popen is None else popen.poll()}, "
            f"progress {self.progress(index)}, host {self.hosts[index]}, "
            f"netns {self.netns[index]})\n"
            f"  events: {json.dumps(shown)[:2500]}\n"
            f"  stderr tail:\n{tail(self.stderr[index], lines)}"
        )

    def describe_all(self) -> str:
        return "\n".join(self.describe(i) for i in range(len(self.procs)))

    # -- control -------------------------------------------------------------
    def wait_for_progress(self, step: int, timeout: float = START_TIMEOUT) -> Optional[str]:
        """Waits until every worker finished ``step`` steps; an error text if not."""
        failed: list = []

        def ready() -> bool:
            done = True
            for i in range(self.num_workers):
                if self.progress(i) >= step:
                    continue
                if self.procs[i].poll() is not None:
                    failed.append(f"worker {i} exited before step {step}")
                    return True
                done = False
            return done

        if not poll_until(ready, timeout, 0.01):
            return f"workers did not reach step {step} within {timeout:.0f}s"
        return failed[0] if failed else None

    def signal(self, index: int, sig: int) -> Optional[float]:
        """Sends ``sig`` to worker ``index``: the time.time() it was sent, None if it had exited."""
        if self.procs[index].poll() is not None:
            return None
        sent = time.time()
        self.procs[index].send_signal(sig)
        self.sent.append((sent, index, signal.Signals(sig).name))
        return sent

    def dump_stacks(self, indices=None) -> None:
        """Makes hung workers print every thread's Python stack to their stderr."""
        indices = range(len(self.procs)) if indices is None else indices
        for i in indices:
            dump_stacks(self.procs[i], self.stderr[i])

    def wait(self, timeout: float, indices=None) -> list:
        """Waits (bounded) for the workers to exit; their codes, None for a hang."""
        indices = range(self.num_workers) if indices is None else indices
        deadline = time.monotonic() + timeout
        codes = []
        for i in indices:
            try:
                codes.append(self.procs[i].wait(timeout=max(0.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                codes.append(None)
        return codes

    def kill(self) -> None:
        for popen in self.procs:
            kill_process(popen)


def ended_cleanly(workers: Workers, result, bound: float, label: str) -> bool:
    """Waits (bounded) for a life that must run to its end: True when every worker
    exited 0; else the hang (counted, stacks dumped) or the exit codes are a violation
    of ``result``, prefixed with ``label``."""
    codes = workers.wait(bound)
    if None in codes:
        result.hangs += 1
        result.violations.append(f"{label}the restarted run did not finish in {bound:.0f}s")
        workers.dump_stacks()
        return False
    if codes != [0] * workers.num_workers:
        result.violations.append(f"{label}the restarted run exited with {codes}")
        return False
    return True


#: Seconds gdb may take to print a hung process's native stacks (a TF process has ~100
#: threads; about 5 s on a quiet machine).
NATIVE_STACKS_BOUND = 90.0


def dump_stacks(popen: subprocess.Popen, stderr: Path) -> None:
    """SIGUSR2 (``trial_worker.STACKS_SIGNAL``) to a live process, then wait for its dump.

    When gdb is installed, every thread's native stack follows (appended to the same
    file): a process stuck in a C++ destructor at interpreter exit shows Python only
    "Garbage-collecting", with no frame to say what it waits for."""
    if popen.poll() is not None:
        return
    size = stderr.stat().st_size if stderr.exists() else 0
    popen.send_signal(signal.SIGUSR2)
    poll_until(lambda: stderr.exists() and stderr.stat().st_size > size, 5.0, 0.05)
    time.sleep(0.2)  # the rest of the dump
    gdb = shutil.which("gdb")
    if gdb is None or popen.poll() is not None:
        return
    command = [gdb, "-p", str(popen.pid), "-batch", "-nx", "-ex", "thread apply all bt 30"]
    with open(stderr, "a") as out:
        out.write(f"\n--- native stacks of pid {popen.pid} (gdb) ---\n")
        out.flush()
        try:
            subprocess.run(
                command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=NATIVE_STACKS_BOUND,
                check=False,
            )
        except subprocess.TimeoutExpired:
            out.write(f"--- gdb gave no stacks in {NATIVE_STACKS_BOUND:.0f} s ---\n")


def peer_env(seconds: float) -> dict:
    return {PEER_TIMEOUT_ENV: str(seconds)}


_REFERENCE: dict = {}


def reference_weights(
    workdir: Optional[Path] = None,
    steps: int = STEPS,
    num_workers: int = NUM_WORKERS,
    worker_args: tuple = (),
    timeout: float = RUN_TIMEOUT,
) -> dict:
    """Final weights of one uninterrupted run (TF's handler), computed once per process
    for each ``(steps, num_workers, worker_args)``; ``timeout`` bounds the run."""
    key = (steps, num_workers, tuple(str(a) for a in worker_args))
    if key not in _REFERENCE:
        root = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="ref-"))
        name = "reference" if key[1:] == (NUM_WORKERS, ()) else f"reference-{len(_REFERENCE)}"
        workers = Workers(
            root / name,
            "reference",
            ckpt_dir=root / name / "train" / "ckpt",
            impl="tf",
            steps=steps,
            step_sleep=0.0,
            worker_args=worker_args,
            num_workers=num_workers,
        ).start()
        try:
            codes = workers.wait(timeout)
            done = [workers.events(i, "done") for i in range(num_workers)]
            if codes != [0] * num_workers or not all(done):
                raise RuntimeError(
                    f"the uninterrupted reference run failed (exit codes {codes})\n"
                    + workers.describe_all()
                )
        finally:
            workers.kill()
        weights = [d[0]["weights"] for d in done]
        for other in weights[1:]:
            mismatch = weights_mismatch(other, weights[0])
            if mismatch:
                raise RuntimeError(f"reference workers disagree: {mismatch}")
        _REFERENCE[key] = weights[0]
    return _REFERENCE[key]


def weights_mismatch(actual: dict, expected: dict) -> Optional[str]:
    import numpy as np

    if sorted(actual) != sorted(expected):
        return f"variables {sorted(actual)} != {sorted(expected)}"
    for name in expected:
        a, e = np.asarray(actual[name]), np.asarray(expected[name])
        if a.shape != e.shape or not np.allclose(a, e, rtol=1e-6, atol=1e-7):
            return f"{name}: {a.tolist()} != uninterrupted {e.tolist()}"
    return None


def chief_dir(ckpt_dir: Path) -> Path:
    return Path(ckpt_dir)


def non_chief_parent(ckpt_dir: Path) -> Path:
    return Path(ckpt_dir).parent / "workertemp_1"


class PsTrialCluster(ps_cluster.PsCluster):
    """ps_cluster's servers with ``trial_worker.py ps-coordinator`` as the chief."""

    def start_trial(self, *coordinator_args) -> PsTrialCluster:
        for task in range(ps_cluster.NUM_WORKERS):
            self.start_server("worker", task)
        for task in range(ps_cluster.NUM_PS):
            self.start_server("ps", task)
        cmd = [
            sys.executable,
            str(TRIAL_WORKER),
            "ps-coordinator",
            "--cluster",
            json.dumps(self.spec),
            "--impl",
            self.impl,
            "--control-dir",
            str(self.workdir),
            *[str(a) for a in coordinator_args],
        ]
        self.coordinator = ps_cluster.Proc("coordinator", cmd, self.workdir)
        return self


def kv_sets(workers: Workers, index: int, prefix: str) -> list:
    return [e for e in workers.events(index, "kv_set") if e["key"].startswith(prefix)]


def round_windows(workers: Workers) -> dict:
    """Wall-clock windows of the protocol, from every worker's events."""
    windows: dict = {}
    for round_key in (RUN_TO_CHECKPOINT, LAST_RUN_TO_CHECKPOINT):
        publish = [
            e
            for i in range(workers.num_workers)
            for e in kv_sets(workers, i, round_key)
            if e["key"] == round_key and e["value"] != STOP_WATCHER and e.get("ok")
        ]
        acks = [
            e
            for i in range(workers.num_workers)
            for e in kv_sets(workers, i, f"{ACK_PREFIX}_{round_key}_")
        ]
        if publish:
            start = min(e["t_start"] for e in publish)
            end = max([e["t"] for e in acks] or [start])
            windows[round_key] = (start, end)
    saves = []
    for i in range(workers.num_workers):
        begins = [e["t"] for e in workers.events(i, "save_begin")]
        for j, e in enumerate(workers.events(i, "save")):
            saves.append((begins[j] if j < len(begins) else e["t_start"], e["t_end"]))
    windows["saves"] = saves
    return windows


def moment_of(t: float, windows: dict, grace: float) -> str:
    """Which part of the protocol was under way at wall time ``t``."""
    first = windows.get(RUN_TO_CHECKPOINT)
    if first is None or t < first[0]:
        return "during_step"
    if t <= first[1]:
        return "during_ack"
    if any(begin <= t <= end for begin, end in windows["saves"]):
        return "during_save"
    last = windows.get(LAST_RUN_TO_CHECKPOINT)
    if grace > 0 and (last is None or t < last[0]):
        return "during_countdown"
    if last is not None and last[0] <= t <= last[1]:
        return "during_ack"
    return "after_agreement"


def await_moment(workers: Workers, moment: str, timeout: float = MOMENT_TIMEOUT) -> bool:
    """Waits (bounded) until the protocol reached ``moment`` on some worker."""

    def began(i: int) -> bool:
        if moment == "during_ack":
            return any(
                e["key"] == RUN_TO_CHECKPOINT and e["value"] != STOP_WATCHER
                for e in workers.events(i, "kv_set")
            )
        if moment == "during_save":
            return bool(workers.events(i, "save_begin"))
        if moment == "during_countdown":
            return bool(workers.events(i, "save"))
        return True

    return poll_until(lambda: any(began(i) for i in range(workers.num_workers)), timeout, 0.005)
