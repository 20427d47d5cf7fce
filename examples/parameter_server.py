"""ParameterServerStrategy training whose coordinator, parameter servers and workers
survive preemptions.

One script for every task; ``TF_CONFIG`` says which (``launch_local.py`` sets it)::

    python examples/launch_local.py --chief --workers 2 --ps 1 --preempt chief:0@40 -- \\
        examples/parameter_server.py --ckpt-dir /tmp/ps-ckpt

* The ``ps`` and ``worker`` tasks serve TensorFlow's runtime with
  ``tf_failure_handling.serve(server)`` instead of ``server.join()``: it serves the
  same way and also watches that task's termination notices.
* The ``chief`` is the coordinator: ``tf_failure_handling.ClusterCoordinator`` schedules
  the steps, and ``PreemptionCheckpointHandler`` (which TensorFlow's refuses to build
  for a cluster with a ``ps`` job) runs around ``schedule``.

A notice to the coordinator or a PS ends in one checkpoint that holds exactly the
closures that finished, and the restart code (42); a notice to a worker drains and
releases that worker while training goes on with the others. The restarted tasks
resume from the checkpoint. Prints ``starting at step N``, ``step N loss X`` (after a
``join()`` every ``--log-every`` steps), ``preempted: ...`` and ``finished at step N``.
"""

from __future__ import annotations

import sys
import time

from common import parser, reporting, say

FEATURES = 4
BATCH = 8
LEARNING_RATE = 0.05


def parse_args(argv=None):
    # A step is one scheduled closure; every --log-every steps the coordinator join()s.
    p = parser(__doc__, steps=200, step_time=0.01, log_every=20)
    p.add_argument("--ckpt-dir", required=True, help="the coordinator's checkpoints")
    return p.parse_args(argv)


def serve(resolver) -> int:
    """A ps or worker task: serve until the process ends (or its notice is handled)."""
    import tensorflow as tf
    import tf_failure_handling as tfh

    server = tf.distribute.Server(
        resolver.cluster_spec(),
        job_name=resolver.task_type,
        task_index=resolver.task_id,
        protocol=resolver.rpc_layer or "grpc",
        start=True,
    )
    tfh.serve(server)  # instead of server.join()
    return 0


def coordinate(resolver, args) -> int:
    """The chief: schedule training steps on the workers, save on a notice."""
    import tensorflow as tf
    import tf_failure_handling as tfh

    strategy = tf.distribute.ParameterServerStrategy(resolver)
    # coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    coordinator = tfh.ClusterCoordinator(strategy)
    with strategy.scope():
        kernel = tf.Variable(tf.zeros((FEATURES, 1)), name="kernel")
        bias = tf.Variable(tf.zeros((1,)), name="bias")
    checkpoint = tf.train.Checkpoint(kernel=kernel, bias=bias)
    handler = tfh.PreemptionCheckpointHandler(resolver, checkpoint, args.ckpt_dir)

    def dataset_fn():
        x = tf.random.stateless_normal((1024, FEATURES), seed=(1, 2))
        y = tf.reduce_sum(x, axis=1, keepdims=True) * 0.5 + 1.0
        return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(BATCH)

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))

    @tf.function
    def train_step(iterator):
        x, y = next(iterator)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.matmul(x, kernel) + bias - y))
        g_kernel, g_bias = tape.gradient(loss, [kernel, bias])
        kernel.assign_sub(LEARNING_RATE * g_kernel)
        bias.assign_sub(LEARNING_RATE * g_bias)
        return loss

    def step() -> int:
        return handler.total_run_calls

    say(f"starting at step {step()}")
    with reporting(step):
        while step() < args.steps:
            # A notice makes run() (or the join() below) save once the scheduled
            # closures are done, and exit.
            loss = handler.run(coordinator.schedule, train_step, args=(iterator,))
            if step() % args.log_every == 0:
                coordinator.join()
                say(f"step {step()} loss {float(loss.fetch()):.6f}")
            time.sleep(args.step_time)
        coordinator.join()
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if resolver.task_type in ("ps", "worker"):
        return serve(resolver)
    return coordinate(resolver, args)


if __name__ == "__main__":
    sys.exit(main())
