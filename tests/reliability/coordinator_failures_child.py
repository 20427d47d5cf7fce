"""Child of ``test_coordinator_failures.py``: many workers whose first closures fail together.

In a fresh interpreter: an in-process cluster on 127.0.0.1 (``WORKERS`` worker
servers and one PS, as TensorFlow's own coordinator tests build it), our
``ClusterCoordinator``, ``WORKERS`` closures scheduled at once that each fail a
``tf.debugging.assert_equal`` (``InvalidArgumentError``), then ``join()``.

Success, printed as ``ok`` with exit 0: ``join()`` raises ``InvalidArgumentError``
and a second ``join()`` after it returns (the error was raised once and the queue
is usable). Before the fix of issue 26, about one such process in six never
returned from ``join()``. ``faulthandler`` turns a hang into exit 1 with every
thread's stack, with one bound for the set-up and one from the first schedule(); they
are bounds, not verdicts by time.
"""

from __future__ import annotations

import faulthandler
import os
import sys
from pathlib import Path

# The integration tests' loopback helpers (stdlib only at import).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from mwms_worker import free_ports

WORKERS = 8
#: Seconds from the first schedule() to the second join()'s return: a hang's bound.
HANG_BOUND = 120.0
#: Seconds for the set-up before it (importing TensorFlow, starting 9 servers): on a
#: loaded machine the import alone took over 120 s, which the join's bound, armed at
#: the start, called a hang in join(). Only a hang's bound too.
SETUP_BOUND = 600.0
#: Printed to stderr when the set-up is done: the parent tells the two bounds apart.
SET_UP = "set-up done: scheduling"


def main() -> int:
    faulthandler.dump_traceback_later(SETUP_BOUND, exit=True)
    os.environ.pop("TF_CONFIG", None)
    os.environ.setdefault("GCE_METADATA_IP", "127.0.0.1:9")
    import tensorflow as tf
    import tf_failure_handling as tfh

    ports = free_ports(WORKERS + 2)
    cluster = {
        "worker": [f"127.0.0.1:{p}" for p in ports[:WORKERS]],
        "ps": [f"127.0.0.1:{ports[WORKERS]}"],
        "chief": [f"127.0.0.1:{ports[WORKERS + 1]}"],
    }
    spec = tf.train.ClusterSpec(cluster)
    # TF's in-process clusters give each worker enough inter-op threads.
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=WORKERS + 1)
    servers = [
        tf.distribute.Server(spec, job_name="worker", task_index=i, config=config, start=True)
        for i in range(WORKERS)
    ]
    servers.append(tf.distribute.Server(spec, job_name="ps", task_index=0, start=True))
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(spec, rpc_layer="grpc")
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tfh.ClusterCoordinator(strategy)
    assert type(coordinator).__module__.startswith("tf_failure_handling"), type(coordinator)

    @tf.function
    def fails():
        # A value only known when the closure runs (constants fail at tracing).
        one = tf.random.uniform([], minval=1, maxval=2, dtype=tf.int32)
        tf.debugging.assert_equal(one, tf.constant(2), message="first closure")
        return tf.constant(0)

    # Every worker thread gets one of these at once: their first failures are
    # classified together.
    faulthandler.cancel_dump_traceback_later()
    print(SET_UP, file=sys.stderr, flush=True)
    faulthandler.dump_traceback_later(HANG_BOUND, exit=True)
    sys.setswitchinterval(1e-5)
    # The error is raised once, by join() or by a schedule() made after a closure
    # failed (as TF's coordinator does: a loaded host can run a closure to its failure
    # before the last schedule()).
    try:
        for _ in range(WORKERS):
            coordinator.schedule(fails)
        coordinator.join()
    except tf.errors.InvalidArgumentError as e:
        assert "first closure" in str(e), e
    else:
        print("join() returned without raising the closures' error", file=sys.stderr)
        return 2
    sys.setswitchinterval(0.005)
    coordinator.join()  # nothing pending: returns
    faulthandler.cancel_dump_traceback_later()
    print("ok")
    sys.stdout.flush()
    # In-process servers cannot be stopped; the process ends here.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
