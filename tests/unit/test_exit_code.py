"""A process exits with the code it asked for, whatever the package's threads are doing.

CPython (before 3.14) ends a daemon thread that re-takes the GIL during finalization
with ``pthread_exit``; a native frame beneath that thread's Python code used to catch
the forced unwind and abort the process (134, "FATAL: exception not rethrown"), which
a launcher that restarts on 42 does not restart. Success here: 30 of 30 runs exit 42.
"""

from __future__ import annotations

import pytest

from .test_signals import _details, run_script

# Everything at once: simulated workers blocked in a collective after a peer left, a
# daemon thread inside handler.run() whose step keeps re-taking the GIL, an open
# PreemptionWatcher, and an object whose __del__ releases the GIL while the interpreter
# finalizes (so that every blocked thread gets its chance to wake up then).
SCENARIO = """
import builtins

cluster = testing.SimulatedCluster(6, root=CKPT_DIR, timeout=60.0)


def worker(ctx):
    h = ctx.handler(testing.FakeCheckpoint(v=testing.FakeVariable(0)), ctx.cluster.checkpoint_dir)
    for i in range(10**6):
        if ctx.index == 5 and i == 2:
            return "left"
        h.run(lambda: ctx.all_reduce(1.0))


threading.Thread(target=lambda: cluster.run(worker), daemon=True).start()
local = PreemptionCheckpointHandler(None, ckpt, CKPT_DIR + "-local")


def spin():
    while True:
        time.sleep(0.001)


threading.Thread(target=lambda: local.run(spin), daemon=True).start()
from tf_failure_handling import PreemptionWatcher

watcher = PreemptionWatcher(signals=())


class ReleasesTheGilAtExit:
    def __del__(self):
        time.sleep(0.3)


builtins._releases_the_gil_at_exit = ReleasesTheGilAtExit()
time.sleep(0.3)
sys.exit(42)
"""


RUNS = 30
RUN_BOUND = 60.0  # one run of the scenario


# Backstop above its own bounds in sequence: RUNS runs of RUN_BOUND each (+ 60 s).
@pytest.mark.timeout(RUNS * RUN_BOUND + 60)
def test_exit_code_survives_threads_waiting_in_the_package(tmp_path, monkeypatch):
    # A crash then prints every thread's Python stack on stderr (the exit code is the
    # same): one run of 30 ended by SIGSEGV, printing nothing, in a loaded fresh-clone
    # run's Python 3.13 end.
    monkeypatch.setenv("PYTHONFAULTHANDLER", "1")
    codes = []
    for run in range(RUNS):
        directory = tmp_path / f"run{run}"
        directory.mkdir()
        rc, _events, proc = run_script(directory, SCENARIO, timeout=RUN_BOUND)
        codes.append(rc)
        assert rc == 42, f"run {run}: " + _details(proc)
    assert codes == [42] * RUNS
