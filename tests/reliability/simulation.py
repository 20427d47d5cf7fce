"""Randomized fault-injection trials of the handler on a simulated cluster.

One trial is one seed. :func:`make_plan` turns it into a :class:`Plan` (2-8
workers, with or without a chief, a step count, random virtual step and save
durations, a grace period, notices on a random subset of workers at random steps
and moments, and at most one fault); :func:`run_trial` runs the plan on
``tf_failure_handling.testing.SimulatedCluster`` (threads over the in-memory
coordination service), restarts the cluster from its checkpoints, and checks the
invariants. A failing trial prints its seed; ``run_trial(make_plan(seed))``
replays it.

Time: each handler reads a per-worker virtual clock (``handler._core.configure(clock=...)``) that a
step advances by its planned duration and a save by its own, so grace periods of
minutes cost no wall time. Waits for peers stay real. No verdict depends on how
fast the machine is: a worker that is alive answers well within the handler's
peer bound (:data:`PEER_TIMEOUT`, generous); only the trials whose fault lasts for
good (:data:`LASTING`: a silent worker, a call that always fails) use a short bound
(:data:`SILENT_PEER_TIMEOUT`), and there every outcome the bound can produce is
checked the same way. A burst of failures is kept far shorter than the handler's
retry bound (:data:`BURST_MAX_CONSECUTIVE`). :data:`CLUSTER_TIMEOUT`
only turns a hang into a failure. Mismatched saves are found from the saves each
worker made, and workers that resume at different steps from the collective
itself (every all-reduce carries the step; a worker that joins one at another step
ends with :class:`OutOfStep` at once instead of deadlocking).

:func:`targeted_plan` builds fixed plans instead of random ones: one preemption in
which exactly one protocol call fails once (claim, publish, watch, acknowledge,
await, both rounds, shutdown), with the notice handled before the worker goes on,
so the call always strikes at the same moment.

Every call a worker's handler makes to the coordination service, from whichever
of its threads, passes through that worker's view of the service
(:class:`_WorkerService`): that is where a fault strikes one worker and where the
writes of a silenced worker are lost.

Moments of a notice: ``before_step`` (between two ``run`` calls), ``during_step``
(inside the train function), ``during_ack`` (right after the leader publishes the
agreed step, while acknowledgements are collected), ``during_save`` (inside a
checkpoint save) and ``during_countdown`` (after the first save of a grace
period).

Faults (one per trial at most), and the outcome that counts as success for each.
A fault "struck" when its moment came (``TrialResult.injected``); a planned fault
that never struck leaves a plain preemption. Where the fault makes the preemption
impossible, success is *the named error*: every worker ends with an error of TF's
type whose message names the fault (the key whose calls failed, the worker that
fell silent, the step's or the save's error), raised by itself or received from
the cluster; a worker that had already saved at the agreed step and exited 42
did its part. A worker that "just" ended with some error does not count.

``preemption`` (no fault), or a fault that never struck
    The preemption succeeded: every worker saved once per round, at the round's
    agreed step, and exited 42 (with a grace period whose final round was not due
    before the last step: every worker finished training having saved the first
    round); no errors. Without a delivered notice every worker finished.
``coordination_fault``
    One set or get of a protocol key fails (``UnavailableError``), on one worker
    for the keys several workers use. A transient failure must not lose the
    preemption: success as above.
``coordination_burst``
    A few calls fail, then the service recovers: one to three of the protocol's
    calls (claim, announce, publish, watch, acknowledge, await, in either round,
    or the shutdown writes) fail once or twice each (:data:`BURST_MAX_CONSECUTIVE`),
    two to six failures in all, a burst far shorter than the handler's retry
    bound. The preemption succeeds: every worker saves at the agreed step of
    every round and exits 42 (these plans notice early, so every round is due).
``coordination_outage``
    One call the preemption needs (claim, publish, watch, acknowledge, await, in
    either round) fails every time, longer than any bound; the handlers' bound is
    :data:`SILENT_PEER_TIMEOUT`. The named error: an ``OpError`` naming the key
    (the driver's "<what> failed N time(s) over Ts") or, when the failing call
    kept a worker from acknowledging, an acknowledgement timeout naming that
    worker.
``peer_unresponsive``, ``peer_crash``
    A worker's acknowledgements never reach the service (unresponsive), or it dies
    at the agreement: its thread stops and nothing it writes arrives (crash). No
    agreement can complete, so the named error: ``DeadlineExceededError`` naming
    the silent worker as one that did not acknowledge, or (for a crash) the error
    of the collective it abandoned, "worker N failed", which the first to see it
    reports to the cluster. The crashed one itself ends any way but an exit.
``step_error`` (an ``OpError`` in one worker's step)
    The named error: ``InvalidArgumentError`` with the step's message.
``save_error`` (a save fails after writing part of a file)
    That worker ends with the save's own error (``OSError``); every other worker
    ends with the named error (an ``OpError`` carrying it, or naming that worker
    as failed or silent) or exited 42 having saved at the agreed step.

Every call the driver gave up on must have been retried for its whole bound (its
error says how long it tried): a transient failure is never given up on at once.

Invariants of every trial (each violation is reported with the seed):

* every worker that saved in a round saved at the round's agreed step, exactly
  once per round; a worker that exited with 42 saved in every round;
* nothing hangs (:data:`CLUSTER_TIMEOUT`); an acknowledgement timeout names the
  silent worker;
* no notice is dropped: a worker that got one and finished training sees the
  claim it starts (:data:`NOTICE_BOUND`), so "everyone finished" cannot hide a
  notice that the handler lost;
* workers step together: every collective checks that all joined it at the same
  step (:class:`OutOfStep` otherwise);
* after a restart, the final state equals an uninterrupted run's, and a restart
  after a preemption in which every worker exited resumes exactly at the agreed
  step (no lost steps).
"""

from __future__ import annotations

import dataclasses
import os
import random
import re
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

from tf_failure_handling import TerminationConfig, _errors, _native, testing

KINDS = (
    "preemption",
    "peer_unresponsive",
    "peer_crash",
    "coordination_fault",
    "step_error",
    "save_error",
    "coordination_burst",
    "coordination_outage",
)
KIND_WEIGHTS = (6, 1, 1, 2, 1, 1, 1, 1)
#: The kinds (and weights) a seed drew from before ``coordination_burst`` and
#: ``coordination_outage`` were added (eea048a to e25c9f2): the rest of
#: :func:`make_plan` is unchanged since, so ``make_plan(seed, FIRST_KINDS)`` is the
#: plan that seed was then. The seeds of defects found in those days replay with it.
FIRST_KINDS = (KINDS[:6], (6, 1, 1, 2, 1, 1))
MOMENTS = ("before_step", "during_step", "during_ack", "during_save", "during_countdown")
#: Kinds whose fault silences a worker for good: the peer bound itself is under test.
SILENCING = ("peer_unresponsive", "peer_crash")
#: Kinds whose fault lasts longer than any bound: the handlers run with the short
#: peer bound (:data:`SILENT_PEER_TIMEOUT`), which also bounds their retries.
LASTING = (*SILENCING, "coordination_outage")
#: Real seconds a leader waits for acknowledgements where every worker stays alive
#: and connected. Far beyond how long a live simulated worker takes to answer on a
#: loaded machine: only a lost acknowledgement reaches it.
PEER_TIMEOUT = 60.0
#: Real seconds a leader waits for acknowledgements in the kinds of :data:`LASTING`
#: (and, being shorter than the transient-failure window, how long a failing call
#: is retried there). A live worker slower than this is named as well, which those
#: trials accept.
SILENT_PEER_TIMEOUT = 0.15
#: At most this many consecutive failures of one call in a ``coordination_burst``.
#: The handler retries a call after 50 ms, then 100 ms: two failures cost 0.15 s
#: of pauses against a retry bound of at least 1 s (the bound is 1 s on a leader
#: whose notice's deadline has come, 10 s elsewhere), and the rule makes at least
#: ``MIN_ATTEMPTS`` (4, ``src/retry.rs``) attempts however slow the machine, so the
#: burst ends within the bound on any machine.
BURST_MAX_CONSECUTIVE = 2
assert (
    f"MIN_ATTEMPTS: u32 = {BURST_MAX_CONSECUTIVE + 2};"
    in (Path(__file__).resolve().parents[2] / "src" / "retry.rs").read_text()
)
#: Real seconds after which a worker still running counts as a hang. A bound that
#: turns a hang into a failure, nothing more: trials take well under a second.
CLUSTER_TIMEOUT = 120.0
#: Real seconds a worker that got a notice and finished training waits for the
#: claim its notice starts (normally there already): a bound that turns a dropped
#: notice into a failure.
NOTICE_BOUND = 60.0
EXIT_CODE = 42
#: An all-reduce carries ``step * STEP_STRIDE`` next to its value (both exact in a
#: float64: steps < 64, values < 2**12, at most 8 workers), so every worker can check
#: that all of them joined it at the same step.
STEP_STRIDE = float(2**20)

RUN_TO_CHECKPOINT = _native.RUN_TO_CHECKPOINT
LAST_RUN_TO_CHECKPOINT = _native.LAST_RUN_TO_CHECKPOINT
TERMINATED_WORKER = _native.TERMINATED_WORKER
ACK_PREFIX = _native.ACK_PREFIX
STOP_WATCHER = _native.STOP_WATCHER
PREEMPTION_NOTICE_KEY = _native.PREEMPTION_NOTICE_KEY


def ack_key(round_key: str, worker: int) -> str:
    return f"{ACK_PREFIX}_{round_key}_{worker}"


def _ack_worker(key: str) -> int:
    """The worker an acknowledgement key belongs to."""
    return int(key.rsplit("_", 1)[1])


def fault_call(plan: Plan) -> Optional[str]:
    """The call a coordination fault strikes, e.g. ``"get RUN_TO_CHECKPOINT"``.

    Acknowledgement keys are named by role (``RECEIVED_SIGNAL_RUN_TO_CHECKPOINT_<id>``).
    None for the other kinds.
    """
    if plan.kind != "coordination_fault":
        return None
    op, key = plan.fault_op
    if key.startswith(ACK_PREFIX):
        key = key.rsplit("_", 1)[0] + "_<id>"
    return f"{op} {key}"


def peer_timeout(plan: Plan) -> float:
    """The handlers' peer bound in this plan's trial."""
    if plan.peer_timeout is not None:
        return plan.peer_timeout
    return SILENT_PEER_TIMEOUT if plan.kind in LASTING else PEER_TIMEOUT


def retry_bound_floor(plan: Plan) -> float:
    """The least the handlers retry a failing call before giving up, in this plan's
    trial: their bound is the transient-failure window (10 s), or the peer bound or
    the time left before the notice's deadline (at least 1 s) when shorter."""
    return min(peer_timeout(plan), 1.0)


class Crash(BaseException):
    """Ends a simulated worker abruptly (a process killed mid-agreement)."""


class NoticeDropped(Exception):
    """A worker got a notice and the cluster never acted on it."""


class OutOfStep(Exception):
    """Workers joined one collective at different steps (they resumed at different runs)."""


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


@dataclasses.dataclass(frozen=True)
class FaultCall:
    """Failures planted in one call of the protocol (``coordination_burst``/``_outage``)."""

    #: The protocol's name for the call: ``claim``, ``announce``, ``publish``,
    #: ``watch``, ``acknowledge``, ``await`` (``... final`` in the grace period's
    #: final round) or ``shutdown`` (the ``STOP_WATCHER`` writes of a worker leaving).
    role: str
    op: str
    key: str
    #: The worker whose calls fail (None: whichever worker makes the call; for
    #: these keys only one worker does, or only one at a time).
    worker: Optional[int]
    #: How many calls fail before the service recovers; None: every call, for
    #: the rest of the first life (longer than any bound).
    count: Optional[int]

    def describe(self) -> str:
        who = "" if self.worker is None else f" on w{self.worker}"
        times = "always" if self.count is None else f"x{self.count}"
        return f"{self.role} ({self.op} {self.key}{who}) {times}"


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
    #: The worker the fault strikes (None for a coordination fault: whichever
    #: worker makes the call first; only one worker makes it in a preemption).
    fault_worker: Optional[int] = None
    fault_step: Optional[int] = None
    #: ("set" | "get", key) for coordination faults.
    fault_op: Optional[tuple] = None
    #: The failing calls of a ``coordination_burst`` or ``coordination_outage``.
    fault_calls: tuple = ()
    #: The handlers' peer bound; None: :func:`peer_timeout` decides by kind.
    peer_timeout: Optional[float] = None
    #: Names a plan not drawn from a seed (:func:`targeted_plan`).
    label: str = ""
    #: This worker's acknowledgements never arrive, whatever the kind (a targeted
    #: plan's way to keep the leader waiting for them).
    acks_lost_from: Optional[int] = None
    #: A ``step_error`` strikes only once the agreed step is published (it waits).
    step_error_after_agreement: bool = False
    #: A worker that gets a notice between or inside its steps waits until its
    #: handler has handled it (claimed) before it goes on (steps of real training
    #: take far longer than a claim; simulated ones do not). Random plans leave the
    #: claim racing with the steps.
    settle_notices: bool = False

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
            if self.fault_calls:
                fault = f", fault {self.kind}: " + ", ".join(c.describe() for c in self.fault_calls)
        name = self.label or f"seed {self.seed}"
        return (
            f"{name}: {self.num_workers} workers{' (chief)' if self.chief else ''}, "
            f"{self.steps} steps, grace {self.grace:.1f}s, notices [{notices}]{fault}"
        )


def make_plan(seed: int, kinds: tuple = (KINDS, KIND_WEIGHTS)) -> Plan:
    """The plan of ``seed``, its kind drawn from ``(kinds, weights)``."""
    rng = random.Random(seed)
    kind = rng.choices(kinds[0], weights=kinds[1])[0]
    if kind in ("coordination_burst", "coordination_outage"):
        return _protocol_fault_plan(seed, rng, kind)
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
        keys.append(ack_key(RUN_TO_CHECKPOINT, peer))
        plan.fault_op = (op, rng.choice(keys))
        if op == "get" and plan.fault_op[1] in (RUN_TO_CHECKPOINT, LAST_RUN_TO_CHECKPOINT):
            # Every worker watches the step keys: the fault strikes one worker's watch.
            plan.fault_worker = rng.randrange(n)
    return plan


#: Grace period (virtual seconds) of the targeted plans that aim at the final round.
TARGETED_GRACE = 2.0

#: The protocol's calls a ``coordination_burst`` may fail, by grace period. The
#: four round roles fail in the first or (with a grace period) the final round.
BURST_ROLES = {
    False: ("claim", "announce", "publish", "watch", "acknowledge", "await", "shutdown"),
    True: ("claim", "announce", "publish", "watch", "acknowledge", "await"),
}
#: The calls a ``coordination_outage`` fails for good: those the preemption cannot
#: do without (an announcement is for ``PreemptionWatcher``\ s and a shutdown write
#: releases readers that also stop by themselves, so neither is one of them).
OUTAGE_ROLES = ("claim", "publish", "watch", "acknowledge", "await")
ROUND_ROLES = ("publish", "watch", "acknowledge", "await")


def protocol_call(role: str, final: bool, worker: int, count: Optional[int]) -> FaultCall:
    """The :class:`FaultCall` of ``role`` (``worker`` is used by the per-worker roles:
    the watcher that reads, the worker that acknowledges, the one awaited)."""
    round_key = LAST_RUN_TO_CHECKPOINT if final else RUN_TO_CHECKPOINT
    name = f"{role} final" if final and role in ROUND_ROLES else role
    table = {
        "claim": ("set", TERMINATED_WORKER, None),
        "announce": ("set", PREEMPTION_NOTICE_KEY, None),
        "publish": ("set", round_key, None),
        "watch": ("get", round_key, worker),
        "acknowledge": ("set", ack_key(round_key, worker), None),
        "await": ("get", ack_key(round_key, worker), None),
        "shutdown": ("set", LAST_RUN_TO_CHECKPOINT, None),
    }
    op, key, who = table[role]
    return FaultCall(name, op, key, who, count)


def _protocol_fault_plan(seed: int, rng: random.Random, kind: str) -> Plan:
    """A preemption whose protocol calls fail: a burst shorter than the bound
    (``coordination_burst``) or one call failing for good (``coordination_outage``).

    Like the targeted plans, and unlike the other random ones, the durations are
    fixed (steps and saves 0.1 s, virtual), one worker gets one notice early (step
    1-10 of 40) and goes on once it is handled, so every planned call is certainly
    made: the preemption reaches every round it plans (the final one too: with a
    grace period of 2 s, it is due 20 steps after the notice).
    """
    n = rng.randint(2, 8)
    chief = rng.random() < 0.3
    grace = rng.choice((0.0, TARGETED_GRACE))
    steps = 40
    leader = rng.randrange(n)
    notice = NoticePlan(
        target=leader,
        step=rng.randint(1, 10),
        moment=rng.choice(("before_step", "during_step")),
        lead=None,
    )
    if kind == "coordination_outage":
        role = rng.choice(OUTAGE_ROLES)
        final = role in ROUND_ROLES and grace > 0 and rng.random() < 0.5
        calls = (protocol_call(role, final, rng.randrange(n), None),)
    else:
        chosen = {}
        roles = rng.sample(BURST_ROLES[grace > 0], rng.randint(1, 3))
        for role in roles:
            final = role in ROUND_ROLES and grace > 0 and rng.random() < 0.5
            call = protocol_call(role, final, rng.randrange(n), 0)
            chosen[(call.op, call.key, call.worker)] = call
        counts = [rng.randint(1, BURST_MAX_CONSECUTIVE) for _ in chosen]
        if sum(counts) < 2:  # a burst: at least two failed calls
            counts[0] = 2
        calls = tuple(dataclasses.replace(c, count=k) for c, k in zip(chosen.values(), counts))
    return Plan(
        seed=seed,
        kind=kind,
        num_workers=n,
        chief=chief,
        steps=steps,
        grace=grace,
        step_durations=[0.1] * steps,
        save_durations=[0.1] * n,
        notices=[notice],
        fault_calls=calls,
        settle_notices=True,
    )


#: One failed call of the protocol, by the moment it strikes, for :func:`targeted_plan`:
#: ``name: (op, key, worker, grace)``. Worker 1 gets the notice and leads; ``worker``
#: is the one whose call fails (None: whichever makes that call first, as only one
#: does). With a grace period of 0 the only set of ``LAST_RUN_TO_CHECKPOINT`` is a
#: shutdown write (``STOP_WATCHER``), hence "shutdown".
TARGETED_CALLS = {
    "claim": ("set", TERMINATED_WORKER, 1, 0.0),
    "announce": ("set", PREEMPTION_NOTICE_KEY, 1, 0.0),
    "publish": ("set", RUN_TO_CHECKPOINT, None, 0.0),
    "peer watch": ("get", RUN_TO_CHECKPOINT, 0, 0.0),
    "leader's own watch": ("get", RUN_TO_CHECKPOINT, 1, 0.0),
    "peer ack": ("set", ack_key(RUN_TO_CHECKPOINT, 0), None, 0.0),
    "leader's own ack": ("set", ack_key(RUN_TO_CHECKPOINT, 1), None, 0.0),
    "await ack": ("get", ack_key(RUN_TO_CHECKPOINT, 0), None, 0.0),
    "publish final": ("set", LAST_RUN_TO_CHECKPOINT, None, TARGETED_GRACE),
    "peer watch final": ("get", LAST_RUN_TO_CHECKPOINT, 0, TARGETED_GRACE),
    "peer ack final": ("set", ack_key(LAST_RUN_TO_CHECKPOINT, 0), None, TARGETED_GRACE),
    "await ack final": ("get", ack_key(LAST_RUN_TO_CHECKPOINT, 0), None, TARGETED_GRACE),
    "shutdown": ("set", LAST_RUN_TO_CHECKPOINT, None, 0.0),
}


def targeted_plan(call: str, num_workers: int, bound: Optional[float] = None) -> Plan:
    """A preemption of worker 1 at step 5 in which the call ``call`` fails once.

    Fixed durations (steps 0.1 s, saves 0.1 s, virtual), no chief, 40 steps, and
    worker 1 goes on only once its notice is claimed: the only thing that varies
    between these plans is which call fails. ``bound`` is
    the handlers' peer bound (default: :data:`PEER_TIMEOUT`).
    """
    op, key, worker, grace = TARGETED_CALLS[call]
    steps = 40
    return Plan(
        seed=-1,
        kind="coordination_fault",
        num_workers=num_workers,
        chief=False,
        steps=steps,
        grace=grace,
        step_durations=[0.1] * steps,
        save_durations=[0.1] * num_workers,
        notices=[NoticePlan(target=1, step=5, moment="before_step", lead=None)],
        fault_worker=worker,
        fault_op=(op, key),
        peer_timeout=PEER_TIMEOUT if bound is None else bound,
        label=f"failed {call}",
        settle_notices=True,
    )


@dataclasses.dataclass
class Sabotage:
    """Defects planted in a trial by the harness's own tests (never in a real trial)."""

    #: This worker's checkpoints record one run more than the step it saved at,
    #: as if its handler saved one step late.
    late_save_on: Optional[int] = None
    #: After the restart, this worker resumes one run ahead of the others.
    resume_ahead: Optional[int] = None
    #: Notices to this worker are counted as delivered but never reach its handler.
    drop_notices_to: Optional[int] = None


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
    #: 1 if the outcome that counts as success for this kind was not reached (a
    #: preemption lost, or a fault not surfaced as the named error).
    wrong_outcome: int = 0

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def struck(self) -> bool:
        """Whether the plan's fault struck (always False for ``preemption``)."""
        return self.plan.kind != "preemption" and bool(self.injected.get(self.plan.kind))


def expected_total(steps: int, n: int) -> float:
    """The variable after ``steps`` uninterrupted steps of :func:`_step_value`."""
    return float(sum(_step_value(s, n) for s in range(steps)))


def _step_value(step: int, n: int) -> float:
    # Every worker adds the all-reduced sum of (step + 1) * (index + 1).
    return float((step + 1) * n * (n + 1) // 2)


class _TrialService(testing.InMemoryCoordinationService):
    """The shared service, recording which worker waits for which key (for a hang report)."""

    def __init__(self) -> None:
        super().__init__()
        self._waits_lock = threading.Lock()
        self._waits: dict = {}

    def get_as(self, worker: int, key: str, timeout_in_ms: int) -> str:
        token = object()
        with self._waits_lock:
            self._waits[token] = (worker, key)
        try:
            return self.get_config_key_value(key, timeout_in_ms)
        finally:
            with self._waits_lock:
                del self._waits[token]

    def pending_waits(self) -> list:
        with self._waits_lock:
            return sorted(set(self._waits.values()))


class _WorkerService:
    """Worker ``index``'s view of the trial's service (what its handler is given).

    Every call of the worker's handler passes here, whichever of its threads makes
    it, so a fault strikes exactly one worker's calls and a silenced worker's
    writes are lost however they are made.
    """

    def __init__(self, trial: _Trial, service: _TrialService, index: int) -> None:
        self._trial = trial
        self._service = service
        self._index = index

    def set_config_key_value(self, key: str, value: str) -> None:
        trial, index = self._trial, self._index
        trial.maybe_fail("set", key, index)
        if trial.lost(index, key):
            return  # written by a worker cut off from the service: never arrives
        agreement = key == RUN_TO_CHECKPOINT and value != STOP_WATCHER
        if agreement:
            trial.before_agreement(index)
        self._service.set_config_key_value(key, value)
        if agreement:
            trial.after_agreement()

    def get_config_key_value(self, key: str, timeout_in_ms: int = 0) -> str:
        self._trial.maybe_fail("get", key, self._index)
        if self._trial.abandoned:
            # The cluster reports its own give-up as DEADLINE_EXCEEDED, which a
            # handler takes for the end of one slice of a longer wait: fail instead.
            raise _errors.make("UnavailableError", "the trial gave up on this cluster (hang)")
        if key.startswith(ACK_PREFIX):
            self._trial.settle_acknowledgements(self._index, key)
        return self._service.get_as(self._index, key, timeout_in_ms)

    def delete_config_key_value(self, key: str) -> None:
        self._service.delete_config_key_value(key)

    def report_error_to_cluster(self, error_code: int, error_message: str) -> None:
        if self._index in self._trial.crashed:
            return
        self._service.report_error_to_cluster(error_code, error_message)


class _Trial:
    """The shared state of one trial's first life (notices, faults, observations)."""

    def __init__(self, plan: Plan, root: str, sabotage: Sabotage) -> None:
        self.plan = plan
        self.root = root
        self.sabotage = sabotage
        self.clocks = [VirtualClock() for _ in range(plan.num_workers)]
        self.lock = threading.Lock()
        self.saves: dict = {i: [] for i in range(plan.num_workers)}
        self.first_round_saved: set = set()
        self.fired: set = set()
        self.injected: dict = {}
        self.drop_acks_of: Optional[int] = None
        self.crashed: set = set()
        self.noticed: set = set()  # workers a notice was delivered to
        self.delivered: dict = {}  # worker -> notices delivered to it
        self.handlers: dict = {}  # worker -> its handler
        self.agreed = threading.Event()  # the first round's step was published
        #: Planted failures not yet raised: ``[op, key, worker or None, count or None]``.
        self.failures_left: list = [[c.op, c.key, c.worker, c.count] for c in plan.fault_calls]
        if plan.kind == "coordination_fault":
            self.failures_left.append([*plan.fault_op, plan.fault_worker, 1])
        #: Every planted failure raised: ``(op, key, worker)``.
        self.failed_calls: list = []
        #: Set when the first life hung: every later call of a worker fails.
        self.abandoned = False
        self.cluster: Optional[testing.SimulatedCluster] = None
        self.service: Optional[_TrialService] = None

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
            with self.lock:
                self.noticed.add(n.target)
                self.delivered[n.target] = self.delivered.get(n.target, 0) + 1
            if self.sabotage.drop_notices_to != n.target:
                self.cluster.preempt(n.target, deadline)
            if self.plan.settle_notices and worker == n.target:
                self.settle(worker)

    def note(self, kind: str) -> None:
        with self.lock:
            self.injected[kind] = self.injected.get(kind, 0) + 1

    # -- the coordination service as the trial sees it ----------------------
    def make_service(self) -> _TrialService:
        self.service = _TrialService()
        return self.service

    def view(self, index: int) -> _WorkerService:
        return _WorkerService(self, self.service, index)

    def maybe_fail(self, op: str, key: str, worker: int) -> None:
        """Raises ``UnavailableError`` if a planted failure matches this call."""
        with self.lock:
            for failure in self.failures_left:
                f_op, f_key, f_worker, count = failure
                if (f_op, f_key) != (op, key) or f_worker not in (None, worker):
                    continue
                if count is not None:
                    if count <= 0:
                        continue
                    failure[3] = count - 1
                self.failed_calls.append((op, key, worker))
                kind = self.plan.kind
                if kind == "coordination_burst":
                    self.injected[kind] = self.injected.get(kind, 0) + 1  # failed calls
                else:
                    self.injected[kind] = 1  # the fault struck
                break
            else:
                return
        raise _errors.make("UnavailableError", f"injected failure of {op}({key!r}) on {worker}")

    def planted_left(self) -> list:
        """The planted failures of a burst or outage that never struck."""
        with self.lock:
            struck = {(op, key) for op, key, _ in self.failed_calls}
            return [
                (op, key, worker, count)
                for op, key, worker, count in self.failures_left
                if (count is not None and count > 0) or (count is None and (op, key) not in struck)
            ]

    def lost(self, worker: int, key: str) -> bool:
        if worker in self.crashed:
            return True
        silent = self.drop_acks_of
        return silent is not None and key.startswith(ACK_PREFIX) and key.endswith(f"_{silent}")

    def before_agreement(self, leader: int) -> None:
        """The leader is about to publish the agreed step: strike the silencing faults."""
        plan = self.plan
        if plan.kind == "peer_unresponsive" and self.drop_acks_of is None:
            self.drop_acks_of = plan.fault_worker
            self.note("peer_unresponsive")
        if plan.acks_lost_from is not None:
            self.drop_acks_of = plan.acks_lost_from
        if plan.kind == "peer_crash" and not self.crashed:
            # Marked before the write, so that none of its acknowledgements slips
            # through; the leader's own publication (checked before this) arrives.
            self.crashed.add(plan.fault_worker)
            self.note("peer_crash")

    def after_agreement(self) -> None:
        self.agreed.set()
        self.fire("during_ack", -1, None)

    def settle_acknowledgements(self, reader: int, key: str) -> None:
        """In a ``coordination_outage`` trial: holds the leader's read of an
        acknowledgement until every worker able to acknowledge the round has done so.

        Those trials run with the short peer bound, which a live worker on a loaded
        machine could overrun; held like this, the leader's wait can only end
        naming the worker whose failing call keeps it from acknowledging (the read
        answers at once when it looks again), so the verdict does not depend on
        the machine's speed. Bounded by :data:`NOTICE_BOUND` (then the read goes
        ahead); an error reported to the cluster ends the hold at once.
        """
        plan = self.plan
        if plan.kind != "coordination_outage":
            return
        call = plan.fault_calls[0]
        round_key = key[len(ACK_PREFIX) + 1 : key.rindex("_")]
        role = call.role.split()[0]
        fault_round = LAST_RUN_TO_CHECKPOINT if call.role.endswith(" final") else RUN_TO_CHECKPOINT
        silent = None  # the worker the outage keeps from acknowledging this round
        if fault_round == round_key and role == "watch":
            silent = call.worker
        elif fault_round == round_key and role == "acknowledge":
            silent = _ack_worker(call.key)
        deadline = time.monotonic() + NOTICE_BOUND
        for worker in range(plan.num_workers):
            if worker == silent:
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                return
            try:
                self.service.get_as(reader, ack_key(round_key, worker), max(1, int(left * 1000)))
            except _errors.module().OpError:
                return  # the cluster is in an error state, or the bound passed

    def settle(self, worker: int) -> None:
        """Waits until ``worker``'s handler has handled every notice delivered to it
        (the claim made and its outcome recorded), bounded by :data:`NOTICE_BOUND`.

        A claim that failed for good is handed to the next ``run()``
        (``handler._thread_error``): then nobody claims, and the trial checks the
        error instead."""
        handler = self.handlers[worker]
        deadline = time.monotonic() + NOTICE_BOUND
        while handler._notices_handled < self.delivered[worker]:
            if time.monotonic() > deadline:
                raise NoticeDropped(f"worker {worker}'s handler did not handle its notice")
            time.sleep(0.001)
        if handler._thread_error is None:
            self.expect_claim(worker)

    def expect_claim(self, worker: int) -> None:
        """Waits until the notice ``worker`` got is claimed: it was not dropped.

        Acting on a notice starts with the claim (``TERMINATED_WORKER``), by this
        worker or by one noticed earlier. The claim runs beside the steps, so
        training may end first; it must still come, within :data:`NOTICE_BOUND`.
        """
        try:
            self.service.get_config_key_value(TERMINATED_WORKER, int(NOTICE_BOUND * 1000))
        except _errors.module().DeadlineExceededError:
            raise NoticeDropped(
                f"worker {worker} got a notice and finished training, and nobody claimed "
                f"{TERMINATED_WORKER} within {NOTICE_BOUND:g}s: the notice was dropped"
            ) from None


def _make_checkpoint(trial: Optional[_Trial], index: int, **variables):
    class TrialManager(testing.FakeCheckpointManager):
        def save(self, checkpoint_number=None):
            if trial is None:
                return super().save(checkpoint_number)
            counter = self._checkpoint.checkpointed_runs
            runs = int(counter.numpy())
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
            if trial.sabotage.late_save_on == index:
                runs += 1
                counter.assign(runs)
            path = super().save(checkpoint_number)
            with trial.lock:
                trial.saves[index].append(runs)
                trial.first_round_saved.add(index)
            return path

    class TrialCheckpoint(testing.FakeCheckpoint):
        def make_manager(self, directory, max_to_keep=1):
            return TrialManager(self, directory, max_to_keep)

    return TrialCheckpoint(**variables)


def _in_step(ctx: testing.WorkerContext, n: int, step: int, value: float) -> float:
    """``ctx.all_reduce(value)``, failing with :class:`OutOfStep` unless all joined at ``step``."""
    total = ctx.all_reduce(value + step * STEP_STRIDE)
    steps, summed = divmod(total, STEP_STRIDE)
    if steps != step * n:
        raise OutOfStep(
            f"worker {ctx.index} joined the collective of step {step}, its peers other steps "
            f"(sum of steps {steps:.0f}, expected {step * n})"
        )
    return summed


def _worker(trial: Optional[_Trial], plan: Plan, sabotage: Sabotage):
    bound = peer_timeout(plan)

    def body(ctx: testing.WorkerContext):
        w = testing.FakeVariable(0.0)
        config = TerminationConfig(grace_period=plan.grace, peer_timeout=bound)
        checkpoint = _make_checkpoint(trial, ctx.index, w=w)
        if trial is None:
            handler = ctx.handler(checkpoint, ctx.checkpoint_dir, config)
        else:
            with testing.use_coordination_service(trial.view(ctx.index)):
                handler = ctx.handler(checkpoint, ctx.checkpoint_dir, config)
        clock = None if trial is None else trial.clocks[ctx.index]
        if clock is not None:
            handler._core.configure(clock=clock.now)
            trial.handlers[ctx.index] = handler
        if trial is None and sabotage.resume_ahead == ctx.index:
            handler._run_counter += 1
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
                        if plan.step_error_after_agreement:
                            trial.agreed.wait(NOTICE_BOUND)
                        trial.note("step_error")
                        raise _errors.make(
                            "InvalidArgumentError", f"injected step error on worker {ctx.index}"
                        )
                total = _in_step(ctx, plan.num_workers, step, float((step + 1) * (ctx.index + 1)))
                w.assign_add(total)
                if clock is not None:
                    clock.advance(plan.step_durations[step])

            handler.run(train)
        if trial is not None and ctx.index in trial.noticed:
            trial.expect_claim(ctx.index)
        return {"value": w.numpy(), "restored": restored}

    return body


def run_trial(
    plan: Plan, root: Optional[str] = None, *, sabotage: Optional[Sabotage] = None
) -> TrialResult:
    """Runs ``plan`` (first life with notices and faults, then a clean restart)."""
    sabotage = sabotage or Sabotage()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        trial = _Trial(plan, tmp, sabotage)
        cluster = testing.SimulatedCluster(
            plan.num_workers,
            root=tmp,
            timeout=CLUSTER_TIMEOUT,
            chief=plan.chief,
            service_factory=trial.make_service,
        )
        trial.cluster = cluster
        violations: list = []
        hung = False
        try:
            first = cluster.run(_worker(trial, plan, sabotage))
        except TimeoutError as e:
            hung = True
            waits = ", ".join(f"worker {w} for {k}" for w, k in trial.service.pending_waits())
            violations.append(f"hang in the first life: {e}; waiting: {waits or 'none'}")
            first = []
            trial.abandoned = True
            _join_released_workers()
        service = cluster.service
        mismatched, wrong = 0, 0
        if first:
            mismatched = _check_saves(plan, trial, service, first, violations)
            wrong = _check_outcome(plan, trial, service, first, violations)

        lost = 0
        if not hung:
            lost = _restart_and_check(plan, cluster, first, service, sabotage, violations)
    return TrialResult(
        plan,
        violations,
        dict(trial.injected),
        hung,
        mismatched,
        lost,
        [_outcome(r) for r in first],
        time.monotonic() - started,
        wrong,
    )


def _join_released_workers() -> None:
    """After a hang: waits for the workers the cluster's reported error released.

    ``SimulatedCluster.run`` reports an error to the cluster when it gives up, which
    fails every blocked call (and the first life's workers find the trial
    abandoned), and leaves the worker threads to end by themselves. They are
    waited for (each closes its handler and joins its watchers), so that no thread
    of a hung trial outlives it: one still inside the native extension when the
    interpreter exits aborts the process.
    """
    for thread in threading.enumerate():
        if thread.name.startswith("simulated-worker-"):
            thread.join(CLUSTER_TIMEOUT)


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


def _check_saves(plan, trial, service, results, violations) -> int:
    """Every save at its round's agreed step, once per round; an exit after every round.

    A final round agreed at the first round's step (a deadline with no room for two
    saves) is one round: its one save is the last."""
    rounds = [_agreed(service, k) for k in (RUN_TO_CHECKPOINT, LAST_RUN_TO_CHECKPOINT)]
    one_save = rounds[0] is not None and rounds[1] == rounds[0]
    if one_save:
        rounds = rounds[:1]
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
            expected_rounds = 1 if plan.grace == 0 or one_save else 2
            if len(saves) != expected_rounds:
                mismatched += 1
                violations.append(
                    f"worker {r.index} exited after {len(saves)} save(s), expected "
                    f"{expected_rounds} (agreed {rounds})"
                )
        elif r.exit_code is not None:
            violations.append(f"worker {r.index} exited with {r.exit_code}")
    for r in results:
        if isinstance(r.error, OutOfStep):
            violations.append(f"worker {r.index}: {r.error}")
    return mismatched


def _acknowledgement_timeouts(results) -> list:
    """``(worker, [silent workers named])`` for every acknowledgement timeout raised."""
    found = []
    deadline_exceeded = _errors.module().DeadlineExceededError
    for r in results:
        if isinstance(r.error, deadline_exceeded):
            named = _named_as_silent(str(r.error))
            if named is not None:
                found.append((r.index, named))
    return found


def _named_as_silent(text: str) -> Optional[list]:
    """The workers an acknowledgement timeout in ``text`` names, or None if none is there.

    ``"... but worker(s) 0, 3 did not acknowledge within ..."``: the numbers after
    the last "worker" before the phrase.
    """
    if "did not acknowledge" not in text:
        return None
    named = re.split(r"worker", text.split("did not acknowledge")[0])[-1]
    return [int(x) for x in re.findall(r"\b\d+\b", named)]


def _names_silent_worker(text: str, worker: int) -> bool:
    named = _named_as_silent(text)
    return named is not None and worker in named


def _names_failed_call(text: str, key: str) -> bool:
    """Whether ``text`` holds the driver's error for a call of ``key`` that kept failing:
    ``"Worker 1: publishing RUN_TO_CHECKPOINT=6 failed 3 time(s) over 0.2s: ..."``."""
    pattern = rf"Worker \d+: [^:]*\b{re.escape(key)}\b[^:]* failed \d+ time\(s\) over"
    return re.search(pattern, text) is not None


#: ``"Worker 1: claiming ... failed 3 time(s) over 0.2s"``: how long the driver retried
#: a call before giving up (rounded to 0.1 s). Only the calls it gives up on when their
#: failures outlast the bound: a leader's reads of acknowledgements also end when the
#: peer timeout passes, however long they had been failing then.
_GAVE_UP = re.compile(
    r"Worker \d+: (?:claiming|publishing|acknowledging|reading (?:LAST_)?RUN_TO_CHECKPOINT\b)"
    r"[^:]* failed (\d+) time\(s\) over ([\d.]+)s"
)


def _check_retries_lasted_the_bound(plan, results, violations) -> None:
    """Every call the driver gave up on had been retried for the whole bound.

    The driver gives up on a claim, a publication, an acknowledgement or a peer
    watcher's read once it has failed for longer than its retry bound, which is
    never shorter than :func:`retry_bound_floor` here; an error saying it gave up
    sooner means a transient failure was not retried.
    """
    floor = retry_bound_floor(plan)
    for r in results:
        for attempts, seconds in _GAVE_UP.findall(str(r.error or "")):
            if float(seconds) + 0.05 < floor:
                violations.append(
                    f"worker {r.index} gave up after {attempts} failure(s) over {seconds}s, "
                    f"before the retry bound ({floor:g}s): {r.error}"
                )


def _check_outcome(plan, trial, service, results, violations) -> int:
    """The outcome that counts as success for the plan's kind (see the module's docstring)."""
    before = len(violations)
    struck = plan.kind != "preemption" and bool(trial.injected.get(plan.kind))
    if plan.kind in ("coordination_burst", "coordination_outage"):
        left = trial.planted_left()
        if left:
            # The plan is built so that every call it fails is certainly made.
            violations.append(f"planted failures that never struck: {left}")
    _check_retries_lasted_the_bound(plan, results, violations)
    if not struck or plan.kind in ("coordination_fault", "coordination_burst"):
        _expect_preemption_succeeded(plan, trial, service, results, violations)
        if plan.kind == "coordination_burst" and len(violations) == before:
            # An early notice and fixed durations: every round is due before the end.
            if any(r.exit_code != EXIT_CODE for r in results):
                violations.append(
                    f"preemption lost after a burst of failed calls: outcomes "
                    f"{[_outcome(r) for r in results]}"
                )
    elif plan.kind in SILENCING:
        _expect_silent_worker_named(plan, trial, service, results, violations)
    elif plan.kind == "coordination_outage":
        call = plan.fault_calls[0]
        # The worker whose call failed; a leader that cannot publish or claim waits
        # for nobody, so only its own error can name the failure.
        culprit = call.worker
        if culprit is None and call.role.startswith(("acknowledge", "await")):
            culprit = _ack_worker(call.key)

        def names(text: str) -> bool:
            return _names_failed_call(text, call.key) or (
                culprit is not None and _names_silent_worker(text, culprit)
            )

        _expect_named_error(
            trial,
            results,
            violations,
            _errors.module().OpError,
            names,
            f"the failure of {call.describe()}",
        )
    elif plan.kind == "step_error":
        cause = f"injected step error on worker {plan.fault_worker}"
        _expect_named_error(
            trial,
            results,
            violations,
            _errors.module().InvalidArgumentError,
            lambda text: cause in text,
            f"worker {plan.fault_worker}'s step error",
        )
    elif plan.kind == "save_error":
        failed = next(r for r in results if r.index == plan.fault_worker)
        cause = f"injected save failure on worker {plan.fault_worker}"
        if not isinstance(failed.error, OSError) or cause not in str(failed.error):
            violations.append(
                f"worker {failed.index} ended with {_outcome(failed)} ({failed.error!r}) "
                f"after its save failed, not with the save's error"
            )
        peers = [r for r in results if r.index != plan.fault_worker]
        _expect_named_error(
            trial,
            peers,
            violations,
            _errors.module().OpError,
            lambda text: (
                cause in text
                or f"worker {plan.fault_worker} failed" in text
                or _names_silent_worker(text, plan.fault_worker)
            ),
            f"worker {plan.fault_worker}'s failed save",
        )
    return int(len(violations) > before)


def _expect_preemption_succeeded(plan, trial, service, results, violations) -> None:
    errors = {r.index: r.error for r in results if r.error is not None}
    if errors:
        violations.append(
            "preemption lost: "
            + "; ".join(f"worker {i} raised {e!r}" for i, e in sorted(errors.items()))
        )
        return
    if not trial.injected.get("notice"):
        unfinished = [r.index for r in results if not r.finished]
        if unfinished:
            violations.append(f"workers {unfinished} stopped without a notice")
        return
    outcomes = {_outcome(r) for r in results}
    if outcomes == {f"exit {EXIT_CODE}"}:
        return  # every save at its agreed step and one per round: _check_saves
    if outcomes == {"finished"}:
        # Training ended before the preemption's last round was due (a notice late
        # in training, a grace period longer than the rest of it): every round the
        # training reached must have been saved by every worker.
        rounds = [_agreed(service, k) for k in (RUN_TO_CHECKPOINT, LAST_RUN_TO_CHECKPOINT)]
        missed = [
            (r.index, step)
            for step in rounds
            if step is not None and step < plan.steps
            for r in results
            if step not in trial.saves[r.index]
        ]
        if not missed:
            return
    violations.append(
        f"preemption lost: a notice was delivered, outcomes "
        f"{[_outcome(r) for r in results]}, saves {trial.saves}, agreed "
        f"{service.value(RUN_TO_CHECKPOINT)}/{service.value(LAST_RUN_TO_CHECKPOINT)}"
    )


def _expect_named_error(trial, results, violations, kind, names, fault: str) -> None:
    """After a fault that ends the preemption: every worker ends with the named error.

    That is an error of TF's type ``kind`` whose message names the fault (``names``:
    the key whose calls failed, the worker that fell silent, the step's error...),
    whether the worker raised it itself or got it from the cluster (an error
    reported to the coordination service, a collective that a peer abandoned).
    A worker that had already saved at the agreed step and exited did its part
    (its save is checked by :func:`_check_saves`); a crashed worker is not asked.
    """
    for r in results:
        if r.index in trial.crashed:
            continue
        if r.exit_code == EXIT_CODE and trial.saves[r.index]:
            continue
        if not isinstance(r.error, kind):
            violations.append(
                f"worker {r.index} ended with {_outcome(r)} ({r.error!r}) after {fault}, "
                f"not with a {kind.__name__} naming it"
            )
        elif not names(str(r.error)):
            violations.append(
                f"worker {r.index}'s {type(r.error).__name__} does not name {fault}: {r.error}"
            )


def _expect_silent_worker_named(plan, trial, service, results, violations) -> None:
    silent = plan.fault_worker
    # A crashed worker is also named by the collectives it abandoned (MWMS names
    # the task), and the first worker to see that error reports it to the cluster.
    failed = f"worker {silent} failed"
    _expect_named_error(
        trial,
        results,
        violations,
        _errors.module().OpError,
        lambda text: _names_silent_worker(text, silent) or failed in text,
        f"the silent worker {silent}",
    )
    crashed = next((r for r in results if r.index in trial.crashed), None)
    if crashed is not None and crashed.exit_code is not None:
        violations.append(f"the crashed worker {crashed.index} exited with {crashed.exit_code}")


def _restart_and_check(plan, cluster, first, service, sabotage, violations) -> int:
    """Restarts every worker without faults; the final state must be the uninterrupted one."""
    # A new life: a plain service (no injected faults, no cut-off writers), same checkpoints.
    restarted = testing.SimulatedCluster(
        plan.num_workers, root=cluster.root, timeout=CLUSTER_TIMEOUT, chief=plan.chief
    )
    try:
        second = restarted.run(_worker(None, plan, sabotage))
    except TimeoutError as e:
        violations.append(f"hang after restart: {e}")
        _join_released_workers()
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
    # After a preemption in which every worker exited at the final agreed step, the
    # restart resumes exactly there.
    lost = 0
    if first and all(r.exit_code == EXIT_CODE for r in first):
        final = _agreed(service, LAST_RUN_TO_CHECKPOINT) or _agreed(service, RUN_TO_CHECKPOINT)
        restored = {r.index: r.value["restored"] for r in second if r.value is not None}
        for index, value in restored.items():
            if final is not None and value is not None and value < final:
                lost += final - value
                violations.append(f"worker {index} restored run {value}, saved at {final}")
    return lost
