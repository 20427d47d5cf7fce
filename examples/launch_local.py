"""Runs a multi-process TensorFlow example on this machine, the way a cluster launcher would.

One process per task, all on 127.0.0.1, each with its own ``TF_CONFIG``. A task that
exits with a restart code (42, or 143 as on GCE) was preempted after saving a
checkpoint: it is started again, as Kubernetes, SLURM or a managed instance group
would do. Under MultiWorkerMirroredStrategy (no ``ps`` job) the whole cluster is
restarted once every worker has exited; under ParameterServerStrategy only the tasks
that exited are (the others keep serving). ``--preempt TASK@STEP`` sends SIGTERM to
one task, once, when a trainer prints ``step N`` with N >= STEP::

    python examples/launch_local.py --workers 2 --preempt worker:1@30 -- \\
        examples/mwms_custom_loop.py --ckpt-dir /tmp/mwms-ckpt
    python examples/launch_local.py --chief --workers 1 --ps 1 --preempt chief:0@40 -- \\
        examples/parameter_server.py --ckpt-dir /tmp/ps-ckpt

Every line a task prints on stdout is shown with the task's name in front; its stderr
(TensorFlow's and the handler's logs) goes to ``LOGS/<job>-<index>.log`` (``--logs``,
a new temporary folder by default), whose end is shown when a task fails. Exit status
0 when every trainer (the chief if there is one, else every worker) finished with 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import queue
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

#: Exit codes that mean "checkpoint saved, start me again": TF's default and GCE's.
RESTART_CODES = (42, 143)
#: Seconds a killed task may take to end (a process in uninterruptible I/O can linger).
KILL_BOUND = 30.0
STEP_LINE = re.compile(r"^step (\d+)\b")


#: Where a port handed out by :func:`free_ports` is reserved (one empty file per port)
#: for :data:`RESERVED_FOR` seconds, for every launcher and test on the machine: a
#: task binds its port seconds after it was chosen, and in between no other caller of
#: :func:`free_ports` may be handed the same one.
RESERVED = Path(tempfile.gettempdir()) / "launch_local-ports"
RESERVED_FOR = 1800.0
#: Below: 15000-24999, the pool of the port server TensorFlow's own tests pick from
#: in this project's runs (``tests/portserver.py``).
LOWEST_PORT = 25000


def _ephemeral_low() -> int:
    """The low end of the kernel's range for outgoing connections' local ports."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _reserve(port: int) -> bool:
    path = RESERVED / str(port)
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        try:
            if time.time() - path.stat().st_mtime < RESERVED_FOR:
                return False
            path.unlink()  # a reservation of a run long over
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            return True
        except OSError:
            return False


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("", port))  # every address: a task may listen on 0.0.0.0
            return True
        except OSError:
            return False


def free_ports(n: int) -> list[int]:
    """``n`` consecutive TCP ports that are free now and that no other caller gets for
    :data:`RESERVED_FOR` seconds, from :data:`LOWEST_PORT` up to the kernel's ephemeral
    range (anywhere above :data:`LOWEST_PORT` only when a custom range leaves no room
    below it). A port of the ephemeral range (what binding port 0 gives) can be taken,
    before the task binds it, as the local port of any outgoing connection, which,
    with many TensorFlow processes connected to each other, happened (the task then
    fails to start its gRPC server)."""
    top = _ephemeral_low() - n
    if top <= LOWEST_PORT:  # a custom ip_local_port_range with no room below it
        top = 65536 - n
    RESERVED.mkdir(parents=True, exist_ok=True)
    rng = random.SystemRandom()
    for _ in range(1000):
        start = rng.randrange(LOWEST_PORT, top)
        ports = list(range(start, start + n))
        if all(_reserve(p) for p in ports) and all(_bindable(p) for p in ports):
            return ports
        # Reservations of a failed try stay: a port that was not bindable is in use.
    raise RuntimeError(f"no {n} consecutive free ports found in 1000 tries")


def cluster_spec(workers: int, ps: int = 0, chief: bool = False) -> dict[str, list[str]]:
    """A cluster on 127.0.0.1 with a free port per task."""
    ports = iter(free_ports(workers + ps + int(chief)))
    cluster = {}
    if chief:
        cluster["chief"] = [f"127.0.0.1:{next(ports)}"]
    cluster["worker"] = [f"127.0.0.1:{next(ports)}" for _ in range(workers)]
    if ps:
        cluster["ps"] = [f"127.0.0.1:{next(ports)}" for _ in range(ps)]
    return cluster


@dataclasses.dataclass
class Result:
    """What happened: every line and every exit, per task and attempt."""

    #: (task, attempt, line) in the order they were printed.
    lines: list = dataclasses.field(default_factory=list)
    #: (task, attempt, exit code) in the order the processes ended.
    exits: list = dataclasses.field(default_factory=list)
    finished: bool = False

    def output(self, task: str) -> list[str]:
        return [line for t, _, line in self.lines if t == task]


class _Task:
    def __init__(self, name, command, env, events, log: Path):
        self.name = name
        self.attempt = -1
        self.log = log
        self._command, self._env, self._events = command, env, events
        self.proc = None
        self.reader = None

    def start(self):
        self.attempt += 1
        with open(self.log, "a") as log:
            log.write(f"--- attempt {self.attempt}\n")
            log.flush()
            self.proc = subprocess.Popen(
                self._command,
                env=self._env,
                stdout=subprocess.PIPE,
                stderr=log,
                stdin=subprocess.DEVNULL,
                text=True,
            )
        self.reader = threading.Thread(
            target=self._read, args=(self.proc, self.attempt), daemon=True
        )
        self.reader.start()

    def _read(self, proc, attempt):
        with proc.stdout:
            for line in proc.stdout:
                self._events.put(("line", self.name, attempt, line.rstrip("\n")))
        self._events.put(("exit", self.name, attempt, proc.wait()))

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, signum):
        if self.running():
            self.proc.send_signal(signum)

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def kill(self):
        if self.running():
            self.proc.kill()
        if self.proc is not None:
            try:
                self.proc.wait(timeout=KILL_BOUND)
            except subprocess.TimeoutExpired:
                raise RuntimeError(
                    f"{self.name} (pid {self.proc.pid}) did not end within {KILL_BOUND:g} s "
                    "of SIGKILL"
                ) from None
            self.reader.join(timeout=10)  # it closes the pipe at the end of the output


def launch(
    command: list[str],
    *,
    workers: int = 1,
    ps: int = 0,
    chief: bool = False,
    preempt: str | None = None,
    restarts: int = 3,
    timeout: float = 600.0,
    env: dict | None = None,
    logs: str | Path | None = None,
    echo=print,
) -> Result:
    """Runs ``command`` (a Python script and its arguments) once per task until the
    trainers finish, a task fails, ``restarts`` restarts were spent or ``timeout``
    seconds passed (then everything is killed)."""
    cluster = cluster_spec(workers, ps, chief)
    logs = Path(tempfile.mkdtemp(prefix="launch_local-") if logs is None else logs)
    logs.mkdir(parents=True, exist_ok=True)
    echo(f"launch_local: {json.dumps(cluster)}; logs in {logs}")
    events: queue.Queue = queue.Queue()
    tasks = {}
    for job, addresses in cluster.items():
        for index in range(len(addresses)):
            name = f"{job}:{index}"
            task_env = dict(os.environ if env is None else env)
            task_env["TF_CONFIG"] = json.dumps(
                {"cluster": cluster, "task": {"type": job, "index": index}}
            )
            task_env.setdefault("PYTHONUNBUFFERED", "1")
            task_env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
            log = logs / f"{job}-{index}.log"
            tasks[name] = _Task(name, [sys.executable, *command], task_env, events, log)
    trainers = ["chief:0"] if chief else [f"worker:{i}" for i in range(workers)]
    gang = not ps  # MultiWorkerMirroredStrategy: the workers restart together
    target, at_step = (None, None)
    if preempt:
        target, _, step = preempt.partition("@")
        at_step = int(step)
        if target not in tasks:
            raise ValueError(f"--preempt names {target!r}, not one of {sorted(tasks)}")
    result = Result()
    done: set[str] = set()
    waiting_for_gang: set[str] = set()
    spent = 0
    deadline = time.monotonic() + timeout
    for task in tasks.values():
        task.start()
    try:
        while True:
            # Checked before each event, not only when none comes: a task that keeps
            # printing must not keep the launcher past its bound.
            left = deadline - time.monotonic()
            try:
                if left <= 0:
                    raise queue.Empty
                kind, name, attempt, value = events.get(timeout=left)
            except queue.Empty:
                echo(
                    f"launch_local: the run did not end within {timeout:.0f} s; killing every task"
                )
                return result
            if kind == "line":
                result.lines.append((name, attempt, value))
                echo(f"[{name}] {value}")
                found = STEP_LINE.match(value)
                if target and found and int(found.group(1)) >= at_step:
                    echo(f"launch_local: SIGTERM to {target} (a preemption notice)")
                    tasks[target].signal(signal.SIGTERM)
                    target = None
                continue
            result.exits.append((name, attempt, value))
            echo(f"launch_local: {name} exited with {value}")
            if value == 0 and name in trainers:
                done.add(name)
                if done == set(trainers):
                    result.finished = True
                    return result
                continue
            if value not in RESTART_CODES:
                echo(f"launch_local: {name} failed; the end of {tasks[name].log}:")
                echo(tasks[name].log_tail())
                return result
            if spent >= restarts:
                echo(f"launch_local: {restarts} restarts spent; stopping every task")
                return result
            if not gang:
                spent += 1
                echo(f"launch_local: restarting {name}")
                tasks[name].start()
                continue
            waiting_for_gang.add(name)
            if waiting_for_gang == set(tasks):
                spent += 1
                echo("launch_local: every worker exited; restarting the cluster")
                waiting_for_gang.clear()
                for task in tasks.values():
                    task.start()
    finally:
        for task in tasks.values():
            task.kill()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=2, help="tasks of the worker job")
    p.add_argument("--ps", type=int, default=0, help="tasks of the ps job")
    p.add_argument("--chief", action="store_true", help="a chief task (the PS coordinator)")
    p.add_argument("--preempt", default=None, help="TASK@STEP: SIGTERM to TASK (say worker:1)")
    p.add_argument("--restarts", type=int, default=3, help="restarts allowed")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before giving up")
    p.add_argument("--logs", default=None, help="folder for each task's stderr")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- SCRIPT [ARGS...]")
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("name the script to run after --")
    result = launch(
        command,
        workers=args.workers,
        ps=args.ps,
        chief=args.chief,
        preempt=args.preempt,
        restarts=args.restarts,
        timeout=args.timeout,
        logs=args.logs,
    )
    return 0 if result.finished else 1


if __name__ == "__main__":
    sys.exit(main())
