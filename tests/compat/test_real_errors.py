"""The failure classifier against errors that the installed TensorFlow really raises.

The truth table (``tests/unit/test_failure_classification.py``) builds errors from
TF 2.21's strings; here the installed TensorFlow writes them. TensorFlow's own
``ClusterCoordinator``, on real ``tf.distribute.Server`` processes on 127.0.0.1,
runs closures while a worker and then the PS are killed, and every error it
classifies is recorded (``real_errors_script.py``). Success: ours gives
TensorFlow's verdicts on every one of them, and those verdicts are the ones the
coordinator needs (a killed worker's errors are worker failures, the killed PS's
a PS failure). Run by the compatibility matrix on every TensorFlow version.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

tf = pytest.importorskip("tensorflow", reason="the errors are raised by TensorFlow itself")

from integration.mwms_worker import child_environment, parse_events  # noqa: E402
from integration.ps_cluster import PsCluster  # noqa: E402

SCRIPT = Path(__file__).resolve().parent / "real_errors_script.py"
#: Bounds the whole client (TF import, four remote ops, two kills); a hang fails.
CLIENT_TIMEOUT_S = 600
#: Bounds each server's start (they are waited for in turn).
SERVING_TIMEOUT_S = 300


# Backstop above its own bounds in sequence: three servers, the client, the kills (10 s
# each) (+ 60 s).
@pytest.mark.timeout(3 * SERVING_TIMEOUT_S + CLIENT_TIMEOUT_S + 3 * 10 + 60)
def test_classifier_on_errors_tensorflow_raises(tmp_path):
    cluster = PsCluster(tmp_path, impl="ours", name="real-errors")
    worker = cluster.start_server("worker", 0)
    cluster.start_server("worker", 1)
    ps = cluster.start_server("ps", 0)
    try:
        for job, task in (("worker", 0), ("worker", 1), ("ps", 0)):
            cluster.wait_serving(job, task, timeout=SERVING_TIMEOUT_S)
        cmd = [
            sys.executable,
            str(SCRIPT),
            "--cluster",
            json.dumps(cluster.spec),
            "--worker-pid",
            str(worker.popen.pid),
            "--ps-pid",
            str(ps.popen.pid),
        ]
        try:
            proc = subprocess.run(
                cmd,
                capture_output=True,
                text=True,
                env=child_environment(),
                timeout=CLIENT_TIMEOUT_S,
                cwd=tmp_path,
            )
        except subprocess.TimeoutExpired as e:
            out = (
                (e.stdout or b"").decode(errors="replace")
                if isinstance(e.stdout, bytes)
                else e.stdout
            )
            raise AssertionError(
                f"the client did not finish in {CLIENT_TIMEOUT_S} s; events so far: {out}"
            ) from None
    finally:
        for server in list(cluster.servers.values()):
            server.kill()
    events = parse_events(proc.stdout)
    where = f"exit {proc.returncode}\nstdout: {proc.stdout[-4000:]}\nstderr: {proc.stderr[-4000:]}"
    assert proc.returncode == 0 and events and events[-1]["event"] == "done", where
    version = events[-1]["tf_version"]
    errors = [e for e in events if e["event"] == "error"]

    def show(found):
        return "\n".join(
            f"{e['phase']}: {e['type']}: {e['message'][:300]} tf={e['tf']} ours={e['ours']}"
            for e in found
        )

    # Ours answers as the installed TensorFlow does, for every error it classified.
    differ = [e for e in errors if e["ours"] != e["tf"]]
    assert not differ, f"TF {version} and ours disagree:\n{show(differ)}"
    # The outcomes that count: the healthy phase had nothing to classify; the
    # killed worker's errors were worker failures (its closures ran on worker 1,
    # join() returned); the killed PS's error was a PS failure.
    assert not [e for e in errors if e["phase"] == "healthy"], show(errors)
    joined = {e["phase"] for e in events if e["event"] == "joined"}
    assert {"healthy", "worker killed"} <= joined, where
    worker = [e for e in errors if e["phase"] == "worker killed"]
    assert worker and all(e["tf"] == [True, False] for e in worker), show(worker) or where
    ps = [e for e in errors if e["phase"] == "ps killed"]
    assert any(e["tf"][1] for e in ps), show(ps) or where
    # ...and it reached the user: schedule() or join() raised it, typed as TF raises it.
    raised = [e for e in events if e["event"] == "raised" and e["phase"] == "ps killed"]
    ps_types = {e["type"] for e in ps if e["tf"][1]}
    assert raised and raised[0]["type"] in ps_types, where
