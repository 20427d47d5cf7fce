"""The failure classifier against errors that the installed TensorFlow really raises.

The truth table (``tests/unit/test_failure_classification.py``) builds errors from
TF 2.21's strings; this test lets the installed TensorFlow write them: a client
connected to real ``tf.distribute.Server`` processes on 127.0.0.1 runs ops on a
live worker, on a task that does not exist, on a worker and a PS that were
killed (``real_errors_script.py``). Success: the live worker answers; the dead
worker's error is a worker failure and not a PS failure, the dead PS's error a
PS failure; and for every error, bare and wrapped, ours gives TensorFlow's own
verdicts. Run by the compatibility matrix on every TensorFlow version.
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


def test_classifier_on_errors_tensorflow_raises(tmp_path):
    cluster = PsCluster(tmp_path, impl="ours", name="real-errors")
    worker = cluster.start_server("worker", 0)
    cluster.start_server("worker", 1)
    ps = cluster.start_server("ps", 0)
    try:
        for job, task in (("worker", 0), ("worker", 1), ("ps", 0)):
            cluster.wait_serving(job, task, timeout=300)
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
            out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else e.stdout
            raise AssertionError(
                f"the client did not finish in {CLIENT_TIMEOUT_S} s; events so far: {out}"
            ) from None
    finally:
        for server in list(cluster.servers.values()):
            server.kill()
    events = parse_events(proc.stdout)
    where = f"exit {proc.returncode}\nstdout: {proc.stdout[-4000:]}\nstderr: {proc.stderr[-4000:]}"
    assert proc.returncode == 0 and events and events[-1]["event"] == "done", where
    by_label = {e["label"]: e for e in events if "label" in e}
    assert by_label["live worker"]["event"] == "ok", where
    for label in ("dead worker", "dead ps"):
        assert by_label[label]["event"] == "error", f"{label}: no error\n{where}"
    # The outcome that counts: a lost worker is retried, a lost PS is not.
    assert by_label["dead worker"]["bare"]["ours"] == [True, False], by_label["dead worker"]
    assert by_label["dead ps"]["bare"]["ours"][1] is True, by_label["dead ps"]
    for event in by_label.values():
        if event["event"] != "error":
            continue
        for form in ("bare", "input_wrapped", "aborted_wrapped"):
            assert event[form]["ours"] == event[form]["tf"], (
                f"{event['label']} ({form}): ours {event[form]['ours']}, "
                f"TF {events[-1]['tf_version']} {event[form]['tf']}\n"
                f"{event['type']}: {event['message']}"
            )
