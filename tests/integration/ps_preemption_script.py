"""Processes of the ParameterServerStrategy preemption tests (``test_ps_preemption.py``).

Server mode (a PS or worker task, ``tfh.serve`` instead of ``server.join()``)::

    python ps_preemption_script.py serve --cluster JSON --job ps --task 0

Coordinator mode (the chief: the handler around ``coordinator.schedule``)::

    python ps_preemption_script.py coordinator --cluster JSON --ckpt DIR --steps 120

Every closure adds one to ``counter`` (a variable on the PS). The coordinator prints
``EVENT`` lines: ``restored`` (the run count and the counter restored from the
checkpoint: equal when nothing was lost or applied twice), ``progress`` every 5 runs,
and ``done`` (both at the end). Every address is 127.0.0.1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

try:
    from .mwms_worker import emit, require_loopback
except ImportError:  # run as a script
    from mwms_worker import emit, require_loopback


def serve(args) -> int:
    import tensorflow as tf
    import tf_failure_handling as tfh

    cluster = json.loads(args.cluster)
    require_loopback(cluster)
    server = tf.distribute.Server(
        tf.train.ClusterSpec(cluster),
        job_name=args.job,
        task_index=args.task,
        protocol="grpc",
        start=True,
    )
    emit("serving", job=args.job, task=args.task, pid=os.getpid())
    tfh.serve(server)
    emit("serve-returned")
    return 0


def coordinator(args) -> int:
    import tensorflow as tf
    import tf_failure_handling as tfh

    cluster = json.loads(args.cluster)
    require_loopback(cluster)
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster), task_type="chief", task_id=0, rpc_layer="grpc"
    )
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coord = tfh.ClusterCoordinator(strategy)
    with strategy.scope():
        counter = tf.Variable(0, dtype=tf.int64, name="counter")
        weights = tf.Variable(tf.eye(64) * 0.5, name="weights")
    checkpoint = tf.train.Checkpoint(counter=counter, weights=weights)
    handler = tfh.PreemptionCheckpointHandler(resolver, checkpoint, args.ckpt)
    runs = handler.total_run_calls
    emit("restored", runs=runs, counter=int(counter.numpy()))

    @tf.function
    def train_step():
        # Some work, so that closures are in flight when a notice comes.
        x = weights
        for _ in tf.range(args.work):
            x = tf.matmul(x, weights) * 0.5 + tf.eye(64)
        counter.assign_add(1)
        return tf.reduce_sum(x)

    while handler.total_run_calls < args.steps:
        handler.run(coord.schedule, train_step)
        runs = handler.total_run_calls
        if runs % 5 == 0:
            emit("progress", runs=runs)
        if runs % args.epoch == 0:
            coord.join()  # an "epoch": most of the training happens in join()
            emit("epoch", runs=runs, counter=int(counter.numpy()))
    coord.join()
    emit("done", runs=handler.total_run_calls, counter=int(counter.numpy()))
    handler.close()
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--cluster", required=True)
    s.add_argument("--job", required=True, choices=("ps", "worker"))
    s.add_argument("--task", type=int, required=True)
    c = sub.add_parser("coordinator")
    c.add_argument("--cluster", required=True)
    c.add_argument("--ckpt", required=True)
    c.add_argument("--steps", type=int, default=120)
    c.add_argument("--work", type=int, default=200)
    c.add_argument("--epoch", type=int, default=20)
    args = p.parse_args(argv)
    return serve(args) if args.mode == "serve" else coordinator(args)


if __name__ == "__main__":
    sys.exit(main())
