"""Formatting shared by the benches: figures and tables as the README prints them.

Every bench ends by printing its README table (Markdown, in the README's words
and units), so that a reader of ``make bench`` can check each figure.
"""

from __future__ import annotations

import os
import platform
import re
import statistics
import subprocess
import sys
import time
from typing import Iterable, Sequence

TIMES = "\u00d7"  # the README's "x" in ratios
DASH = "\u2013"  # the README's range dash
MICRO = "\u00b5"


def duration(seconds: float) -> str:
    """``42 ns``, ``1.52 us``, ``11.8 us``, ``654 us``, ``1.36 ms``, ``0.110 s`` (micro sign)."""
    if seconds < 0:
        return "-" + duration(-seconds)
    ns = seconds * 1e9
    if ns < 1_000:
        return f"{ns:.0f} ns"
    if ns < 10_000:
        return f"{ns / 1e3:.2f} {MICRO}s"
    if ns < 100_000:
        return f"{ns / 1e3:.1f} {MICRO}s"
    if ns < 1_000_000:
        return f"{ns / 1e3:.0f} {MICRO}s"
    if seconds < 0.01:
        return f"{seconds * 1e3:.2f} ms"
    if seconds < 0.1:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.3f} s"


def per_second(rate: float) -> str:
    """``9.6M``, ``53k``, ``148``."""
    if rate >= 1e6:
        return f"{rate / 1e6:.1f}M"
    if rate >= 1e4:
        return f"{rate / 1e3:.0f}k"
    if rate >= 1e3:
        return f"{rate / 1e3:.1f}k"
    return f"{rate:.0f}"


def ratio(r: float) -> str:
    """``123x``, ``4.4x``, ``1.07x`` (with the multiplication sign)."""
    digits = 0 if r >= 10 else 1 if r >= 2 else 2
    return f"{r:.{digits}f}{TIMES}"


def ratio_range(ratios: Iterable[float]) -> str:
    """``105-131x``, ``1.0-1.4x`` (en dash, multiplication sign): lowest and highest;
    two decimals below 2x."""
    values = sorted(ratios)
    lo, hi = values[0], values[-1]
    digits = 0 if hi >= 10 else 1 if hi >= 2 else 2
    return f"{lo:.{digits}f}{DASH}{hi:.{digits}f}{TIMES}"


def median(values: Iterable[float]) -> float:
    return statistics.median(list(values))


def markdown(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A Markdown table, as the README has it."""

    def line(cells: Sequence[str]) -> str:
        return "|" + "".join(f" {c} |" if c else " |" for c in cells)

    return "\n".join([line(header), line(["---"] * len(header)), *map(line, rows)])


def cells(row: str) -> list:
    """The cells of a table row as :func:`markdown` writes it: ``| a | b |`` -> a, b."""
    return [c.strip() for c in row.strip().strip("|").split("|")]


def print_readme_table(title: str, header: Sequence[str], rows: Iterable[Sequence[str]]) -> None:
    """Prints ``title`` and the table, set off from the bench's own output; under
    ``make figures`` (:data:`FIGURES_ENV` set) also writes it there
    (:func:`write_figure`)."""
    table = markdown(header, list(rows))
    print()
    print(f"README, {title}:")
    print()
    print(table)
    print(flush=True)
    write_figure(title, table)


#: The folder ``make figures`` writes every table into (``docs/figures``); unset, the
#: benches only print.
FIGURES_ENV = "TFH_FIGURES_DIR"


def slug(title: str) -> str:
    """``run() overhead, per call (9 rounds)`` -> ``run-overhead-per-call``: the file
    name leaves out what is in parentheses (counts of the run), so a page's include
    holds whatever the run's options."""
    return re.sub(r"[^a-z0-9]+", "-", title.split(" (")[0].lower()).strip("-")


def _git(*args: str) -> str:
    try:
        out = subprocess.run(
            ["git", *args],
            cwd=os.path.dirname(os.path.abspath(__file__)),
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def provenance() -> str:
    """Where a table comes from: the command, the commit (and whether the working
    tree differed from it), the date and the machine."""
    commit = _git("rev-parse", "--short=10", "HEAD") or "unknown"
    if _git("status", "--porcelain", "--untracked-files=no", "--", "src", "python", "benches"):
        commit += " with uncommitted changes"
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    if os.path.basename(os.path.dirname(sys.argv[0])) == "pytest":
        script = "-m pytest"  # python -m pytest: argv[0] is pytest/__main__.py
    else:
        script = os.path.relpath(sys.argv[0], os.path.dirname(os.path.dirname(__file__)))
    command = " ".join(["python", script, *sys.argv[1:]])
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return (
        f"Printed by `{command}` at commit `{commit}` on {when}; "
        f"{os.cpu_count()} CPUs ({cpu}), Python {platform.python_version()}."
    )


def write_figure(title: str, text: str) -> None:
    """Writes ``text`` (a table or a list of figures) with its provenance to
    ``$TFH_FIGURES_DIR/<slug of title>.md``, when that variable is set."""
    folder = os.environ.get(FIGURES_ENV)
    if not folder:
        return
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, slug(title) + ".md")
    body = f"<!-- generated by make figures: do not edit -->\n{text}\n\n*{provenance()}*\n"
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(body)
    os.replace(tmp, path)
