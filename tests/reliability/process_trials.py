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

This file is the entry point and the command line (the long mode)::

    python tests/reliability/process_trials.py --seeds 0-19 [--kinds partition]

The parts live in ``processes/``: ``plans.py`` (plans from seeds), ``harness.py``
(worker processes and their events), ``netns.py`` (network namespaces),
``trials.py`` (one function per kind, :func:`run_trial`) and ``report.py``
(:class:`TrialResult`, the table).

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
    *complete* checkpoint (A, 0, or the chief's finished save when only the non-chief
    was killed; when the chief was killed, the survivor's own save of the round's step,
    issue 62, if the state file names one, which must be of that step), never the
    chief's partial one, and ends with the weights of an uninterrupted run.
``partition``
    One worker runs in a network namespace behind a veth pair; a SIGTERM reaches a
    worker and, at a random moment around it, the veth link goes down. Invariant: the
    worker left in the root namespace stops within :data:`PARTITION_BOUND` with an
    error naming the cut-off worker (its task index or its address), or exits 42 if
    the agreement and its save completed before the cut; it never hangs. Where
    network namespaces cannot be created the trial is skipped, with the reason,
    and counted in the table's ``skipped`` column; under ``CI=true`` it fails.
``ps_worker_kills``
    A ParameterServerStrategy cluster (``tests/integration/ps_cluster.py``) runs
    5,000+ indexed closures in waves while random workers (sometimes both) are
    SIGKILLed and restarted at random moments. Invariants: every RemoteValue
    resolves with its own closure's result; every closure index ran (its one-op
    update ``contrib[i] += i + 1`` is on the PS at least once), duplicates
    (at-least-once, as TF documents) are counted, not lost; the separately updated
    PS ``total`` holds at least one contribution of every closure.
``ps_preemption``
    A ParameterServerStrategy cluster of ``tests/integration/ps_preemption_script.py``
    processes on 127.0.0.1: the coordinator (``PreemptionCheckpointHandler`` around
    ``coord.schedule``, a ``join()`` every epoch), one or two PS and two or three
    workers (``tfh.serve(server)``), under a launcher that restarts whatever exits, a
    bounded number of times (``processes/ps_preemption.py``). Every closure scheduled
    through ``handler.run`` carries its id (the run index, ``0..steps-1``) and adds 1 to
    ``applied[id]``, a per-id counter on a PS saved in the checkpoint. Per seed the plan
    also picks: our coordinator or TensorFlow's own (a named variant, its own row); a
    grace period of 0 or more; a platform deadline on every SIGTERM (Kubernetes' pod
    grace period) or none; a ``fetch()`` of the run's result every Nth run; evaluation
    closures scheduled outside ``handler.run`` (their own per-id counter).
    One or two faults -- SIGTERM; SIGKILL; SIGSTOP, then SIGCONT 1 to 5 s later -- on
    a random role, sometimes two roles, sometimes the same task again after its
    restart, landing inside a ``schedule()`` call, inside ``join()`` (or the first
    ``fetch()`` of a result), during a worker's drain (after that worker's notice) or
    during the coordinator's save (after its own notice or a PS's); gates in the
    coordinator hold each moment open until the fault is sent (``trial_worker.py``),
    and where it landed is counted (``at_join``, ...). While a task that a fault took
    down restarts, or a worker with a notice drains, the trial holds the coordinator at
    its next ``schedule()`` (it is only slower): the next fault and that worker's exit
    come before training ends. In half the plans the coordinator's bound on its
    closures before a save is 0 or 0.5 s (a deadline that leaves them no time), so
    closures are queued and in flight at the bound. Invariants:

    * every process ends: a task that got a SIGTERM exits 42 within its bound
      (``SERVER_EXIT_BOUND`` for the PS and the workers, ``COORDINATOR_EXIT_BOUND``
      for the coordinator), released by the coordinator whenever one was up to do it
      (the task's ``exiting`` event, else the coordinator's records) -- a task
      preempted again after its restart is watched like the first time; the
      coordinator never falls silent for ``STALL_BOUND`` (a ``fetch()`` that never
      returns after a notice is such a hang); training ends within ``TRIAL_BOUND``; at
      the end no process of the trial is left. A bound that runs out dumps the stacks
      (a hang);
    * every coordinator life restores the last complete checkpoint (``lost steps``
      otherwise);
    * identity, not a sum (``processes/ps_checks.py``): every id below the run count of
      every checkpoint and of ``done`` was applied (``lost ids``); an id applied more
      than once is a duplicate, and each duplicate application must be excused by id
      and on the harness's own clock (its ``closure_begin``/``closure_end``,
      ``bound_*`` and ``save_*`` events): by the save it was ahead of, whose record
      names that id (``in_flight_runs`` or ``finished_after_first_unfinished``) as the
      harness saw it (once per naming save), or by a PS or worker SIGKILLed, paused or
      gone on its own while that id was in flight on it (a PS: on any worker; once per
      such fault); a checkpoint holding one of a closure's two writes without the
      other is a violation unless its save named the id in flight or a fault hit it;
      any other duplicate is a violation, except with TensorFlow's coordinator, where
      it is measured (it cannot hold its workers). Closures scheduled outside
      ``handler.run`` are reported, not counted as runs; one the last life scheduled
      and never applied is a violation;
    * a server exits only by its notice (42) or a SIGKILL; the coordinator exits 0
      after ``done``, 42 after a notice (its own or its PS's), or fails only when a
      server it depended on went -- SIGKILLed or paused, a PS gone, any server gone
      while it connected -- (the launcher restarts it; noted); a worker that leaves
      after its drain is no such cause: the coordinator let it go;
    * the last life prints ``done`` with runs == steps.

``lost_worker``
    2 or 3 MWMS workers; the chief or a non-chief is SIGKILLed, SIGSTOPped or cut off (a
    network namespace whose veth link goes down) with no notice, mid-training or during
    a preemption's agreement or save; every fifth seed runs TensorFlow's handler, a
    variant in its own row (``processes/lost_worker.py`` has the invariants: the
    restart resumes at L - 1 or later, no torn step, an uninterrupted run's weights, no
    hang).

Every trial returns a :class:`TrialResult` with the counters of the reliability
table: faults injected by kind, lost steps, hangs, mismatched saves, lost (and
duplicated) closures, lost ids and duplicates explained or not (``ps_preemption``),
seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
if str(TESTS) not in sys.path:  # run as a script; under pytest `tests` is on the path
    sys.path.insert(0, str(TESTS))

from reliability.processes.harness import reference_weights  # noqa: E402
from reliability.processes.netns import netns_unavailable  # noqa: E402
from reliability.processes.plans import (  # noqa: E402
    KINDS,
    MOMENTS,
    SECOND_NOTICE_MOMENTS,
    Plan,
    make_plan,
)
from reliability.processes.report import TrialResult, aggregate, format_table  # noqa: E402
from reliability.processes.trials import run_process_trials, run_trial  # noqa: E402

__all__ = [
    "KINDS",
    "MOMENTS",
    "SECOND_NOTICE_MOMENTS",
    "Plan",
    "TrialResult",
    "aggregate",
    "format_table",
    "make_plan",
    "netns_unavailable",
    "reference_weights",
    "run_process_trials",
    "run_trial",
]


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
