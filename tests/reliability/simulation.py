"""Randomized fault-injection trials of the handler on a simulated cluster.

One trial is one seed. :func:`make_plan` turns it into a :class:`Plan` (2-8
workers, with or without a chief, a step count, random virtual step and save
durations, a grace period, notices on a random subset of workers at random steps
and moments, and at most one fault); :func:`run_trial` runs the plan on
``tf_failure_handling.testing.SimulatedCluster`` (threads over the in-memory
coordination service), restarts the cluster from its checkpoints, and checks the
invariants. A failing trial prints its seed; ``run_trial(make_plan(seed))``
replays it.

Time: each handler reads a per-worker virtual clock (``handler._clock``) that a
step advances by its planned duration and a save by its own, so grace periods of
minutes cost no wall time. Waits for peers stay real and are bounded by
:data:`PEER_TIMEOUT`; a worker still running after :data:`CLUSTER_TIMEOUT` real
seconds is a hang.

Moments of a notice: ``before_step`` (between two ``run`` calls), ``during_step``
(inside the train function), ``during_ack`` (right after the leader publishes the
agreed step, while acknowledgements are collected), ``during_save`` (inside a
checkpoint save) and ``during_countdown`` (after the first save of a grace
period).

Faults (one per trial at most): ``peer_unresponsive`` (a worker's
acknowledgements never reach the service), ``peer_crash`` (a worker dies at the
agreement: its thread stops and nothing it writes arrives), ``coordination_fault``
(one set or get of a protocol key fails), ``step_error`` (an ``OpError`` in one
worker's step), ``save_error`` (a save fails after writing part of a file).

Invariants (each violation is reported with the seed):

* every worker that saved in a round saved at the round's agreed step, exactly
  once per round; a worker that exited with 42 saved in every round;
* nothing hangs: the cluster ends within :data:`CLUSTER_TIMEOUT`; an
  acknowledgement timeout raises ``DeadlineExceededError`` naming the worker
  that did not answer;
* an error in one worker's step ends every other worker with the same error type
  (unless that worker had already exited at an agreed step);
* after a restart, the final state equals an uninterrupted run's, and a restart
  after a clean preemption resumes exactly at the agreed step (no lost steps).
"""

from __future__ import annotations

import dataclasses
import os
import random
import tempfile
import threading
import time
from typing import Optional

from tf_failure_handling import TerminationConfig, _errors, _native, testing

KINDS = (
    "preemption",
    "peer_unresponsive",
    "peer_crash",
    "coordination_fault",
    "step_error",
    "save_error",
)
KIND_WEIGHTS = (6, 1, 1, 2, 1, 1)
MOMENTS = ("before_step", "during_step", "during_ack", "during_save", "during_countdown")
#: Real seconds a leader waits for acknowledgements in a trial (the bound under test).
PEER_TIMEOUT = 0.15
#: Real seconds after which a worker still running counts as a hang.
CLUSTER_TIMEOUT = 20.0
#: Real seconds a simulated collective waits for a missing peer.
COLLECTIVE_TIMEOUT = 10.0
EXIT_CODE = 42

RUN_TO_CHECKPOINT = _native.RUN_TO_CHECKPOINT
LAST_RUN_TO_CHECKPOINT = _native.LAST_RUN_TO_CHECKPOINT
TERMINATED_WORKER = _native.TERMINATED_WORKER
ACK_PREFIX = _native.ACK_PREFIX
STOP_WATCHER = _native.STOP_WATCHER


class Crash(BaseException):
    """Ends a simulated worker abruptly (a process killed mid-agreement)."""


class VirtualClock:
    """A monotonic clock that only moves when told to."""

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds


@dataclasses.dataclass
class NoticePlan:
    target: int
    step: int
    moment: str
    #: Virtual seconds from the notice to the deadline it announces (None: no deadline).
    lead: Optional[float]


@dataclasses.dataclass
class Plan:
    seed: int
    kind: str
    num_workers: int
    chief: bool
    steps: int
    grace: float
    step_durations: list
    save_durations: list
    notices: list
    fault_worker: Optional[int] = None
    fault_step: Optional[int] = None
    #: ("set" | "get", key) for coordination faults.
    fault_op: Optional[tuple] = None

    def describe(self) -> str:
        notices = ", ".join(
            f"w{n.target}@{n.step}/{n.moment}" + ("" if n.lead is None else f"+{n.lead:.1f}s")
            for n in self.notices
        )
        fault = ""
        if self.kind != "preemption":
            fault = f", fault {self.kind} worker={self.fault_worker} step={self.fault_step}"
            if self.fault_op:
                fault += f" op={self.fault_op}"
        return (
            f"seed {self.seed}: {self.num_workers} workers{' (chief)' if self.chief else ''}, "
            f"{self.steps} steps, grace {self.grace:.1f}s, notices [{notices}]{fault}"
        )


def make_plan(seed: int) -> Plan:
    rng = random.Random(seed)
    kind = rng.choices(KINDS, weights=KIND_WEIGHTS)[0]
    n = rng.randint(2, 8)
    steps = rng.randint(8, 40)
    grace = 0.0 if rng.random() < 0.5 else rng.choice((0.5, 2.0, 10.0, 60.0))
    step_durations = [rng.uniform(0.05, 2.0) for _ in range(steps)]
    save_durations = [rng.uniform(0.0, 1.5) for _ in range(n)]
    count = rng.choices((0, 1, 2, 3, n), weights=(1, 6, 2, 1, 1))[0]
    if kind != "preemption" and kind != "step_error":
        count = max(count, 1)  # these faults strike during an agreement
    targets = rng.sample(range(n), min(count, n))
    notices = []
    for i, t in enumerate(targets):
        # The first notice starts an agreement; later ones may land inside it.
        moments = MOMENTS if i else ("before_step", "during_step")
        notices.append(
            NoticePlan(
                target=t,
                step=rng.randint(1, max(1, steps - 3)),
                moment=rng.choice(moments),
                lead=None if rng.random() < 0.6 else rng.uniform(1.0, 90.0),
            )
        )
    plan = Plan(
        seed, kind, n, rng.random() < 0.3, steps, grace, step_durations, save_durations, notices
    )
    if kind in ("peer_unresponsive", "peer_crash", "save_error"):
        plan.fault_worker = rng.randrange(n)
    elif kind == "step_error":
        plan.fault_worker = rng.randrange(n)
        plan.fault_step = rng.randint(1, steps - 1)
    elif kind == "coordination_fault":
        op = rng.choice(("set", "get"))
        keys = [RUN_TO_CHECKPOINT, LAST_RUN_TO_CHECKPOINT]
        if op == "set":
            keys.append(TERMINATED_WORKER)
        peer = rng.randrange(n)
        keys.append(f"{ACK_PREFIX}_{RUN_TO_CHECKPOINT}_{peer}")
        plan.fault_op = (op, rng.choice(keys))
    return plan


@dataclasses.dataclass
class TrialResult:
    plan: Plan
    violations: list
    #: Faults actually injected (a planned fault whose moment never came is not counted).
    injected: dict
    hung: bool
    mismatched_saves: int
    lost_steps: int
    outcomes: list
    seconds: float

    @property
    def ok(self) -> bool:
        return not self.violations


def expected_total(steps: int, n: int) -> float:
    """The variable after ``steps`` uninterrupted steps of :func:`_step_value`."""
    return float(sum(_step_value(s, n) for s in range(steps)))


def _step_value(step: int, n: int) -> float:
    # Every worker adds the all-reduced sum of (step + 1) * (index + 1).
    return float((step + 1) * n * (n + 1) // 2)


class _Trial:
    """The shared state of one trial's first life (notices, faults, observations)."""

    def __init__(self, plan: Plan, root: str) -> None:
        self.plan = plan
        self.root = root
        self.clocks = [VirtualClock() for _ in range(plan.num_workers)]
        self.lock = threading.Lock()
        self.saves: dict = {i: [] for i in range(plan.num_workers)}
        self.first_round_saved: set = set()
        self.fired: set = set()
        self.injected: dict = {}
        self.cut_off: set = set()  # worker ids whose writes never arrive
        self.drop_acks_of: Optional[int] = None
        self.crashed: set = set()
        self.cluster: Optional[testing.SimulatedCluster] = None

    # -- notices -----------------------------------------------------------
    def fire(self, moment: str, worker: int, step: Optional[int]) -> None:
        """Delivers the notices planned for this moment (each at most once)."""
        for i, n in enumerate(self.plan.notices):
            if n.moment != moment or i in self.fired:
                continue
            if moment in ("before_step", "during_step") and (worker != n.target or step != n.step):
                continue
            if moment == "during_countdown" and (
                worker != n.target or n.target not in self.first_round_saved
            ):
                continue
            with self.lock:
                if i in self.fired:
                    continue
                self.fired.add(i)
            deadline = None if n.lead is None else self.clocks[n.target].now() + n.lead
            self.note("notice")
            self.cluster.preempt(n.target, deadline)

    def note(self, kind: str) -> None:
        with self.lock:
            self.injected[kind] = self.injected.get(kind, 0) + 1

    # -- the coordination service as the trial sees it ----------------------
    def service(self) -> testing.InMemoryCoordinationService:
        trial = self

        class TrialService(testing.InMemoryCoordinationService):
            def set_config_key_value(self, key: str, value: str) -> None:
                if trial.dropped(key):
                    return  # written by a worker cut off from the service: lost
                super().set_config_key_value(key, value)
                if key == RUN_TO_CHECKPOINT and value != STOP_WATCHER:
                    trial.on_agreement()

        service = TrialService()
        if self.plan.kind == "coordination_fault":
            op, key = self.plan.fault_op
            (service.fail_next_set if op == "set" else service.fail_next_get)(key)
            self.note("coordination_fault")
        return service

    def dropped(self, key: str) -> bool:
        name = threading.current_thread().name
        writer = name.rsplit("-", 1)[-1]
        if writer.isdigit() and int(writer) in self.crashed:
            return True
        return (
            self.drop_acks_of is not None
            and key.startswith(ACK_PREFIX)
            and key.endswith(f"_{self.drop_acks_of}")
        )

    def on_agreement(self) -> None:
        plan = self.plan
        if plan.kind == "peer_unresponsive" and self.drop_acks_of is None:
            self.drop_acks_of = plan.fault_worker
            self.note("peer_unresponsive")
        if plan.kind == "peer_crash" and not self.crashed:
            self.crashed.add(plan.fault_worker)
            self.note("peer_crash")
        self.fire("during_ack", -1, None)


def _make_checkpoint(trial: Optional[_Trial], index: int, **variables):
    class TrialManager(testing.FakeCheckpointManager):
        def save(self, checkpoint_number=None):
            if trial is None:
                return super().save(checkpoint_number)
            runs = int(self._checkpoint.checkpointed_runs.numpy())
            plan = trial.plan
            if plan.kind == "save_error" and index == plan.fault_worker:
                trial.note("save_error")
                # A torn write: part of a file, then the failure.
                os.makedirs(self.directory, exist_ok=True)
                with open(os.path.join(self.directory, f"ckpt-{runs}.json.partial"), "w") as f:
                    f.write('{"w": 12')
                raise OSError(f"injected save failure on worker {index}")
            trial.fire("during_save", index, None)
            trial.clocks[index].advance(plan.save_durations[index])
            path = super().save(checkpoint_number)
            with trial.lock:
                trial.saves[index].append(runs)
                trial.first_round_saved.add(index)
            return path

    class TrialCheckpoint(testing.FakeCheckpoint):
        def make_manager(self, directory, max_to_keep=1):
            return TrialManager(self, directory, max_to_keep)

    return TrialCheckpoint(**variables)


def _worker(trial: Optional[_Trial], plan: Plan):
    def body(ctx: testing.WorkerContext):
        w = testing.FakeVariable(0.0)
        handler = ctx.handler(
            _make_checkpoint(trial, ctx.index, w=w),
            ctx.checkpoint_dir,
            TerminationConfig(grace_period=plan.grace, peer_timeout=PEER_TIMEOUT),
        )
        clock = None if trial is None else trial.clocks[ctx.index]
        if clock is not None:
            handler._clock = clock.now
        restored = handler._run_counter

        for step in range(restored, plan.steps):
            if trial is not None:
                if ctx.index in trial.crashed:
                    raise Crash(f"worker {ctx.index} crashed")
                trial.fire("before_step", ctx.index, step)
                trial.fire("during_countdown", ctx.index, step)

            def train(step=step):
                if trial is not None:
                    trial.fire("during_step", ctx.index, step)
                    if (
                        plan.kind == "step_error"
                        and ctx.index == plan.fault_worker
                        and step == plan.fault_step
                    ):
                        trial.note("step_error")
                        raise _errors.make(
                            "InvalidArgumentError", f"injected step error on worker {ctx.index}"
                        )
                total = ctx.all_reduce(float((step + 1) * (ctx.index + 1)))
                w.assign_add(total)
                if clock is not None:
                    clock.advance(plan.step_durations[step])

            handler.run(train)
        return {"value": w.numpy(), "restored": restored}

    return body


def run_trial(plan: Plan, root: Optional[str] = None) -> TrialResult:
    """Runs ``plan`` (first life with notices and faults, then a clean restart)."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        trial = _Trial(plan, tmp)
        cluster = testing.SimulatedCluster(
            plan.num_workers,
            root=tmp,
            timeout=CLUSTER_TIMEOUT,
            chief=plan.chief,
            service_factory=trial.service,
        )
        trial.cluster = cluster
        violations: list = []
        hung = False
        try:
            first = cluster.run(_worker(trial, plan))
        except TimeoutError as e:
            hung = True
            violations.append(f"hang in the first life: {e}")
            first = []
        service = cluster.service
        mismatched = _check_first_life(plan, trial, service, first, violations) if first else 0

        lost = 0
        if not hung:
            lost = _restart_and_check(plan, cluster, trial, first, service, violations)
    return TrialResult(
        plan,
        violations,
        dict(trial.injected),
        hung,
        mismatched,
        lost,
        [_outcome(r) for r in first],
        time.monotonic() - started,
    )


def _outcome(r: testing.WorkerResult) -> str:
    if r.exit_code is not None:
        return f"exit {r.exit_code}"
    if r.error is not None:
        return type(r.error).__name__
    return "finished"


def _agreed(service, key: str) -> Optional[int]:
    value = service.value(key)
    if value is None or value == STOP_WATCHER:
        return None
    return int(value)


def _check_first_life(plan, trial, service, results, violations) -> int:
    rounds = [_agreed(service, k) for k in (RUN_TO_CHECKPOINT, LAST_RUN_TO_CHECKPOINT)]
    mismatched = 0
    for r in results:
        saves = trial.saves[r.index]
        if len(saves) != len(set(saves)) or len(saves) > 2:
            mismatched += 1
            violations.append(f"worker {r.index} saved {saves}: more than once per round")
            continue
        for i, runs in enumerate(saves):
            if i >= len(rounds) or rounds[i] is None or runs != rounds[i]:
                mismatched += 1
                violations.append(
                    f"worker {r.index} saved at {runs} in round {i + 1}; agreed steps {rounds}"
                )
        if r.exit_code == EXIT_CODE:
            expected_rounds = 1 if plan.grace == 0 else 2
            if len(saves) != expected_rounds and plan.kind == "preemption":
                mismatched += 1
                violations.append(
                    f"worker {r.index} exited after {len(saves)} save(s), expected "
                    f"{expected_rounds} (agreed {rounds})"
                )
        elif r.exit_code is not None:
            violations.append(f"worker {r.index} exited with {r.exit_code}")
        if r.seconds > CLUSTER_TIMEOUT:
            violations.append(f"worker {r.index} ran {r.seconds:.1f}s")

    errors = [r.error for r in results if r.error is not None]
    for e in errors:
        if isinstance(e, _errors.module().DeadlineExceededError) and "did not acknowledge" in str(
            e
        ):
            silent = plan.fault_worker if plan.kind in ("peer_unresponsive", "peer_crash") else None
            if silent is not None and f" {silent}" not in str(e).split("did not acknowledge")[0]:
                violations.append(f"acknowledgement timeout does not name worker {silent}: {e}")
    if plan.kind == "preemption" and errors:
        violations.append(f"errors without a fault: {[repr(e) for e in errors]}")
    if plan.kind == "step_error" and trial.injected.get("step_error"):
        kind = _errors.module().InvalidArgumentError
        for r in results:
            if r.exit_code is not None or r.index in trial.crashed:
                continue
            if not isinstance(r.error, kind):
                violations.append(
                    f"worker {r.index} ended with {_outcome(r)} after worker "
                    f"{plan.fault_worker}'s step error"
                )
    return mismatched


def _restart_and_check(plan, cluster, trial, first, service, violations) -> int:
    """Restarts every worker without faults; the final state must be the uninterrupted one."""
    # A new life: a plain service (no injected faults, no cut-off writers), same checkpoints.
    restarted = testing.SimulatedCluster(
        plan.num_workers, root=cluster.root, timeout=CLUSTER_TIMEOUT, chief=plan.chief
    )
    try:
        second = restarted.run(_worker(None, plan))
    except TimeoutError as e:
        violations.append(f"hang after restart: {e}")
        return 0
    expected = expected_total(plan.steps, plan.num_workers)
    for r in second:
        if r.error is not None or r.exit_code is not None:
            violations.append(f"restarted worker {r.index} ended with {_outcome(r)}: {r.error!r}")
        elif r.value["value"] != expected:
            violations.append(
                f"restarted worker {r.index} ended with {r.value['value']}, "
                f"uninterrupted run {expected}"
            )
    # After a clean preemption every worker exited at the final agreed step: the
    # restart resumes exactly there.
    lost = 0
    if plan.kind == "preemption" and first and all(r.exit_code == EXIT_CODE for r in first):
        final = _agreed(service, LAST_RUN_TO_CHECKPOINT) or _agreed(service, RUN_TO_CHECKPOINT)
        restored = {r.index: r.value["restored"] for r in second if r.value is not None}
        for index, value in restored.items():
            if final is not None and value is not None and value < final:
                lost += final - value
                violations.append(f"worker {index} restored run {value}, saved at {final}")
    return lost
