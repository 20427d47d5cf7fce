"""Keras 3 ``model.fit`` that saves at the batch a preemption notice arrives and resumes there.

Keras 3's own ``BackupAndRestore`` saves every ``save_freq`` and resumes at an epoch
boundary. ``tf_failure_handling.keras.PreemptionCheckpoint`` runs every training step
of ``fit`` inside a ``PreemptionCheckpointHandler``: on a notice (SIGTERM, or the
platform's) it saves the model, the optimizer and the position in ``fit`` and exits
42 (143 on GCE); run again, ``fit`` resumes at the saved epoch and batch::

    python examples/launch_local.py --workers 1 --preempt worker:0@30 -- \\
        examples/keras3_fit.py --ckpt-dir /tmp/keras3-ckpt

One process here, with no strategy (a MirroredStrategy scope works the same way).
Keras 3.15's own ``fit`` does not run under MultiWorkerMirroredStrategy (see the docs'
Keras 3 page). Prints ``starting at step N`` (the optimizer's ``iterations`` when
``fit`` begins), ``step N loss X``, ``preempted: ...`` and ``finished at step N``.
"""

from __future__ import annotations

import os
import sys

from common import keras_progress, parser, reporting

FEATURES = 4
BATCH = 16


def parse_args(argv=None):
    p = parser(__doc__, steps=100, step_time=0.02)
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--steps-per-epoch", type=int, default=25)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")  # the only backend it supports
    import keras
    import tensorflow as tf
    from tf_failure_handling.keras import PreemptionCheckpoint

    x = tf.random.stateless_normal((1024, FEATURES), seed=(1, 2))
    y = tf.reduce_sum(x, axis=1, keepdims=True) * 0.5 + 1.0
    data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(1024, seed=0).repeat().batch(BATCH)

    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="mse")

    def step() -> int:
        return int(model.optimizer.iterations.numpy())

    with reporting(step):
        model.fit(
            data,
            epochs=args.steps // args.steps_per_epoch,
            steps_per_epoch=args.steps_per_epoch,
            # PreemptionCheckpoint restores when fit starts, before Progress reports.
            callbacks=[
                PreemptionCheckpoint(args.ckpt_dir),
                keras_progress(keras.callbacks.Callback, step, args),
            ],
            verbose=0,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
