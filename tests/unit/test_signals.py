"""Real signals, each in a fresh subprocess so pytest's own signal state is never touched.

The scripts use local mode and ``testing.FakeCheckpoint`` and block TensorFlow's import,
so each subprocess starts in a fraction of a second.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from .conftest import BLOCK_TENSORFLOW, NO_METADATA_SERVER

PRELUDE = (
    BLOCK_TENSORFLOW
    + """
import json, os, signal, sys, threading, time

from tf_failure_handling import PreemptionCheckpointHandler, TerminationConfig, _native, testing

CKPT_DIR = sys.argv[1]
w = testing.FakeVariable(0)
ckpt = testing.FakeCheckpoint(w=w)


def emit(kind, **data):
    print("EVENT", json.dumps(dict(data, event=kind)), flush=True)


def step():
    w.assign_add(1)


def wait_for_attention(handler, seconds=30.0):
    deadline = time.monotonic() + seconds
    while not handler._attention and time.monotonic() < deadline:
        time.sleep(0.0005)


def train_until_exit(handler, seconds=30.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        handler.run(step)
        time.sleep(0.001)
    emit("not_exited", runs=handler._run_counter)
    sys.exit(3)
"""
)


def run_script(tmp_path, body: str, timeout: float = 55.0):
    """Runs PRELUDE + body in a fresh interpreter; returns (returncode, events, completed)."""
    script = tmp_path / "script.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    env = dict(os.environ)
    env["GCE_METADATA_IP"] = NO_METADATA_SERVER
    env.pop("TF_FAILURE_HANDLING_PEER_TIMEOUT", None)
    env["PYTHONUNBUFFERED"] = "1"
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "ckpt")],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=str(tmp_path),
        stdin=subprocess.DEVNULL,
        check=False,
    )
    events = {}
    for line in proc.stdout.splitlines():
        if line.startswith("EVENT "):
            e = json.loads(line[6:])
            events[e.pop("event")] = e
    return proc.returncode, events, proc


def saved_checkpoint(tmp_path):
    """(w, checkpointed_runs) of the checkpoint on disk, or None."""
    directory = tmp_path / "ckpt"
    index = directory / "checkpoint"
    if not index.exists():
        return None
    data = json.loads((directory / index.read_text().strip()).read_text())
    return data["w"], data["checkpointed_runs"]


def _details(proc) -> str:
    return f"rc={proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"


@pytest.mark.timeout(60)
def test_handler_built_off_the_main_thread_sees_sigterm_and_exits_42(tmp_path):
    rc, events, proc = run_script(
        tmp_path,
        """
        box = []
        t = threading.Thread(
            target=lambda: box.append(PreemptionCheckpointHandler(None, ckpt, CKPT_DIR)),
            name="builder",
        )
        t.start()
        t.join()
        h = box[0]
        for _ in range(3):
            h.run(step)
        os.kill(os.getpid(), signal.SIGTERM)
        wait_for_attention(h)
        emit("noticed", attention=h._attention)
        train_until_exit(h)
        """,
    )
    assert rc == 42, _details(proc)
    assert "not_exited" not in events
    assert events["noticed"]["attention"] is True
    saved = saved_checkpoint(tmp_path)
    assert saved is not None, _details(proc)
    assert saved[0] == saved[1] == 4


@pytest.mark.timeout(60)
def test_sigterm_is_watched_even_with_a_watcher_fn(tmp_path):
    rc, events, proc = run_script(
        tmp_path,
        """
        calls = []

        def watcher():
            calls.append(1)
            return False

        def exit_fn():
            emit("exit", watcher_calls=len(calls))
            sys.exit(42)

        h = PreemptionCheckpointHandler(
            None, ckpt, CKPT_DIR, TerminationConfig(termination_watcher_fn=watcher, exit_fn=exit_fn)
        )
        for _ in range(2):
            h.run(step)
        os.kill(os.getpid(), signal.SIGTERM)
        wait_for_attention(h)
        train_until_exit(h)
        """,
    )
    assert rc == 42, _details(proc)
    assert events["exit"]["watcher_calls"] >= 1, "the watcher fn was never polled"
    assert saved_checkpoint(tmp_path) == (3, 3)


@pytest.mark.timeout(60)
def test_watcher_fn_alone_triggers_a_notice(tmp_path):
    rc, _events, proc = run_script(
        tmp_path,
        """
        fire = threading.Event()
        h = PreemptionCheckpointHandler(
            None, ckpt, CKPT_DIR, TerminationConfig(termination_watcher_fn=fire.is_set)
        )
        for _ in range(5):
            h.run(step)
        fire.set()
        train_until_exit(h)
        """,
    )
    assert rc == 42, _details(proc)
    saved = saved_checkpoint(tmp_path)
    assert saved is not None and saved[0] == saved[1] >= 6


@pytest.mark.timeout(60)
def test_configured_signals_replace_sigterm(tmp_path):
    rc, _events, proc = run_script(
        tmp_path,
        """
        h = PreemptionCheckpointHandler(
            None, ckpt, CKPT_DIR, TerminationConfig(signals=[signal.SIGUSR1])
        )
        for _ in range(2):
            h.run(step)
        os.kill(os.getpid(), signal.SIGUSR1)
        wait_for_attention(h)
        train_until_exit(h)
        """,
    )
    assert rc == 42, _details(proc)
    assert saved_checkpoint(tmp_path) == (3, 3)


@pytest.mark.timeout(60)
def test_sigterm_is_not_watched_when_other_signals_are_configured(tmp_path):
    rc, events, proc = run_script(
        tmp_path,
        """
        h = PreemptionCheckpointHandler(
            None, ckpt, CKPT_DIR, TerminationConfig(signals=[signal.SIGUSR1])
        )
        h.run(step)
        emit("ready")
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        emit("survived")
        """,
    )
    assert rc == -signal.SIGTERM, _details(proc)
    assert "ready" in events and "survived" not in events
    assert saved_checkpoint(tmp_path) is None


@pytest.mark.timeout(60)
def test_close_restores_the_previous_python_handler(tmp_path):
    rc, events, proc = run_script(
        tmp_path,
        """
        import ctypes

        def sigaction_handler(signum):  # the process's handler: the first field
            buf = ctypes.create_string_buffer(256)
            assert ctypes.CDLL(None).sigaction(signum, None, buf) == 0
            return buf.raw[: ctypes.sizeof(ctypes.c_void_p)]

        got = []
        signal.signal(signal.SIGTERM, lambda s, f: got.append(s))
        python_action = sigaction_handler(signal.SIGTERM)
        h = PreemptionCheckpointHandler(
            None, ckpt, CKPT_DIR, TerminationConfig(exit_fn=lambda: emit("exit_fn"))
        )
        h.run(step)
        installed = sigaction_handler(signal.SIGTERM) != python_action
        h.close()
        restored = sigaction_handler(signal.SIGTERM) == python_action
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            time.sleep(0.001)
        for _ in range(5):
            h.run(step)
        emit(
            "done",
            python_handler_calls=len(got),
            installed=installed,
            restored=restored,
            attention=h._attention,
            tensorflow_imported="tensorflow" in sys.modules,
        )
        """,
    )
    assert rc == 0, _details(proc)
    assert "exit_fn" not in events
    done = events["done"]
    assert done["python_handler_calls"] == 1
    assert done["installed"], "the handler installed no sigaction of its own"
    assert done["restored"], "the handler's sigaction is still installed after close()"
    assert done["attention"] is False
    assert done["tensorflow_imported"] is False
    assert saved_checkpoint(tmp_path) is None


@pytest.mark.timeout(60)
def test_close_restores_the_default_disposition(tmp_path):
    rc, events, proc = run_script(
        tmp_path,
        """
        h = PreemptionCheckpointHandler(None, ckpt, CKPT_DIR)
        h.run(step)
        h.close()
        emit("closed")
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        emit("survived")
        """,
    )
    assert rc == -signal.SIGTERM, _details(proc)
    assert "closed" in events and "survived" not in events
    assert saved_checkpoint(tmp_path) is None


@pytest.mark.timeout(60)
def test_two_handlers_share_the_signal_until_both_close(tmp_path):
    rc, _events, proc = run_script(
        tmp_path,
        """
        other = testing.FakeCheckpoint(v=testing.FakeVariable(0))
        first = PreemptionCheckpointHandler(
            None, other, CKPT_DIR + "-first", TerminationConfig(exit_fn=lambda: None)
        )
        second = PreemptionCheckpointHandler(None, ckpt, CKPT_DIR)
        first.close()
        second.run(step)
        os.kill(os.getpid(), signal.SIGTERM)
        wait_for_attention(second)
        train_until_exit(second)
        """,
    )
    assert rc == 42, _details(proc)
    assert saved_checkpoint(tmp_path) == (2, 2)
    assert not (tmp_path / "ckpt-first").exists()


@pytest.mark.timeout(60)
def test_sigterm_during_a_blocking_step_saves_after_it(tmp_path):
    """The notice lands while the main thread is blocked inside the step."""
    rc, _events, proc = run_script(
        tmp_path,
        """
        h = PreemptionCheckpointHandler(None, ckpt, CKPT_DIR)

        def slow_step():
            w.assign_add(1)
            if w.numpy() == 3:
                os.kill(os.getpid(), signal.SIGTERM)
                wait_for_attention(h)  # still inside the step when the notice is handled

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            h.run(slow_step)
        emit("not_exited")
        """,
    )
    assert rc == 42, _details(proc)
    # Noticed during run 3: published before run 4, saved after it.
    assert saved_checkpoint(tmp_path) == (4, 4)
