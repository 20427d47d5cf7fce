"""``python -m tf_failure_handling report PATH [--json] [--plot timeline.png]``.

One row per preemption across all tasks of the records in ``PATH`` (a records
folder, one file, or a checkpoint folder with its ``preemption_records`` inside; a
``gs://`` or other path TensorFlow can read too): when, source, agreed step, save
duration, margin left to the deadline, downtime, steps lost; then totals. ``--json``
prints the same as JSON; ``--plot`` draws one lane per task (training, notice,
agreement, save, exit, restart, the deadline) with matplotlib
(``pip install tf-failure-handling[plot]``).

Lines that cannot be read (cut off by a kill, not JSON, not of the records' schema)
are skipped; how many is said in one line on stderr after the table. Exit codes:
:data:`EXIT_CODES`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from dataclasses import dataclass, field
from typing import Any, Optional

from . import records

#: What ``report``'s exit code means; anything but 0 comes with one line on stderr.
EXIT_CODES = {
    0: "the table (or JSON) was printed",
    1: "PATH holds no readable preemption record",
    2: "PATH does not exist or cannot be read",
    3: "--plot could not draw the picture",
}


@dataclass
class Row:
    tasks: list = field(default_factory=list)

    @property
    def when(self) -> float:
        return min(p.notice_time or p.save_start or p.exit_time or 0.0 for p in self.tasks)

    @property
    def end(self) -> Optional[float]:
        ends = [p.exit_time for p in self.tasks if p.exit_time is not None]
        return max(ends) if ends else None

    def summary(self, resumes: list) -> dict:
        sources = sorted({p.source for p in self.tasks if p.source and p.source != "peer"})
        steps = [p.agreed_step for p in self.tasks if p.agreed_step is not None]
        saves = [p.save_duration for p in self.tasks if p.save_duration is not None]
        margins = [p.margin for p in self.tasks if p.margin is not None]
        errors = [f"{p.label}: {p.error}" for p in self.tasks if p.error]
        end = self.end
        resumed = [r for r in resumes if end is not None and r.time >= end]
        first = resumed[0] if resumed else None
        return {
            "when": self.when,
            "tasks": sorted({p.label for p in self.tasks}),
            "source": ", ".join(sources) or ("peer" if self.tasks else None),
            "agreed_step": max(steps) if steps else None,
            "save_seconds": max(saves) if saves else None,
            "margin_seconds": min(margins) if margins else None,
            "downtime_seconds": None if first is None else first.time - end,
            "steps_lost": None if first is None else first.lost,
            "exit_codes": sorted({str(p.exit_code) for p in self.tasks if p.exit_time}),
            "errors": errors,
        }


def group(found: records.Records) -> list:
    """Task-level preemptions grouped into cluster-wide ones, in time order (the core's
    grouping, ``found.groups``)."""
    return [Row([found.preemptions[i] for i in tasks]) for tasks in found.groups]


def _when(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _s(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.2f} s"


def _v(value: Any) -> str:
    return "-" if value is None else str(value)


def table(summaries: list) -> str:
    header = ("when (UTC)", "source", "tasks", "step", "save", "margin", "downtime", "lost")
    body = [
        (
            _when(s["when"]),
            _v(s["source"]),
            str(len(s["tasks"])),
            _v(s["agreed_step"]),
            _s(s["save_seconds"]),
            _s(s["margin_seconds"]),
            _s(s["downtime_seconds"]),
            _v(s["steps_lost"]),
        )
        for s in summaries
    ]
    widths = [max(len(r[i]) for r in (header, *body)) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in (header, *body)]
    return "\n".join(lines)


def totals(summaries: list) -> dict:
    down = [s["downtime_seconds"] for s in summaries if s["downtime_seconds"] is not None]
    lost = [s["steps_lost"] for s in summaries if s["steps_lost"] is not None]
    return {
        "preemptions": len(summaries),
        "downtime_seconds": sum(down),
        "steps_lost": sum(lost),
        "errors": sum(len(s["errors"]) for s in summaries),
    }


def plot(found: records.Records, out: str) -> None:
    """Draws the timeline to ``out`` (``.png`` or ``.svg``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lanes = sorted(
        {p.label for p in found.preemptions} | {f"{r.job} {r.task}" for r in found.resumes}
    )
    if not lanes:
        raise ValueError("nothing to draw: the records hold no preemption")
    times = [
        t
        for p in found.preemptions
        for t in (p.notice_time, p.agreement_time, p.save_start, p.save_end, p.exit_time)
        if t is not None
    ] + [r.time for r in found.resumes]
    t0 = min(times)
    # Training before the first notice: the records start at the notice, so the
    # lane's first bar is drawn from a little before it.
    pad = max(1.0, 0.1 * (max(times) - t0))
    fig, ax = plt.subplots(figsize=(10, 1.6 + 0.6 * len(lanes)))
    y = {lane: i for i, lane in enumerate(lanes)}
    seen: set = set()

    def label(name: str) -> Optional[str]:
        if name in seen:
            return None
        seen.add(name)
        return name

    for lane in lanes:
        i = y[lane]
        mine = [p for p in found.preemptions if p.label == lane]
        resumes = [r for r in found.resumes if f"{r.job} {r.task}" == lane]
        start = -pad
        for p in mine:
            notice = p.notice_time if p.notice_time is not None else p.save_start
            if notice is not None:
                ax.barh(
                    i,
                    notice - t0 - start,
                    left=start,
                    height=0.25,
                    color="#c7d9ee",
                    label=label("training"),
                )
                ax.plot(notice - t0, i, "v", color="#d62728", label=label("notice"))
            if p.agreement_time is not None and notice is not None:
                ax.barh(
                    i,
                    p.agreement_time - notice,
                    left=notice - t0,
                    height=0.5,
                    color="#ffbf69",
                    label=label("agreement"),
                )
            if p.save_start is not None and p.save_end is not None:
                ax.barh(
                    i,
                    p.save_end - p.save_start,
                    left=p.save_start - t0,
                    height=0.5,
                    color="#2a9d8f",
                    label=label("save"),
                )
            if p.exit_time is not None:
                ax.plot(p.exit_time - t0, i, "x", color="black", markersize=9, label=label("exit"))
            if p.deadline is not None:
                ax.vlines(
                    p.deadline - t0,
                    i - 0.4,
                    i + 0.4,
                    colors="#d62728",
                    linestyles="dashed",
                    label=label("deadline"),
                )
            after = [r for r in resumes if p.exit_time is not None and r.time >= p.exit_time]
            start = (after[0].time - t0) if after else (p.exit_time or notice or t0) - t0
        for r in resumes:
            ax.plot(r.time - t0, i, "^", color="#2a9d8f", markersize=8, label=label("restart"))
        last = max(times) - t0
        if resumes and resumes[-1].time - t0 >= start:
            ax.barh(
                i,
                last - start + 1.0,
                left=start,
                height=0.25,
                color="#c7d9ee",
                label=label("training"),
            )
    ax.set_yticks(range(len(lanes)), lanes)
    ax.set_xlabel(f"seconds since the first notice ({_when(t0)} UTC)")
    ax.set_title("Preemptions")
    ax.set_ylim(-0.6, len(lanes) - 0.4)
    fig.legend(loc="lower center", ncol=7, fontsize="small", frameon=False)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(out)
    plt.close(fig)


def main(argv: Optional[list] = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tf_failure_handling report",
        description="One row per preemption found in a records folder (or file).",
        epilog="exit codes: " + "; ".join(f"{k}: {v}" for k, v in EXIT_CODES.items()),
    )
    p.add_argument(
        "path",
        help="a checkpoint folder, its records folder (<checkpoint_dir>/preemption_records) "
        "or one records file; gs:// and other TensorFlow file systems too",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--plot", metavar="FILE", help="also draw the timeline (.png or .svg)")
    args = p.parse_args(argv)
    try:
        found = records.load(args.path)
    except FileNotFoundError as e:
        print(f"report: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"report: cannot read {args.path}: {e}", file=sys.stderr)
        return 2
    if not found.preemptions and not found.resumes:
        bad = sum(len(v) for v in found.skipped.values())
        why = f" ({bad} unreadable line(s))" if bad else ""
        print(f"report: no preemption records in {args.path}{why}", file=sys.stderr)
        return 1
    summaries = [row.summary(found.resumes) for row in group(found)]
    bad = sum(len(v) for v in found.skipped.values())
    if args.json:
        result = {"preemptions": summaries, "totals": totals(summaries), "skipped": found.skipped}
        print(json.dumps(result, indent=2))
    else:
        print(table(summaries))
        t = totals(summaries)
        print(
            f"\n{t['preemptions']} preemption(s); {t['downtime_seconds']:.2f} s down; "
            f"{t['steps_lost']} step(s) lost; {t['errors']} error(s)."
        )
    if bad:
        print(
            f"report: skipped {bad} unreadable line(s) in {len(found.skipped)} file(s)",
            file=sys.stderr,
        )
    if args.plot:
        try:
            plot(found, args.plot)
        except ImportError:
            print(
                "report: --plot needs matplotlib: pip install 'tf-failure-handling[plot]'",
                file=sys.stderr,
            )
            return 3
        except (ValueError, OSError) as e:
            print(f"report: cannot draw {args.plot}: {e}", file=sys.stderr)
            return 3
        print(f"timeline written to {args.plot}", file=sys.stderr)
    return 0
