"""A few real-process fault trials (see ``process_trials.py``), one of each kind.

Each runs real TensorFlow processes on 127.0.0.1 (the partition trial also on the two
veth addresses of a network namespace it creates) with a fixed seed; a failure
prints the seed, the plan, what was observed and the processes' logs, and
``run_trial(make_plan(kind, seed))`` replays it. The long mode runs many seeds::

    .venv/bin/python tests/reliability/process_trials.py --seeds 0-19

The seeds below were picked for coverage: the preemption trial signals both
workers, the second one during the acknowledgement round, with a grace period,
delayed acknowledgements and slow saves; the crash trial kills the chief after
its data files were written, with an earlier complete checkpoint to fall back to;
the partition trial cuts off the non-leader while the leader waits for its
acknowledgement; the PS trial kills both workers at once, then one. The
``ps_preemption`` seeds: a PS's notice, a second one during the save it started,
then the restarted PS's notice again (see :data:`PS_PREEMPTION_SEEDS`).
"""

from __future__ import annotations

import importlib.util
import types

import pytest
from ci import is_ci
from integration.ps_cluster import DONE_EXIT_BOUND

from .process_trials import (
    KINDS,
    MOMENTS,
    SECOND_NOTICE_MOMENTS,
    Plan,
    TrialResult,
    format_table,
    make_plan,
    netns_unavailable,
    reference_weights,
    run_trial,
)
from .processes import harness, netns, ps_checks, ps_preemption, trials
from .processes.plans import PS_MOMENTS, PS_ROLES, PS_SHAPES, PS_SIGNALS

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("tensorflow") is None,
    reason="tensorflow is not installed: the real-process trials need it",
)

PREEMPTION_SEED = 22
CRASH_SEED = 4
PARTITION_SEED = 0
#: Cuts off worker 0, the coordination-service leader, 0.08 s after worker 1 got its
#: SIGTERM and published the agreed step (acknowledgements take 0.5 s in this plan).
LEADER_PARTITION_SEED = 8
#: Cut before the notice: the survivor's collective is aborted by TF's heartbeat
#: error, which names no worker (a violation until run() named the unreachable peers).
HEARTBEAT_PARTITION_SEED = 1
PS_SEED = 6
#: ps_preemption seeds for make test (each about a minute on 2 loaded cores):
#: 1 -- the PS's notice inside a schedule() call, and a second one while the
#: coordinator saves for the first, with no time for the closures (a bound of 0 s);
#: 57 -- the PS's notice inside join(), then, after the PS and the coordinator
#: restarted, the new PS's notice (still watched), with a bound of 0.5 s.
PS_PREEMPTION_SEEDS = (1, 57)

#: The trials' bounds that a test goes through in sequence, for its pytest-timeout (the
#: backstop above them): ``trial_root``'s reference run (a fixture's setup), ...
REFERENCE_BOUND = harness.RUN_TIMEOUT
#: ... a partition trial's ``ip`` commands (the probe's too, made by the first one), ...
PARTITION_IP_BOUND = netns.PROBE_BOUND + netns.PARTITION_LIFE_BOUND
#: ... and room for the kills (10 s a process), stack dumps, the plans' sleeps.
MARGIN = 60.0


def ps_worker_kills_bound(seed: int) -> float:
    """The ps_worker_kills trial: waits share PS_TIMEOUT, but the restarts of the last
    kill that began in time each add a kill (10 s) and a PS_RESTART_TIMEOUT, then the
    done event (at least 30 s) and the exit; every restart is counted."""
    restarts = sum(len(k["workers"]) for k in make_plan("ps_worker_kills", seed).params["kills"])
    return trials.PS_TIMEOUT + restarts * (10 + trials.PS_RESTART_TIMEOUT) + 30 + DONE_EXIT_BOUND


@pytest.fixture(scope="module")
def trial_root(tmp_path_factory):
    """Where the trials' directories go; the reference run is made once, first."""
    root = tmp_path_factory.mktemp("process-trials")
    reference_weights(root)
    return root


def require_netns() -> None:
    """Skips a partition trial where namespaces cannot be made; fails it under CI=true."""
    why = netns_unavailable()
    if why:
        (pytest.fail if is_ci() else pytest.skip)(f"the partition trial cannot run: {why}")


def check(result: TrialResult) -> None:
    assert result.ok, result.report()
    assert result.hangs == 0 and result.lost_steps == 0, result.report()
    assert result.mismatched_saves == 0 and result.lost_closures == 0, result.report()


# ------------------------------------------------------------------ plans (no processes)
def test_plans_are_reproducible_from_their_seed():
    for kind in KINDS:
        for seed in range(20):
            assert make_plan(kind, seed) == make_plan(kind, seed)
        assert len({make_plan(kind, s).describe() for s in range(20)}) > 1, kind


def test_plans_cover_the_fault_space():
    pre = [make_plan("preemption", s).params for s in range(200)]
    assert {tuple(p["targets"]) for p in pre} >= {(0,), (1,), (0, 1), (1, 0)}
    assert any(p["grace"] for p in pre) and any(not p["grace"] for p in pre)
    assert {p["second_moment"] for p in pre} == {None, *SECOND_NOTICE_MOMENTS}
    crash = [make_plan("crash_during_save", s).params for s in range(200)]
    assert {(p["prior"], p["kill_target"]) for p in crash} == {
        (a, b) for a in (False, True) for b in (0, 1)
    }
    halves = {p["kill_delay"] > p["slow_save"] / 2 for p in crash}
    assert halves == {False, True}, "kills before and after the data files are written"
    part = [make_plan("partition", s).params for s in range(200)]
    assert {(p["isolated"], p["notice_target"]) for p in part} == {
        (a, b) for a in (0, 1) for b in (0, 1)
    }
    assert any(p["cut_offset"] < 0 for p in part) and any(p["cut_offset"] > 0 for p in part)
    ps = [make_plan("ps_worker_kills", s).params for s in range(200)]
    assert all(p["closures"] >= 5000 for p in ps)
    kills = [k for p in ps for k in p["kills"]]
    assert {tuple(k["workers"]) for k in kills} == {(0,), (1,), (0, 1)}


def test_ps_preemption_plans_cover_roles_faults_and_moments():
    plans = [make_plan("ps_preemption", s).params for s in range(200)]
    faults = [f for p in plans for f in p["faults"]]
    assert {p["shape"] for p in plans} == set(PS_SHAPES)
    assert {f["moment"] for f in faults} == set(PS_MOMENTS)
    assert {(f["role"], f["signal"]) for f in faults} == {
        (r, s) for r in PS_ROLES for s in PS_SIGNALS
    }
    for p in plans:
        first, *rest = p["faults"]
        assert first["moment"] in ("scheduling", "join") and first["at_runs"] < p["steps"]
        for f in rest:
            if f["moment"] == "drain":  # inside the drain the first notice began
                assert first["signal"] == "SIGTERM" and first["role"].startswith("worker")
            elif f["moment"] == "save":  # inside the save the first notice began
                assert first["signal"] == "SIGTERM" and first["role"] in ("coordinator", "ps0")
            else:
                assert first["at_runs"] < f["at_runs"] < p["steps"]
    assert {p["closure_bound"] for p in plans} == {None, 0.0, 0.5}
    again = {p["faults"][0]["role"] for p in plans if p["shape"] == "again"}
    assert again == set(PS_ROLES), "every role's task is preempted again after its restart"


def _life(name: str, pid: int, events: list):
    """A coordinator incarnation as ps_checks reads it: its EVENT lines and its pid."""
    return types.SimpleNamespace(
        name=name,
        pid=pid,
        events=lambda kind=None: [e for e in events if kind in (None, e["event"])],
        first=lambda kind: next((e for e in events if e["event"] == kind), None),
    )


def _excess_verdict(k, kill_at=None):
    """A life that saves at run 30 (k named in flight), restored with counter 32."""
    from tf_failure_handling.records import Preemption

    plan = make_plan("ps_preemption", 0)
    result = TrialResult("ps_preemption", 0, plan)
    ev = [
        {"event": "restored", "t": 10.0, "runs": 0, "counter": 0},
        {"event": "epoch", "t": 20.0, "runs": 20, "counter": 20},
    ]
    lives = [
        _life("coordinator#0", 100, ev),
        _life("coordinator#1", 101, [{"event": "restored", "t": 40.0, "runs": 30, "counter": 32}]),
    ]
    save = Preemption("chief", 0, pid=100, agreed_step=30, save_start=25.0, save_end=26.0)
    if k is not None:
        save.extra["in_flight_at_bound"] = k
    faults = []
    if kill_at is not None:
        faults.append(
            types.SimpleNamespace(
                role="worker0", signal="SIGKILL", fired_at=kill_at, continued_at=None
            )
        )
    launcher = types.SimpleNamespace(history={r: [] for r in PS_ROLES})
    driver = types.SimpleNamespace(faults=faults)
    ps_checks._check_excess(launcher, driver, lives, [save], result)
    return result


def test_ps_checks_name_what_a_save_applied_beyond_its_records():
    # Two closures' effects beyond the saved run count, the records name one.
    result = _excess_verdict(k=1)
    [violation] = result.violations
    assert "2 closure(s) applied beyond" in violation and "name 1 in flight" in violation
    # The record without the field: K = 0, and the report says it was absent.
    assert "(in_flight_at_bound absent)" in _excess_verdict(k=None).violations[0]
    assert _excess_verdict(k=2).ok
    # A worker SIGKILLed before the save's bound: TensorFlow's at-least-once, counted.
    result = _excess_verdict(k=0, kill_at=22.0)
    assert result.ok and result.duplicate_closures == 2, result.violations
    # ... but not after the bound (every worker held): the save is held to K.
    assert not _excess_verdict(k=0, kill_at=25.5).ok


def test_a_failing_trial_names_its_seed_and_plan():
    plan = make_plan("preemption", 123)
    result = TrialResult(plan.kind, plan.seed, plan, violations=["worker 1 saved at [7, 7]"])
    result.fault("sigterm", 2)
    report = result.report()
    assert "seed 123" in report and plan.describe() in report
    assert "make_plan('preemption', 123)" in report and "worker 1 saved" in report
    table = format_table([result, TrialResult("partition", 1, Plan("partition", 1, {}))])
    assert "| preemption | 1 | 1 | 0 | sigterm 2 |" in table
    assert set(MOMENTS) >= {"during_ack", "during_save", "during_countdown"}


# ------------------------------------------------------------------ real processes
# Backstop above its own bounds in sequence: reference, progress, the second notice's
# moment, the exit, the restart.
@pytest.mark.timeout(
    REFERENCE_BOUND
    + harness.START_TIMEOUT
    + harness.MOMENT_TIMEOUT
    + harness.EXIT_TIMEOUT
    + harness.RUN_TIMEOUT
    + MARGIN
)
def test_preemption_with_a_second_notice(trial_root):
    result = run_trial(make_plan("preemption", PREEMPTION_SEED), trial_root)
    check(result)
    assert result.faults["sigterm"] == 2
    # Aimed at the acknowledgement round, which is held open until it was sent.
    assert result.notes["second_notice"] == "during_ack", result.report()


# Backstop above its own bounds in sequence: reference; the prior life's progress and
# exit; the crash life's progress, save_begin, save_written, the kill (10 s), the
# survivor; the restart.
@pytest.mark.timeout(
    REFERENCE_BOUND
    + 2 * harness.START_TIMEOUT
    + 3 * harness.EXIT_TIMEOUT
    + 10
    + trials.SURVIVOR_BOUND
    + harness.RUN_TIMEOUT
    + MARGIN
)
def test_sigkill_during_a_save_restores_the_last_complete_checkpoint(trial_root):
    result = run_trial(make_plan("crash_during_save", CRASH_SEED), trial_root)
    check(result)
    assert result.faults == {"sigterm": 2, "sigkill": 1}, result.report()
    # The chief died mid-save: its earlier checkpoint is the one to restore.
    assert result.notes["partial"] > result.notes["complete"] > 0, result.report()
    assert result.notes["restart_restored"] == [result.notes["complete"]] * 2


# Backstop above its own bounds in sequence: reference, the ip commands, progress, the
# survivor's stop.
@pytest.mark.timeout(
    REFERENCE_BOUND + PARTITION_IP_BOUND + harness.START_TIMEOUT + trials.PARTITION_BOUND + MARGIN
)
def test_partition_stops_the_other_worker_with_an_error_naming_the_cut_off_one(trial_root):
    require_netns()
    result = run_trial(make_plan("partition", PARTITION_SEED), trial_root)
    check(result)
    assert result.faults == {"sigterm": 1, "partition": 1}, result.report()


# Backstop as above (its PARTITION_BOUND is lowered to 30 s).
@pytest.mark.timeout(
    REFERENCE_BOUND + PARTITION_IP_BOUND + harness.START_TIMEOUT + trials.PARTITION_BOUND + MARGIN
)
def test_partition_of_the_coordination_leader(trial_root, monkeypatch):
    require_netns()
    # Once hung here: the other worker's error report to the cut-off leader never
    # returned. Now it stops after the 4 s peer bound and the bounded report.
    monkeypatch.setattr(trials, "PARTITION_BOUND", 30.0)
    result = run_trial(make_plan("partition", LEADER_PARTITION_SEED), trial_root)
    check(result)


# Backstop as above.
@pytest.mark.timeout(
    REFERENCE_BOUND + PARTITION_IP_BOUND + harness.START_TIMEOUT + trials.PARTITION_BOUND + MARGIN
)
def test_partition_before_the_notice_names_the_cut_off_worker(trial_root):
    require_netns()
    result = run_trial(make_plan("partition", HEARTBEAT_PARTITION_SEED), trial_root)
    check(result)


# Backstop above its own bounds in sequence: reference, the trial's.
@pytest.mark.timeout(REFERENCE_BOUND + ps_worker_kills_bound(PS_SEED) + MARGIN)
def test_ps_worker_kills_lose_no_closure(trial_root):
    result = run_trial(make_plan("ps_worker_kills", PS_SEED), trial_root)
    check(result)
    assert result.faults["worker_sigkill"] >= 3, result.report()
    assert result.notes["ps"]["scheduled"] >= 5000, result.report()


# Backstop above its own bounds in sequence: the trial's (checked between the loop's
# turns, one of which may wait on a process's start), its stack dumps and kills (+ 60 s).
@pytest.mark.timeout(ps_preemption.TRIAL_BOUND + ps_preemption.START_BOUND + 60)
@pytest.mark.parametrize("seed", PS_PREEMPTION_SEEDS)
def test_ps_preemption_loses_nothing_and_leaves_nothing(tmp_path, seed):
    # (No MWMS reference run: trial_root's is of no use here.)
    result = run_trial(make_plan("ps_preemption", seed), tmp_path)
    check(result)
    assert not result.notes.get("missed_faults"), result.report()
    assert result.faults["ps_sigterm"] == 2, result.report()
    # Each PS that got a notice exited 42, released by the coordinator after its save.
    exits = result.notes["server_exits"]
    assert exits and all(e["code"] == 42 and e["released"] for e in exits), result.report()
    assert len(exits) == (2 if seed == 57 else 1), result.report()
