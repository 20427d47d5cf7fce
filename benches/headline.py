"""The README's speed table: rows picked from the tables ``make figures`` wrote.

Each row of :data:`ROWS` names a table (by the file name ``benches/_report.slug``
gives it) and, for TensorFlow, ours and the ratio, the row whose label starts with
a given text and the column of a given header. The figures are copied from those
tables as they stand, so the README states no figure of its own; ``benches/figures.py``
rewrites the README's table between :data:`BEGIN` and :data:`END` after every
complete run (and ``tests/unit/test_figures.py`` checks it like any page).
"""

from __future__ import annotations

import re
from pathlib import Path

import _report  # benches/: on sys.path as the running script's folder, or put there

BEGIN = "<!-- speed table: written by make figures (benches/headline.py) -->"
END = "<!-- speed table end -->"

#: (what, table, (row, column) of TF, of ours, of the ratio). A row is matched by the
#: start of its first cell, a column by its header.
ROWS = (
    (
        "`handler.run(fn)`, overhead per call over `fn()`",
        "run-overhead",
        ("TensorFlow", "overhead"),
        ("tf-failure-handling", "overhead"),
        ("**ratio**", "overhead"),
    ),
    (
        "`ClusterCoordinator.schedule()` per call, loops of 3,000 closures, "
        "garbage collection included",
        "clustercoordinator-end-to-end-2-workers-3000-closures-per-loop",
        ("`schedule()` per call, wall", "TensorFlow"),
        ("`schedule()` per call, wall", "tf-failure-handling"),
        ("`schedule()` per call, wall", "ratio, ours better (per round)"),
    ),
    (
        "`ClusterCoordinator.schedule()` per call, loops of 400 closures",
        "clustercoordinator-end-to-end-2-workers-400-closures-per-loop",
        ("`schedule()` per call, wall", "TensorFlow"),
        ("`schedule()` per call, wall", "tf-failure-handling"),
        ("`schedule()` per call, wall", "ratio, ours better (per round)"),
    ),
    (
        "objects each `schedule()` leaves for the garbage collector to track (allocated)",
        "clustercoordinator-end-to-end-2-workers-3000-closures-per-loop",
        ("objects a `schedule()` leaves", "TensorFlow"),
        ("objects a `schedule()` leaves", "tf-failure-handling"),
        ("objects a `schedule()` leaves", "ratio, ours better (per round)"),
    ),
    (
        "closures/s through `schedule()` + `join()` on 2 workers, 3,000 per loop "
        "(time per closure)",
        "clustercoordinator-end-to-end-2-workers-3000-closures-per-loop",
        ("closures/s through", "TensorFlow"),
        ("closures/s through", "tf-failure-handling"),
        ("closures/s through", "ratio, ours better (per round)"),
    ),
    (
        "the closure queue's `put` + `get` + `mark_finished`, 1 thread",
        "closure-queue",
        ("`put`+`get`+`mark_finished`", "TensorFlow"),
        ("`put`+`get`+`mark_finished`", "tf-failure-handling"),
        ("`put`+`get`+`mark_finished`", "ratio (per round)"),
    ),
    (
        "failure classification of a failed closure (both verdicts)",
        "failure-classification-per-call",
        ("both verdicts", "TensorFlow"),
        ("both verdicts", "tf-failure-handling"),
        ("both verdicts", "ratio (per repeat)"),
    ),
    (
        "a `termination_watcher_fn` notice on one worker: the other worker exits "
        "this long after it",
        "from-a-notice-to-the-exit",
        ("`termination_watcher_fn` notice", "TensorFlow"),
        ("`termination_watcher_fn` notice", "tf-failure-handling"),
        ("`termination_watcher_fn` notice", "ratio"),
    ),
)


def parse(text: str) -> tuple[list, list]:
    """The header and rows of the first Markdown table in ``text``."""
    rows = [_report.cells(line) for line in text.splitlines() if line.startswith("|")]
    return rows[0], rows[2:]


def cell(table: tuple, name: str, ref: tuple) -> str:
    """In ``table`` (header, rows) of file ``name``: the cell of ``ref`` (row, column)."""
    label, column = ref
    header, rows = table
    index = header.index(column)
    for row in rows:
        if row[0].startswith(label):
            return row[index]
    raise LookupError(f"{name}.md has no row starting with {label!r}")


def table(folder: Path) -> str:
    lines = [
        "| | TensorFlow | tf-failure-handling | ours better by |",
        "| --- | --- | --- | --- |",
    ]
    parsed = {name: parse((folder / f"{name}.md").read_text()) for name in {r[1] for r in ROWS}}
    for what, name, tf_ref, ours_ref, ratio_ref in ROWS:
        cells = [cell(parsed[name], name, ref) for ref in (tf_ref, ours_ref, ratio_ref)]
        cells[2] = re.sub(r"\*\*|\s*less\b", "", cells[2])
        lines.append(f"| {what} | {' | '.join(cells)} |")
    return "\n".join(lines)


def rewrite(readme: Path, folder: Path) -> None:
    """Replaces the README's speed table with one built from ``folder``'s tables."""
    text = readme.read_text()
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    readme.write_text(f"{text[:start]}\n{table(folder)}\n{text[end:]}")
