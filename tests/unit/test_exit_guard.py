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

#: Counts the guards still waiting, from outside the binding (no test-only entry point).
GUARDS_WAITING = """
def guards_waiting():
    # The exit guard's threads still alive: Rust threads named tfh-exit-guard (each
    # ends once it stood down or its moment passed).
    import os
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                names.append(f.read().strip())
        except OSError:
            pass
    return names.count("tfh-exit-guard")
"""
_guards: dict = {}
exec(GUARDS_WAITING, _guards)
guards_waiting = _guards["guards_waiting"]

PRELUDE = (
    """
import atexit, sys, threading, time
from tf_failure_handling import _native
from tf_failure_handling._protocol import exit_guard
# The deadline 3 s from now on the handler's clock (monotonic), as after a last save.
now = time.monotonic()
"""
    + GUARDS_WAITING
)


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
        while guards_waiting():
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
            while guards_waiting():
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
    before = guards_waiting()
    assert exit_guard.arm(deadline, now, 42) is None
    assert guards_waiting() == before


def test_the_handler_constructor_disarms(make_handler, tmp_path, monkeypatch):
    """The constructor's call is what stands a guard down when training goes on."""
    from tf_failure_handling import testing

    calls = []
    monkeypatch.setattr(exit_guard, "disarm", lambda: calls.append(1))
    make_handler(testing.FakeCheckpoint(w=testing.FakeVariable(0)), tmp_path / "ckpt")
    assert calls == [1]


# Backstop above its own bound: the child's, CHILD_BOUND (+ 30 s).
@pytest.mark.timeout(CHILD_BOUND + 30)
def test_a_process_that_catches_the_exit_trains_on_and_ends_by_itself_keeps_its_code(tmp_path):
    """Issue 60: a real handler on Kubernetes with a stated grace period of 20 s saves at
    a SIGTERM and raises the restart code's SystemExit, with the guard armed (checked).
    The process catches it, trains on through the handler, finishes and calls
    ``sys.exit(0)``. Its exit then waits until no guard waits: a guard still armed at its
    moment (19 s after the notice) would end it with 42 first; one that stood down when
    training went on lets it end with its own code. Success: exit 0, and the exit never
    waited out a guard (no "ending it now" line). The 20 s is the guard's moment, not a
    margin: the verdict holds however long each part takes."""
    from .test_signals import run_script

    rc, events, proc = run_script(
        tmp_path,
        GUARDS_WAITING
        + textwrap.dedent(
            """
        import atexit

        os.environ["KUBERNETES_SERVICE_HOST"] = "10.0.0.1"
        os.environ["TF_FAILURE_HANDLING_KUBERNETES_GRACE_PERIOD"] = "20"
        h = PreemptionCheckpointHandler(None, ckpt, CKPT_DIR)
        for _ in range(3):
            h.run(step)
        os.kill(os.getpid(), signal.SIGTERM)
        wait_for_attention(h)
        try:
            train_until_exit(h)
        except SystemExit as e:
            emit("caught", code=e.code, waiting=guards_waiting())
        for _ in range(5):  # training goes on, and ends by itself
            h.run(step)


        def exit_waits_for_the_guards():
            bound = time.monotonic() + 60
            while guards_waiting():
                if time.monotonic() > bound:
                    emit("guard_never_stood_down")
                    os._exit(3)
                time.sleep(0.01)


        atexit.register(exit_waits_for_the_guards)
        sys.exit(0)
        """
        ),
        timeout=CHILD_BOUND,
    )
    details = f"rc={rc}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    assert events.get("caught") == {"code": 42, "waiting": 1}, details
    assert rc == 0, details
    assert "ending it now" not in proc.stderr, details
