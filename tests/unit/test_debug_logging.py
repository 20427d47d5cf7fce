"""DEBUG logging must not deadlock anything (no Rust lock is held while Python runs).

pyo3-log turns every Rust ``log::debug!`` into a Python ``logging`` call, which needs
the GIL; a Rust mutex held across one, while another thread holds the GIL and waits for
that mutex, deadlocks. Each scenario runs in a fresh process with
``logging.basicConfig(level=logging.DEBUG)`` and a handler that does I/O (so the logging
call releases the GIL). Success: the scenario finishes (exit 0) and prints its result;
the subprocess bound only turns a hang into a failure.
"""

from __future__ import annotations

import pytest

from .test_signals import _details, run_script

#: The SimulatedCluster timeout of the cluster scenario, whose script runs the cluster
#: twice in sequence; the script's bound is above both runs.
CLUSTER_BOUND = 120.0
CLUSTER_SCRIPT_BOUND = 2 * CLUSTER_BOUND + 30
DEBUG_LOGGING = """
import logging


native_records = []


class SlowIO(logging.Handler):
    def emit(self, record):
        if record.name.startswith("_native"):
            native_records.append(record.name)
        os.write(devnull, self.format(record).encode() + b"\\n")
        time.sleep(0.0005)


devnull = os.open(os.devnull, os.O_WRONLY)
logging.basicConfig(level=logging.DEBUG, handlers=[SlowIO()])
"""


# Backstop above its own bound: the script's CLUSTER_SCRIPT_BOUND (+ 30 s).
@pytest.mark.timeout(CLUSTER_SCRIPT_BOUND + 30)
def test_simulated_cluster_of_8_under_debug_logging(tmp_path):
    """The README's SimulatedCluster example with 8 workers (it hung every time)."""
    rc, events, proc = run_script(
        tmp_path,
        DEBUG_LOGGING
        + f"CLUSTER_BOUND = {CLUSTER_BOUND!r}\n"
        + """
def worker(ctx):
    w = testing.FakeVariable(0.0)
    handler = ctx.handler(testing.FakeCheckpoint(w=w), ctx.cluster.checkpoint_dir)
    for step in range(handler.total_run_calls, 100):
        if step == 10 and ctx.index == 1 and ctx.attempt == 0:
            ctx.cluster.preempt(1)
        handler.run(lambda: w.assign_add(ctx.all_reduce(1.0)))
    return w.numpy()


cluster = testing.SimulatedCluster(num_workers=8, root=CKPT_DIR, timeout=CLUSTER_BOUND)
first = sorted({r.exit_code for r in cluster.run(worker)}, key=str)
second = sorted({r.value for r in cluster.run(worker)}, key=str)
emit("done", first=first, second=second, native=len(native_records) > 0)
""",
        timeout=CLUSTER_SCRIPT_BOUND,
    )
    assert rc == 0, _details(proc)
    # native: Rust log records reached Python's logging (so the check can fail).
    assert events["done"] == {"first": [42], "second": [800.0], "native": True}, events


@pytest.mark.timeout(180)
def test_signal_watches_built_and_closed_from_four_threads_under_debug_logging(tmp_path):
    """Four threads each build and close 50 SignalWatches (it hung the same way)."""
    rc, events, proc = run_script(
        tmp_path,
        DEBUG_LOGGING
        + """
done = []


def churn():
    for _ in range(50):
        w = _native.SignalWatch([signal.SIGUSR2], owner=False)
        w.close()
    done.append(1)


threads = [threading.Thread(target=churn) for _ in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
emit("done", threads=len(done), native=len(native_records) > 0)
""",
        timeout=150.0,
    )
    assert rc == 0, _details(proc)
    assert events["done"] == {"threads": 4, "native": True}, events
