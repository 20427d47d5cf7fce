"""tf_keras ``model.fit`` under MultiWorkerMirroredStrategy that saves before a preemption.

tf_keras' ``BackupAndRestore(backup_dir, save_before_preemption=True)`` builds
TensorFlow's ``PreemptionCheckpointHandler``; after ``tf_failure_handling.patch()``
it builds ours, on every platform (tf_keras alone turns the option on only on GCE).
Every worker runs this script with its ``TF_CONFIG``::

    python examples/launch_local.py --workers 2 --preempt worker:0@30 -- \\
        examples/tf_keras_fit.py --backup-dir /tmp/tf-keras-backup

On a notice to any worker, every worker saves after the same batch and exits 42 (143
on GCE); started again, ``fit`` restores the weights, the optimizer, the epoch and the
batch, and goes on from the next batch. Prints ``starting at step N`` (the optimizer's
``iterations`` when ``fit`` begins), ``step N loss X``, ``preempted: ...`` and
``finished at step N``.
"""

from __future__ import annotations

import sys

import tf_failure_handling
from common import keras_progress, parser, reporting

tf_failure_handling.patch()  # before or after importing tf_keras

FEATURES = 4
GLOBAL_BATCH = 16


def parse_args(argv=None):
    p = parser(__doc__, steps=100, step_time=0.02)
    p.add_argument("--backup-dir", required=True, help="on storage every worker sees")
    p.add_argument("--steps-per-epoch", type=int, default=25)
    return p.parse_args(argv)


def dataset(tf):
    """Shuffled and repeated, so a resumed epoch need not start where the cut one was."""
    x = tf.random.stateless_normal((1024, FEATURES), seed=(1, 2))
    y = tf.reduce_sum(x, axis=1, keepdims=True) * 0.5 + 1.0
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return (
        tf.data.Dataset.from_tensor_slices((x, y))
        .shuffle(1024, seed=0)
        .repeat()
        .batch(GLOBAL_BATCH)
        .with_options(options)
    )


def main(argv=None) -> int:
    args = parse_args(argv)
    import tensorflow as tf
    import tf_keras

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = tf_keras.Sequential([tf_keras.Input((FEATURES,)), tf_keras.layers.Dense(1)])
        model.compile(optimizer=tf_keras.optimizers.SGD(0.05, momentum=0.9), loss="mse")

    def step() -> int:
        return int(model.optimizer.iterations.numpy())

    backup = tf_keras.callbacks.BackupAndRestore(args.backup_dir, save_before_preemption=True)
    with reporting(step):
        model.fit(
            dataset(tf),
            epochs=args.steps // args.steps_per_epoch,
            steps_per_epoch=args.steps_per_epoch,
            # BackupAndRestore restores when fit starts, before Progress reports.
            callbacks=[backup, keras_progress(tf_keras.callbacks.Callback, step, args)],
            verbose=0,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
