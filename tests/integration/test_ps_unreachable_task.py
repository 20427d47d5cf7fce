"""A stopped task under ParameterServerStrategy (item 4 of issue 32), on a real cluster on
127.0.0.1: coordinator, 2 workers, 1 PS, each a process of ``ps_preemption_script.py``.

The coordinator trains to run 40, waits for its closures (``join()``) and pauses. The
test stops one task with SIGSTOP -- the process keeps its sockets, so its peers see an
open TCP connection that never answers -- waits until the coordinator's poll has found
it unanswered, sends SIGTERM to another task, waits until the coordinator has taken
that notice, and ends the pause (``--resume-file``). Nothing here depends on timing:
each step waits for the previous one's effect, and every wait is bounded only to turn a
hang into a failure.

What counts as success:

* the other task's notice is acted on: a PS's or the coordinator's notice ends in a
  checkpoint at run 40 and the coordinator's exit with the restart code within
  ``SAVE_EXIT_BOUND`` of the end of the pause; the PS leaves released by the coordinator
  ("checkpoint saved"), not by its own 120 s timeout; a worker's notice ends in that
  worker's release ("drained");
* after SIGCONT the cluster resumes from that checkpoint (runs == counter == 40) and
  trains to the end (runs == counter == 120);
* every process is reaped (the fixture sends SIGCONT, then kills what is left).

Before the package set gRPC keepalive (``src/ps_control/keepalive.rs``), the coordinator's
save blocked for as long as the worker stayed stopped (more than 200 s measured; it
ends only when the task runs again or its socket closes):
``TF_FAILURE_HANDLING_GRPC_KEEPALIVE=0`` reproduces that, and this test then fails at
``SAVE_EXIT_BOUND``.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from tf_failure_handling._coordinator import grpc_keepalive

from .test_ps_preemption import (
    EXIT_BOUND,
    MARGIN,
    RESTART_CODE,
    RESUME_BOUND,
    SERVERS_BOUND,
    START_BOUND,
    STEPS,
    Cluster,
    _resume_and_finish,
)

PAUSE_AT = 40
#: The longest pause: the test ends it sooner through the resume file.
PAUSE = 300.0
#: From the end of the pause to the coordinator's exit: its save, with one task
#: stopped, waits at most about 15 s on gRPC (ping every 5 s, 5 s for its answer, 5 s
#: for a reconnection), then 5 s for the PS's release (``CALL_TIMEOUT``). Bounds a hang.
SAVE_EXIT_BOUND = 60.0
#: The coordinator's poll gives a stopped task up after ``CALL_TIMEOUT`` (5 s).
SEEN_BOUND = 30.0
#: The `paused` fixture's bounds in sequence: the servers, then its wait for the pause.
PAUSED_BOUND = SERVERS_BOUND + START_BOUND + 120.0


@pytest.fixture
def paused(tmp_path, monkeypatch):
    """The cluster, its coordinator paused at run 40 with nothing in flight. Its
    processes build the cluster with ``SimpleClusterResolver`` (no ``TF_CONFIG``), so
    they are told to add gRPC keepalive, as a user of such a cluster does."""
    if os.environ.get(grpc_keepalive.GRPC_KEEPALIVE_ENV) is None:
        monkeypatch.setenv(grpc_keepalive.GRPC_KEEPALIVE_ENV, "1")
    c = Cluster(tmp_path)
    stopped: list = []
    c.resume_file = tmp_path / "resume"
    try:
        c.start_servers()
        c.start(
            "coordinator",
            "coordinator",
            "--ckpt",
            str(tmp_path / "ckpt"),
            "--steps",
            str(STEPS),
            "--pause-at",
            str(PAUSE_AT),
            "--pause",
            str(PAUSE),
            "--resume-file",
            str(c.resume_file),
        )
        event = c.wait_event("coordinator", "paused", START_BOUND + 120.0)
        assert event["runs"] == event["counter"] == PAUSE_AT, event
        c.stopped = stopped
        yield c
    finally:
        for name in stopped:
            proc = c.procs[name]
            if proc.popen.poll() is None:
                proc.popen.send_signal(signal.SIGCONT)
        c.stop()
        assert all(p.popen.poll() is not None for p in c.history.values()), c.describe()


def _stop(c: Cluster, name: str, task: str) -> None:
    """SIGSTOP ``name``; returns once the coordinator's poll found it unanswered."""
    c.procs[name].popen.send_signal(signal.SIGSTOP)
    c.stopped.append(name)
    c.wait_log("coordinator", f"{task} does not answer", SEEN_BOUND)


def _notice_then_resume(c: Cluster, name: str) -> float:
    """SIGTERM ``name``; once the coordinator has taken the notice (its next ``run()``
    saves, and the workers take no new closure), ends its pause."""
    c.procs[name].popen.send_signal(signal.SIGTERM)
    c.wait_log("coordinator", "take no new closures until the save", SEEN_BOUND)
    c.resume_file.write_text("go")
    return time.monotonic()


def _cont(c: Cluster, name: str) -> None:
    c.procs[name].popen.send_signal(signal.SIGCONT)
    c.stopped.remove(name)


def _saved_at_pause(c: Cluster) -> None:
    from tf_failure_handling import records

    found = records.load(c.workdir / "ckpt" / "preemption_records").preemptions
    saves = [p for p in found if p.job == "chief" and p.save_end is not None]
    assert [p.agreed_step for p in saves] == [PAUSE_AT], saves
    assert saves[0].exit_code == RESTART_CODE, saves


def _exits_in_bound(c: Cluster, resumed: float) -> float:
    code = c.wait_exit("coordinator", SAVE_EXIT_BOUND)
    took = time.monotonic() - resumed
    assert code == RESTART_CODE, c.describe()
    return took


# Backstop above its own bounds in sequence, the fixture's setup included.
@pytest.mark.timeout(
    PAUSED_BOUND
    + 2 * SEEN_BOUND
    + SAVE_EXIT_BOUND
    + EXIT_BOUND
    + START_BOUND
    + RESUME_BOUND
    + MARGIN
)
def test_ps_notice_with_a_worker_stopped_saves_and_exits(paused):
    c = paused
    _stop(c, "worker1", "/job:worker/replica:0/task:1")
    resumed = _notice_then_resume(c, "ps0")
    took = _exits_in_bound(c, resumed)
    assert c.wait_exit("ps0", EXIT_BOUND) == RESTART_CODE, c.describe()
    [exiting] = c.history[("ps0", 0)].events("exiting")
    assert exiting["released"] and exiting["reason"] == "checkpoint saved", exiting
    _saved_at_pause(c)
    print(f"coordinator exited {took:.1f}s after the pause ended")
    _cont(c, "worker1")
    c.serve("ps", 0)
    c.wait_event("ps0", "serving", START_BOUND)
    restored = _resume_and_finish(c)
    assert restored["runs"] == restored["counter"] == PAUSE_AT, restored


# Backstop above its own bounds in sequence, the fixture's setup included.
@pytest.mark.timeout(PAUSED_BOUND + 2 * SEEN_BOUND + SAVE_EXIT_BOUND + RESUME_BOUND + MARGIN)
def test_coordinator_notice_with_a_worker_stopped_saves_and_exits(paused):
    c = paused
    _stop(c, "worker0", "/job:worker/replica:0/task:0")
    resumed = _notice_then_resume(c, "coordinator")
    took = _exits_in_bound(c, resumed)
    assert c.alive("ps0") and c.alive("worker1"), c.describe()
    _saved_at_pause(c)
    print(f"coordinator exited {took:.1f}s after the pause ended")
    _cont(c, "worker0")
    restored = _resume_and_finish(c)
    assert restored["runs"] == restored["counter"] == PAUSE_AT, restored


# Backstop above its own bounds in sequence, the fixture's setup included.
@pytest.mark.timeout(PAUSED_BOUND + SEEN_BOUND + EXIT_BOUND + MARGIN)
def test_worker_notice_with_the_other_worker_stopped_is_drained(paused):
    c = paused
    _stop(c, "worker1", "/job:worker/replica:0/task:1")
    c.procs["worker0"].popen.send_signal(signal.SIGTERM)
    assert c.wait_exit("worker0", EXIT_BOUND) == RESTART_CODE, c.describe()
    [exiting] = c.history[("worker0", 0)].events("exiting")
    assert exiting["released"] and exiting["reason"] == "drained", exiting
    assert c.alive("coordinator") and c.alive("ps0"), c.describe()


# Backstop above its own bounds in sequence, the fixture's setup included.
@pytest.mark.timeout(PAUSED_BOUND + SEEN_BOUND + EXIT_BOUND + MARGIN)
def test_worker_notice_with_the_ps_stopped_is_drained(paused):
    c = paused
    _stop(c, "ps0", "/job:ps/replica:0/task:0")
    c.procs["worker1"].popen.send_signal(signal.SIGTERM)
    assert c.wait_exit("worker1", EXIT_BOUND) == RESTART_CODE, c.describe()
    [exiting] = c.history[("worker1", 0)].events("exiting")
    assert exiting["released"] and exiting["reason"] == "drained", exiting
    assert c.alive("coordinator") and c.alive("worker0"), c.describe()
