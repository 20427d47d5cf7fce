"""Client side of ``test_real_errors.py``: raises real TensorFlow errors and classifies them.

Connects this process's eager context to a cluster of ``tf.distribute.Server``
processes on 127.0.0.1 (as the chief), runs small ops on remote devices, kills
servers as told, and for every error TensorFlow raises prints one ``EVENT``
line with its type, its message and the verdicts of TensorFlow's own
``_is_worker_failure`` / ``_is_ps_failure`` and of ours, bare and wrapped in
``ClosureInputError`` / ``ClosureAbortedError`` as the coordinator sees them.

    python real_errors_script.py --cluster '{...}' --worker-pid N --ps-pid M
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from mwms_worker import emit, poll_until, require_loopback  # noqa: E402
from ps_cluster import port_open  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cluster", required=True)
    p.add_argument("--worker-pid", type=int, required=True)
    p.add_argument("--ps-pid", type=int, required=True)
    args = p.parse_args()
    cluster = json.loads(args.cluster)
    require_loopback(cluster)

    import tensorflow as tf
    from tensorflow.python.distribute.coordinator import cluster_coordinator as cc
    from tf_failure_handling import _failure

    tf.config.experimental_connect_to_cluster(tf.train.ClusterSpec(cluster), job_name="chief")

    def verdicts(error):
        return {
            "tf": [cc._is_worker_failure(error), cc._is_ps_failure(error)],
            "ours": [_failure.is_worker_failure(error), _failure.is_ps_failure(error)],
        }

    def attempt(label: str, device: str) -> None:
        try:
            with tf.device(device):
                value = (tf.constant(1.0) + 1.0).numpy()
        except Exception as error:  # noqa: BLE001 - every error TF raises is classified
            emit(
                "error",
                label=label,
                type=type(error).__name__,
                message=str(error)[:2000],
                bare=verdicts(error),
                input_wrapped=verdicts(cc.ClosureInputError(error)),
                aborted_wrapped=verdicts(cc.ClosureAbortedError(error)),
            )
        else:
            emit("ok", label=label, value=float(value))

    def kill(pid: int, address: str) -> None:
        os.kill(pid, signal.SIGKILL)
        port = int(address.rsplit(":", 1)[1])
        if not poll_until(lambda: not port_open(port), timeout=60, poll=0.1):
            raise AssertionError(f"{address} still accepts connections 60 s after SIGKILL")

    attempt("live worker", "/job:worker/replica:0/task:0")
    attempt("no such task", "/job:worker/replica:0/task:7")
    kill(args.worker_pid, cluster["worker"][0])
    attempt("dead worker", "/job:worker/replica:0/task:0")
    kill(args.ps_pid, cluster["ps"][0])
    attempt("dead ps", "/job:ps/replica:0/task:0")
    emit("done", tf_version=tf.__version__, t_end=time.time())
    return 0


if __name__ == "__main__":
    sys.exit(main())
