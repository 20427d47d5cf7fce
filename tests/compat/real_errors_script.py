"""Client side of ``test_real_errors.py``: the errors TensorFlow's coordinator classifies.

The chief of a ParameterServerStrategy cluster of ``tf.distribute.Server``
processes on 127.0.0.1 runs TensorFlow's own ``ClusterCoordinator`` with its
module functions ``_is_worker_failure`` / ``_is_ps_failure`` wrapped to record
every error the coordinator asks them about. It runs closures, kills worker 0
and runs more (worker 1 takes them; worker 0's errors are classified), then
kills the PS and runs more (its error is raised by ``schedule()`` or
``join()``, whichever comes first). For every recorded
error it prints one ``EVENT`` line: the phase, the type, the message, and
TensorFlow's and our verdicts for both questions.

    python real_errors_script.py --cluster '{...}' --worker-pid N --ps-pid M
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from mwms_worker import emit, poll_until, require_loopback
from ps_cluster import port_open

#: Closures per phase: enough that worker 0 is busy when it dies.
CLOSURES = 40


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

    recorded: list[tuple[str, BaseException]] = []
    phase = ["start"]
    lock = threading.Lock()

    def recording(fn):
        def wrapper(error):
            with lock:
                recorded.append((phase[0], error))
            return fn(error)

        return wrapper

    cc._is_worker_failure = recording(tf_worker := cc._is_worker_failure)
    cc._is_ps_failure = recording(tf_ps := cc._is_ps_failure)

    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster), rpc_layer="grpc"
    )
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    coordinator = cc.ClusterCoordinator(strategy)
    with strategy.scope():
        v = tf.Variable(tf.constant(0, tf.int64))

    @tf.function
    def step():
        v.assign_add(1)
        return v.read_value()

    def run_phase(name: str) -> None:
        phase[0] = name
        # A closure's error is raised by the next schedule() or join(), whichever
        # comes first: which one it is depends on timing, so both are caught.
        call = "schedule"
        try:
            for _ in range(CLOSURES):
                coordinator.schedule(step)
            call = "join"
            coordinator.join()
        except Exception as error:  # noqa: BLE001 - reported, the test decides
            emit(
                "raised",
                phase=name,
                call=call,
                type=type(error).__name__,
                message=str(error)[:500],
            )
        else:
            emit("joined", phase=name)

    def kill(pid: int, address: str) -> None:
        os.kill(pid, signal.SIGKILL)
        port = int(address.rsplit(":", 1)[1])
        if not poll_until(lambda: not port_open(port), timeout=60, poll=0.1):
            raise AssertionError(f"{address} still accepts connections 60 s after SIGKILL")

    run_phase("healthy")
    kill(args.worker_pid, cluster["worker"][0])
    run_phase("worker killed")
    kill(args.ps_pid, cluster["ps"][0])
    run_phase("ps killed")

    with lock:
        seen = list(recorded)
    for name, error in seen:
        emit(
            "error",
            phase=name,
            type=type(error).__name__,
            message=str(error)[:2000],
            tf=[tf_worker(error), tf_ps(error)],
            ours=[_failure.is_worker_failure(error), _failure.is_ps_failure(error)],
        )
    emit("done", tf_version=tf.__version__)
    # The coordinator's threads still wait for worker 0 and the PS: leave at once.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
