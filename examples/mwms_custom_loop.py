"""A custom training loop under MultiWorkerMirroredStrategy that survives preemptions.

Every worker runs this script. ``TF_CONFIG`` says which worker it is (without it, one
local worker); ``launch_local.py`` sets it for a cluster on this machine::

    python examples/launch_local.py --workers 2 --preempt worker:1@30 -- \\
        examples/mwms_custom_loop.py --ckpt-dir /tmp/mwms-ckpt

When any worker gets a termination notice (SIGTERM, or its platform's: SLURM,
Kubernetes, GCE, AWS, Azure), every worker saves a checkpoint after the same step
and exits with the restart code (42; 143 on GCE). Started again with the same
``--ckpt-dir``, the handler restores that checkpoint and the loop resumes at the saved
step. The batches are a function of the step and the worker, so a resumed run ends
with exactly the weights of an uninterrupted one (``make demo`` compares them).

The model is a linear regression trained with SGD and momentum; the optimizer's
``iterations`` counter is in the checkpoint and is the step to resume at.

Prints ``starting at step N``, ``step N loss X``, ``preempted: checkpoint saved at
step N, exiting with code C`` and ``finished at step N`` with the final weights.
"""

from __future__ import annotations

import json
import sys
import time

from common import parser, reporting, say

IN_FEATURES = 4
OUT_FEATURES = 2
PER_WORKER_BATCH = 8
LEARNING_RATE = 0.05
MOMENTUM = 0.9


def batch_for(step: int, worker: int):
    """The (x, y) batch that ``worker`` trains on at ``step``: the same in every run."""
    import numpy as np

    rng = np.random.default_rng([step, worker])
    x = rng.standard_normal((PER_WORKER_BATCH, IN_FEATURES)).astype(np.float32)
    true_kernel = np.arange(IN_FEATURES * OUT_FEATURES, dtype=np.float32).reshape(
        IN_FEATURES, OUT_FEATURES
    )
    y = x @ (true_kernel / 10.0) + 0.5
    noise = rng.standard_normal((PER_WORKER_BATCH, OUT_FEATURES)).astype(np.float32)
    return x, y + 0.01 * noise


def build_model(strategy):
    """The model's and the optimizer's variables, created in ``strategy``'s scope.

    MEAN aggregation: an assignment in a replica all-reduces the update."""
    import tensorflow as tf

    mean = tf.VariableAggregation.MEAN
    with strategy.scope():
        model = tf.Module(name="model")
        model.kernel = tf.Variable(
            tf.reshape(
                tf.linspace(-0.3, 0.3, IN_FEATURES * OUT_FEATURES), (IN_FEATURES, OUT_FEATURES)
            ),
            name="kernel",
            aggregation=mean,
        )
        model.bias = tf.Variable(tf.zeros((OUT_FEATURES,)), name="bias", aggregation=mean)
        optimizer = tf.Module(name="sgd_momentum")
        optimizer.iterations = tf.Variable(
            tf.constant(0, tf.int64),
            name="iterations",
            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
        )
        optimizer.v_kernel = tf.Variable(tf.zeros_like(model.kernel), aggregation=mean)
        optimizer.v_bias = tf.Variable(tf.zeros_like(model.bias), aggregation=mean)
    return model, optimizer


def replica_step_fn(model, optimizer):
    """One SGD-with-momentum update of one replica on its batch; returns the loss."""
    import tensorflow as tf

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.matmul(x, model.kernel) + model.bias - y))
        g_kernel, g_bias = tape.gradient(loss, [model.kernel, model.bias])
        optimizer.v_kernel.assign(MOMENTUM * optimizer.v_kernel + g_kernel)
        optimizer.v_bias.assign(MOMENTUM * optimizer.v_bias + g_bias)
        model.kernel.assign_sub(LEARNING_RATE * optimizer.v_kernel)
        model.bias.assign_sub(LEARNING_RATE * optimizer.v_bias)
        optimizer.iterations.assign_add(1)
        return loss

    return replica_step


def weights(model) -> dict:
    return {
        "kernel": [float(v) for v in model.kernel.numpy().ravel()],
        "bias": [float(v) for v in model.bias.numpy().ravel()],
    }


def parse_args(argv=None):
    p = parser(__doc__, steps=200, step_time=0.02)
    p.add_argument("--ckpt-dir", required=True, help="checkpoints, on storage every worker sees")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    import tensorflow as tf

    # from tensorflow.distribute.experimental import PreemptionCheckpointHandler
    from tf_failure_handling import PreemptionCheckpointHandler

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    model, optimizer = build_model(strategy)
    replica_step = replica_step_fn(model, optimizer)

    @tf.function
    def train_step(x, y):
        losses = strategy.run(replica_step, args=(x, y))
        return strategy.reduce(tf.distribute.ReduceOp.MEAN, losses, axis=None)

    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
    # Restores the latest checkpoint in ckpt_dir, if there is one.
    handler = PreemptionCheckpointHandler(strategy.cluster_resolver, checkpoint, args.ckpt_dir)
    worker = strategy.cluster_resolver.task_id or 0

    def step() -> int:
        return int(optimizer.iterations.numpy())

    say(f"starting at step {step()}")
    with reporting(step, lambda: f"; weights {json.dumps(weights(model))}"):
        while step() < args.steps:
            x, y = batch_for(step(), worker)
            # A notice makes run() save after an agreed step and exit.
            loss = handler.run(train_step, tf.constant(x), tf.constant(y))
            if step() % args.log_every == 0:
                say(f"step {step()} loss {float(loss):.6f}")
            time.sleep(args.step_time)
    return 0


if __name__ == "__main__":
    sys.exit(main())
