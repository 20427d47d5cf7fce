"""First calls of the native entry points from many threads at once (issue 26).

The coordinator hung when several worker threads classified their first failed
closures at the same moment: the type-layout check sat in a std ``OnceLock``
whose initializer ran Python, so a thread waiting on the cell held the GIL the
initializer needed. These tests make such first calls in fresh interpreters,
eight threads released by one barrier, with a switch interval of 1 µs so that
an initializer that runs Python is interrupted at once.

Success: every thread returns (the child prints ``ok``, exit 0). A hang is
turned into a failure by the child's own bound (``faulthandler`` dumps every
thread's stack and exits 1); the subprocess timeout only backs that up.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.unit import first_calls_child

CHILD = first_calls_child.__file__
#: Backs up the child's own bound (``HANG_BOUND``); never decides a verdict alone.
PROCESS_BOUND = first_calls_child.HANG_BOUND + 60


def _run(scenario: str, threads: int = 8) -> None:
    env = dict(os.environ)
    env.pop("PYTHONFAULTHANDLER", None)
    try:
        done = subprocess.run(
            [sys.executable, CHILD, scenario, str(threads)],
            capture_output=True,
            text=True,
            timeout=PROCESS_BOUND,
            env=env,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{scenario}: the child hung past {PROCESS_BOUND:.0f} s\n{e.stderr}")
    assert done.returncode == 0 and f"ok {scenario}" in done.stdout, (
        f"{scenario}: exit {done.returncode} (1 = hung, stacks below)\n"
        f"--- stderr ---\n{done.stderr[-6000:]}"
    )


@pytest.mark.parametrize("attempt", range(6))
def test_eight_threads_classify_their_first_failures_at_once(attempt: int) -> None:
    """The reported hang: 10 of 10 such processes hung before the fix."""
    _run("classifier")


@pytest.mark.parametrize("scenario", sorted(first_calls_child.SCENARIOS))
def test_first_call_of_each_entry_point_from_eight_threads(scenario: str) -> None:
    _run(scenario)


@pytest.mark.parametrize("attempt", range(3))
def test_first_calls_of_every_entry_point_in_every_order(attempt: int) -> None:
    _run("everything")
