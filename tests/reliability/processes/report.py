"""What a real-process trial found, and the table that sums many of them."""

from __future__ import annotations

import dataclasses
import json
from typing import Optional

from .plans import Plan, lost_variant, ps_features, ps_variant


@dataclasses.dataclass
class TrialResult:
    """What one trial did and found: a row of the reliability table."""

    kind: str
    seed: int
    plan: Plan
    violations: list = dataclasses.field(default_factory=list)
    #: Faults actually injected, by kind (``sigterm``, ``sigkill``, ``partition``, ...).
    faults: dict = dataclasses.field(default_factory=dict)
    lost_steps: int = 0
    hangs: int = 0
    mismatched_saves: int = 0
    lost_closures: int = 0
    #: At-least-once re-executions (not a loss): ``ps_worker_kills`` counts them per
    #: closure index; ``ps_preemption`` per id (every application of an id beyond one).
    duplicate_closures: int = 0
    #: ``ps_preemption``: ids scheduled through ``handler.run`` and never applied, and
    #: the duplicates a kill, a pause or the save's bound explains, or nothing does
    #: (``ps_checks.py``).
    lost_ids: int = 0
    duplicates_explained: int = 0
    duplicates_unexplained: int = 0
    seconds: float = 0.0
    #: Why the trial could not run (only ``partition``, without network namespaces).
    skipped: Optional[str] = None
    #: Observations worth a column or a failure message (moments, exit codes, ...).
    notes: dict = dataclasses.field(default_factory=dict)
    #: Log tails of the processes, kept for a failure message.
    logs: str = ""

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def variant(self) -> str:
        """The report's row within the kind (``ps_preemption``: its coordinator)."""
        if self.kind == "ps_preemption":
            return ps_variant(self.plan.params)
        if self.kind == "lost_worker":
            return lost_variant(self.plan.params)
        return "-"

    def fault(self, kind: str, n: int = 1) -> None:
        self.faults[kind] = self.faults.get(kind, 0) + n

    def record(self) -> dict:
        """The counters as plain data (JSON-able), for a long-mode runner."""
        return {
            "kind": self.kind,
            "seed": self.seed,
            "ok": self.ok,
            "skipped": self.skipped,
            "faults": dict(self.faults),
            "lost_steps": self.lost_steps,
            "hangs": self.hangs,
            "mismatched_saves": self.mismatched_saves,
            "lost_closures": self.lost_closures,
            "duplicate_closures": self.duplicate_closures,
            "lost_ids": self.lost_ids,
            "duplicates_explained": self.duplicates_explained,
            "duplicates_unexplained": self.duplicates_unexplained,
            "variant": self.variant,
            "seconds": round(self.seconds, 2),
            "notes": self.notes,
            "violations": list(self.violations),
            "plan": self.plan.describe(),
        }

    def report(self) -> str:
        """A failure message: seed, plan, violations, notes and the processes' logs.
        Its first line names what failed (the first violation, else the counters that
        are not zero): a CI log that keeps only pytest's short summary line keeps it."""
        counters = {
            "hangs": self.hangs,
            "lost_steps": self.lost_steps,
            "mismatched_saves": self.mismatched_saves,
            "lost_closures": self.lost_closures,
            "lost_ids": self.lost_ids,
            "duplicates_unexplained": self.duplicates_unexplained,
        }
        failed = ", ".join(f"{k} {v}" for k, v in counters.items() if v)
        first = ""
        if self.violations:
            said = " ".join(str(self.violations[0]).split())[:300]
            first = f"{len(self.violations)} violation(s), first: {said}; "
        lines = [
            f"{self.kind} trial, seed {self.seed}: {first}{failed or 'no counter above 0'} "
            f"(replay: run_trial(make_plan({self.kind!r}, {self.seed})))",
            f"  plan: {self.plan.describe()}",
            f"  faults injected: {self.faults}",
            f"  notes: {json.dumps(self.notes, default=str)[:3000]}",
        ]
        lines += [f"  VIOLATION: {v}" for v in self.violations]
        if self.logs:
            lines.append(self.logs)
        return "\n".join(lines)


COLUMNS = (
    "kind",
    "variant",
    "trials",
    "failed",
    "skipped",
    "faults injected",
    "lost steps",
    "hangs",
    "mismatched saves",
    "lost closures",
    "duplicate closures",
    "lost ids",
    "duplicates (explained/unexplained)",
    "violations",
    "median s",
)


#: What holds in each ``ps_preemption`` variant (the table's note under it).
VARIANT_NOTES = {
    "ours": "every id applied; no extra application but one per save whose record names "
    "the id (in_flight_runs, finished_after_first_unfinished) as the harness saw it, and "
    "one per kill or pause of the task that had the id in flight; no closure half "
    "applied in a checkpoint but those: any other is a violation",
    "TF's coordinator": "it cannot hold its workers: closures in flight at the save may "
    "run twice (measured, not violations); a lost id is a violation",
}


def aggregate(results) -> list:
    """One row per kind and variant: the counters of the reliability table."""
    rows = []
    for kind, variant in dict.fromkeys((r.kind, r.variant) for r in results):
        rs = [r for r in results if r.kind == kind and r.variant == variant]
        faults: dict = {}
        for r in rs:
            for k, v in r.faults.items():
                faults[k] = faults.get(k, 0) + v
        seconds = sorted(r.seconds for r in rs if not r.skipped)
        rows.append(
            {
                "kind": kind,
                "variant": variant,
                "trials": len(rs),
                "failed": sum(not r.ok for r in rs),
                "skipped": sum(bool(r.skipped) for r in rs),
                "faults injected": ", ".join(f"{k} {v}" for k, v in sorted(faults.items())),
                "lost steps": sum(r.lost_steps for r in rs),
                "hangs": sum(r.hangs for r in rs),
                "mismatched saves": sum(r.mismatched_saves for r in rs),
                "lost closures": sum(r.lost_closures for r in rs),
                "duplicate closures": sum(r.duplicate_closures for r in rs),
                "lost ids": sum(r.lost_ids for r in rs),
                "duplicates (explained/unexplained)": (
                    f"{sum(r.duplicates_explained for r in rs)}/"
                    f"{sum(r.duplicates_unexplained for r in rs)}"
                ),
                "violations": sum(len(r.violations) for r in rs),
                "median s": round(seconds[len(seconds) // 2], 1) if seconds else 0,
            }
        )
    return rows


def format_table(results) -> str:
    """The aggregate as a Markdown table."""
    rows = aggregate(results)
    lines = [
        "| " + " | ".join(COLUMNS) + " |",
        "| " + " | ".join("---" for _ in COLUMNS) + " |",
    ]
    lines += ["| " + " | ".join(str(row[c]) for c in COLUMNS) + " |" for row in rows]
    lines += feature_lines(results)
    return "\n".join(lines)


#: What each ``lost_worker`` variant's trials check (the table's note under it).
LOST_NOTES = {
    "ours": "each trial checks that the restart resumes at L - 1 or later (L: the highest "
    "step any worker finished before the loss), at one run on every worker, with "
    "pair_a == pair_b (no torn step) and an uninterrupted run's weights at the end, and "
    "that nothing hangs; any other outcome is a violation",
    "TF's handler": "it saves nothing at a loss: lost steps (L - the restored run) and "
    "hangs are measured, not violations; the restart must still end with an "
    "uninterrupted run's weights",
}


def feature_lines(results) -> list:
    """Under the table: what each ``lost_worker`` and ``ps_preemption`` variant
    guarantees, and the ``ps_preemption`` trials (and failures) by what the plan
    varied."""
    lines = [""]
    lost = [r for r in results if r.kind == "lost_worker"]
    for variant in dict.fromkeys(r.variant for r in lost):
        lines.append(f"lost_worker, {variant}: {LOST_NOTES.get(variant, '')}.")
    ps = [r for r in results if r.kind == "ps_preemption"]
    if not ps:
        return lines if lost else []
    for variant in dict.fromkeys(r.variant for r in ps):
        lines.append(f"ps_preemption, {variant}: {VARIANT_NOTES.get(variant, '')}.")
    counts: dict = {}
    for r in ps:
        for feature in ps_features(r.plan.params) or ["none of them"]:
            trials, failed = counts.get(feature, (0, 0))
            counts[feature] = (trials + 1, failed + (not r.ok))
    lines.append(
        "ps_preemption trials (failed) by what they varied: "
        + ", ".join(f"{k} {t} ({f})" for k, (t, f) in sorted(counts.items()))
        + "."
    )
    return lines
