"""The exit guard (``_protocol/exit_guard.py``, ``src/python/exit_guard.rs``): after the
last save, a process still in its exit shortly before the deadline ends with its exit
code; a process that trains on is never ended by it.

Each case runs a child process. The child's slow exit blocks for good (an ``atexit``
hook, or a non-daemon thread, waiting on an event nobody sets), so only the guard can
end it: no verdict depends on how fast the machine is, and the bound only turns a hang
into a failure.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from tf_failure_handling import _native
from tf_failure_handling._protocol import exit_guard

#: Bounds a child that the guard fails to end (then the test fails, saying so).
CHILD_BOUND = 120.0

PRELUDE = """
import atexit, sys, threading, time
from tf_failure_handling import _native
from tf_failure_handling._protocol import exit_guard
# The deadline 3 s from now on the handler's clock (monotonic), as after a last save.
now = time.monotonic()
"""


def _child(body: str) -> subprocess.CompletedProcess:
    code = PRELUDE + textwrap.dedent(body)
    try:
        return subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=CHILD_BOUND
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the child did not end within {CHILD_BOUND:.0f}s:\n{e.stderr}")


@pytest.mark.parametrize("slow_part", ["atexit hook", "non-daemon thread"])
def test_an_exit_that_runs_past_the_guard_ends_with_the_exit_code(slow_part):
    """Success: the child, whose exit never ends by itself, exits 42, and says why."""
    if slow_part == "atexit hook":
        slow = "atexit.register(threading.Event().wait)"
    else:
        slow = "threading.Thread(target=threading.Event().wait, daemon=False).start()"
    done = _child(
        f"""
        {slow}
        assert exit_guard.arm(now + 3.0, now, 42) is not None
        sys.exit(0)
        """
    )
    assert done.returncode == 42, done.stderr
    assert "ending it now with exit code 42" in done.stderr


def test_a_process_that_trains_on_is_left_alone():
    """A SystemExit caught (as TensorFlow's own single-worker tests catch it): the guard's
    moment passes while the process is not in its exit, so it stands down; the exit that
    comes later, slow or not, keeps its own code. Success: exit 0."""
    done = _child(
        """
        assert exit_guard.arm(now + 2.0, now, 42) is not None
        start = time.monotonic()
        while _native.exit_guards_waiting():
            assert time.monotonic() - start < 60, "the guard never stood down"
            time.sleep(0.05)
        # Its moment has passed: a slow exit now is the process's own.
        atexit.register(time.sleep, 0.5)
        sys.exit(0)
        """
    )
    assert done.returncode == 0, done.stderr
    assert "ending it now" not in done.stderr


def test_a_new_handler_stands_the_guard_down():
    """``disarm`` (a new handler's constructor calls it): a guard armed before it does not
    end the process, even one whose exit is slow past the guard's moment. The child's
    exit waits until no guard waits, then ends. Success: exit 0."""
    done = _child(
        """
        assert exit_guard.arm(now + 2.0, now, 42) is not None
        exit_guard.disarm()
        def slow_exit():
            start = time.monotonic()
            while _native.exit_guards_waiting():
                assert time.monotonic() - start < 60, "the guard never stood down"
                time.sleep(0.05)
        atexit.register(slow_exit)
        sys.exit(0)
        """
    )
    assert done.returncode == 0, done.stderr
    assert "ending it now" not in done.stderr


@pytest.mark.parametrize(
    "deadline, now", [(None, 0.0), (10.0, 10.0 - _native.EXIT_GUARD_LEAD), (10.0, 12.0)]
)
def test_no_deadline_or_one_too_close_arms_nothing(deadline, now):
    before = _native.exit_guards_waiting()
    assert exit_guard.arm(deadline, now, 42) is None
    assert _native.exit_guards_waiting() == before


def test_the_handler_constructor_disarms(make_handler, tmp_path, monkeypatch):
    """The constructor's call is what stands a guard down when training goes on."""
    from tf_failure_handling import testing

    calls = []
    monkeypatch.setattr(exit_guard, "disarm", lambda: calls.append(1))
    make_handler(testing.FakeCheckpoint(w=testing.FakeVariable(0)), tmp_path / "ckpt")
    assert calls == [1]
