"""A MultiWorkerMirroredStrategy worker lost without notice (issue 62), with real TF.

Two workers of ``mwms_worker.py`` on 127.0.0.1 train with our handler; one is SIGKILLed
mid-training (an OOM kill, a segfault, a lost host: no notice, no SIGTERM). The survivor's
step fails; success for this fault is:

* the survivor raises the error TensorFlow raises there (``UnavailableError``), so
  ``except`` blocks and exit codes behave as with TensorFlow;
* its log names the lost worker, by task and address, and how the loss showed (the
  protocol's ``Action.PeerLost``, confirmed by a health probe);
* within a bound: nothing waits on the dead peer.
"""

from __future__ import annotations

import re
import signal

import pytest

from .conftest import STARTUP_BOUND

NUM_WORKERS = 2
STEPS = 400  # longer than the test: the kill comes first
STEP_SLEEP = 0.03
KILL_AFTER = 15
#: Bound on the survivor's exit after the kill (a hang bound): TF's error comes within a
#: second of a SIGKILL, the probe and the report are bounded by the core.
EXIT_BOUND = 120.0
HANG_BOUND = STARTUP_BOUND + EXIT_BOUND + 60


@pytest.mark.timeout(HANG_BOUND)
@pytest.mark.parametrize("killed", [1, 0], ids=["non_chief", "chief"])
def test_the_survivor_names_the_worker_lost_without_notice(cluster_factory, killed):
    cluster = cluster_factory(name=f"lost{killed}", impl="ours", steps=STEPS, step_sleep=STEP_SLEEP)
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
