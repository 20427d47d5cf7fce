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
``ps_preemption`` seeds check every closure by its id, with a fetch() in the loop and
closures outside handler.run, grace period 0 and > 0 (see :data:`PS_PREEMPTION_SEEDS`).
"""

from __future__ import annotations

import importlib.util

import pytest
from ci import is_ci
from integration.gcs_emulator import LIFETIME_BOUND
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
from .processes import harness, lost_worker, netns, ps_checks, ps_preemption, trials
from .processes.plans import (
    LOST_FAULTS,
    LOST_MOMENTS,
    PS_COORDINATORS,
    PS_MOMENTS,
    PS_ROLES,
    PS_SHAPES,
    PS_SIGNALS,
    ps_features,
    ps_roles,
    ps_variant,
)

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
#: ps_preemption seeds for make test (each under a minute on 2 loaded cores), checked id
#: by id, each with closures scheduled outside handler.run. Each of the first two failed
#: on the code before issue 48's fixes (249d32a):
#: 36 -- a fetch() every 7th run, grace period 0, a 60 s deadline: the PS's notice
#: while the coordinator waits in a fetch() (hung there before the fix: item 1), then
#: the coordinator's own notice;
#: 22 -- grace period 0, a 25 s deadline: the PS's notice inside schedule(), twice
#: (before the fix an outside closure unfinished at the save made a finished run run
#: again, which no record named: item 2);
#: 39 -- 2 PS, 3 workers, a fetch() every 7th run, a grace period of 3 s and a 25 s
#: deadline: a worker's notice, the PS's notice during that worker's drain.
PS_PREEMPTION_SEEDS = (36, 22, 39)
#: lost_worker seeds for make test (issue 62: a network cut), our handler: 7 cuts off the
#: non-chief of 2 workers; 33 the chief of 3 (whose coordination service goes with it),
#: one step's pair collectives 0.02 s apart.
LOST_WORKER_CUT_SEEDS = {"non_chief": 7, "chief_of_3": 33}
#: lost_worker seeds for make test (issue 62), a worker lost inside a preemption, 2
#: workers: 41 the chief SIGSTOPped as the non-chief publishes the agreed step (the
#: leader's own calls go unanswered); 46 the non-chief SIGKILLed while the chief awaits its
#: acknowledgement; 45 the chief SIGKILLed inside its save (the non-chief, saved, does not
#: find the chief's checkpoint).
LOST_WORKER_PREEMPTION_SEEDS = {"leader_unanswered": 41, "ack_missing": 46, "chief_in_save": 45}


def lost_plan(fault: str, target: int) -> Plan:
    """A ``lost_worker`` plan of our handler, 2 workers, mid-training (for gs://)."""
    params = {
        "impl": "ours",
        "num_workers": 2,
        "fault": fault,
        "target": target,
        "moment": "training",
        "step": 10,
        "delay": 0.01,
        "notice_target": 0,
        "ack_delay": 0.0,
        "slow_save": 0.0,
        "paired_gap": 0.02,
    }
    return Plan("lost_worker", -1, params)


#: On gs:// (the emulator, where a rename is a copy and a delete): the chief SIGKILLed
#: (the coordination service goes with it: the non-chief writes), the non-chief paused
#: (the chief writes; the resumed worker finds the claim naming it lost).
LOST_WORKER_GCS_PLANS = {
    "chief_killed": lost_plan("SIGKILL", 0),
    "non_chief_paused": lost_plan("SIGSTOP", 1),
}

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


def check_lost(result: TrialResult) -> None:
    """A ``lost_worker`` trial of our handler: no violation, no hang, no torn save; at
    most one step lost (the trial's own check, L - 1, made a violation)."""
    assert result.ok, result.report()
    assert result.hangs == 0 and result.mismatched_saves == 0, result.report()
    assert result.lost_steps <= 1, result.report()
    assert result.notes["restored"][0] >= result.notes["L"] - 1 > 0, result.report()


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


def test_lost_worker_plans_cover_faults_targets_sizes_and_moments():
    plans = [make_plan("lost_worker", s).params for s in range(200)]
    ours = [p for p in plans if p["impl"] == "ours"]
    assert {p["fault"] for p in ours} == set(LOST_FAULTS)
    assert {p["moment"] for p in ours} == set(LOST_MOMENTS)
    assert {p["num_workers"] for p in ours} == {2, 3}
    sizes_and_targets = {(p["num_workers"], p["target"]) for p in ours}
    assert sizes_and_targets == {(2, 0), (2, 1), (3, 0), (3, 1), (3, 2)}
    assert {(p["fault"], p["target"] == 0) for p in ours} == {
        (f, chief) for f in LOST_FAULTS for chief in (False, True)
    }
    # TensorFlow's handler is every fifth seed: 20 of the long mode's 25 are ours.
    assert [s for s in range(25) if plans[s]["impl"] == "tf"] == [4, 9, 14, 19, 24]
    assert {p["paired_gap"] for p in ours} >= {0.0, 0.05}


def test_lost_worker_cut_seeds_are_cuts_of_our_handler():
    chosen = {k: make_plan("lost_worker", s).params for k, s in LOST_WORKER_CUT_SEEDS.items()}
    assert all(p["fault"] == "cut" and p["impl"] == "ours" for p in chosen.values())
    assert (chosen["non_chief"]["num_workers"], chosen["non_chief"]["target"]) == (2, 1)
    assert (chosen["chief_of_3"]["num_workers"], chosen["chief_of_3"]["target"]) == (3, 0)


def test_lost_worker_preemption_seeds_lose_a_worker_inside_a_preemption():
    chosen = {
        k: make_plan("lost_worker", s).params for k, s in LOST_WORKER_PREEMPTION_SEEDS.items()
    }
    picked = {
        k: (p["impl"], p["num_workers"], p["fault"], p["target"], p["moment"], p["notice_target"])
        for k, p in chosen.items()
    }
    assert picked == {
        "leader_unanswered": ("ours", 2, "SIGSTOP", 0, "agreement", 1),
        "ack_missing": ("ours", 2, "SIGKILL", 1, "agreement", 0),
        "chief_in_save": ("ours", 2, "SIGKILL", 0, "save", 0),
    }


def test_ps_preemption_plans_cover_roles_faults_and_moments():
    plans = [make_plan("ps_preemption", s).params for s in range(200)]
    faults = [f for p in plans for f in p["faults"]]
    assert {p["shape"] for p in plans} == set(PS_SHAPES)
    assert {f["moment"] for f in faults} == set(PS_MOMENTS)
    assert {(f["role"], f["signal"]) for f in faults} >= {
        (r, s) for r in (*PS_ROLES, "ps1") for s in PS_SIGNALS
    }
    assert "worker2" in {f["role"] for f in faults}
    for p in plans:
        assert p["roles"] == list(ps_roles(p["num_ps"], p["num_workers"]))
        assert {f["role"] for f in p["faults"]} <= set(p["roles"])
        first, *rest = p["faults"]
        assert first["moment"] in ("scheduling", "join") and first["at_runs"] < p["steps"]
        for f in rest:
            if f["moment"] == "drain":  # inside the drain the first notice began
                assert first["signal"] == "SIGTERM" and first["role"].startswith("worker")
            elif f["moment"] == "save":  # inside the save the first notice began
                assert first["signal"] == "SIGTERM" and first["role"] in (
                    "coordinator",
                    "ps0",
                    "ps1",
                )
            else:
                assert first["at_runs"] < f["at_runs"] < p["steps"]
    assert {p["closure_bound"] for p in plans} == {None, 0.0, 0.5}
    again = {p["faults"][0]["role"] for p in plans if p["shape"] == "again"}
    assert again >= set(PS_ROLES), "every role's task is preempted again after its restart"
    # What the identity trials vary besides the faults (issue 48), both ways.
    assert {p["num_ps"] for p in plans} == {1, 2} and {p["num_workers"] for p in plans} == {2, 3}
    assert {p["coordinator"] for p in plans} == set(PS_COORDINATORS)
    assert {bool(p["grace"]) for p in plans} == {False, True}
    assert {p["deadline"] is None for p in plans} == {False, True}
    assert {bool(p["fetch_every"]) for p in plans} == {False, True}
    assert {bool(p["outside_every"]) for p in plans} == {False, True}
    # The default long mode (run.py's 60 seeds from 0) has each variant several times.
    first = [make_plan("ps_preemption", s).params for s in range(60)]
    assert sum(ps_variant(p) == "TF's coordinator" for p in first) >= 5
    for feature in ("grace>0", "deadline", "fetch", "outside closures", "2 PS", "3 workers"):
        assert sum(feature in ps_features(p) for p in first) >= 10, feature


def _attempts(**override):
    """The harness's closures of the first life: ids 0..3 on workers 0 and 1 (t = 10 + id
    to 10.8 + id), id 4 on worker 0 from 14 to 17.5 (in flight over the bound, 16 to
    16.5, and into the save, 17 to 18), id 5 never given to a worker (queued).
    ``override``: id -> (worker, begin, end) or None (no attempt)."""
    spans = {i: (i % 2, 10.0 + i, 10.8 + i) for i in range(4)}
    spans[4] = (0, 14.0, 17.5)
    spans.update({int(k[1:]): v for k, v in override.items()})
    found = []
    for i, span in sorted(spans.items()):
        for worker, begin, end in [span] if isinstance(span, tuple) else span or []:
            found.append(ps_checks.Attempt(i, worker, begin, end))
    return found


def _snapshot(t, runs, applied, applied_b=None, steps=10):
    second = list(applied) if applied_b is None else applied_b
    return {"t": t, "runs": runs, "applied": applied, "applied_b": second, "outside": [0] * steps}


def _ids_lives(first_applied, second_applied, done_applied, steps=10, attempts=None, b=None):
    """Two coordinator lives as ps_checks reads them: the first restores nothing, runs ids
    0..5 (each handed to handler.run at t = 10 + id), joins at 13.5 and saves at run 4
    (the harness's bound 16 to 16.5, its save 17 to 18; the record's save_start 17); the
    second restores that checkpoint (``second_applied``, ``b`` its applied_b), runs ids
    4..9 and ends with ``done_applied``."""
    first = ps_checks.Life(
        name="coordinator#0",
        pid=100,
        started=0.0,
        ended=20.0,
        restored=_snapshot(5.0, 0, first_applied),
        runs={i: 10.0 + i for i in range(6)},
        outside={},
        join_ends=[13.5],
        closures=_attempts() if attempts is None else attempts,
        bound_spans=[(16.0, 16.5)],
        save_spans=[(17.0, 18.0)],
    )
    second = ps_checks.Life(
        name="coordinator#1",
        pid=101,
        started=30.0,
        ended=None,
        restored=_snapshot(35.0, 4, second_applied, b),
        runs={i: 36.0 + i for i in range(4, steps)},
        outside={},
        join_ends=[50.0],
        done=_snapshot(51.0, steps, done_applied),
        closures=[ps_checks.Attempt(i, i % 2, 36.0 + i, 36.5 + i) for i in range(4, steps)],
    )
    return [first, second]


def _identity(
    second_applied, done_applied, faults=(), tf_coordinator=False, attempts=None, b=None, **named
):
    """The verdict on :func:`_ids_lives` with a save whose record has ``named`` (e.g.
    ``in_flight_runs=[4]``)."""
    save = ps_checks.Save(pid=100, agreed_step=4, save_start=17.0, save_end=18.0, extra=named)
    lives = _ids_lives([0] * 10, second_applied, done_applied, attempts=attempts, b=b)
    return ps_checks.check_identity(lives, [save], list(faults), 10, tf_coordinator)


#: The checkpoint of run 4 with ids 0..3 applied once; done with every id once.
CLEAN_SAVE = [1, 1, 1, 1, 0, 0, 0, 0, 0, 0]
CLEAN_DONE = [1] * 10
#: Id 4 was applied before the save (in flight at its bound) and again after the restart.
AHEAD_SAVE = [1, 1, 1, 1, 1, 0, 0, 0, 0, 0]
AHEAD_DONE = [1, 1, 1, 1, 2, 1, 1, 1, 1, 1]


def test_identity_check_passes_exactly_once():
    verdict = _identity(CLEAN_SAVE, CLEAN_DONE)
    assert not verdict.violations and not verdict.lost and not verdict.duplicates


def test_identity_check_finds_a_lost_id():
    # Id 2 counted by the checkpoint's run count (4) but never applied: lost, even though
    # another id (7) was applied twice, which a sum of the counts would not tell apart.
    verdict = _identity([1, 1, 0, 1, 0, 0, 0, 0, 0, 0], [1, 1, 0, 1, 1, 1, 1, 2, 1, 1])
    assert verdict.lost == [2]
    assert any("never applied: [2]" in v for v in verdict.violations), verdict.violations
    # ... and the duplicate of id 7, with no fault and not at a save, is not explained.
    [dup] = verdict.duplicates
    assert (dup.id, dup.kind, dup.explained_by) == (7, ps_checks.REPEAT, None)
    # A lost id is a violation with TensorFlow's coordinator too.
    assert _identity([1, 1, 0, 1] + [0] * 6, CLEAN_DONE, tf_coordinator=True).lost == [2]


def test_identity_check_excuses_only_the_id_the_record_names_and_the_harness_saw():
    # Applied ahead of the checkpoint's run count and again after the restart, with a
    # record that names no run in flight at the save's bound: a violation.
    verdict = _identity(AHEAD_SAVE, AHEAD_DONE)
    [dup] = verdict.duplicates
    assert (dup.id, dup.kind, dup.life) == (4, ps_checks.AHEAD, "coordinator#0")
    assert verdict.unexplained == 1
    assert any("1 duplicate application(s)" in v for v in verdict.violations)
    # A count names no id: a record that says "1 in flight" excuses nothing.
    assert _identity(AHEAD_SAVE, AHEAD_DONE, in_flight_at_bound=1).violations
    # Named by id, and in flight over the harness's bound: excused.
    verdict = _identity(AHEAD_SAVE, AHEAD_DONE, in_flight_at_bound=1, in_flight_runs=[4])
    assert not verdict.violations and verdict.explained == 1, verdict.duplicates
    # Named, but the harness saw it finish before its bound began: the record is wrong.
    finished = _attempts(i4=(0, 14.0, 15.0))
    verdict = _identity(AHEAD_SAVE, AHEAD_DONE, attempts=finished, in_flight_runs=[4])
    assert verdict.unexplained == 1 and verdict.violations
    # Named, but never given to a worker by the harness's account: not excused either.
    verdict = _identity(AHEAD_SAVE, AHEAD_DONE, attempts=_attempts(i4=None), in_flight_runs=[4])
    assert verdict.unexplained == 1 and verdict.violations
    # With TensorFlow's coordinator: measured, not a violation.
    verdict = _identity(AHEAD_SAVE, AHEAD_DONE, tf_coordinator=True)
    assert not verdict.violations and verdict.unexplained == 1


def test_identity_check_finished_after_the_first_unfinished_run_by_id():
    # Run 4 in flight over the bound, run 5 finished before it (14.5 to 15): both in the
    # checkpoint, both run again. The record names each: both excused.
    attempts = _attempts(i5=(1, 14.5, 15.0))
    two, done = [1, 1, 1, 1, 1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 2, 2, 1, 1, 1, 1]
    named = {"in_flight_runs": [4], "finished_after_first_unfinished": [5]}
    verdict = _identity(two, done, attempts=attempts, **named)
    assert not verdict.violations and verdict.explained == 2, verdict.duplicates
    # A count (issue 48's record) names no id.
    verdict = _identity(
        two, done, attempts=attempts, in_flight_runs=[4], finished_after_first_unfinished=1
    )
    assert (verdict.explained, verdict.unexplained) == (1, 1) and verdict.violations
    # Run 4, the first unfinished by the record, had finished before the harness's bound
    # began: run 5 is no "finished after" (and 4 no "in flight"): neither is excused.
    early = _attempts(i4=(0, 14.0, 15.5), i5=(1, 14.5, 15.0))
    verdict = _identity(two, done, attempts=early, **named)
    assert verdict.unexplained == 2 and verdict.violations


def test_identity_check_history_a_a_queued_run_ran_during_the_save():
    # Issue 60, history (A): run 4 in flight at the bound never reached the checkpoint,
    # but run 5, queued, ran during the save (a broken hold) and is in it. Issue 48's
    # check excused run 5's duplicate with in_flight_at_bound 1; the record names run 4.
    attempts = _attempts(i5=(1, 17.2, 17.6))
    saved = [1, 1, 1, 1, 0, 1, 0, 0, 0, 0]
    done = [1, 1, 1, 1, 1, 2, 1, 1, 1, 1]
    verdict = _identity(saved, done, attempts=attempts, in_flight_at_bound=1, in_flight_runs=[4])
    [dup] = verdict.duplicates
    assert (dup.id, dup.kind, dup.explained_by) == (5, ps_checks.AHEAD, None)
    assert verdict.violations


def test_identity_check_history_b_an_ahead_run_applied_twice_before_the_save():
    # Issue 60, history (B): runs 4 and 5 were in flight at the bound (named); run 4 was
    # applied twice before the save, run 5 not at all. Issue 48's check spent the record's
    # count (2 in flight) on run 4's two duplicates; by id, the record excuses one.
    attempts = _attempts(i5=(1, 15.0, 17.6))
    saved = [1, 1, 1, 1, 2, 0, 0, 0, 0, 0]
    done = [1, 1, 1, 1, 3, 1, 1, 1, 1, 1]
    named = {"in_flight_at_bound": 2, "in_flight_runs": [4, 5]}
    verdict = _identity(saved, done, attempts=attempts, **named)
    assert (verdict.explained, verdict.unexplained) == (1, 1), verdict.duplicates
    assert verdict.violations


def test_identity_check_history_c_a_pause_excuses_only_what_it_hit():
    # Issue 60, history (C): run 1, finished at 11.8, was applied again; worker 1 (which
    # ran it) was paused 5 s later, 16.8 to 17.0, with nothing in flight. With no join
    # before the save, issue 48's check made run 1's window reach the save and the pause
    # excused it. It has nothing to do with run 1.
    saved, done = [1, 2, 1, 1, 0, 0, 0, 0, 0, 0], [1, 2, 1, 1, 1, 1, 1, 1, 1, 1]
    pause = ps_checks.FaultWindow("SIGSTOP worker1", 16.8, 17.0, "worker1")
    lives = _ids_lives([0] * 10, saved, done)
    lives[0].join_ends = []
    save = ps_checks.Save(100, 4, 17.0, 18.0, {})
    verdict = ps_checks.check_identity(lives, [save], [pause], 10)
    [dup] = verdict.duplicates
    assert (dup.id, dup.kind, dup.explained_by) == (1, ps_checks.REPEAT, None)
    assert verdict.violations


def test_identity_check_a_fault_excuses_the_closure_it_hit_in_flight():
    # Run 4 ran on worker 0 from 14 to 17.5: a kill of worker 0 at 15 can have made it
    # run again; a kill of worker 1 then cannot; a PS's kill can (any worker's).
    kill0 = ps_checks.FaultWindow("SIGKILL worker0", 15.0, 15.0, "worker0")
    verdict = _identity(AHEAD_SAVE, AHEAD_DONE, faults=[kill0])
    assert not verdict.violations, verdict.duplicates
    assert verdict.duplicates[0].explained_by == "SIGKILL worker0 with run 4 in flight"
    kill1 = ps_checks.FaultWindow("SIGKILL worker1", 15.0, 15.0, "worker1")
    assert _identity(AHEAD_SAVE, AHEAD_DONE, faults=[kill1]).violations
    ps = ps_checks.FaultWindow("SIGSTOP ps0", 15.0, 16.0, "ps0")
    assert not _identity(AHEAD_SAVE, AHEAD_DONE, faults=[ps]).violations
    # Before run 4 was given to a worker: nothing of it was in flight.
    early = ps_checks.FaultWindow("SIGKILL worker0", 13.9, 13.9, "worker0")
    assert _identity(AHEAD_SAVE, AHEAD_DONE, faults=[early]).violations
    # A pause covers what began on the worker while it lasted.
    pause = ps_checks.FaultWindow("SIGSTOP worker0", 13.0, 14.5, "worker0")
    assert not _identity(AHEAD_SAVE, AHEAD_DONE, faults=[pause]).violations
    # One fault excuses one application per closure it hit: run 4 applied three times
    # (twice ahead, once after the restart) with one kill is one too many.
    verdict = _identity([1, 1, 1, 1, 2, 0, 0, 0, 0, 0], [1, 1, 1, 1, 3, 1, 1, 1, 1, 1], [kill0])
    assert (verdict.explained, verdict.unexplained) == (1, 1)


def test_identity_check_finds_a_half_applied_closure_in_a_checkpoint():
    # Run 4's first write (applied) is in the checkpoint, its second (applied_b) is not.
    torn = [1, 1, 1, 1, 0, 0, 0, 0, 0, 0]
    verdict = _identity(AHEAD_SAVE, AHEAD_DONE, b=torn, in_flight_runs=[4])
    assert not verdict.torn and not verdict.violations, verdict.violations
    verdict = _identity(AHEAD_SAVE, AHEAD_DONE, b=torn)
    assert verdict.torn == [("coordinator#1 restored", 4)]
    assert any("half applied" in v for v in verdict.violations)
    # Measured, not a violation, with TensorFlow's coordinator.
    verdict = _identity(AHEAD_SAVE, AHEAD_DONE, b=torn, tf_coordinator=True)
    assert verdict.torn and "tf_coordinator_torn" in verdict.notes
    assert not [v for v in verdict.violations if "half applied" in v]


def test_identity_check_finds_a_run_count_that_went_back():
    # Life B restored run 5 and saved run 4 (before issue 48's item 2 was fixed: an
    # outside closure unfinished at the save was taken off the run count): run 4, in the
    # checkpoint of run 5, runs again in life C; B's runs 5 and 6 are ahead of its save.
    def life(name, pid, started, restored, runs, applied, done=None):
        return ps_checks.Life(
            name,
            pid,
            started,
            started + 9.0,
            _snapshot(started + 1.0, restored, applied),
            {i: started + 2.0 + i / 10 for i in runs},
            {},
            [started + 5.0],
            done=done,
        )

    done = _snapshot(29.0, 10, [1, 1, 1, 1, 2, 2, 2, 1, 1, 1])
    lives = [
        life("coordinator#0", 100, 0.0, 0, range(6), [0] * 10),
        life("coordinator#1", 101, 10.0, 5, range(5, 7), [1] * 5 + [0] * 5),
        life("coordinator#2", 102, 20.0, 4, range(4, 10), [1] * 7 + [0] * 3, done),
    ]
    saves = [
        ps_checks.Save(100, 5, 6.0, 7.0, {"in_flight_at_bound": 0}),
        ps_checks.Save(101, 4, 16.0, 17.0, {"in_flight_at_bound": 0}),
    ]
    verdict = ps_checks.check_identity(lives, saves, [], 10)
    kinds = sorted((d.id, d.kind) for d in verdict.duplicates)
    assert kinds == [(4, ps_checks.RERUN), (5, ps_checks.AHEAD), (6, ps_checks.AHEAD)]
    assert verdict.unexplained == 3 and verdict.violations and not verdict.lost


def test_identity_check_does_not_count_an_outside_closure_as_a_named_run():
    # The bound had one closure in flight, an evaluation scheduled outside handler.run
    # (the record names its function, no run id): a handler id applied ahead is not
    # excused by it.
    extra = {"in_flight_at_bound": 1, "in_flight": {"0": "__inference_eval_step_7"}}
    assert _identity(AHEAD_SAVE, AHEAD_DONE, **extra).violations


def test_outside_closures_are_reported_not_counted_as_runs():
    lives = _ids_lives([0] * 10, CLEAN_SAVE, CLEAN_DONE)
    save = ps_checks.Save(100, 4, 17.0, 18.0, {"in_flight_at_bound": 0})
    lives[0].outside = {0: 10.1, 4: 14.1}
    lives[0].restored["outside"] = [0] * 10
    lives[1].restored["outside"] = [1] + [0] * 9  # 4 unfinished at the save: missing
    lives[1].outside = {4: 40.1, 8: 44.1}
    lives[1].done["outside"] = [1, 0, 0, 0, 1, 0, 0, 0, 1, 0]
    violations: list = []
    report = ps_checks.check_outside(lives, [save], violations)
    assert not violations
    assert report == {"scheduled": 4, "applied": 3, "missing_after_restart": 1, "duplicated": 0}
    # One the last life scheduled and its join() never saw applied: a violation.
    lives[1].done["outside"] = [1, 0, 0, 0, 1, 0, 0, 0, 0, 0]
    ps_checks.check_outside(lives, [save], violations)
    assert violations and "run 8" in violations[0]


def test_a_failing_trial_names_its_seed_and_plan():
    plan = make_plan("preemption", 123)
    result = TrialResult(plan.kind, plan.seed, plan, violations=["worker 1 saved at [7, 7]"])
    result.fault("sigterm", 2)
    report = result.report()
    assert "seed 123" in report and plan.describe() in report
    assert "make_plan('preemption', 123)" in report and "worker 1 saved" in report
    table = format_table([result, TrialResult("partition", 1, Plan("partition", 1, {}))])
    assert "| preemption | - | 1 | 1 | 0 | sigterm 2 |" in table
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
    # The chief died mid-save, after a clean preemption's checkpoint: the survivor, which
    # did not find the chief's checkpoint of the round, saved the round's step itself
    # (issue 62), a complete checkpoint newer than the earlier one; the restart restores
    # it on both workers, never the chief's partial files.
    notes = result.notes
    earlier = notes["saves"][0][0][-1]
    assert notes["survivors_saved"] == notes["partial"] > earlier > 0, result.report()
    assert notes["restart_restored"] == [notes["partial"]] * 2, result.report()


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


# Backstop above its own bounds in sequence: its reference run, the ip commands, the
# progress, the life's end after the cut, the restart.
@pytest.mark.timeout(
    lost_worker.RESTART_BOUND
    + PARTITION_IP_BOUND
    + harness.START_TIMEOUT
    + lost_worker.LOST_BOUND
    + lost_worker.RESTART_BOUND
    + MARGIN
)
@pytest.mark.parametrize("cut", sorted(LOST_WORKER_CUT_SEEDS))
def test_a_network_cut_the_survivors_save_and_the_restart_resumes_there(tmp_path, cut):
    """Success for a cut (issue 62): every worker of both sides ends within the bound
    (none hangs on the other side), and the restart resumes at L - 1 or later (L: the
    highest step any worker finished before the cut), at one run on every worker, with
    pair_a == pair_b, and ends with exactly an uninterrupted run's weights."""
    require_netns()
    result = run_trial(make_plan("lost_worker", LOST_WORKER_CUT_SEEDS[cut]), tmp_path)
    check_lost(result)
    assert result.faults == {"cut": 1}, result.report()


# Backstop above its own bounds in sequence: its reference run, the progress, the life's
# end after the fault (a paused one: after its SIGCONT too), the restart.
@pytest.mark.timeout(
    lost_worker.RESTART_BOUND
    + harness.START_TIMEOUT
    + 2 * lost_worker.LOST_BOUND
    + lost_worker.RESTART_BOUND
    + MARGIN
)
@pytest.mark.parametrize("case", sorted(LOST_WORKER_PREEMPTION_SEEDS))
def test_a_worker_lost_inside_a_preemption_the_survivors_save_and_the_restart_resumes_there(
    tmp_path, case
):
    """Success for a worker lost inside a preemption's agreement or the chief's save
    (issue 62): as the cut test, and the state file names the survivors' checkpoint (the
    round's own save never became one)."""
    result = run_trial(make_plan("lost_worker", LOST_WORKER_PREEMPTION_SEEDS[case]), tmp_path)
    check_lost(result)
    assert (result.notes["named"] or "").startswith("ckpt-survivor"), result.report()


@pytest.fixture(scope="module")
def gcs():
    from integration.gcs_emulator import require_gcs_emulator

    with require_gcs_emulator() as emu:
        yield emu


# Backstop above its own bounds in sequence: the module's emulator, its reference run,
# the progress, the life's end after the fault (a paused one: after its SIGCONT too),
# the restart.
@pytest.mark.timeout(
    LIFETIME_BOUND
    + lost_worker.RESTART_BOUND
    + harness.START_TIMEOUT
    + 2 * lost_worker.LOST_BOUND
    + lost_worker.RESTART_BOUND
    + MARGIN
)
@pytest.mark.parametrize("case", sorted(LOST_WORKER_GCS_PLANS))
def test_a_lost_worker_on_gs_the_survivors_save_and_the_restart_resumes_there(tmp_path, gcs, case):
    """As the cut test, through TensorFlow's own GCS file system against the emulator:
    the survivors' checkpoint, its claim and the state file are objects of the bucket."""
    result = run_trial(LOST_WORKER_GCS_PLANS[case], tmp_path, gcs=gcs)
    check_lost(result)
    folder = result.notes["ckpt_dir"].removeprefix(f"gs://{gcs.bucket}/") + "/"
    objects = gcs.list_objects(folder)
    saved = [o for o in objects if "/ckpt-survivor" in o and o.endswith(".index")]
    assert len(saved) == 1, objects
    assert f"{folder}lost-worker/job" in objects, objects


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
def test_ps_preemption_applies_every_id_and_leaves_nothing(tmp_path, seed):
    # (No MWMS reference run: trial_root's is of no use here.)
    plan = make_plan("ps_preemption", seed)
    result = run_trial(plan, tmp_path)
    check(result)
    assert not result.notes.get("missed_faults"), result.report()
    # Identity: no id lost, every duplicate named by a save's record or a kill/pause.
    assert result.lost_ids == 0 and result.duplicates_unexplained == 0, result.report()
    # Each task that got a notice exited 42, released by the coordinator after its save.
    exits = result.notes["server_exits"]
    assert exits and all(e["code"] == 42 and e["released"] for e in exits), result.report()
    # What the plan varies did run: fetch() in the loop, closures outside handler.run.
    if plan.params["fetch_every"]:
        assert sum(life["fetches"] for life in result.notes["lives"]) > 0, result.report()
    assert result.notes["outside"]["applied"] > 0, result.report()


def test_ps_preemption_seeds_of_make_test_cover_the_variants():
    features = [set(ps_features(make_plan("ps_preemption", s).params)) for s in PS_PREEMPTION_SEEDS]
    assert all("outside closures" in f for f in features)
    assert {"fetch", "grace>0", "deadline", "2 PS", "3 workers"} <= set().union(*features)
    assert any("grace>0" not in f for f in features), "grace period 0 too"
