"""A coordinator exits with ``TF_PSS_ENABLE_COORDINATION_SERVICE`` set (issue 32, item 6).

With the variable set, TF's ``CoordinationServicePreemptionHandler`` polls the
coordination service from a chain of non-daemon ``threading.Timer`` threads (its
``RepeatedTimer``), and nothing stops the chain before the interpreter joins its
threads: the coordinator saved at a notice and then hung in ``sys.exit(42)``, and
hung again after its last step (``_integrations/tf_exit.py``).

The cluster of ``test_ps_preemption.py`` (coordinator, 2 workers, 1 PS on
127.0.0.1, every process of ``ps_preemption_script.py``), with the variable set in
every process: SIGTERM to the coordinator after 30 runs, it exits with the restart
code; restarted, it resumes from the checkpoint, runs to the end and exits 0.
"""

from __future__ import annotations

import pytest

from .test_ps_preemption import (
    CLUSTER_BOUND,
    EXIT_BOUND,
    FINISH_BOUND,
    MARGIN,
    RESTART_CODE,
    RESUME_BOUND,
    START_BOUND,
    Cluster,
    _notice_after_runs,
    _resume_and_finish,
)

ENV = "TF_PSS_ENABLE_COORDINATION_SERVICE"


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    # Every child's environment is a copy of this process's (child_environment()).
    monkeypatch.setenv(ENV, "1")
    c = Cluster(tmp_path)
    try:
        c.start_servers()
        c.coordinator()
        restored = c.wait_event("coordinator", "restored", START_BOUND)
        assert restored["runs"] == restored["counter"] == 0, restored
        yield c
    finally:
        c.stop()


# Backstop above its own bounds in sequence, the fixture's setup included.
@pytest.mark.timeout(CLUSTER_BOUND + FINISH_BOUND + EXIT_BOUND + RESUME_BOUND + MARGIN)
def test_coordinator_exits_after_a_notice_and_at_the_end(cluster):
    c = cluster
    _notice_after_runs(c, "coordinator")
    # Without the fix: the checkpoint is saved, then sys.exit(42) waits for TF's
    # poller thread forever.
    assert c.wait_exit("coordinator", EXIT_BOUND) == RESTART_CODE, c.describe()
    assert all(c.alive(n) for n in ("ps0", "worker0", "worker1")), c.describe()
    # Resumes (runs == counter), runs to 120 and exits 0 within EXIT_BOUND.
    _resume_and_finish(c)
    assert all(c.alive(n) for n in ("ps0", "worker0", "worker1")), c.describe()
