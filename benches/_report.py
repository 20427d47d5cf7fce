"""Formatting shared by the benches: figures and tables as the README prints them.

Every bench ends by printing its README table (Markdown, in the README's words
and units), so that a reader of ``make bench`` can check each figure.
"""

from __future__ import annotations

import statistics
from typing import Iterable, Sequence

TIMES = "\u00d7"  # the README's "x" in ratios
DASH = "\u2013"  # the README's range dash
MICRO = "\u00b5"


def duration(seconds: float) -> str:
    """``42 ns``, ``1.52 us``, ``11.8 us``, ``654 us``, ``1.36 ms``, ``0.110 s`` (micro sign)."""
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


def print_readme_table(title: str, header: Sequence[str], rows: Iterable[Sequence[str]]) -> None:
    """Prints ``title`` and the table, set off from the bench's own output."""
    print()
    print(f"README, {title}:")
    print()
    print(markdown(header, rows))
    print(flush=True)
