"""While a handler is open it owns the notice (issue 8): real signals, real processes.

Each scenario runs in a fresh interpreter (``test_signals.run_script``: local mode,
``testing.FakeCheckpoint``, TensorFlow's import blocked). The outcome that counts as
success is stated per test: exit 42 with a checkpoint at the agreed step, a notice
absorbed, the default disposition back in a forked child, and so on.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from .conftest import BLOCK_TENSORFLOW, NO_METADATA_SERVER
from .test_signals import _details, run_script, saved_checkpoint

PREVIOUS_HANDLERS = {
    # absltest and TF's multi-process test harness do this in every process.
    "faulthandler-chain": "import faulthandler\nfaulthandler.register(signal.SIGTERM, chain=True)",
    "python-handler-that-exits": "signal.signal(signal.SIGTERM, lambda *_: sys.exit(3))",
    "python-handler-that-records": (
        "signal.signal(signal.SIGTERM, lambda *_: emit('previous_called'))"
    ),
    "none": "pass",
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("previous", sorted(PREVIOUS_HANDLERS))
def test_a_handler_installed_before_does_not_prevent_the_save(tmp_path, previous):
    """Success: exit 42 with the checkpoint of run 4 (the notice after run 3 agrees on the
    next run, as TF); the earlier handler is not called."""
    rc, events, proc = run_script(
        tmp_path,
        PREVIOUS_HANDLERS[previous]
        + """
h = PreemptionCheckpointHandler(None, ckpt, CKPT_DIR)
for _ in range(3):
    h.run(step)
os.kill(os.getpid(), signal.SIGTERM)
wait_for_attention(h)
train_until_exit(h)
""",
    )
    assert rc == 42, _details(proc)
    assert "previous_called" not in events, events
    assert saved_checkpoint(tmp_path) == (4, 4), _details(proc)


@pytest.mark.timeout(60)
def test_close_gives_the_notice_back_to_the_earlier_handler(tmp_path):
    """Success: after close(), SIGTERM reaches the Python handler installed before."""
    rc, events, proc = run_script(
        tmp_path,
        """
got = []
signal.signal(signal.SIGTERM, lambda *_: got.append(1))
h = PreemptionCheckpointHandler(None, ckpt, CKPT_DIR)
h.run(step)
h.close()
os.kill(os.getpid(), signal.SIGTERM)
deadline = time.monotonic() + 30
while not got and time.monotonic() < deadline:
    time.sleep(0.001)
emit("done", calls=len(got), handler=signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL)
""",
    )
    assert rc == 0, _details(proc)
    assert events["done"]["calls"] == 1, events


@pytest.mark.timeout(60)
@pytest.mark.parametrize("run", range(5))
def test_the_newest_of_two_open_handlers_owns_the_notice(tmp_path, run):
    """tf_keras leaves the handler of an earlier fit open. Success: the newer one saves at
    run 3 and exits 42; the older one saves nothing and its exit_fn is never called; the
    interpreter's exit is not held up by the older one (no close() anywhere)."""
    rc, events, proc = run_script(
        tmp_path,
        """
old_ckpt = testing.FakeCheckpoint(v=testing.FakeVariable(0))
older = PreemptionCheckpointHandler(
    None, old_ckpt, CKPT_DIR + "-older", TerminationConfig(exit_fn=lambda: emit("older_exit"))
)
older.run(lambda: None)
newer = PreemptionCheckpointHandler(None, ckpt, CKPT_DIR)
for _ in range(2):
    newer.run(step)
os.kill(os.getpid(), signal.SIGTERM)
wait_for_attention(newer)
train_until_exit(newer)
""",
    )
    assert rc == 42, _details(proc)
    assert "older_exit" not in events, events
    assert saved_checkpoint(tmp_path) == (3, 3), _details(proc)
    assert not (tmp_path / "ckpt-older" / "checkpoint").exists(), "the older handler saved"


@pytest.mark.timeout(60)
def test_after_an_exit_fn_that_returns_further_notices_are_absorbed(tmp_path):
    """orbit's keep_running_after_save. Success: the second SIGTERM is absorbed (the
    process trains on and ends with 0, one checkpoint); after close() the default
    disposition is back (a third SIGTERM ends the process with -SIGTERM)."""
    rc, events, proc = run_script(
        tmp_path,
        """
exits = []
h = PreemptionCheckpointHandler(
    None, ckpt, CKPT_DIR, TerminationConfig(exit_fn=lambda: exits.append(h._run_counter))
)
h.run(step)
os.kill(os.getpid(), signal.SIGTERM)
wait_for_attention(h)
while not exits:
    h.run(step)
handled = h._notices_handled
os.kill(os.getpid(), signal.SIGTERM)
deadline = time.monotonic() + 30
while h._notices_handled == handled and time.monotonic() < deadline:
    time.sleep(0.001)
for _ in range(5):
    h.run(step)
emit("trained_on", exits=exits, runs=h._run_counter, handled=h._notices_handled)
h.close()
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(30)
emit("survived_close")
""",
    )
    assert rc == -signal.SIGTERM, _details(proc)
    trained = events["trained_on"]
    assert trained["exits"] == [2], events
    assert trained["handled"] == 2, "the second notice was not seen"
    assert trained["runs"] == 2 + 1 + 5
    assert "survived_close" not in events
    assert saved_checkpoint(tmp_path) == (2, 2)


@pytest.mark.timeout(60)
def test_a_forked_child_gets_the_default_disposition_back(tmp_path):
    """Success: SIGTERM ends a forked child (no dispatcher thread there); the parent's
    handler sees nothing of it and still saves at its own notice."""
    rc, events, proc = run_script(
        tmp_path,
        """
h = PreemptionCheckpointHandler(None, ckpt, CKPT_DIR)
h.run(step)
pid = os.fork()
if pid == 0:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)
    os._exit(5)
_, status = os.waitpid(pid, 0)
killed = os.WIFSIGNALED(status)
emit("child", signalled=killed, signal=os.WTERMSIG(status) if killed else None,
     attention=h._attention)
os.kill(os.getpid(), signal.SIGTERM)
wait_for_attention(h)
train_until_exit(h)
""",
    )
    assert rc == 42, _details(proc)
    child = events["child"]
    assert child == {"signalled": True, "signal": int(signal.SIGTERM), "attention": False}, events
    assert saved_checkpoint(tmp_path) == (2, 2)


@pytest.mark.timeout(60)
def test_a_later_signal_handler_is_warned_about(tmp_path):
    """Success: replacing the handler's SIGTERM disposition logs one warning naming it."""
    rc, events, proc = run_script(
        tmp_path,
        """
import logging
records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append(record.getMessage())
logging.getLogger("tf_failure_handling").addHandler(Keep())
h = PreemptionCheckpointHandler(None, ckpt, CKPT_DIR)
signal.signal(signal.SIGTERM, lambda *_: None)
deadline = time.monotonic() + 30
while not any("was replaced" in r for r in records) and time.monotonic() < deadline:
    time.sleep(0.01)
time.sleep(0.3)
emit("warnings", messages=[r for r in records if "was replaced" in r])
""",
    )
    assert rc == 0, _details(proc)
    messages = events["warnings"]["messages"]
    assert len(messages) == 1, events
    assert f"signal {int(signal.SIGTERM)}" in messages[0]


@pytest.mark.timeout(60)
def test_close_leaves_a_later_handler_in_place_and_a_new_handler_still_works(tmp_path):
    """Success: a Python handler installed after ours survives close(); a handler built
    after that owns SIGTERM again (exit 42 with a checkpoint, the Python one not called)."""
    rc, events, proc = run_script(
        tmp_path,
        """
got = []
other = testing.FakeCheckpoint(v=testing.FakeVariable(0))
first = PreemptionCheckpointHandler(None, other, CKPT_DIR + "-first")
signal.signal(signal.SIGTERM, lambda *_: got.append(1))
first.close()
os.kill(os.getpid(), signal.SIGTERM)
deadline = time.monotonic() + 30
while not got and time.monotonic() < deadline:
    time.sleep(0.001)
emit("after_close", calls=len(got))
h = PreemptionCheckpointHandler(None, ckpt, CKPT_DIR)
h.run(step)
os.kill(os.getpid(), signal.SIGTERM)
wait_for_attention(h)
emit("owned", calls=len(got))
train_until_exit(h)
""",
    )
    assert rc == 42, _details(proc)
    assert events["after_close"]["calls"] == 1
    assert events["owned"]["calls"] == 1, "the later Python handler ran while a handler was open"
    assert saved_checkpoint(tmp_path) == (2, 2)


#: A script whose own exit hook runs after the package's (``atexit`` runs the last
#: registered first, and this one is registered before the package is imported): it
#: sends the signal the process then gets during its exit, as SLURM's time-limit warning
#: arrived during TensorFlow's teardown of a finished run.
SIGNAL_DURING_EXIT = """
import atexit, os, signal, sys, time
SIG = getattr(signal, sys.argv[2])

def during_exit():
    print("EVENT {\\"event\\": \\"signalled\\"}", flush=True)
    os.kill(os.getpid(), SIG)
    time.sleep(0.5)  # a fatal default action ends the process here
    print("EVENT {\\"event\\": \\"lived\\"}", flush=True)

atexit.register(during_exit)
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "sig, code", [("SIGUSR1", 0), ("SIGUSR2", 0), ("SIGTERM", -signal.SIGTERM)]
)
def test_a_warning_signal_during_the_exit_does_not_end_a_finished_run(tmp_path, sig, code):
    """Success: a handler that watched SIGUSR1/SIGUSR2 and whose training ended, getting
    one during the interpreter's exit, exits 0 as its script asked (the default action
    would end it with 128 + 10 and SLURM mark the job FAILED); SIGTERM is no warning: its
    default is back and ends the process (-15)."""
    script = tmp_path / "script.py"
    script.write_text(
        BLOCK_TENSORFLOW
        + SIGNAL_DURING_EXIT
        + """
from tf_failure_handling import PreemptionCheckpointHandler, TerminationConfig, testing

w = testing.FakeVariable(0)
config = TerminationConfig(signals=[signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2])
h = PreemptionCheckpointHandler(None, testing.FakeCheckpoint(w=w), sys.argv[1], config)
for _ in range(3):
    h.run(lambda: w.assign_add(1))
print("EVENT {\\"event\\": \\"done\\"}", flush=True)
"""
    )
    env = dict(os.environ, GCE_METADATA_IP=NO_METADATA_SERVER, PYTHONUNBUFFERED="1")
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "ckpt"), sig],
        env=env,
        capture_output=True,
        text=True,
        timeout=55,
        cwd=str(tmp_path),
        stdin=subprocess.DEVNULL,
        check=False,
    )
    events = [
        line.split('"event": "')[1].split('"')[0]
        for line in proc.stdout.splitlines()
        if line.startswith("EVENT ")
    ]
    assert events[:2] == ["done", "signalled"], _details(proc)
    assert proc.returncode == code, _details(proc)
    assert ("lived" in events) == (code == 0), _details(proc)
