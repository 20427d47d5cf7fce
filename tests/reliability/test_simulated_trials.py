"""1,000 randomized fault-injection trials on the simulated cluster (see ``simulation.py``).

Each batch runs the seeds of 100 and fails with every violating seed and its plan,
so a failure is replayed with ``run_trial(make_plan(seed))``. Seeds that once found
a defect are kept in :data:`REGRESSION_SEEDS`, each with the call its plan fails, and
run first (``test_regression_seeds``); they were drawn before the burst and outage
kinds existed, so they replay with ``make_plan(seed, FIRST_KINDS)``.

Every trial checks the outcome that counts as success for its kind: the
preemption succeeded (after one failed coordination-service call, or a burst of
them shorter than the handler's retry bound), or, where the fault made that
impossible (a call that keeps failing, a silent peer, a failed step or save), the
named error on every worker. Next to the random seeds, one targeted trial per
protocol call (claim, announce, publish, watch, acknowledge, await, both rounds,
shutdown), for 2 and 5 workers, fails that call once and checks that every worker
still saved at one step and exited 42.

The DEBUG-logging variant runs a few seeds in a child process with the package's
loggers at DEBUG through a handler that writes to a file, so that a Rust lock held
while a log record reaches Python deadlocks it (``run.py`` explains how); the long
mode (``make reliability``) runs many more.

No verdict here depends on how fast the machine is: the harness's own tests below
plant a defect whose consequence is certain (a save at another step, workers out of
step, a wait without end, a dropped notice) and check that the trial reports it.
"""

from __future__ import annotations

import collections
import logging

import pytest
from tf_failure_handling import _errors
from tf_failure_handling._protocol.driver import Driver
from tf_failure_handling._protocol.retries import Retrier

from . import run as long_mode
from . import simulation
from .simulation import (
    FIRST_KINDS,
    KINDS,
    OUTAGE_ROLES,
    TARGETED_CALLS,
    NoticePlan,
    Plan,
    Sabotage,
    fault_call,
    make_plan,
    protocol_call,
    run_trial,
    targeted_plan,
)

BATCHES = 10
BATCH = 100
#: Seeds of the DEBUG-logging variant here (after the random ones above): few,
#: so that it runs in well under a minute; the long mode runs 1,000.
DEBUG_SEEDS = range(BATCHES * BATCH, BATCHES * BATCH + 40)
#: Seeds that found a defect once (none of them may regress), with the call their
#: plan fails (``fault_call``), in plans of :data:`simulation.FIRST_KINDS`. Issue 9,
#: item 1: one failed get or set of a protocol key made a watcher or the leader give
#: up, and every worker ended with an error instead of saving. These 45 coordination
#: faults lost the preemption on the handler of 9d2d3ad in each of three replays
#: (that code built, the harness of 2a65d68; cbba1a9's message counts 82 such seeds:
#: the rest lost it in some replays only); the protocol driver (c5fb6af) fixed them.
#: The other defect a random seed found, a step error during the leader's wait for
#: acknowledgements (cbba1a9), hit whichever seeds the timing chose (2-3 of 68
#: step_error seeds per replay, never the same): no seed keeps it;
#: ``test_a_step_error_ends_the_leaders_wait_for_acknowledgements`` does.
REGRESSION_SEEDS = {
    **dict.fromkeys(
        (6, 578, 631, 701, 731, 734, 751, 782, 852, 899, 905, 972, 976, 984),
        "get RUN_TO_CHECKPOINT",
    ),
    **dict.fromkeys((106, 222, 282, 562, 599), "set RUN_TO_CHECKPOINT"),
    **dict.fromkeys(
        (170, 171, 219, 225, 363, 487, 509, 573, 729, 743, 753, 800, 832, 867),
        "get RECEIVED_SIGNAL_RUN_TO_CHECKPOINT_<id>",
    ),
    **dict.fromkeys(
        (19, 191, 230, 292, 413, 639, 659, 702, 951, 964),
        "set RECEIVED_SIGNAL_RUN_TO_CHECKPOINT_<id>",
    ),
    **dict.fromkeys((664, 878), "get LAST_RUN_TO_CHECKPOINT"),
}


@pytest.fixture(autouse=True)
def quiet_handler_logs(caplog):
    # Thousands of handlers log their protocol at INFO; keep warnings and errors.
    caplog.set_level(logging.WARNING, logger="tf_failure_handling")


def run_plans(plans) -> collections.Counter:
    failures, kinds = [], collections.Counter()
    for plan in plans:
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
    kinds = run_plans(make_plan(seed) for seed in range(batch * BATCH, (batch + 1) * BATCH))
    assert sum(kinds.values()) == BATCH


@pytest.mark.timeout(240)
def test_regression_seeds():
    """Each seed still draws the plan that found the defect (its fault call), its
    fault strikes, and the trial passes."""
    assert len(REGRESSION_SEEDS) == 45, "a regression seed was dropped"
    plans = [make_plan(seed, FIRST_KINDS) for seed in sorted(REGRESSION_SEEDS)]
    assert {p.seed: fault_call(p) for p in plans} == REGRESSION_SEEDS, (
        "make_plan no longer draws these seeds' plans: keep the generator they came from"
    )
    failures = []
    for plan in plans:
        result = run_trial(plan)
        if not result.struck:
            failures.append(f"{plan.describe()}\n    the fault never struck: tests nothing")
        elif not result.ok:
            failures.append(
                f"{plan.describe()}\n    outcomes {result.outcomes}\n    "
                + "\n    ".join(result.violations[:5])
            )
    assert not failures, f"{len(failures)} regression seed(s) failed:\n" + "\n".join(failures)


# Backstop above its own bounds in sequence: a trial's two lives, CLUSTER_TIMEOUT each
# (+ 30 s).
@pytest.mark.timeout(2 * simulation.CLUSTER_TIMEOUT + 30)
@pytest.mark.parametrize("num_workers", [2, 5])
@pytest.mark.parametrize("call", list(TARGETED_CALLS))
def test_one_failed_call_does_not_lose_the_preemption(call, num_workers):
    """Worker 1 is preempted; one call of the protocol fails once: every worker still saves."""
    result = run_trial(targeted_plan(call, num_workers))
    assert result.struck, f"the failure of {call} never struck: {result.plan.describe()}"
    assert result.ok, "\n".join(result.violations)
    assert result.outcomes == ["exit 42"] * num_workers


# Backstop above its own bounds in sequence: a trial's two lives, CLUSTER_TIMEOUT each
# (+ 30 s).
@pytest.mark.timeout(2 * simulation.CLUSTER_TIMEOUT + 30)
def test_a_step_error_ends_the_leaders_wait_for_acknowledgements():
    """Worker 1 leads and waits for worker 0's acknowledgement, which never comes;
    worker 0's step fails and the error is reported to the cluster: every worker, the
    waiting leader too, ends with that error (TF: a reported error fails every blocked
    get), not with DeadlineExceededError for the missing acknowledgement. (The driver
    of 451fc61 retried the failing get until the peer bound; main's driver gives up
    after its transient-failure window, or the peer bound when shorter, as here.)"""
    plan = preemption_plan(num_workers=2, label="step error while the leader waits")
    plan.kind, plan.fault_worker, plan.fault_step = "step_error", 0, 4
    plan.acks_lost_from, plan.step_error_after_agreement = 0, True
    plan.peer_timeout = 5.0  # far beyond the report; only how long the defect takes
    result = run_trial(plan)
    assert result.struck, result.violations
    assert result.ok, "\n".join(result.violations)
    assert result.outcomes == ["InvalidArgumentError"] * 2


@pytest.mark.timeout(300)
def test_trials_under_debug_logging():
    """Simulated trials with DEBUG logging to a file: none hangs or fails, and Rust's
    log records did reach Python's logging (else the variant would check nothing)."""
    tally = long_mode.Tally()
    logged = long_mode.run_debug_logging(tally, DEBUG_SEEDS.start, len(DEBUG_SEEDS), max_hangs=1)
    failures = [f"{describe}\n    " + "\n    ".join(v[:5]) for _, describe, v in tally.failures]
    assert not failures, f"{len(failures)} failing trial(s):\n" + "\n".join(failures)
    assert tally.trials[long_mode.DEBUG_ROW] == len(DEBUG_SEEDS)
    assert logged["native"] > 0, logged


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
    calls = {fault_call(p) for p in plans if p.kind == "coordination_fault"}
    assert len(calls) >= 7, calls
    # Bursts fail every call of the protocol, in both rounds, gets and sets, and
    # more than once in a row; outages fail every call the preemption needs.
    bursts = [c for p in plans if p.kind == "coordination_burst" for c in p.fault_calls]
    assert {c.role for c in bursts} == {
        *("claim", "announce", "shutdown"),
        *(f"{r}{s}" for r in simulation.ROUND_ROLES for s in ("", " final")),
    }
    assert {c.op for c in bursts} == {"get", "set"}
    assert max(c.count for c in bursts) == simulation.BURST_MAX_CONSECUTIVE
    assert all(
        sum(c.count for c in p.fault_calls) >= 2 for p in plans if p.kind == "coordination_burst"
    )
    outages = [p.fault_calls[0] for p in plans if p.kind == "coordination_outage"]
    assert {c.role.split()[0] for c in outages} == set(OUTAGE_ROLES)
    assert any(c.role.endswith(" final") for c in outages)
    assert all(c.count is None for c in outages)


# ------------------------------------------------------------- the harness's own tests


def preemption_plan(num_workers: int = 3, label: str = "") -> Plan:
    """Worker 1 preempted at step 4 of 20; its notice is claimed before it goes on."""
    steps = 20
    return Plan(
        seed=-1,
        kind="preemption",
        num_workers=num_workers,
        chief=False,
        steps=steps,
        grace=0.0,
        step_durations=[0.1] * steps,
        save_durations=[0.1] * num_workers,
        notices=[NoticePlan(target=1, step=4, moment="before_step", lead=None)],
        label=label or "preemption of worker 1",
        settle_notices=True,
    )


def test_a_plain_preemption_passes():
    result = run_trial(preemption_plan())
    assert result.ok, result.violations
    assert result.outcomes == ["exit 42"] * 3 and result.injected == {"notice": 1}


def test_the_harness_catches_a_worker_saving_at_another_step():
    """A handler that saves one step late on worker 1: its save is reported as mismatched."""
    result = run_trial(preemption_plan(), sabotage=Sabotage(late_save_on=1))
    assert not result.ok
    assert result.mismatched_saves == 1, result.violations
    assert any("worker 1 saved at" in v for v in result.violations), result.violations


def test_the_harness_catches_workers_resuming_at_different_steps():
    """A restart in which worker 1 resumes one run ahead fails at its first collective."""
    result = run_trial(preemption_plan(), sabotage=Sabotage(resume_ahead=1))
    assert not result.ok and not result.hung
    assert any("OutOfStep" in v for v in result.violations), result.violations


def test_the_harness_catches_a_dropped_notice(monkeypatch):
    """A notice that never reaches the handler: training ends, and the trial fails."""
    # The notice is certainly lost, so the bound only decides how long the test takes.
    monkeypatch.setattr(simulation, "NOTICE_BOUND", 0.5)
    plan = preemption_plan()
    plan.settle_notices = False
    result = run_trial(plan, sabotage=Sabotage(drop_notices_to=1))
    assert result.wrong_outcome == 1, result.violations
    assert any("NoticeDropped" in v for v in result.violations), result.violations


def test_the_harness_catches_an_unbounded_wait(monkeypatch):
    """A leader whose wait for a silent peer never ends: the trial reports a hang."""
    # The acknowledgement never comes and the leader waits for it without end, so
    # the hang is certain: the cluster bound only decides how long the test takes.
    monkeypatch.setattr(simulation, "SILENT_PEER_TIMEOUT", 1e6)
    monkeypatch.setattr(simulation, "CLUSTER_TIMEOUT", 2.0)
    plan = preemption_plan(label="worker 0 unresponsive")
    plan.kind, plan.fault_worker = "peer_unresponsive", 0
    result = run_trial(plan)
    assert result.hung, result.violations
    assert result.violations[0].startswith("hang in the first life"), result.violations


def outage_plan(role: str, final: bool = False, worker: int = 0) -> Plan:
    """Worker 1 of 3 preempted at step 4; the call ``role`` fails for good."""
    plan = preemption_plan(label=f"outage of {role}")
    plan.kind = "coordination_outage"
    plan.fault_calls = (protocol_call(role, final, worker, None),)
    return plan


# Backstop above its own bounds in sequence: a trial's two lives, CLUSTER_TIMEOUT each
# (+ 30 s).
@pytest.mark.timeout(2 * simulation.CLUSTER_TIMEOUT + 30)
@pytest.mark.parametrize("role", OUTAGE_ROLES)
def test_an_outage_ends_in_the_named_error(role):
    """A call the preemption needs fails for good: every worker ends with an error of
    TF's type naming the failed key or the worker it kept from acknowledging."""
    result = run_trial(outage_plan(role))
    assert result.struck, result.violations
    assert result.ok, "\n".join(result.violations)
    assert all(o.endswith("Error") for o in result.outcomes), result.outcomes


def test_the_harness_catches_a_burst_that_loses_the_preemption():
    """A "burst" of claim failures that never ends: the preemption is lost (the named
    error on every worker), and the burst's check reports it."""
    plan = preemption_plan(label="claim fails for good, checked as a burst")
    plan.kind = "coordination_burst"
    plan.fault_calls = (protocol_call("claim", False, 0, None),)
    plan.peer_timeout = 1.0  # the claim is retried for 1 s, not 10: only the test's length
    result = run_trial(plan)
    assert result.wrong_outcome == 1, result.violations
    assert any(v.startswith("preemption lost") for v in result.violations), result.violations


def test_the_harness_catches_an_error_that_does_not_name_the_fault(monkeypatch):
    """A driver whose errors name nothing (no key, no cause): the outage trial reports
    every worker's error as not naming the failure."""

    def anonymous(self, error, what, attempts, seconds):
        return _errors.make("UnavailableError", "something failed")

    monkeypatch.setattr(Retrier, "named", anonymous)
    result = run_trial(outage_plan("publish"))
    assert result.struck and result.wrong_outcome == 1, result.violations
    assert any("does not name the failure of publish" in v for v in result.violations), (
        result.violations
    )


def test_the_harness_catches_a_call_given_up_at_the_first_failure(monkeypatch):
    """A driver that does not retry (a retry bound of 0): one failed claim loses the
    preemption, and the trial says the driver gave up before its bound."""
    # Every call is retried for 0 s (the core's bound, its peer timeout set to 0 once the
    # driver is built, as the handler's ``_peer_timeout`` view sets it): the driver's
    # writes, the leader's and the reader's calls; the first failure gives up.
    built = Driver.__init__

    def without_retries(self, ctx, *args, **kwargs):
        built(self, ctx, *args, **kwargs)
        ctx.core.configure(peer_timeout=0.0)

    monkeypatch.setattr(Driver, "__init__", without_retries)
    result = run_trial(targeted_plan("claim", 2))
    assert result.struck and not result.ok
    assert any("before the retry bound" in v for v in result.violations), result.violations


#: The stall bound of the harness's test with a child that stops.
SILENT_CHILD_STALL_BOUND = 20.0
#: One trial's own bounds in a child: two lives of CLUSTER_TIMEOUT.
TRIAL_BOUND = 2 * simulation.CLUSTER_TIMEOUT
#: A child's end: its exit, then its reader's join.
CHILD_END_BOUND = 2 * long_mode.CHILD_EXIT_BOUND


# Backstop above its own bounds in sequence: the stopped child's stall and end, the
# second child's trial and end (+ 30 s).
@pytest.mark.timeout(SILENT_CHILD_STALL_BOUND + TRIAL_BOUND + 2 * CHILD_END_BOUND + 30)
def test_the_harness_catches_a_child_that_falls_silent(monkeypatch):
    """A DEBUG-logging child that stops (as a deadlocked one does: no thread runs) is
    counted as a hang for its seed, with its thread dump, and the next seed runs in a
    new child."""
    # The first child certainly stops (SIGSTOP) at its first seed, so STALL_BOUND only
    # decides how long the test takes; it stays far above any pause of the live second
    # child (a heartbeat every 0.5 s), even on a loaded machine. The exit bound is the
    # harness's own: the stopped child is woken up to dump its threads and abort.
    monkeypatch.setattr(long_mode, "STALL_BOUND", SILENT_CHILD_STALL_BOUND)
    start = DEBUG_SEEDS.start
    monkeypatch.setenv(long_mode.FREEZE_ENV, str(start))
    tally = long_mode.Tally()
    long_mode.run_debug_logging(tally, start, 2)
    assert tally.trials[long_mode.DEBUG_ROW] == 2, tally.failures
    assert tally.zero["hangs"][long_mode.DEBUG_ROW] == 1, tally.failures
    [(_, _, violations)] = tally.failures
    assert violations[0].startswith(f"DEBUG-logging trial of seed {start}: no sign of life")
    assert "Fatal Python error: Aborted" in violations[0], violations[0]


# Backstop above its own bounds in sequence: one child's two trials and its end (+ 30 s).
@pytest.mark.timeout(2 * TRIAL_BOUND + CHILD_END_BOUND + 30)
def test_the_harness_reports_a_child_that_dies_after_its_last_trial(monkeypatch):
    """A child that reported every trial and then ends badly is a violation of its
    own, not a trial of a seed it was never given."""
    monkeypatch.setenv(long_mode.FREEZE_ENV, "exit")
    tally = long_mode.Tally()
    start = DEBUG_SEEDS.start
    long_mode.run_debug_logging(tally, start, 2)
    assert tally.trials[long_mode.DEBUG_ROW] == 2, tally.failures
    assert tally.zero["hangs"][long_mode.DEBUG_ROW] == 0
    [(_, _, violations)] = tally.failures
    assert violations[0].startswith(
        f"DEBUG-logging child of seeds up to {start + 1}: exit code 3 after its last trial;"
    ), violations[0]
