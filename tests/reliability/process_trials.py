"""Randomized fault trials on real processes with real TensorFlow (issue 5).

The simulated trials (``simulation.py``) cover thousands of plans in threads; these
run the same kinds of faults against real ``MultiWorkerMirroredStrategy`` and
``ParameterServerStrategy`` clusters, one process per task, all on 127.0.0.1 (the
partition trial adds two veth addresses inside a network namespace it creates).

One trial is one ``(kind, seed)``. :func:`make_plan` draws everything random from
``random.Random(seed)`` (targets, steps, delays, which worker is cut off, when
workers are killed); :func:`run_trial` runs the plan and checks the invariants;
:func:`run_process_trials` runs many and :func:`format_table` aggregates them.
A violation names the seed and the plan: ``run_trial(make_plan(kind, seed))``
replays it (the moments are as random as the machine's scheduling, the plan is not).

Kinds:

``preemption``
    2 MWMS workers (``--impl ours``). SIGTERM to one worker, or to both with a
    random delay between the two signals; sometimes a grace period (two save
    rounds), slow saves and delayed acknowledgements, so that the second signal
    lands before the agreement, during the acknowledgement round, during a save or
    during the grace countdown (the moment it landed is recorded). Invariants: both
    exit 42; every worker saved once per round, all at the same step; nothing saved
    before the notice; a restart resumes at the last agreed step (no lost steps) and
    ends with the weights of an uninterrupted run.
``crash_during_save``
    Sometimes a clean preemption first (a complete checkpoint at step A); then a
    preemption whose saves are slow, and SIGKILL to one worker while it saves (before
    or after its data files are written, never after the state file names them).
    Invariants: the other worker stops (no hang); the restart restores the last
    *complete* checkpoint of the chief (A, 0, or the chief's finished save when only
    the non-chief was killed), never the partial one, and ends with the weights of
    an uninterrupted run.
``partition``
    One worker runs in a network namespace behind a veth pair; a SIGTERM reaches a
    worker and, at a random moment around it, the veth link goes down. Invariant: the
    worker left in the root namespace stops within :data:`PARTITION_BOUND` with an
    error naming the cut-off worker (its task index or its address), or exits 42 if
    the agreement and its save completed before the cut; it never hangs. Skipped,
    with the reason, where network namespaces cannot be created.
``ps_worker_kills``
    A ParameterServerStrategy cluster (``tests/integration/ps_cluster.py``) runs
    5,000+ indexed closures in waves while random workers (sometimes both) are
    SIGKILLed and restarted at random moments. Invariants: every RemoteValue
    resolves with its own closure's result; every closure index ran (its one-op
    update ``contrib[i] += i + 1`` is on the PS at least once), duplicates
    (at-least-once, as TF documents) are counted, not lost; the separately updated
    PS ``total`` holds at least one contribution of every closure.

Every trial returns a :class:`TrialResult` with the counters of the reliability
table: faults injected by kind, lost steps, hangs, mismatched saves, lost (and
duplicated) closures, seconds.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

TESTS = Path(__file__).resolve().parent.parent
if str(TESTS) not in sys.path:  # run as a script; under pytest `tests` is on the path
    sys.path.insert(0, str(TESTS))

from integration import ps_cluster  # noqa: E402
from integration.mwms_worker import LIVE_PROCESSES as _LIVE  # noqa: E402
from integration.mwms_worker import (  # noqa: E402
    child_environment,
    free_ports,
    parse_events,
    poll_until,
    tail,
)

TRIAL_WORKER = Path(__file__).resolve().parent / "trial_worker.py"

KINDS = ("preemption", "crash_during_save", "partition", "ps_worker_kills")
#: Moments at which a second notice can land (the vocabulary of ``simulation.py``).
MOMENTS = (
    "during_step",
    "during_ack",
    "during_save",
    "during_countdown",
    "after_agreement",
    "after_exit",
)

#: Moments a preemption trial aims its second notice at (where it landed is measured).
SECOND_NOTICE_MOMENTS = ("during_step", "during_ack", "during_save", "during_countdown")

NUM_WORKERS = 2
EXIT_CODE = 42  # the handler's default exit code off GCE
STEPS = 150  # run calls of every MWMS life (outlasts notice + grace period)
STEP_SLEEP = 0.02  # python-side sleep inside each step
START_TIMEOUT = 120.0  # process start + TF import + cluster set-up, 2 busy cores
EXIT_TIMEOUT = 60.0  # notice -> every worker saved and exited
RUN_TIMEOUT = 150.0  # a whole uninterrupted life
#: Peer bound of the handlers in the MWMS trials without a partition (acks are
#: delayed by at most 0.4 s there; the bound only catches a hang).
PEER_TIMEOUT = 30.0
#: Peer bound of the handlers in the partition trial.
PARTITION_PEER_TIMEOUT = 4.0
#: From the cut: the worker left behind has stopped. Seen on this kind of machine:
#: the peer bound + 10 s (TF's deadline for reporting the error to the cut-off task)
#: when it waits for an acknowledgement; TF's 10 s heartbeat timeout when it is
#: blocked in a collective. About 3x that.
PARTITION_BOUND = 45.0
#: From the SIGKILL: the other worker of a crash_during_save trial has stopped.
SURVIVOR_BOUND = 60.0
PS_CLOSURES = 5000
PS_TIMEOUT = 420.0  # the whole PS trial, 5,000+ closures with kills and restarts
PS_RESTART_TIMEOUT = 90.0  # a restarted worker server serves again

ENV_PEER_TIMEOUT = "TF_FAILURE_HANDLING_PEER_TIMEOUT"
ACK_PREFIX = "RECEIVED_SIGNAL"
RUN_TO_CHECKPOINT = "RUN_TO_CHECKPOINT"
LAST_RUN_TO_CHECKPOINT = "LAST_RUN_TO_CHECKPOINT"
STOP_WATCHER = "STOP_WATCHER"


# ============================================================================ plans
@dataclasses.dataclass
class Plan:
    """Everything random about one trial, drawn from its seed."""

    kind: str
    seed: int
    params: dict

    def describe(self) -> str:
        items = ", ".join(f"{k}={_short(v)}" for k, v in self.params.items())
        return f"{self.kind} seed {self.seed}: {items}"


def _short(value) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_short(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_short(v)}" for k, v in value.items()) + "}"
    return str(value)


def make_plan(kind: str, seed: int) -> Plan:
    """The plan of trial ``(kind, seed)``: the same seed always gives the same plan."""
    if kind not in KINDS:
        raise ValueError(f"unknown trial kind {kind!r}; kinds: {', '.join(KINDS)}")
    rng = random.Random(f"{kind}:{seed}")
    return Plan(kind, seed, _PLANNERS[kind](rng))


def _plan_preemption(rng: random.Random) -> dict:
    targets = rng.choice([(0,), (1,), (0, 1), (1, 0), (0, 1), (1, 0), (0, 0), (1, 1)])
    second = rng.choice(SECOND_NOTICE_MOMENTS) if len(targets) > 1 else None
    grace = rng.choice((0.0, 0.0, 1.0, 2.0))
    ack_delay = rng.choice((0.0, 0.0, 0.1, 0.3))
    slow_save = rng.choice((0.0, 0.0, 0.3, 0.6))
    # Make the planned moment of the second notice long enough to be hit.
    if second == "during_ack":
        ack_delay = max(ack_delay, 0.3)
    elif second == "during_save":
        slow_save = max(slow_save, 0.4)
    elif second == "during_countdown":
        grace = max(grace, 1.0)
    return {
        "targets": list(targets),  # who gets SIGTERM, in order
        "step": rng.randint(5, 30),  # first signal once every worker finished this step
        "first_delay": rng.uniform(0.0, 0.04),  # ... plus this (inside a step)
        # The second signal: once the moment began (the leader published the step, a
        # save began, the first round's saves ended), plus a random delay.
        "second_moment": second,
        "second_delay": rng.uniform(0.0, 0.15 if second == "during_step" else 0.05),
        "grace": grace,
        "ack_delay": ack_delay,
        "slow_save": slow_save,
    }


def _plan_crash_during_save(rng: random.Random) -> dict:
    prior = rng.random() < 0.5
    slow_save = rng.uniform(0.8, 1.6)
    return {
        # An earlier clean preemption leaves a complete checkpoint to fall back to.
        "prior": prior,
        "prior_target": rng.randrange(NUM_WORKERS),
        "prior_step": rng.randint(5, 30),
        "notice_target": rng.randrange(NUM_WORKERS),
        "notice_after": rng.randint(3, 25),  # steps after the restored step
        "kill_target": rng.randrange(NUM_WORKERS),
        "slow_save": slow_save,
        # SIGKILL this long after the target's save_begin: before its data files
        # (first half) or between them and the state file (second half).
        "kill_delay": rng.uniform(0.0, 0.85) * slow_save,
    }


def _plan_partition(rng: random.Random) -> dict:
    isolated = rng.randrange(NUM_WORKERS)
    return {
        "isolated": isolated,  # the worker inside the namespace, cut off later
        "notice_target": rng.randrange(NUM_WORKERS),
        "step": rng.randint(5, 30),
        # Seconds from the SIGTERM to the cut (negative: the cut comes first).
        "cut_offset": rng.choice((rng.uniform(-0.3, 0.0), rng.uniform(0.0, 0.3))),
        "ack_delay": rng.choice((0.0, 0.5)),
    }


def _plan_ps_worker_kills(rng: random.Random) -> dict:
    count = rng.randint(2, 4)
    thresholds = sorted(rng.sample(range(300, int(PS_CLOSURES * 0.8), 50), count))
    kills = []
    for at in thresholds:
        kills.append(
            {
                "at_done": at,  # closures finished (joined waves) before the kill
                "delay": rng.uniform(0.0, 0.5),
                "workers": rng.choices(([0], [1], [0, 1]), weights=(4, 4, 1))[0],
                "downtime": rng.uniform(0.3, 3.0),
            }
        )
    return {
        "closures": PS_CLOSURES,
        "wave_min": rng.choice((50, 100, 200)),
        "wave_max": rng.choice((300, 500, 800)),
        "kills": kills,
    }


_PLANNERS = {
    "preemption": _plan_preemption,
    "crash_during_save": _plan_crash_during_save,
    "partition": _plan_partition,
    "ps_worker_kills": _plan_ps_worker_kills,
}


# ============================================================================ results
@dataclasses.dataclass
class TrialResult:
    """What one trial did and found: a row of the reliability table."""

    kind: str
    seed: int
    plan: Plan
    violations: list = dataclasses.field(default_factory=list)
    #: Faults actually injected, by kind (``sigterm``, ``sigkill``, ``partition``, ...).
    faults: dict = dataclasses.field(default_factory=dict)
    lost_steps: int = 0
    hangs: int = 0
    mismatched_saves: int = 0
    lost_closures: int = 0
    #: At-least-once re-executions (not a loss).
    duplicate_closures: int = 0
    seconds: float = 0.0
    #: Why the trial could not run (only ``partition``, without network namespaces).
    skipped: Optional[str] = None
    #: Observations worth a column or a failure message (moments, exit codes, ...).
    notes: dict = dataclasses.field(default_factory=dict)
    #: Log tails of the processes, kept for a failure message.
    logs: str = ""

    @property
    def ok(self) -> bool:
        return not self.violations

    def fault(self, kind: str, n: int = 1) -> None:
        self.faults[kind] = self.faults.get(kind, 0) + n

    def record(self) -> dict:
        """The counters as plain data (JSON-able), for a long-mode runner."""
        return {
            "kind": self.kind,
            "seed": self.seed,
            "ok": self.ok,
            "skipped": self.skipped,
            "faults": dict(self.faults),
            "lost_steps": self.lost_steps,
            "hangs": self.hangs,
            "mismatched_saves": self.mismatched_saves,
            "lost_closures": self.lost_closures,
            "duplicate_closures": self.duplicate_closures,
            "seconds": round(self.seconds, 2),
            "notes": self.notes,
            "violations": list(self.violations),
            "plan": self.plan.describe(),
        }

    def report(self) -> str:
        """A failure message: seed, plan, violations, notes and the processes' logs."""
        lines = [
            f"{self.kind} trial, seed {self.seed} "
            f"(replay: run_trial(make_plan({self.kind!r}, {self.seed})))",
            f"  plan: {self.plan.describe()}",
            f"  faults injected: {self.faults}",
            f"  notes: {json.dumps(self.notes, default=str)[:3000]}",
        ]
        lines += [f"  VIOLATION: {v}" for v in self.violations]
        if self.logs:
            lines.append(self.logs)
        return "\n".join(lines)


# ============================================================================ MWMS harness
class Workers:
    """One life of a 2-worker MWMS cluster of ``trial_worker.py mwms`` processes.

    ``hosts[i]`` is worker ``i``'s address (127.0.0.1 unless a partition trial put
    it on a veth address); ``netns[i]`` the network namespace it runs in (None: this
    one).
    """

    def __init__(
        self,
        workdir: Path,
        name: str,
        *,
        ckpt_dir: Path,
        impl: str = "ours",
        steps: int = STEPS,
        step_sleep: float = STEP_SLEEP,
        hosts=None,
        netns=None,
        trial_args=(),
        env=None,
    ):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.ckpt_dir = Path(ckpt_dir)
        self.impl = impl
        self.steps = steps
        self.step_sleep = step_sleep
        self.hosts = list(hosts or ["127.0.0.1"] * NUM_WORKERS)
        self.netns = list(netns or [None] * NUM_WORKERS)
        self.trial_args = [str(a) for a in trial_args]
        self.env = dict(env or {})
        self.procs: list = []
        self.stdout = [self.workdir / f"{name}-worker{i}.stdout" for i in range(NUM_WORKERS)]
        self.stderr = [self.workdir / f"{name}-worker{i}.stderr" for i in range(NUM_WORKERS)]
        self.sent: list = []  # (time.time(), worker, signal name)

    def command(self, index: int, ports: list) -> list:
        cmd = [
            sys.executable,
            str(TRIAL_WORKER),
            "mwms",
            "--hosts",
            ",".join(self.hosts),
            *self.trial_args,
            "--ports",
            ",".join(str(p) for p in ports),
            "--index",
            str(index),
            "--impl",
            self.impl,
            "--ckpt-dir",
            str(self.ckpt_dir),
            "--steps",
            str(self.steps),
            "--step-sleep",
            str(self.step_sleep),
            "--progress-every",
            "1",
        ]
        if self.netns[index] is not None:
            cmd = ["ip", "netns", "exec", self.netns[index], *cmd]
        return cmd

    def start(self) -> Workers:
        ports = free_ports(NUM_WORKERS)
        env = {**child_environment(), **self.env}
        for i in range(NUM_WORKERS):
            with open(self.stdout[i], "wb") as out, open(self.stderr[i], "wb") as err:
                popen = subprocess.Popen(
                    self.command(i, ports),
                    stdout=out,
                    stderr=err,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    cwd=str(self.workdir),
                )
            _LIVE.add(popen)
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
            for i in range(NUM_WORKERS):
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
            _dump_stacks(self.procs[i], self.stderr[i])

    def wait(self, timeout: float, indices=None) -> list:
        """Waits (bounded) for the workers to exit; their codes, None for a hang."""
        indices = range(NUM_WORKERS) if indices is None else indices
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
            if popen.poll() is None:
                popen.kill()
                try:
                    popen.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    continue
            _LIVE.discard(popen)


def _dump_stacks(popen: subprocess.Popen, stderr: Path) -> None:
    """SIGUSR2 (``trial_worker.STACKS_SIGNAL``) to a live process, then wait for its dump."""
    if popen.poll() is not None:
        return
    size = stderr.stat().st_size if stderr.exists() else 0
    popen.send_signal(signal.SIGUSR2)
    poll_until(lambda: stderr.exists() and stderr.stat().st_size > size, 5.0, 0.05)
    time.sleep(0.2)  # the rest of the dump


def _peer_env(seconds: float) -> dict:
    return {ENV_PEER_TIMEOUT: str(seconds)}


_REFERENCE: dict = {}


def reference_weights(workdir: Optional[Path] = None, steps: int = STEPS) -> dict:
    """Final weights of one uninterrupted run (TF's handler), computed once per process."""
    if steps not in _REFERENCE:
        root = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="ref-"))
        workers = Workers(
            root / "reference",
            "reference",
            ckpt_dir=root / "reference" / "train" / "ckpt",
            impl="tf",
            steps=steps,
            step_sleep=0.0,
        ).start()
        try:
            codes = workers.wait(RUN_TIMEOUT)
            done = [workers.events(i, "done") for i in range(NUM_WORKERS)]
            if codes != [0] * NUM_WORKERS or not all(done):
                raise RuntimeError(
                    f"the uninterrupted reference run failed (exit codes {codes})\n"
                    + workers.describe_all()
                )
        finally:
            workers.kill()
        weights = [d[0]["weights"] for d in done]
        mismatch = _weights_mismatch(weights[1], weights[0])
        if mismatch:
            raise RuntimeError(f"reference workers disagree: {mismatch}")
        _REFERENCE[steps] = weights[0]
    return _REFERENCE[steps]


def _weights_mismatch(actual: dict, expected: dict) -> Optional[str]:
    import numpy as np

    if sorted(actual) != sorted(expected):
        return f"variables {sorted(actual)} != {sorted(expected)}"
    for name in expected:
        a, e = np.asarray(actual[name]), np.asarray(expected[name])
        if a.shape != e.shape or not np.allclose(a, e, rtol=1e-6, atol=1e-7):
            return f"{name}: {a.tolist()} != uninterrupted {e.tolist()}"
    return None


def _chief_dir(ckpt_dir: Path) -> Path:
    return Path(ckpt_dir)


def _non_chief_parent(ckpt_dir: Path) -> Path:
    return Path(ckpt_dir).parent / "workertemp_1"


def _restart_and_check(
    result: TrialResult, workdir: Path, ckpt_dir: Path, expected_step: int, name: str
) -> Optional[Workers]:
    """A clean life from ``ckpt_dir``: resumes at ``expected_step``, ends as uninterrupted."""
    reference = reference_weights(workdir)
    workers = Workers(
        workdir, name, ckpt_dir=ckpt_dir, env=_peer_env(PEER_TIMEOUT), step_sleep=0.0
    ).start()
    codes = workers.wait(RUN_TIMEOUT)
    if None in codes:
        result.hangs += 1
        result.violations.append(f"{name}: the restarted run did not finish in {RUN_TIMEOUT:.0f}s")
        workers.dump_stacks()
        return workers
    if codes != [0] * NUM_WORKERS:
        result.violations.append(f"{name}: the restarted run exited with {codes}")
        return workers
    restored = []
    for i in range(NUM_WORKERS):
        starts, done = workers.events(i, "start"), workers.events(i, "done")
        if not starts or not done:
            result.violations.append(f"{name}: worker {i} printed no start/done event")
            continue
        restored.append(starts[0]["restored"])
        if starts[0]["restored"] != expected_step:
            result.violations.append(
                f"{name}: worker {i} restored run {starts[0]['restored']}, "
                f"the last complete checkpoint is of run {expected_step}"
            )
            if starts[0]["restored"] < expected_step:
                result.lost_steps = max(result.lost_steps, expected_step - starts[0]["restored"])
        if done[0]["total_run_calls"] != STEPS:
            result.violations.append(
                f"{name}: worker {i} ended after {done[0]['total_run_calls']} runs, not {STEPS}"
            )
        mismatch = _weights_mismatch(done[0]["weights"], reference)
        if mismatch:
            result.violations.append(
                f"{name}: worker {i} resumed from run {starts[0]['restored']} and ended "
                f"with other weights than an uninterrupted run: {mismatch}"
            )
    result.notes[f"{name}_restored"] = restored
    return workers


def _kv_sets(workers: Workers, index: int, prefix: str) -> list:
    return [e for e in workers.events(index, "kv_set") if e["key"].startswith(prefix)]


def _round_windows(workers: Workers) -> dict:
    """Wall-clock windows of the protocol, from every worker's events."""
    windows: dict = {}
    for round_key in (RUN_TO_CHECKPOINT, LAST_RUN_TO_CHECKPOINT):
        publish = [
            e
            for i in range(NUM_WORKERS)
            for e in _kv_sets(workers, i, round_key)
            if e["key"] == round_key and e["value"] != STOP_WATCHER and e.get("ok")
        ]
        acks = [
            e
            for i in range(NUM_WORKERS)
            for e in _kv_sets(workers, i, f"{ACK_PREFIX}_{round_key}_")
        ]
        if publish:
            start = min(e["t_start"] for e in publish)
            end = max([e["t"] for e in acks] or [start])
            windows[round_key] = (start, end)
    saves = []
    for i in range(NUM_WORKERS):
        begins = [e["t"] for e in workers.events(i, "save_begin")]
        for j, e in enumerate(workers.events(i, "save")):
            saves.append((begins[j] if j < len(begins) else e["t_start"], e["t_end"]))
    windows["saves"] = saves
    return windows


def _moment(t: float, windows: dict, grace: float) -> str:
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


def _await_moment(workers: Workers, moment: str, timeout: float = 30.0) -> bool:
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

    return poll_until(lambda: any(began(i) for i in range(NUM_WORKERS)), timeout, 0.005)


def _check_preemption_life(result: TrialResult, workers: Workers, rounds: int, after: int):
    """Both exited 42 having saved ``rounds`` times at the same steps (>= ``after``).

    Returns the agreed step of the last round, or None.
    """
    codes = workers.wait(EXIT_TIMEOUT)
    result.notes.setdefault("exit_codes", []).append(codes)
    if None in codes:
        result.hangs += 1
        result.violations.append(
            f"{workers.name}: workers {[i for i, c in enumerate(codes) if c is None]} still "
            f"running {EXIT_TIMEOUT:.0f}s after the notice"
        )
        workers.dump_stacks()
        return None
    if codes != [EXIT_CODE] * NUM_WORKERS:
        result.violations.append(f"{workers.name}: exit codes {codes}, expected 42 from both")
    saves = [[e["runs"] for e in workers.events(i, "save")] for i in range(NUM_WORKERS)]
    result.notes.setdefault("saves", []).append(saves)
    for i, steps in enumerate(saves):
        if len(steps) != rounds or len(set(steps)) != len(steps):
            result.mismatched_saves += 1
            result.violations.append(
                f"{workers.name}: worker {i} saved at runs {steps}, expected once in each of "
                f"{rounds} round(s)"
            )
    if any(s != saves[0] for s in saves):
        result.mismatched_saves += 1
        result.violations.append(f"{workers.name}: workers saved at different runs: {saves}")
    if saves[0] and saves[0][0] < after:
        result.violations.append(
            f"{workers.name}: saved at run {saves[0][0]}, before the notice (sent after "
            f"every worker finished run {after})"
        )
    chief = _chief_dir(workers.ckpt_dir)
    if not (chief / "checkpoint").is_file():
        result.violations.append(f"{workers.name}: no checkpoint state file in {chief}")
    if codes == [EXIT_CODE] * NUM_WORKERS and _non_chief_parent(workers.ckpt_dir).exists():
        result.violations.append(
            f"{workers.name}: {_non_chief_parent(workers.ckpt_dir)} left behind at exit"
        )
    return saves[0][-1] if saves[0] else None


# ============================================================================ kinds
def _trial_preemption(plan: Plan, result: TrialResult, workdir: Path) -> list:
    p = plan.params
    reference_weights(workdir)
    ckpt = workdir / "train" / "ckpt"
    trial_args = ["--slow-save", p["slow_save"], "--ack-delay", p["ack_delay"]]
    if p["grace"]:
        trial_args += ["--grace", p["grace"]]
    workers = Workers(
        workdir, "preempted", ckpt_dir=ckpt, trial_args=trial_args, env=_peer_env(PEER_TIMEOUT)
    ).start()
    lives = [workers]
    problem = workers.wait_for_progress(p["step"])
    if problem:
        result.violations.append(f"before the notice: {problem}")
        return lives
    after = min(workers.progress(i) for i in range(NUM_WORKERS))
    time.sleep(p["first_delay"])
    sent = []
    for n, target in enumerate(p["targets"]):
        if n:
            _await_moment(workers, p["second_moment"])
            time.sleep(p["second_delay"])
        sent.append(workers.signal(target, signal.SIGTERM))
        if sent[-1] is not None:
            result.fault("sigterm")
    rounds = 2 if p["grace"] else 1
    saved = _check_preemption_life(result, workers, rounds, after)
    windows = _round_windows(workers)
    if p["grace"] and saved is not None and sent[0] is not None:
        # Observed, not checked: a plan's saves may not fit in its grace period.
        ends = [e["t_end"] for i in range(NUM_WORKERS) for e in workers.events(i, "save")]
        result.notes["grace_deadline_margin_s"] = round(sent[0] + p["grace"] - max(ends), 3)
    if len(sent) > 1:
        # The moment the second notice landed (a worker that had exited got none).
        moment = "after_exit" if sent[1] is None else _moment(sent[1], windows, p["grace"])
        result.notes["second_notice"] = moment
        result.fault(f"second_notice_{moment}")
    if saved is None:
        return lives
    lives.append(_restart_and_check(result, workdir, ckpt, saved, "restart"))
    return lives


def _trial_crash_during_save(plan: Plan, result: TrialResult, workdir: Path) -> list:
    p = plan.params
    reference_weights(workdir)
    ckpt = workdir / "train" / "ckpt"
    env = _peer_env(PEER_TIMEOUT)
    lives: list = []
    complete = 0  # run count of the chief's last complete checkpoint
    if p["prior"]:
        prior = Workers(workdir, "prior", ckpt_dir=ckpt, env=env).start()
        lives.append(prior)
        problem = prior.wait_for_progress(p["prior_step"])
        if problem:
            result.violations.append(f"prior life: {problem}")
            return lives
        after = min(prior.progress(i) for i in range(NUM_WORKERS))
        prior.signal(p["prior_target"], signal.SIGTERM)
        result.fault("sigterm")
        saved = _check_preemption_life(result, prior, 1, after)
        if saved is None:
            return lives
        complete = saved

    crash = Workers(
        workdir, "crash", ckpt_dir=ckpt, env=env, trial_args=["--slow-save", p["slow_save"]]
    ).start()
    lives.append(crash)
    problem = crash.wait_for_progress(complete + p["notice_after"])
    if problem:
        result.violations.append(f"crash life: {problem}")
        return lives
    restored = [e["restored"] for i in range(NUM_WORKERS) for e in crash.events(i, "start")]
    if restored != [complete] * NUM_WORKERS:
        result.violations.append(f"crash life restored {restored}, expected {complete}")
    crash.signal(p["notice_target"], signal.SIGTERM)
    result.fault("sigterm")
    target = p["kill_target"]
    found = poll_until(lambda: bool(crash.events(target, "save_begin")), EXIT_TIMEOUT, 0.01)
    if not found:
        result.violations.append(f"worker {target} never began a save after the notice")
        return lives
    begin = crash.events(target, "save_begin")[0]
    time.sleep(max(0.0, begin["t"] + p["kill_delay"] - time.time()))
    killed_at = crash.signal(target, signal.SIGKILL)
    result.fault("sigkill")
    crash.wait(10, [target])
    written = [e for e in crash.events(target, "save_written") if e["t"] <= killed_at]
    completed = crash.events(target, "save")
    result.notes["kill_landed"] = (
        "after_save" if completed else "after_data_files" if written else "before_data_files"
    )
    if completed:
        result.violations.append(
            f"the SIGKILL came {killed_at - completed[0]['t_end']:.3f}s after worker "
            f"{target}'s save had finished (the harness missed its window)"
        )

    survivor = 1 - target
    (code,) = crash.wait(SURVIVOR_BOUND, [survivor])
    survivor_saves = [e["runs"] for e in crash.events(survivor, "save")]
    result.notes["survivor"] = {"worker": survivor, "exit_code": code, "saves": survivor_saves}
    if survivor_saves and survivor_saves != [begin["runs"]]:
        result.mismatched_saves += 1
        result.violations.append(
            f"worker {survivor} saved at runs {survivor_saves}; worker {target} was killed "
            f"while saving at run {begin['runs']}"
        )
    if code is None:
        result.hangs += 1
        result.violations.append(
            f"worker {survivor} still running {SURVIVOR_BOUND:.0f}s after worker {target} "
            f"was killed during its save"
        )
        crash.dump_stacks([survivor])
    crash.kill()
    chief_saves = [
        e["runs"] for e in crash.events(0, "save") if Path(e["directory"]) == _chief_dir(ckpt)
    ]
    partial = crash.events(target, "save_begin")[0]["runs"]
    if chief_saves:
        complete = chief_saves[-1]
    result.notes["complete"] = complete
    result.notes["partial"] = partial
    final = _restart_and_check(result, workdir, ckpt, complete, "restart")
    lives.append(final)
    if target == 0 and partial != complete and final is not None:
        restored = result.notes.get("restart_restored", [])
        if partial in restored:
            result.violations.append(
                f"the restart restored the partial checkpoint of run {partial} (the chief "
                f"was killed while saving it)"
            )
    return lives


def _trial_partition(plan: Plan, result: TrialResult, workdir: Path) -> list:
    p = plan.params
    why = netns_unavailable()
    if why:
        result.skipped = why
        return []
    isolated = p["isolated"]
    with Partition() as net:
        hosts = [net.host_address, net.host_address]
        hosts[isolated] = net.ns_address
        netns = [None, None]
        netns[isolated] = net.namespace
        env = {
            **_peer_env(PARTITION_PEER_TIMEOUT),
            "NO_PROXY": f"127.0.0.1,localhost,{net.host_address},{net.ns_address}",
            "no_proxy": f"127.0.0.1,localhost,{net.host_address},{net.ns_address}",
        }
        for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "grpc_proxy"):
            env[var] = ""
        workers = Workers(
            workdir,
            "partitioned",
            ckpt_dir=workdir / "train" / "ckpt",
            hosts=hosts,
            netns=netns,
            env=env,
            trial_args=["--ack-delay", p["ack_delay"]],
        ).start()
        try:
            _partition_and_watch(p, result, workers, net)
        finally:
            workers.kill()  # before the namespace goes
        result.notes["isolated_exit_code"] = workers.returncode(isolated)
        return [workers]


def _partition_and_watch(p: dict, result: TrialResult, workers: Workers, net: Partition) -> None:
    isolated, survivor = p["isolated"], 1 - p["isolated"]
    problem = workers.wait_for_progress(p["step"])
    if problem:
        result.violations.append(f"before the partition: {problem}")
        return
    if p["cut_offset"] < 0:
        cut_at = net.cut()
        time.sleep(-p["cut_offset"])
        notice_at = workers.signal(p["notice_target"], signal.SIGTERM)
    else:
        notice_at = workers.signal(p["notice_target"], signal.SIGTERM)
        time.sleep(p["cut_offset"])
        cut_at = net.cut()
    result.fault("sigterm")
    result.fault("partition")
    (code,) = workers.wait(PARTITION_BOUND, [survivor])
    stopped_after = time.time() - cut_at
    result.notes["survivor"] = {
        "worker": survivor,
        "exit_code": code,
        "stopped_after_cut_s": None if code is None else round(stopped_after, 2),
        "cut_minus_notice_s": round(cut_at - notice_at, 3),
    }
    if code is None:
        result.hangs += 1
        result.violations.append(
            f"worker {survivor} still running {PARTITION_BOUND:.0f}s after worker "
            f"{isolated} ({net.ns_address}) was cut off"
        )
        workers.dump_stacks([survivor])
    elif code == EXIT_CODE:
        result.notes["survivor"]["how"] = "saved and exited (agreement done before the cut)"
    else:
        message = _stop_reason(workers, survivor)
        result.notes["survivor"]["reason"] = message[:600]
        result.notes["survivor"]["how"] = (
            "acknowledgement timeout"
            if "did not acknowledge" in message
            else "TF heartbeat"
            if "heartbeat" in message.lower()
            else "other error"
        )
        if not _names_worker(message, isolated, net.ns_address):
            result.violations.append(
                f"worker {survivor} stopped (exit {code}) with an error that does not name "
                f"the cut-off worker {isolated} ({net.ns_address}): {message[:1500]}"
            )


def _stop_reason(workers: Workers, index: int) -> str:
    errors = workers.events(index, "error")
    text = " | ".join(f"{e['type']}: {e['message']}" for e in errors)
    return text or tail(workers.stderr[index], 15)


def _names_worker(message: str, index: int, address: str) -> bool:
    if f"/task:{index}" in message or address in message:
        return True
    match = re.search(r"worker\(s\) ([\d, ]+) did not acknowledge", message)
    return bool(match) and str(index) in [w.strip() for w in match.group(1).split(",")]


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


def _trial_ps_worker_kills(plan: Plan, result: TrialResult, workdir: Path, impl: str) -> list:
    p = plan.params
    cluster = PsTrialCluster(workdir, impl=impl, name="ps")
    started = time.monotonic()
    cluster.start_trial(
        "--closures",
        p["closures"],
        "--seed",
        plan.seed,
        "--wave-min",
        p["wave_min"],
        "--wave-max",
        p["wave_max"],
        "--max-seconds",
        PS_TIMEOUT - 60,
    )
    try:
        for kill in p["kills"]:
            remaining = PS_TIMEOUT - (time.monotonic() - started)
            cluster.wait_event(
                lambda e, at=kill["at_done"]: e["event"] == "progress" and e["done"] >= at,
                remaining,
                f"{kill['at_done']} closures done",
            )
            time.sleep(kill["delay"])
            for w in kill["workers"]:
                cluster.kill_server("worker", w)
                result.fault("worker_sigkill")
            time.sleep(kill["downtime"])
            for w in kill["workers"]:
                cluster.start_server("worker", w)
            for w in kill["workers"]:
                cluster.wait_serving("worker", w, PS_RESTART_TIMEOUT)
        (cluster.workdir / "faults_done").touch()
        remaining = PS_TIMEOUT - (time.monotonic() - started)
        cluster.wait_done(max(remaining, 30.0))
    except AssertionError as e:
        if "timed out" in str(e):
            result.hangs += 1
            if cluster.coordinator is not None:
                _dump_stacks(cluster.coordinator.popen, cluster.coordinator.stderr_path)
        result.violations.append(str(e).split("\n", 1)[0])
        result.logs = cluster.describe()
        cluster.kill()
        return []
    finally:
        result.notes["ps_progress_events"] = len(cluster.events("progress"))
    cluster.kill()
    summaries = cluster.events("summary")
    gave_up = cluster.events("gave_up")
    if gave_up:
        result.violations.append(f"the coordinator gave up: {gave_up}")
    if len(summaries) != 1:
        result.violations.append(f"expected one summary, got {len(summaries)}")
        result.logs = cluster.describe()
        return []
    s = summaries[0]
    result.notes["ps"] = {
        k: s[k]
        for k in (
            "scheduled",
            "waves",
            "count_by_worker",
            "duplicated_closures",
            "contrib_sum",
            "total",
            "exactly_once",
            "seconds",
            "faults_seen_at",
        )
    }
    result.lost_closures = s["unresolved"] + s["wrong_count"] + s["never_ran_count"]
    result.duplicate_closures = s["duplicates"]
    if s["scheduled"] < p["closures"]:
        result.violations.append(f"only {s['scheduled']} closures scheduled")
    if s["unresolved"]:
        result.violations.append(
            f"{s['unresolved']} RemoteValues did not resolve: {s['unresolved_sample']}"
        )
    if s["wrong_count"]:
        result.violations.append(
            f"{s['wrong_count']} RemoteValues hold another closure's result: {s['wrong_results']}"
        )
    if s["never_ran_count"]:
        result.violations.append(
            f"{s['never_ran_count']} closures never updated the PS (contrib[i] == 0): "
            f"{s['never_ran']}"
        )
    if s["uneven"]:
        result.violations.append(f"contrib[i] not a multiple of i + 1 at {s['uneven']}")
    if s["contrib_beyond_scheduled"]:
        result.violations.append(
            f"{s['contrib_beyond_scheduled']} contributed beyond the scheduled closures"
        )
    if s["total"] < s["exactly_once"]:
        result.violations.append(
            f"PS total {s['total']} < {s['exactly_once']}, the sum of one execution of every "
            f"closure: an update was lost"
        )
    if result.violations:
        result.logs = cluster.describe()
    return []


# ============================================================================ network namespaces
_NETNS_PROBE: Optional[tuple] = None
_PARTITION_IDS = itertools.count()


def netns_unavailable() -> Optional[str]:
    """None if this process may create network namespaces and veth pairs, else why not."""
    global _NETNS_PROBE
    if _NETNS_PROBE is None:
        _NETNS_PROBE = (_probe_netns(),)
    return _NETNS_PROBE[0]


def _probe_netns() -> Optional[str]:
    if not sys.platform.startswith("linux"):
        return f"network namespaces are Linux-only (platform {sys.platform})"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    try:
        with Partition(probe=True):
            pass
    except PartitionError as e:
        return f"cannot create a network namespace with a veth pair here: {e}"
    return None


class PartitionError(RuntimeError):
    pass


class Partition:
    """A network namespace joined to this one by a veth pair, removed on exit.

    The namespace and both veth ends exist only inside this machine (sandbox): the
    two addresses are the trial's own hosts, nothing is routed anywhere else.
    Names and the /30 subnet are unique per trial (process id and a counter).
    """

    def __init__(self, probe: bool = False):
        n = next(_PARTITION_IDS)
        tag = f"{os.getpid() % 100000}{'p' if probe else ''}{n}"
        self.namespace = f"tfh-trial-{tag}"
        self.host_link = f"tfh{tag}h"[:15]
        self.ns_link = f"tfh{tag}n"[:15]
        # 10.213.0.0/16, one /30 per partition: .1 this side, .2 in the namespace.
        block = (os.getpid() * 7 + n) % 16384
        base = f"10.213.{block // 64}.{(block % 64) * 4}"
        prefix, last = base.rsplit(".", 1)
        self.host_address = f"{prefix}.{int(last) + 1}"
        self.ns_address = f"{prefix}.{int(last) + 2}"
        self.created: list = []

    def _ip(self, *args: str, namespace: Optional[str] = None) -> None:
        cmd = ["ip", *args]
        if namespace is not None:
            cmd = ["ip", "netns", "exec", namespace, *cmd]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        if proc.returncode != 0:
            raise PartitionError(f"`{' '.join(cmd)}` failed: {proc.stderr.strip()}")

    def __enter__(self) -> Partition:
        try:
            self._ip("netns", "add", self.namespace)
            self.created.append("netns")
            self._ip("link", "add", self.host_link, "type", "veth", "peer", "name", self.ns_link)
            self.created.append("veth")
            self._ip("link", "set", self.ns_link, "netns", self.namespace)
            self._ip("addr", "add", f"{self.host_address}/30", "dev", self.host_link)
            self._ip("link", "set", self.host_link, "up")
            ns = self.namespace
            self._ip("addr", "add", f"{self.ns_address}/30", "dev", self.ns_link, namespace=ns)
            self._ip("link", "set", self.ns_link, "up", namespace=ns)
            self._ip("link", "set", "lo", "up", namespace=ns)
        except BaseException:
            self.remove()
            raise
        return self

    def cut(self) -> float:
        """Takes the link down on both sides; returns the time.time() of the cut."""
        at = time.time()
        self._ip("link", "set", self.host_link, "down")
        self._ip("link", "set", self.ns_link, "down", namespace=self.namespace)
        return at

    def remove(self) -> None:
        if "veth" in self.created:
            subprocess.run(["ip", "link", "del", self.host_link], capture_output=True, timeout=30)
        if "netns" in self.created:
            subprocess.run(["ip", "netns", "del", self.namespace], capture_output=True, timeout=30)
        self.created.clear()

    def __exit__(self, *exc) -> None:
        self.remove()


# ============================================================================ running
def run_trial(
    plan: Plan, root: Optional[Path] = None, *, impl: str = "ours", keep: bool = False
) -> TrialResult:
    """Runs one planned trial in a fresh directory (kept if it failed or ``keep``).

    The MWMS kinds use tf_failure_handling's handler; ``impl`` picks the PS
    coordinator (``"tf"`` runs the same trial against TensorFlow's, for comparison).
    """
    result = TrialResult(plan.kind, plan.seed, plan)
    root = Path(root) if root is not None else Path(tempfile.gettempdir())
    root.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix=f"{plan.kind}-{plan.seed}-", dir=root))
    started = time.monotonic()
    lives: list = []
    try:
        if plan.kind == "ps_worker_kills":
            lives = _trial_ps_worker_kills(plan, result, workdir, impl)
        elif plan.kind == "preemption":
            lives = _trial_preemption(plan, result, workdir)
        elif plan.kind == "crash_during_save":
            lives = _trial_crash_during_save(plan, result, workdir)
        else:
            lives = _trial_partition(plan, result, workdir)
    finally:
        result.seconds = time.monotonic() - started
        if result.violations and not result.logs:
            result.logs = "\n".join(w.describe_all() for w in lives if w is not None)
        for workers in lives:
            if workers is not None:
                workers.kill()
        if not keep and result.ok:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            result.notes["workdir"] = str(workdir)
    return result


def run_process_trials(
    kinds=KINDS, seeds=range(1), *, root: Optional[Path] = None, impl: str = "ours"
) -> list:
    """Runs ``make_plan(kind, seed)`` for every kind and seed; one TrialResult each."""
    results = []
    for kind in kinds:
        for seed in seeds:
            results.append(run_trial(make_plan(kind, seed), root, impl=impl))
    return results


COLUMNS = (
    "kind",
    "trials",
    "failed",
    "skipped",
    "faults injected",
    "lost steps",
    "hangs",
    "mismatched saves",
    "lost closures",
    "duplicate closures",
    "median s",
)


def aggregate(results) -> list:
    """One row per kind: the counters of the reliability table."""
    rows = []
    for kind in dict.fromkeys(r.kind for r in results):
        rs = [r for r in results if r.kind == kind]
        faults: dict = {}
        for r in rs:
            for k, v in r.faults.items():
                faults[k] = faults.get(k, 0) + v
        seconds = sorted(r.seconds for r in rs if not r.skipped)
        rows.append(
            {
                "kind": kind,
                "trials": len(rs),
                "failed": sum(not r.ok for r in rs),
                "skipped": sum(bool(r.skipped) for r in rs),
                "faults injected": ", ".join(f"{k} {v}" for k, v in sorted(faults.items())),
                "lost steps": sum(r.lost_steps for r in rs),
                "hangs": sum(r.hangs for r in rs),
                "mismatched saves": sum(r.mismatched_saves for r in rs),
                "lost closures": sum(r.lost_closures for r in rs),
                "duplicate closures": sum(r.duplicate_closures for r in rs),
                "median s": round(seconds[len(seconds) // 2], 1) if seconds else 0,
            }
        )
    return rows


def format_table(results) -> str:
    """The aggregate as a Markdown table."""
    rows = aggregate(results)
    lines = [
        "| " + " | ".join(COLUMNS) + " |",
        "| " + " | ".join("---" for _ in COLUMNS) + " |",
    ]
    lines += ["| " + " | ".join(str(row[c]) for c in COLUMNS) + " |" for row in rows]
    return "\n".join(lines)


def _seed_range(text: str) -> range:
    first, _, last = text.partition("-")
    return range(int(first), int(last or first) + 1)


def main(argv=None) -> int:
    """Long mode: ``python tests/reliability/process_trials.py --seeds 0-19``."""
    p = argparse.ArgumentParser(description="real-process randomized fault trials")
    p.add_argument("--kinds", default=",".join(KINDS), help="comma-separated trial kinds")
    p.add_argument("--seeds", default="0-9", help="FIRST-LAST (inclusive)")
    p.add_argument("--impl", choices=("ours", "tf"), default="ours", help="PS coordinator")
    p.add_argument("--root", default=None, help="where trial directories go")
    p.add_argument("--json", default=None, help="write every record to this file")
    args = p.parse_args(argv)
    results = []
    for kind in args.kinds.split(","):
        for seed in _seed_range(args.seeds):
            r = run_trial(make_plan(kind, seed), args.root, impl=args.impl)
            results.append(r)
            status = "skipped" if r.skipped else "ok" if r.ok else "FAILED"
            print(f"{kind} seed {seed}: {status} in {r.seconds:.1f}s", flush=True)
            if not r.ok:
                print(r.report(), flush=True)
    print(format_table(results))
    if args.json:
        Path(args.json).write_text(json.dumps([r.record() for r in results], indent=1))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
