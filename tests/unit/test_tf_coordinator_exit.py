"""A process with TensorFlow's own ``ClusterCoordinator`` and our handler ends while TF's
worker recovery is under way (``_integrations/tf_exit.py``, ``stop_recovery``).

TF's recovery thread (a daemon) holds ``_cluster_update_lock`` while it rebuilds the
cluster; TF's ``ClusterCoordinator.__del__`` runs at interpreter exit, after daemon
threads are frozen, and its ``stop()`` takes that lock. A worker restarted near the end
of training (its closures failed, TF's recovery began) hung the coordinator at exit:
``test_ps_preemption.py::test_a_restarted_worker_that_no_closure_goes_to_is_released_again
[tf]``, 2 runs of 9, the stack in ``stop`` under ``__del__``, "Garbage-collecting".

Each case runs a child process: TF's real ``WorkerPreemptionHandler`` with a stand-in
for the eager context's ``update_server_def`` (a rebuild that ends once the handler is
told to stop, or one that never ends: the worker never comes back) and a stand-in for
TF's coordinator whose ``stop()`` of the handler comes after the package's at the
interpreter's end, as TF's ``__del__`` does (an ``atexit`` function registered before
the package's: Python 3.10 runs no module global's ``__del__`` at exit while a daemon
thread still runs, so a ``__del__`` there proved nothing on it). What counts: the child
exits 0 by itself, its ``stop()`` at exit returned, and the log says which way the
recovery thread went. The child's bound only turns a hang into a failure.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("tensorflow", reason="TF's WorkerPreemptionHandler is the subject")

from tf_failure_handling._native import CoordinatorProtocol

Lane = CoordinatorProtocol.Lane

#: Bound on the child (TensorFlow's import on a loaded machine included): only turns a
#: hang at exit into a failure.
HANG = 180.0

CHILD = textwrap.dedent(
    """
    import atexit
    import logging
    import os
    import sys
    import threading
    import time
    import types

    logging.getLogger("tf_failure_handling").setLevel(logging.INFO)
    logging.getLogger("tf_failure_handling").addHandler(logging.StreamHandler())

    from tensorflow.python.distribute.coordinator import cluster_coordinator as cc

    from tf_failure_handling._integrations import tf_exit

    rebuild, given = sys.argv[1:3]
    updating = threading.Event()
    never = threading.Event()


    class Context:
        def update_server_def(self, server_def):
            updating.set()
            if rebuild == "ends":
                # The worker is back: the rebuild ends, here once told to stop.
                while handler._should_preemption_thread_run:
                    time.sleep(0.01)
            else:
                never.wait(600)  # the worker never comes back (bounded for the test)


    cc.context = types.SimpleNamespace(context=Context)
    handler = cc.WorkerPreemptionHandler(None, None)


    class Coordinator:
        # TF's ClusterCoordinator: its __del__ stops its cluster's failure handler
        # (Cluster.stop) when the interpreter ends.
        def __init__(self):
            self._cluster = types.SimpleNamespace(failure_handler=handler)


    coordinator = Coordinator()


    def stop_at_exit(write=os.write):
        # TF's __del__ at the interpreter's end, made an atexit function registered
        # before the package's (atexit runs them last first): it comes after the
        # package's stop, as the final garbage collection does, on every Python
        # (Python 3.10 collects no module global while a daemon thread still runs).
        coordinator._cluster.failure_handler.stop()
        write(1, b"stopped at exit\\n")


    atexit.register(stop_at_exit)
    # What the handler's start_watch does: with the coordinator it found, or None (the
    # handler made before the coordinator): then the live threads show TF's handler.
    tf_exit.install(coordinator if given == "coordinator" else None)
    handler._cluster_due_for_update_or_finish.set()  # a closure failed on a restarted worker
    if not updating.wait(60):
        sys.exit("the recovery did not start within 60 s")
    print("exiting", flush=True)
    """
)


ENDED = "Stopped TensorFlow's worker-recovery thread so the process can exit."
# The stop's bound, as the coordinator's protocol object gives it.
STOP_BOUND = CoordinatorProtocol([]).poll(Lane.Stop()).timeout
GIVEN_UP = f"was still rebuilding the cluster after {STOP_BOUND:g}s"


@pytest.mark.parametrize(
    "rebuild, given, logged",
    [
        ("ends", "coordinator", ENDED),
        ("never", "coordinator", GIVEN_UP),
        ("ends", "none", ENDED),
    ],
)
def test_tfs_coordinator_exits_while_its_recovery_rebuilds_the_cluster(rebuild, given, logged):
    try:
        done = subprocess.run(
            [sys.executable, "-c", CHILD, rebuild, given],
            capture_output=True,
            text=True,
            timeout=HANG,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(
            f"the process hung at exit (TF's stop() on the recovery's lock) for {HANG:.0f}s\n"
            f"stdout: {e.stdout}\nstderr tail: {str(e.stderr)[-2000:]}"
        )
    tail = done.stderr[-3000:]
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{tail}"
    assert done.stdout.splitlines() == ["exiting", "stopped at exit"], done.stdout
    assert logged in done.stderr, tail
