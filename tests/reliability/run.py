"""The long mode of the fault-injection trials: many seeds, one table.

    python tests/reliability/run.py [--sim-trials N] [--process-seeds M] [--seed S]

(``make reliability`` runs it with the defaults.) Simulated trials run on the
in-memory cluster (``simulation.py``); process trials run real TensorFlow
workers and ParameterServerStrategy clusters on 127.0.0.1 (``process_trials.py``).
The table counts trials by kind, the trials that could not run (``skipped``: a
partition trial without network namespaces; under ``CI=true`` such a trial fails
instead), faults injected by kind, and the numbers that must stay zero: lost
steps, hangs, mismatched saves, lost closures, and wrong outcomes (a simulated
trial that did not end the way that counts as success for its kind: the
preemption saved by every worker, or the fault's named error). Any violating seed
is printed with its plan; the exit code is 1 if there was one, or if no trial ran.
"""

from __future__ import annotations

import argparse
import collections
import logging
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tests/, so that `reliability` imports

ZERO_COLUMNS = ("lost steps", "hangs", "mismatched saves", "lost closures", "wrong outcomes")


class Tally:
    def __init__(self) -> None:
        self.trials: collections.Counter = collections.Counter()
        self.skipped: collections.Counter = collections.Counter()
        self.faults: collections.Counter = collections.Counter()
        self.zero: dict = {k: collections.Counter() for k in ZERO_COLUMNS}
        self.failures: list = []
        self.seconds: collections.Counter = collections.Counter()

    def add(self, kind: str, record: dict) -> None:
        self.trials[kind] += 1
        self.skipped[kind] += int(bool(record.get("skipped")))
        self.seconds[kind] += record.get("seconds", 0.0)
        for fault, count in record.get("faults", {}).items():
            self.faults[fault] += count
        for column in ZERO_COLUMNS:
            self.zero[column][kind] += int(record.get(column, 0))
        if record.get("violations"):
            self.failures.append((kind, record.get("describe", ""), record["violations"]))

    def table(self, seeds: str) -> str:
        kinds = sorted(self.trials)
        header = ["trial kind", "trials", "skipped", *ZERO_COLUMNS, "violations", "wall s"]
        rows = []
        for kind in kinds:
            violations = sum(1 for k, _, _ in self.failures if k == kind)
            rows.append(
                [
                    kind,
                    str(self.trials[kind]),
                    str(self.skipped[kind]),
                    *(str(self.zero[c][kind]) for c in ZERO_COLUMNS),
                    str(violations),
                    f"{self.seconds[kind]:.0f}",
                ]
            )
        rows.append(
            [
                "**all**",
                str(sum(self.trials.values())),
                str(sum(self.skipped.values())),
                *(str(sum(self.zero[c].values())) for c in ZERO_COLUMNS),
                str(len(self.failures)),
                f"{sum(self.seconds.values()):.0f}",
            ]
        )
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        faults = ", ".join(f"{k} {v}" for k, v in sorted(self.faults.items())) or "none"
        lines += ["", f"Faults injected: {faults}.", f"Seeds: {seeds}."]
        return "\n".join(lines)


def run_simulated(tally: Tally, start: int, count: int, progress_every: int) -> None:
    from reliability.simulation import make_plan, run_trial

    t0 = time.monotonic()
    for i, seed in enumerate(range(start, start + count)):
        plan = make_plan(seed)
        r = run_trial(plan)
        tally.add(
            f"sim: {plan.kind}",
            {
                "seconds": r.seconds,
                "faults": r.injected,
                "lost steps": r.lost_steps,
                "hangs": int(r.hung),
                "mismatched saves": r.mismatched_saves,
                "wrong outcomes": r.wrong_outcome,
                "violations": r.violations,
                "describe": plan.describe(),
            },
        )
        if progress_every and (i + 1) % progress_every == 0:
            print(
                f"  simulated trials: {i + 1}/{count} in {time.monotonic() - t0:.0f}s, "
                f"{len(tally.failures)} violating",
                flush=True,
            )


def run_processes(tally: Tally, start: int, seeds_per_kind: int) -> None:
    from reliability import process_trials

    for kind in process_trials.KINDS:
        for seed in range(start, start + seeds_per_kind):
            r = process_trials.run_trial(process_trials.make_plan(kind, seed))
            tally.add(
                f"process: {kind}",
                {
                    "seconds": r.seconds,
                    "faults": r.faults,
                    "lost steps": r.lost_steps,
                    "hangs": r.hangs,
                    "mismatched saves": r.mismatched_saves,
                    "lost closures": r.lost_closures,
                    "skipped": r.skipped,
                    "violations": r.violations,
                    "describe": r.plan.describe(),
                },
            )
            state = "skipped: " + r.skipped if r.skipped else "ok" if r.ok else "VIOLATION"
            print(f"  process trial {kind} seed {seed}: {state} ({r.seconds:.0f}s)", flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sim-trials", type=int, default=10_000)
    p.add_argument(
        "--process-seeds", type=int, default=6, help="real-process trials per kind (4 kinds)"
    )
    p.add_argument("--seed", type=int, default=0, help="first seed")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    logging.getLogger("tf_failure_handling").setLevel(logging.ERROR)
    os.environ.setdefault("GCE_METADATA_IP", "127.0.0.1:9")
    os.environ.setdefault("TF_FAILURE_HANDLING_CLOUD", "none")

    tally = Tally()
    started = time.monotonic()
    if args.sim_trials:
        print(f"Running {args.sim_trials} simulated trials from seed {args.seed}...", flush=True)
        run_simulated(tally, args.seed, args.sim_trials, max(1, args.sim_trials // 20))
    if args.process_seeds:
        print(f"Running {args.process_seeds} real-process trials of each kind...", flush=True)
        run_processes(tally, args.seed, args.process_seeds)
    seeds = (
        f"simulated {args.seed}..{args.seed + args.sim_trials - 1}, "
        f"real-process {args.seed}..{args.seed + args.process_seeds - 1} of each kind"
    )
    print()
    print(tally.table(seeds))
    print(f"\nTotal wall time {time.monotonic() - started:.0f}s.")
    for kind, describe, violations in tally.failures[:20]:
        print(f"\nVIOLATION ({kind}) {describe}")
        for v in violations[:5]:
            print(f"    {v}")
    ran = sum(tally.trials.values()) - sum(tally.skipped.values())
    return 1 if tally.failures or not ran else 0


if __name__ == "__main__":
    sys.exit(main())
