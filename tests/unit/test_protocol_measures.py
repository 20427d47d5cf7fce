"""dev/protocol_measures.py counts what it says (issue 51's measures)."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

_PATH = Path(__file__).resolve().parents[2] / "dev" / "protocol_measures.py"
_spec = importlib.util.spec_from_file_location("protocol_measures", _PATH)
measures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(measures)


def test_a_clock_passed_on_counts_as_a_read():
    tree = ast.parse(
        "import time\n"
        "from time import sleep, monotonic as mono\n"
        "def f(clock=time.monotonic):\n"
        "    time.sleep(1)\n"
        "    sleep(1)\n"
        "    return mono() + time.time()\n"
        "time.strftime('%Y')\n"
    )
    found = sorted(measures.clock_calls(tree))
    assert found == [
        (3, "time.monotonic"),
        (4, "time.sleep"),
        (5, "sleep"),
        (6, "mono"),
        (6, "time.time"),
    ]


def test_constructors_over_four_parts_are_named_functions_and_values_are_not_parts():
    tree = ast.parse(
        "class Wide:\n"
        "    def __init__(self, a: A, b: 'x.B', c: C, d: D, e: E, f: Callable, n: int):\n"
        "        pass\n"
        "class Narrow:\n"
        "    def __init__(self, ctx: Context, a: A, b: B, c: C, f: Callable, p: Path):\n"
        "        pass\n"
    )
    assert measures.wide_constructors(tree) == [(2, "Wide", ["a", "b", "c", "d", "e"])]


def test_the_package_meets_the_measures_it_has_reached():
    """The measures issue 51 brought to their goal stay there: a change that adds a clock
    read, a long file or a wide constructor to the package is named here."""
    places = measures.measure()
    assert places["policy"] == []
    assert places["clock"] == []
    assert places["long_files"] == []
    assert places["wide"] == []
    assert len(places["binding_clock"]) == 1
