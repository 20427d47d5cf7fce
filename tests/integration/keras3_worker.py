"""One Keras 3 ``model.fit`` process with ``tf_failure_handling.keras.PreemptionCheckpoint``.

Run as a standalone script, one process per worker, all on 127.0.0.1::

    python keras3_worker.py --mode mwms --ports 23001,23002 --index 0 \
        --ckpt-dir /tmp/ckpt --epochs 3 --steps 6

``--mode mwms`` trains under MultiWorkerMirroredStrategy (one process per worker),
``mirrored`` under MirroredStrategy over two logical CPUs in this one process, ``none``
without a strategy. The model is a Dense layer behind a layer that can inject an
``OpError`` into the training step; every batch of the input is the same unless
``--varying`` is given.

Keras 3.15's ``fit`` does not run under MultiWorkerMirroredStrategy as shipped
(keras-team/keras#20585): in ``--mode mwms`` this script works around its two defects
(:func:`work_around_keras_mwms_defects`) before training. Nothing of
tf_failure_handling is patched.

Everything the tests need is printed on stdout as ``EVENT {json}`` lines
(``mwms_worker.emit``):

* ``start``: ``pid``, ``index``, ``mode``.
* ``resumed``: in ``on_train_begin`` after the restore: ``position`` ([epoch, batch] or
  None) and ``iterations`` (the optimizer's, restored).
* ``first_batch``: the first ``epoch`` and ``batch`` this process trains.
* ``reached``: before batch ``--pause-at`` (counted in this process) it waits, bounded,
  until its handler has handled a termination notice (the test sends SIGTERM on this
  event), then trains on.
* ``save``: every ``tf.train.CheckpointManager.save``: ``directory``, ``runs``
  (``checkpointed_runs``), ``position`` (the fit position saved).
* ``exit`` (``SystemExit`` left fit: ``code``), ``error`` (``type``, ``message``,
  ``batches``), ``done`` (``iterations``, ``batches`` trained by this process,
  ``weights``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from mwms_worker import emit, require_loopback, tf_config

IN_FEATURES = 4
OUT_FEATURES = 2
GLOBAL_BATCH = 16
LEARNING_RATE = 0.05
MOMENTUM = 0.9
#: Bound on every wait of this script for the test (a notice, a release file).
WAIT_BOUND = 120.0


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=("mwms", "mirrored", "none"), required=True)
    p.add_argument("--ports", default="", help="comma-separated ports (mwms)")
    p.add_argument("--index", type=int, default=0)
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--steps", type=int, default=6, help="steps_per_epoch")
    p.add_argument("--no-callback", action="store_true", help="plain fit (the reference)")
    p.add_argument("--varying", action="store_true", help="batches differ from each other")
    p.add_argument("--pause-at", type=int, default=None, help="batch (this process) to pause at")
    p.add_argument("--fail", choices=("step", "callback"), default=None)
    p.add_argument("--fail-at", type=int, default=None, help="batch (this process) that fails")
    p.add_argument(
        "--hold-after-error",
        default=None,
        help="after fit raised, stay alive until this file exists",
    )
    return p.parse_args(argv)


def work_around_keras_mwms_defects(model, strategy) -> None:
    """Test-only workarounds for Keras 3.15 under MultiWorkerMirroredStrategy.

    As shipped, Keras 3.15's ``fit`` fails before its first step under MWMS
    (keras-team/keras#20585): ``_maybe_symbolic_build`` passes the whole ``(x, y)``
    batch to ``strategy.reduce``, which takes one value, not a nest; and
    ``reduce_per_replica`` reduces scalar losses across workers along axis 0. These two
    replacements build the model from this worker's first replica's batch (shapes only)
    and reduce each per-replica output across replicas. They touch nothing that
    ``PreemptionCheckpoint`` uses or changes.
    """
    import tensorflow as tf
    from keras.src.backend.tensorflow import trainer as tf_trainer

    def maybe_symbolic_build(iterator=None, data_batch=None):
        if data_batch is None:
            for _, _, distributed in iterator:
                data_batch = next(distributed)
                break
        local = tf.nest.map_structure(
            lambda v: (
                strategy.experimental_local_results(v)[0]
                if isinstance(v, tf.distribute.DistributedValues)
                else v
            ),
            data_batch,
        )
        with strategy.scope():
            model._symbolic_build(data_batch=local)

    model._maybe_symbolic_build = maybe_symbolic_build

    shipped = tf_trainer.reduce_per_replica
    if getattr(shipped, "_keras3_worker_workaround", False):
        return

    def reduce_per_replica(values, strategy_, reduction):
        if reduction in ("auto", "mean") and tf_trainer._collective_all_reduce_multi_worker(
            strategy_
        ):
            return tf.nest.map_structure(
                lambda v: (
                    strategy_.reduce("MEAN", v, axis=None)
                    if isinstance(v, tf.distribute.DistributedValues)
                    else v
                ),
                values,
            )
        return shipped(values, strategy_, reduction)

    reduce_per_replica._keras3_worker_workaround = True
    tf_trainer.reduce_per_replica = reduce_per_replica


def instrument_saves() -> None:
    """Make every ``tf.train.CheckpointManager.save`` print a ``save`` event."""
    import tensorflow as tf

    cls = tf.train.CheckpointManager
    original = cls.save

    def save(self, *args, **kwargs):
        runs = getattr(self.checkpoint, "checkpointed_runs", None)
        position = getattr(self.checkpoint, "fit_position", None)
        path = original(self, *args, **kwargs)
        directory = self.directory  # a ram:// folder (the non-chief's, issue 36) as it is
        emit(
            "save",
            directory=directory if "://" in directory else os.path.abspath(directory),
            path=path,
            runs=None if runs is None else int(runs.numpy()),
            position=None if position is None else json.loads(position.serialize()),
        )
        return path

    cls.save = save


def make_strategy(args):
    import tensorflow as tf

    if args.mode == "mwms":
        ports = [int(p) for p in args.ports.split(",") if p]
        config = tf_config(ports, args.index)
        require_loopback(config["cluster"])
        os.environ["TF_CONFIG"] = json.dumps(config)
        return tf.distribute.MultiWorkerMirroredStrategy()
    if args.mode == "mirrored":
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * 2
        )
        return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    return None


def build_model(strategy, fail_flag):
    """Dense(2) behind a layer that fails the step (check_numerics) while ``fail_flag``."""
    import keras
    import tensorflow as tf

    class MaybeFail(keras.layers.Layer):
        def call(self, inputs):
            scale = tf.where(fail_flag, float("inf"), 1.0)
            return tf.debugging.check_numerics(inputs * scale, "injected failure")

    def make():
        kernel = keras.initializers.RandomNormal(stddev=0.3, seed=7)
        model = keras.Sequential(
            [
                keras.Input((IN_FEATURES,)),
                MaybeFail(),
                keras.layers.Dense(OUT_FEATURES, kernel_initializer=kernel),
            ]
        )
        model.compile(optimizer=keras.optimizers.SGD(LEARNING_RATE, momentum=MOMENTUM), loss="mse")
        return model

    if strategy is None:
        return make()
    with strategy.scope():
        return make()


def dataset(args, skip: int):
    """Global batches of GLOBAL_BATCH rows; all equal (and all rows equal) unless ``--varying``."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(2024)
    count = args.epochs * args.steps
    x = rng.standard_normal((count, GLOBAL_BATCH, IN_FEATURES)).astype(np.float32)
    y = rng.standard_normal((count, GLOBAL_BATCH, OUT_FEATURES)).astype(np.float32)
    if args.varying:
        ds = tf.data.Dataset.from_tensor_slices((x, y))
    else:
        # Every row equal too: under MWMS a worker's share of a global batch (which half)
        # can depend on the input's position, which a restart does not restore.
        one = (np.repeat(x[0, :1], GLOBAL_BATCH, axis=0), np.repeat(y[0, :1], GLOBAL_BATCH, axis=0))
        ds = tf.data.Dataset.from_tensors(one)
    ds = ds.repeat().skip(skip)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return ds.with_options(options)


def wait_for(predicate, what: str) -> None:
    deadline = time.monotonic() + WAIT_BOUND
    while not predicate():
        if time.monotonic() > deadline:
            emit("timeout", what=what)
            raise SystemExit(3)
        time.sleep(0.005)


def make_recorder(args, checkpoint_cb, fail_flag):
    import keras

    class Recorder(keras.callbacks.Callback):
        """Records what this process trains; pauses and injects failures on cue."""

        def __init__(self):
            super().__init__()
            self.batches = 0

        def on_train_begin(self, logs=None):
            position = None if checkpoint_cb is None else checkpoint_cb.restored_position
            emit(
                "resumed",
                position=None if position is None else list(position),
                iterations=int(self.model.optimizer.iterations.numpy()),
            )
            self.epoch = None

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_begin(self, batch, logs=None):
            if self.batches == 0:
                emit("first_batch", epoch=self.epoch, batch=batch)
            if args.pause_at is not None and self.batches == args.pause_at:
                handler = checkpoint_cb.handler
                emit("reached", epoch=self.epoch, batch=batch)
                wait_for(lambda: handler._notices_handled > 0, "a termination notice")
            if args.fail == "step" and self.batches == args.fail_at:
                fail_flag.assign(True)

        def on_train_batch_end(self, batch, logs=None):
            self.batches += 1
            if args.fail == "callback" and self.batches - 1 == args.fail_at:
                raise RuntimeError(f"injected callback failure at epoch {self.epoch}")

    return Recorder()


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("GCE_METADATA_IP", "127.0.0.1:9")
    import keras
    import tensorflow as tf

    keras.config.disable_traceback_filtering()
    strategy = make_strategy(args)
    instrument_saves()
    emit("start", pid=os.getpid(), index=args.index, mode=args.mode)

    from tf_failure_handling.keras import PreemptionCheckpoint

    fail_flag = tf.Variable(False, trainable=False)
    model = build_model(strategy, fail_flag)
    if args.mode == "mwms":
        work_around_keras_mwms_defects(model, strategy)

    skip = 0  # PreemptionCheckpoint positions fit's input itself
    checkpoint_cb = None if args.no_callback else PreemptionCheckpoint(args.ckpt_dir)
    recorder = make_recorder(args, checkpoint_cb, fail_flag)
    callbacks = [recorder] if checkpoint_cb is None else [checkpoint_cb, recorder]
    try:
        model.fit(
            dataset(args, skip),
            epochs=args.epochs,
            steps_per_epoch=args.steps,
            callbacks=callbacks,
            verbose=0,
            shuffle=False,
        )
    except SystemExit as e:
        emit("exit", code=e.code, batches=recorder.batches)
        raise
    except BaseException as e:
        emit("error", type=type(e).__name__, message=str(e)[-2000:], batches=recorder.batches)
        if args.hold_after_error:
            wait_for(lambda: os.path.exists(args.hold_after_error), "the release file")
            emit("released")
        raise

    emit(
        "done",
        iterations=int(model.optimizer.iterations.numpy()),
        batches=recorder.batches,
        weights=[[float(v) for v in w.ravel()] for w in model.get_weights()],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
