"""The plans of the real-process trials: everything random about a trial, from its seed.

One trial is one ``(kind, seed)``; :func:`make_plan` draws every random choice
(targets, steps, delays, which worker is cut off, when workers are killed) from
``random.Random(f"{kind}:{seed}")``, so the same seed always gives the same plan.
"""

from __future__ import annotations

import dataclasses
import random

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
PS_CLOSURES = 5000


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
