"""1,000 randomized fault-injection trials on the simulated cluster (see ``simulation.py``).

Each batch runs 100 seeds and fails with every violating seed and its plan, so a
failure is replayed with ``run_trial(make_plan(seed))``. Seeds that once found a
defect are kept in :data:`REGRESSION_SEEDS` and run first.
"""

from __future__ import annotations

import collections
import logging

import pytest
from tf_failure_handling import handler as handler_module

from .simulation import KINDS, make_plan, run_trial

BATCHES = 10
BATCH = 100
#: Seeds that found a defect once (none of them may regress).
REGRESSION_SEEDS: list = []


@pytest.fixture(autouse=True)
def quiet_handler_logs(caplog):
    # Thousands of handlers log their protocol at INFO; keep warnings and errors.
    caplog.set_level(logging.WARNING, logger="tf_failure_handling")


def run_seeds(seeds) -> collections.Counter:
    failures, kinds = [], collections.Counter()
    for seed in seeds:
        plan = make_plan(seed)
        result = run_trial(plan)
        kinds[plan.kind] += 1
        if not result.ok:
            failures.append(
                f"{plan.describe()}\n    outcomes {result.outcomes}\n    "
                + "\n    ".join(result.violations[:5])
            )
    assert not failures, f"{len(failures)} failing trial(s):\n" + "\n".join(failures)
    return kinds


@pytest.mark.timeout(240)
@pytest.mark.parametrize("batch", range(BATCHES))
def test_randomized_trials(batch):
    kinds = run_seeds(range(batch * BATCH, (batch + 1) * BATCH))
    assert sum(kinds.values()) == BATCH


@pytest.mark.timeout(120)
def test_regression_seeds():
    run_seeds(REGRESSION_SEEDS)


def test_plans_cover_every_fault_kind_and_moment():
    plans = [make_plan(seed) for seed in range(BATCHES * BATCH)]
    assert {p.kind for p in plans} == set(KINDS)
    assert {n.moment for p in plans for n in p.notices} == {
        "before_step",
        "during_step",
        "during_ack",
        "during_save",
        "during_countdown",
    }
    assert {p.num_workers for p in plans} == set(range(2, 9))
    assert any(p.chief for p in plans) and not all(p.chief for p in plans)


def _first_seed(kind: str, predicate=lambda plan: True) -> int:
    for seed in range(10_000):
        plan = make_plan(seed)
        if plan.kind == kind and predicate(plan):
            return seed
    raise AssertionError(f"no {kind} plan in 10,000 seeds")


def test_the_harness_catches_a_worker_saving_at_another_step(monkeypatch):
    """The invariants can fail: a handler that saves one step late on worker 1 is caught."""
    original = handler_module.PreemptionCheckpointHandler._save_checkpoint_at

    def late(self, round_key, step, args, kwargs):
        if self._id_in_cluster == "1":
            self._run_counter = step + 1
        return original(self, round_key, step, args, kwargs)

    monkeypatch.setattr(handler_module.PreemptionCheckpointHandler, "_save_checkpoint_at", late)
    # The restart then deadlocks in a collective (the workers resume at different steps).
    monkeypatch.setattr("reliability.simulation.CLUSTER_TIMEOUT", 3.0)
    seed = _first_seed("preemption", lambda p: bool(p.notices))
    result = run_trial(make_plan(seed))
    assert not result.ok
    assert result.mismatched_saves >= 1, result.violations


def test_the_harness_catches_an_unbounded_wait(monkeypatch):
    """A leader that ignores the peer bound would hang: the trial reports a violation."""
    monkeypatch.setattr("reliability.simulation.PEER_TIMEOUT", 5.0)
    monkeypatch.setattr("reliability.simulation.CLUSTER_TIMEOUT", 1.0)
    seed = _first_seed("peer_unresponsive", lambda p: p.notices[0].moment == "before_step")
    result = run_trial(make_plan(seed))
    assert result.hung or not result.ok, result
