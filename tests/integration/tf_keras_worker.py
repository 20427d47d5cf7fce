"""One tf_keras MultiWorkerMirroredStrategy worker: ``model.fit`` with
``BackupAndRestore(backup_dir, save_before_preemption=True)``.

Run as a standalone script (one process per worker, all on 127.0.0.1)::

    python tf_keras_worker.py --ports 23001,23002 --index 0 --impl ours \
        --backup-dir /tmp/backup --epochs 3 --steps-per-epoch 6

``--impl ours`` calls ``tf_failure_handling.patch()`` first thing, as a user script
would, before tf_keras is imported; ``--impl tf`` leaves TensorFlow's classes.

Every batch the model sees is the same 8 rows, so where the input pipeline stands
after a restart does not matter and weights compare exactly with an uninterrupted run.

Events (``EVENT {json}`` lines on stdout, see ``mwms_worker.emit``):

* ``fit_begin``: ``fit`` (0-based), ``epoch``, ``batch`` of the first batch this fit
  runs (where a restarted fit resumed), ``handler`` (class of
  ``model._preemption_handler``, or None);
* ``batch``: ``fit``, ``epoch``, ``batch`` after each batch that ran;
* ``reached``: at ``--hold-at``; the worker then waits (bounded) until its preemption
  handler has handled a termination notice, so a notice sent now is acted on at the
  next batch whatever the machine's speed;
* ``save``: every ``CheckpointManager.save``: ``preemption`` (inside the handler's
  save), ``epoch``/``batch`` (tf_keras' saved counters), ``runs``
  (``checkpointed_runs``), ``directory``;
* ``exit`` (``code``), ``error`` (``type``, ``message``), ``done`` (``weights``,
  ``iterations`` of the optimizer, ``batches`` run by this process).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

# The script's directory is on sys.path.
from mwms_worker import configure_heartbeat_timeout, emit, reporting_the_end, tf_config

IN_FEATURES = 4
OUT_FEATURES = 2
GLOBAL_BATCH = 16
LEARNING_RATE = 0.05
#: Bound on waiting, at ``--hold-at``, for the handler to handle the notice.
HOLD_TIMEOUT = 60.0


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ports", required=True, help="comma-separated ports, all on 127.0.0.1")
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--impl", choices=("tf", "ours"), default="ours")
    p.add_argument("--backup-dir", required=True)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--steps-per-epoch", type=int, default=6)
    p.add_argument("--fits", type=int, default=1, help="model.fit calls in this process")
    p.add_argument(
        "--hold-at",
        default=None,
        help="EPOCH:BATCH of the last fit: print `reached`, wait until the handler has "
        "handled a termination notice",
    )
    p.add_argument(
        "--batch-sleep",
        type=float,
        default=0.0,
        help="seconds each batch end sleeps (a test's time to act between batches)",
    )
    p.add_argument(
        "--fail-at-step",
        type=int,
        default=None,
        help="the batch of this index (from 0, over the process) raises InvalidArgumentError "
        "inside this worker's train step",
    )
    p.add_argument(
        "--pause-after",
        type=int,
        default=None,
        help="SIGSTOP this process after this many batches (over the process): a worker "
        "paused between two batches, the others blocked in the next one's all-reduce",
    )
    p.add_argument(
        "--heartbeat-timeout",
        type=float,
        default=None,
        help="the coordination service's heartbeat timeout, in seconds (TF's default is 10): "
        "a long one keeps TensorFlow from aborting a batch blocked on a paused peer",
    )
    return p.parse_args(argv)


def data():
    """The dataset: the same batch forever.

    Each element is a global batch of 16 rows made of one 8-row block twice, so every
    per-replica batch the distributed dataset cuts from it is that block, however
    MultiWorkerMirroredStrategy rebatches it.
    """
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    block = rng.standard_normal((GLOBAL_BATCH // 2, IN_FEATURES)).astype(np.float32)
    x = np.concatenate([block, block])
    w = np.arange(IN_FEATURES * OUT_FEATURES, dtype=np.float32).reshape(IN_FEATURES, -1) / 10
    y = x @ w + 0.5
    options = tf.data.Options()
    # Each worker reads its own copy; every batch is the same anyway.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return tf.data.Dataset.from_tensors((x, y)).repeat().with_options(options)


def build_model(tf_keras, tf, fail):
    """A dense layer behind a numerics check; ``fail`` (a variable of this worker only)
    set to 1 makes the check raise ``InvalidArgumentError`` inside the train step,
    before the gradients' all-reduce."""
    import numpy as np

    def check(t):
        return tf.debugging.check_numerics(
            tf.where(fail > 0, t * float("nan"), t), "injected failure"
        )

    inputs = tf_keras.Input((IN_FEATURES,))
    checked = tf_keras.layers.Lambda(check)(inputs)
    kernel = np.linspace(-0.3, 0.3, IN_FEATURES * OUT_FEATURES).reshape(IN_FEATURES, -1)
    outputs = tf_keras.layers.Dense(
        OUT_FEATURES,
        kernel_initializer=tf_keras.initializers.Constant(kernel),
        bias_initializer="zeros",
    )(checked)
    model = tf_keras.Model(inputs, outputs)
    model.compile(optimizer=tf_keras.optimizers.Adam(LEARNING_RATE), loss="mse")
    return model


def instrument_saves(tf) -> None:
    """Every ``CheckpointManager.save`` prints a ``save`` event."""
    from tensorflow.python.checkpoint import checkpoint_context

    cls = tf.train.CheckpointManager
    original = cls.save

    def value(checkpoint, name):
        variable = getattr(checkpoint, name, None)
        return None if variable is None else int(variable.numpy())

    def save(self, *args, **kwargs):
        checkpoint = self.checkpoint
        path = original(self, *args, **kwargs)
        emit(
            "save",
            preemption=checkpoint_context.in_preemption_save_context(),
            epoch=value(checkpoint, "ckpt_saved_epoch"),
            batch=value(checkpoint, "ckpt_saved_batch"),
            runs=value(checkpoint, "checkpointed_runs"),
            directory=os.path.abspath(self.directory),
            path=path,
        )
        return path

    cls.save = save


def probe_callback(
    tf_keras,
    fit: int,
    hold_at,
    counter: list,
    fail_at,
    fail,
    batch_sleep: float = 0.0,
    pause_after=None,
):
    """Reports where each fit starts and each batch that ran; holds at ``hold_at``; sets
    ``fail`` before the batch ``fail_at`` (counted over the process); sleeps
    ``batch_sleep`` s at each batch's end; SIGSTOPs this process once ``pause_after``
    batches have ended (counted over the process), after reporting the last one."""

    class Probe(tf_keras.callbacks.Callback):
        epoch = None
        began = False

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = int(epoch)  # numpy's int64 in a resumed fit

        def on_train_batch_begin(self, batch, logs=None):
            batch = int(batch)
            if fail_at is not None and counter[0] == fail_at:
                fail.assign(1.0)
            if not self.began:
                self.began = True
                handler = getattr(self.model, "_preemption_handler", None)
                emit(
                    "fit_begin",
                    fit=fit,
                    epoch=self.epoch,
                    batch=batch,
                    handler=None if handler is None else type(handler).__module__,
                )

        def on_train_batch_end(self, batch, logs=None):
            batch = int(batch)
            counter[0] += 1
            emit("batch", fit=fit, epoch=self.epoch, batch=batch)
            if pause_after is not None and counter[0] == pause_after:
                emit("pausing", batches=counter[0])
                os.kill(os.getpid(), signal.SIGSTOP)
            if batch_sleep:
                time.sleep(batch_sleep)
            if hold_at != (self.epoch, batch):
                return
            handler = self.model._preemption_handler
            emit("reached", fit=fit, epoch=self.epoch, batch=batch)
            deadline = time.monotonic() + HOLD_TIMEOUT
            while handler._notices_handled < 1:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no termination notice handled within {HOLD_TIMEOUT}s")
                time.sleep(0.005)

    return Probe()


def main(argv=None) -> int:
    args = parse_args(argv)
    ports = [int(p) for p in args.ports.split(",") if p]
    os.environ["TF_CONFIG"] = json.dumps(tf_config(ports, args.index))
    os.environ.setdefault("GCE_METADATA_IP", "127.0.0.1:9")

    import tensorflow as tf

    if args.impl == "ours":
        import tf_failure_handling

        tf_failure_handling.patch()
    import tf_keras

    instrument_saves(tf)
    if args.heartbeat_timeout is not None:
        configure_heartbeat_timeout(args.heartbeat_timeout)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    # Created outside the strategy's scope: this worker's own variable, not mirrored.
    fail = tf.Variable(0.0, trainable=False, name="inject_failure")
    with strategy.scope():
        model = build_model(tf_keras, tf, fail)
    emit("start", pid=os.getpid(), index=args.index, impl=args.impl)

    hold_at = None
    if args.hold_at:
        epoch, batch = args.hold_at.split(":")
        hold_at = (int(epoch), int(batch))
    batches = [0]
    with reporting_the_end():
        for fit in range(args.fits):
            callbacks = [
                probe_callback(
                    tf_keras,
                    fit,
                    hold_at if fit == args.fits - 1 else None,
                    batches,
                    args.fail_at_step,
                    fail,
                    args.batch_sleep,
                    args.pause_after,
                ),
                tf_keras.callbacks.BackupAndRestore(args.backup_dir, save_before_preemption=True),
            ]
            model.fit(
                data(),
                epochs=args.epochs,
                steps_per_epoch=args.steps_per_epoch,
                callbacks=callbacks,
                verbose=0,
            )

    kernel, bias = (v.numpy() for v in model.layers[-1].weights)
    emit(
        "done",
        weights={
            "kernel": [float(v) for v in kernel.ravel()],
            "bias": [float(v) for v in bias.ravel()],
        },
        iterations=int(model.optimizer.iterations.numpy()),
        batches=batches[0],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
