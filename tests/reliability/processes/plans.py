"""The plans of the real-process trials: everything random about a trial, from its seed.

One trial is one ``(kind, seed)``; :func:`make_plan` draws every random choice
(targets, steps, delays, which worker is cut off, when workers are killed) from
``random.Random(f"{kind}:{seed}")``, so the same seed always gives the same plan.
"""

from __future__ import annotations

import dataclasses
import random

KINDS = (
    "preemption",
    "crash_during_save",
    "partition",
    "ps_worker_kills",
    "ps_preemption",
    "lost_worker",
)
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
PS_CLOSURES = 5000


def ps_roles(num_ps: int, num_workers: int) -> tuple:
    """The processes of a ``ps_preemption`` trial (``ps_preemption_script.py``), by role:
    the coordinator, ``ps0``.., ``worker0``.."""
    return (
        "coordinator",
        *(f"ps{i}" for i in range(num_ps)),
        *(f"worker{i}" for i in range(num_workers)),
    )


#: The smallest ``ps_preemption`` cluster (1 PS, 2 workers); a plan's ``roles`` may add
#: a second PS and a third worker.
PS_ROLES = ps_roles(1, 2)
#: The coordinators of a ``ps_preemption`` trial: ours (``tfh.ClusterCoordinator``), or
#: TensorFlow's own (``tf.distribute.coordinator.ClusterCoordinator``), a named variant
#: reported apart: it cannot hold its workers, so closures in flight at the save may run
#: twice (measured, not a violation; nothing may be lost).
PS_COORDINATORS = ("ours", "tf")
#: The faults of a ``ps_preemption`` trial: a notice, a crash, a pause (SIGSTOP, SIGCONT).
PS_SIGNALS = ("SIGTERM", "SIGKILL", "SIGSTOP")
#: Where a ``ps_preemption`` fault lands, from the coordinator's side: inside a
#: ``schedule()`` call, inside ``join()``, during a worker's drain (after a worker's
#: notice), during the coordinator's save (after its own notice or its PS's).
PS_MOMENTS = ("scheduling", "join", "drain", "save")
#: The shapes of a ``ps_preemption`` plan: one fault; two faults on two roles; the same
#: task twice (the second time after its restart); a second fault inside the drain or
#: the save that a first notice started.
PS_SHAPES = ("one", "two", "again", "inside")


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
    if kind == "lost_worker":  # its variant follows the seed (every LOST_TF_EVERY-th)
        return Plan(kind, seed, _plan_lost_worker(rng, seed))
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


#: The faults of a ``lost_worker`` trial: a crash, a pause (SIGCONT once the others
#: ended), a network cut (the target behind a veth pair that goes down).
LOST_FAULTS = ("SIGKILL", "SIGSTOP", "cut")
#: Where a ``lost_worker`` fault lands: inside training, inside the agreement of a
#: preemption (a SIGTERM to a random worker first), inside that preemption's save.
LOST_MOMENTS = ("training", "agreement", "save")
#: Every this-many seeds of ``lost_worker`` runs TensorFlow's handler: a variant reported
#: in its own row (it saves nothing: how many steps it loses).
LOST_TF_EVERY = 5


def lost_variant(params: dict) -> str:
    """The row of the report a ``lost_worker`` plan belongs to: its handler."""
    return "TF's handler" if params.get("impl") == "tf" else "ours"


def _plan_lost_worker(rng: random.Random, seed: int) -> dict:
    num_workers = rng.choice((2, 2, 3))
    target = rng.choice((0, rng.randrange(1, num_workers)))
    moment = rng.choices(LOST_MOMENTS, weights=(3, 1, 1))[0]
    impl = "tf" if seed % LOST_TF_EVERY == LOST_TF_EVERY - 1 else "ours"
    if impl == "tf" and moment == "agreement":
        # TF's agreement is not observed (trial_worker prints our handler's keys only):
        # its fault is aimed at the save that follows.
        moment = "save"
    return {
        "impl": impl,
        "num_workers": num_workers,
        "fault": rng.choice(LOST_FAULTS),
        "target": target,  # 0 is the chief
        "moment": moment,
        "step": rng.randint(5, 30),  # the fault once every worker finished this step
        "delay": rng.uniform(0.0, 0.06),  # ... plus this: inside a step, or its collectives
        # A preemption's notice, for the agreement and save moments.
        "notice_target": rng.randrange(num_workers),
        "ack_delay": 0.5 if moment == "agreement" else 0.0,
        "slow_save": 1.0 if moment == "save" else 0.0,
        # Seconds between the step's two pair collectives (mwms_worker --paired-gap).
        "paired_gap": rng.choice((0.0, 0.02, 0.05)),
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


def ps_variant(params: dict) -> str:
    """The row of the report a ``ps_preemption`` plan belongs to: its coordinator."""
    return "TF's coordinator" if params.get("coordinator") == "tf" else "ours"


def ps_features(params: dict) -> list:
    """What a ``ps_preemption`` plan varies beyond its faults, by name (the report counts
    trials and failures per feature)."""
    found = []
    if params.get("grace"):
        found.append("grace>0")
    if params.get("deadline") is not None:
        found.append("deadline")
    if params.get("fetch_every"):
        found.append("fetch")
    if params.get("outside_every"):
        found.append("outside closures")
    if params.get("num_ps", 1) > 1:
        found.append("2 PS")
    if params.get("num_workers", 2) > 2:
        found.append("3 workers")
    return found


def _plan_ps_preemption(rng: random.Random) -> dict:
    num_ps = rng.choice((1, 1, 2))
    num_workers = rng.choice((2, 2, 3))
    roles = ps_roles(num_ps, num_workers)
    shape = rng.choices(PS_SHAPES, weights=(2, 3, 2, 3))[0]
    steps = rng.choice((80, 100, 120))
    first_at = rng.randint(10, steps // 3)
    second_at = first_at + rng.randint(10, steps // 4)

    def signal() -> str:
        return rng.choices(PS_SIGNALS, weights=(2, 1, 1))[0]

    def fault(role: str, sig: str, moment: str, at_runs) -> dict:
        return {
            "role": role,
            "signal": sig,
            "moment": moment,
            # scheduling / join: once the coordinator's run count reached this (and the
            # cluster is whole again after the faults before); drain / save: None.
            "at_runs": at_runs,
            # Seconds from the coordinator's arrival at the moment's gate to the signal
            # (the gate is held until 0.2 s after it).
            "delay": rng.uniform(0.0, 0.05),
            "stop_s": round(rng.uniform(1.0, 5.0), 3) if sig == "SIGSTOP" else 0.0,
        }

    def early() -> str:
        return rng.choice(("scheduling", "join"))

    if shape == "one":
        faults = [fault(rng.choice(roles), signal(), early(), first_at)]
    elif shape == "two":
        first, second = rng.sample(roles, 2)
        faults = [
            fault(first, signal(), early(), first_at),
            fault(second, signal(), early(), second_at),
        ]
    elif shape == "again":
        role = rng.choice(roles)
        sig = rng.choices(("SIGTERM", "SIGKILL"), weights=(3, 1))[0]
        faults = [
            fault(role, sig, early(), first_at),
            fault(role, rng.choices(PS_SIGNALS, weights=(4, 1, 1))[0], early(), second_at),
        ]
    else:  # inside: the second fault lands in the drain or the save the notice began
        role = rng.choice(roles)
        faults = [
            fault(role, "SIGTERM", early(), first_at),
            fault(
                rng.choice(roles),
                signal(),
                "drain" if role.startswith("worker") else "save",
                None,
            ),
        ]
    # Matmuls per closure (closures in flight at a notice; ~1 ms to ~10 ms each).
    work = rng.choice((200, 1000))
    epoch = rng.choice((10, 20))  # join() every this many runs
    return {
        "shape": shape,
        "num_ps": num_ps,
        "num_workers": num_workers,
        "roles": list(roles),
        # The coordinator: ours, or TensorFlow's own (a named variant, reported apart).
        "coordinator": rng.choices(PS_COORDINATORS, weights=(5, 1))[0],
        # TerminationConfig(grace_period=...) of every process.
        # (Short: a training that ends within the grace period after a notice never
        # restarts, and the trial then checks less.)
        "grace": rng.choice((0.0, 0.0, 1.0, 3.0)),
        # A platform deadline on every SIGTERM: Kubernetes' (the pod's grace period,
        # TF_FAILURE_HANDLING_KUBERNETES_GRACE_PERIOD), or none.
        "deadline": rng.choice((None, None, 25.0, 60.0)),
        # fetch() of the RemoteValue handler.run returned, every this many runs (0: never).
        "fetch_every": rng.choice((0, 0, 3, 7)),
        # An evaluation closure scheduled outside handler.run every this many runs.
        "outside_every": rng.choice((0, 0, 4, 9)),
        "steps": steps,
        "work": work,
        "epoch": epoch,
        "faults": faults,
        # The coordinator's bound on the closures before a save (its peer_timeout; the
        # notices carry no deadline): None for ps_preemption.PEER_TIMEOUT, which they
        # always meet; 0 or 0.5 s, as a deadline that leaves them no time, so closures
        # are still queued and in flight at the bound.
        "closure_bound": rng.choice((None, None, 0.0, 0.5)),
    }


_PLANNERS = {
    "preemption": _plan_preemption,
    "crash_during_save": _plan_crash_during_save,
    "partition": _plan_partition,
    "ps_worker_kills": _plan_ps_worker_kills,
    "ps_preemption": _plan_ps_preemption,
}
