"""A MultiWorkerMirroredStrategy worker lost without notice (issue 62), with real TF.

Two workers of ``mwms_worker.py`` on 127.0.0.1 train with our handler; one is SIGKILLed
mid-training (an OOM kill, a segfault, a lost host: no notice, no SIGTERM). The survivor's
step fails; success for this fault is:

* the survivor raises the error TensorFlow raises there (``UnavailableError``), so
  ``except`` blocks and exit codes behave as with TensorFlow;
* its log names the lost worker, by task and address, and how the loss showed (the
  protocol's ``Action.PeerLost``, confirmed by a health probe);
* the survivor that writes (the lowest worker id that answered: the chief when it
  lives) saves the last whole step, run N: a restarted cluster resumes at N, with N at
  least L - 1 (L: the highest step any worker reported finished before the kill), and
  ends with exactly the weights of an uninterrupted run (``reference_weights``: the
  training data is a function of the global step, so any torn or miscounted save would
  show);
* within a bound: nothing waits on the dead peer.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
from typing import Optional

import pytest

from . import test_mwms_handler as mwms
from .conftest import STARTUP_BOUND
from .test_mwms_handler import RUN_BOUND, STEPS, restart_and_check

#: The uninterrupted run's final weights: test_mwms_handler's fixture, used here too.
reference_weights = mwms.reference_weights

STEP_SLEEP = 0.03
KILL_AFTER = 15
#: Bound on the survivor's exit after the kill (a hang bound): TF's error comes within a
#: second of a SIGKILL, the probe and the report are bounded by the core.
EXIT_BOUND = 120.0
HANG_BOUND = RUN_BOUND + STARTUP_BOUND + EXIT_BOUND + RUN_BOUND + 60


@pytest.mark.timeout(HANG_BOUND)
@pytest.mark.parametrize("killed", [1, 0], ids=["non_chief", "chief"])
def test_the_survivor_saves_the_last_whole_step_and_the_restart_ends_as_uninterrupted(
    cluster_factory, reference_weights, killed
):
    cluster = _started(cluster_factory, f"lost{killed}")
    cluster.send_signal(killed, signal.SIGKILL)
    codes = cluster.wait(EXIT_BOUND, f"the survivor to fail after worker {killed}'s SIGKILL")
    assert codes[killed] == -signal.SIGKILL, cluster.describe(killed)
    runs = _survivor_saved(cluster, 1 - killed, killed, codes, ("UnavailableError",))
    restart_and_check(cluster_factory, "ours", cluster.ckpt_dir, runs, reference_weights)


@pytest.mark.timeout(HANG_BOUND + EXIT_BOUND)
@pytest.mark.parametrize("stopped", [1, 0], ids=["non_chief", "chief"])
def test_a_paused_worker_is_lost_the_survivor_saves_and_the_resumed_worker_writes_nothing(
    cluster_factory, reference_weights, stopped
):
    """SIGSTOP (a hung process, a frozen host): nothing resets a connection. A stopped
    non-chief stops sending heartbeats, and the chief's coordination service says so; a
    stopped chief freezes the service, and the survivor's own heartbeat to it goes
    unanswered (TF 2.21 aborts the collectives then, about 10 s on). Either way the
    survivor saves and exits within the bound. Then the paused worker is resumed
    (SIGCONT): its step fails, it finds the survivor's claim naming it lost, and writes
    nothing, so the restart resumes at the survivor's save."""
    cluster = _started(cluster_factory, f"stop{stopped}")
    survivor = 1 - stopped
    cluster.send_signal(stopped, signal.SIGSTOP)
    try:
        survivor_proc = cluster.procs[survivor]
        try:
            code = survivor_proc.wait(timeout=EXIT_BOUND)
        except subprocess.TimeoutExpired:
            pytest.fail(
                f"the survivor did not exit within {EXIT_BOUND:g} s of worker {stopped}'s "
                f"SIGSTOP\n{cluster.describe(survivor)}"
            )
        codes = [None, None]
        codes[survivor] = code
        runs = _survivor_saved(
            cluster, survivor, stopped, codes, ("UnavailableError", "DeadlineExceededError")
        )
    finally:
        cluster.procs[stopped].send_signal(signal.SIGCONT)
    try:
        resumed = cluster.procs[stopped].wait(timeout=EXIT_BOUND)
    except subprocess.TimeoutExpired:
        cluster.kill()
        pytest.fail(
            f"the resumed worker {stopped} did not exit within {EXIT_BOUND:g} s\n"
            f"{cluster.describe(stopped)}"
        )
    log = cluster.stderr_paths[stopped].read_text(errors="replace")
    assert resumed not in (0, 42), cluster.describe(stopped)
    assert "saved the last whole step" not in log, cluster.describe(stopped)
    surviving = sorted(p.name for p in cluster.ckpt_dir.glob("ckpt-survivor*.index"))
    assert surviving == [f"ckpt-survivor{survivor}-{runs}.index"], surviving
    restart_and_check(cluster_factory, "ours", cluster.ckpt_dir, runs, reference_weights)


#: The coordination service's heartbeat timeout of the hung-worker test: far past the
#: handler's own bound (its peer timeout) and the test's, so only the handler aborts.
LONG_HEARTBEAT = 600.0
#: The handler's own bound on a blocked step there (TF_FAILURE_HANDLING_PEER_TIMEOUT).
STEP_BOUND = 5.0


@pytest.mark.timeout(HANG_BOUND + EXIT_BOUND)
def test_a_hung_peer_tensorflow_does_not_abort_the_handlers_bound_aborts_and_the_survivor_saves(
    cluster_factory, reference_weights
):
    """Issue 62, "A hung worker": with a heartbeat timeout of 600 s, TensorFlow aborts
    nothing when the non-chief is SIGSTOPped, and the chief's step waits in its
    all-reduce. Success: the handler's step watch finds the step blocked past its bound
    (the peer timeout, 5 s) with worker 1 not answering a health probe, aborts the
    collectives itself, and the chief saves the last whole step (L - 1 or later) and
    raises TensorFlow's UnavailableError, well within the bound; the restart ends as
    uninterrupted."""
    cluster = _started(
        cluster_factory,
        "hung",
        ["--heartbeat-timeout", str(LONG_HEARTBEAT)],
        {"TF_FAILURE_HANDLING_PEER_TIMEOUT": str(STEP_BOUND)},
    )
    cluster.send_signal(1, signal.SIGSTOP)
    try:
        code = cluster.chief_aborted_its_collectives(EXIT_BOUND, "worker 1's SIGSTOP")
        runs = _survivor_saved(
            cluster,
            0,
            1,
            [code, None],
            ("UnavailableError",),
            "a step blocked past the peer timeout",
        )
    finally:
        cluster.kill()
    restart_and_check(cluster_factory, "ours", cluster.ckpt_dir, runs, reference_weights)


def _started(cluster_factory, name: str, extra: tuple = (), env: Optional[dict] = None):
    """Two workers of our handler, started and past step ``KILL_AFTER``."""
    cluster = cluster_factory(
        name=name,
        impl="ours",
        steps=STEPS,
        step_sleep=STEP_SLEEP,
        extra_args=["--progress-every", "1", *extra],
        **({"env": env} if env else {}),
    )
    cluster.start()
    cluster.wait_for_progress(KILL_AFTER)
    return cluster


def _survivor_saved(
    cluster, survivor: int, lost_worker: int, codes: list, types: tuple, detection: str = ""
) -> int:
    """Checks what the survivor did after losing ``lost_worker`` (``detection``: how the
    loss must have shown, else any way a step's error shows it); returns the run it saved."""
    details = cluster.describe(survivor)
    assert codes[survivor] not in (0, 42), details
    errors = cluster.events(survivor, "error")
    assert errors and errors[0]["type"] in types, details
    log = cluster.stderr_paths[survivor].read_text(errors="replace")
    port = cluster.ports[lost_worker]
    label = f"worker {lost_worker}"  # TF_CONFIG names every task a worker; 0 is the chief
    # How the loss shows depends on which comes first: the broken connection, or the
    # coordination service's word that the task stopped sending heartbeats.
    shown = (
        re.escape(detection)
        if detection
        else (r"connection lost|stopped sending heartbeats|no answer to this worker's heartbeats")
    )
    lost = re.findall(rf"Worker (\d+): lost without notice: (.+) \(({shown}), and no answer", log)
    assert [(w, who) for w, who, _ in lost] == [(str(survivor), f"{label} (127.0.0.1:{port})")], (
        details
    )
    saved = re.findall(r"saved the last whole step, run (\d+), at (\S+)\.\n", log)
    assert len(saved) == 1, details
    runs, path = int(saved[0][0]), saved[0][1]
    assert path == str(cluster.ckpt_dir / f"ckpt-survivor{survivor}-{runs}"), details
    finished = max(cluster.progress(i) for i in range(2))
    assert finished - 1 <= runs <= finished, (runs, finished, details)
    # The record names the lost worker, how the loss showed and what was saved.
    lines = [
        json.loads(line)
        for f in sorted((cluster.ckpt_dir / "preemption_records").iterdir())
        for line in f.read_text().splitlines()
    ]
    notice = [
        x
        for x in lines
        if x["stage"] == "notice" and x.get("source") == "lost_peer" and x["task"] == survivor
    ]
    assert len(notice) == 1, lines
    assert notice[0]["lost"] == [f"{label} (127.0.0.1:{port})"], lines
    assert notice[0]["runs"] == runs and notice[0]["detection"] == lost[0][2], lines
    ends = [x["path"] for x in lines if x["stage"] == "save_end" and x["task"] == survivor]
    assert ends == [path], lines
    return runs
