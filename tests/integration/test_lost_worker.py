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
    cluster = cluster_factory(
        name=f"lost{killed}",
        impl="ours",
        steps=STEPS,
        step_sleep=STEP_SLEEP,
        extra_args=["--progress-every", "1"],
    )
    cluster.start()
    cluster.wait_for_progress(KILL_AFTER)
    cluster.send_signal(killed, signal.SIGKILL)
    codes = cluster.wait(EXIT_BOUND, f"the survivor to fail after worker {killed}'s SIGKILL")
    survivor = 1 - killed
    details = cluster.describe(survivor)
    assert codes[killed] == -signal.SIGKILL, details
    assert codes[survivor] not in (0, 42), details
    errors = cluster.events(survivor, "error")
    assert errors and errors[0]["type"] == "UnavailableError", details
    log = cluster.stderr_paths[survivor].read_text(errors="replace")
    port = cluster.ports[killed]
    label = f"worker {killed}"  # TF_CONFIG names every task a worker; worker 0 is the chief
    # How the loss shows depends on which comes first: the broken connection, or the
    # coordination service's word that the task stopped sending heartbeats.
    lost = re.findall(
        r"Worker (\d+): lost without notice: (.+) \((connection lost|stopped sending "
        r"heartbeats), and no answer",
        log,
    )
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
    notice = [x for x in lines if x["stage"] == "notice" and x.get("source") == "lost_peer"]
    assert len(notice) == 1 and notice[0]["task"] == survivor, lines
    assert notice[0]["lost"] == [f"{label} (127.0.0.1:{port})"], lines
    assert notice[0]["runs"] == runs and notice[0]["detection"] == lost[0][2], lines
    assert [x["path"] for x in lines if x["stage"] == "save_end"] == [path], lines
    restart_and_check(cluster_factory, "ours", cluster.ckpt_dir, runs, reference_weights)
