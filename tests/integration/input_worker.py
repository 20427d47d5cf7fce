"""One worker that trains on element ids and records which ids it trained, in order.

Run as a standalone script (one process per worker, all on 127.0.0.1)::

    python input_worker.py --stack custom --ports 23001,23002 --index 0 \
        --ckpt-dir /tmp/ckpt --out /tmp/out-0.json --preempt-at 12

The input is ``IDS`` element ids, shuffled with a seed and reshuffled each epoch,
global batch ``GLOBAL_BATCH``. Every step all-gathers the global batch's ids (in the
global batch's order, whatever the number of workers) and adds them to two variables
of the model, saved in its checkpoint: ``counts[id]`` (how often each id was trained)
and ``trace``, a hash of every id in the order trained. An uninterrupted run trains
every id ``--epochs`` times; a resumed run is exact when both equal an uninterrupted
run's.

``--stack``: ``custom`` (TensorFlow's docstring loop: an iterator per epoch, passed into
a ``tf.function``, with ``handler.track_input``; ``--no-track`` leaves that line out),
``tf_keras`` (``fit`` with ``BackupAndRestore(save_before_preemption=True)`` after
``tf_failure_handling.patch()``) or ``keras3`` (``fit`` with ``PreemptionCheckpoint``).
``--ports`` empty: no strategy (one process). ``--preempt-at N``: worker
``--preempt-worker`` sends itself SIGTERM after its ``N``-th step and holds (bounded)
until its handler has handled the notice; the handler then saves at the agreed step
and exits. ``--kill-at N`` (custom stack): that worker SIGKILLs itself after its
``N``-th step instead, with no notice; the survivors save the last whole step and
raise. The end writes ``--out`` (JSON: ``counts``, ``trace``, ``steps`` run by this
process); an exit writes nothing.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time

IDS = 64
GLOBAL_BATCH = 8
SEED = 7
#: The trace's hash: trace = (trace * PRIME + id + 1) mod MODULUS, id by id.
PRIME = 1_000_003
MODULUS = 2**31 - 1
#: Bound on the hold after the self-sent SIGTERM.
HOLD_TIMEOUT = 60.0


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stack", choices=("custom", "tf_keras", "keras3"), required=True)
    p.add_argument("--ports", default="", help="comma-separated ports; empty: no strategy")
    p.add_argument("--index", type=int, default=0)
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--steps-per-epoch", type=int, default=None)
    p.add_argument("--repeat", action="store_true", help="dataset.repeat() (one iterator)")
    p.add_argument("--preempt-at", type=int, default=None)
    p.add_argument("--preempt-worker", type=int, default=0)
    p.add_argument(
        "--kill-at",
        type=int,
        default=None,
        help="custom stack: worker --preempt-worker SIGKILLs itself after this step (a "
        "worker lost without notice)",
    )
    p.add_argument("--no-track", action="store_true")
    p.add_argument(
        "--input",
        choices=("seeded", "generator", "shuffle-cache", "cache-shuffle"),
        default="seeded",
        help="generator: Dataset.from_generator (cannot be positioned); shuffle-cache: "
        "cache() in memory after the shuffle (every epoch the first one's order: cannot "
        "be positioned); cache-shuffle: cache() before it (can be)",
    )
    return p.parse_args(argv)


def dataset(tf, args):
    if args.input == "generator":

        def ids():
            yield from range(IDS)

        ds = tf.data.Dataset.from_generator(ids, output_signature=tf.TensorSpec((), tf.int64))
    else:
        ds = tf.data.Dataset.range(IDS)
    if args.input == "cache-shuffle":
        ds = ds.cache()
    ds = ds.shuffle(IDS, seed=SEED, reshuffle_each_iteration=True)
    if args.input == "shuffle-cache":
        ds = ds.cache()
    if args.repeat:
        ds = ds.repeat()
    return ds.batch(GLOBAL_BATCH)


def record(tf, counts, trace, ids):
    """Adds the replica's ids, gathered into the global batch, to the two variables
    (each replica's copy: they are ``ON_READ`` variables, and every replica adds the
    same global batch)."""
    ctx = tf.distribute.get_replica_context()
    everything = ids
    if ctx.num_replicas_in_sync > 1:
        # Replica r holds the global batch's r-th slice (AutoShardPolicy.DATA): put its
        # ids there, add up (an all-gather of ints, as an exact float64 all-reduce).
        n = tf.shape(ids)[0]
        start = tf.cast(ctx.replica_id_in_sync_group, tf.int32) * n
        slots = tf.scatter_nd(
            tf.expand_dims(tf.range(start, start + n), 1),
            tf.cast(ids + 1, tf.float64),
            [n * ctx.num_replicas_in_sync],
        )
        everything = tf.cast(ctx.all_reduce(tf.distribute.ReduceOp.SUM, slots), tf.int64) - 1
    counts.assign_add(tf.math.bincount(everything, minlength=IDS, maxlength=IDS, dtype=tf.int64))
    value = tf.foldl(lambda t, i: (t * PRIME + i + 1) % MODULUS, everything, initializer=trace)
    trace.assign(value)


def hold(handler, what: str) -> None:
    os.kill(os.getpid(), signal.SIGTERM)
    deadline = time.monotonic() + HOLD_TIMEOUT
    while handler._notices_handled < 1:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no termination notice handled within {HOLD_TIMEOUT}s ({what})")
        time.sleep(0.01)


def finish(args, counts, trace, steps: int) -> None:
    with open(args.out, "w") as f:
        json.dump({"counts": [int(c) for c in counts], "trace": int(trace), "steps": steps}, f)


def strategy_for(tf, args):
    ports = [int(p) for p in args.ports.split(",") if p]
    if not ports:
        return tf.distribute.get_strategy(), None, 1
    os.environ["TF_CONFIG"] = json.dumps(
        {
            "cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
            "task": {"type": "worker", "index": args.index},
        }
    )
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    return strategy, strategy.cluster_resolver, len(ports)


def run_custom(args) -> None:
    import tensorflow as tf
    import tf_failure_handling as tfh

    strategy, resolver, _ = strategy_for(tf, args)
    with strategy.scope():
        counts = tf.Variable(
            tf.zeros([IDS], tf.int64),
            synchronization=tf.VariableSynchronization.ON_READ,
            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
        )
        trace = tf.Variable(
            tf.constant(0, tf.int64),
            synchronization=tf.VariableSynchronization.ON_READ,
            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
        )
    checkpoint = tf.train.Checkpoint(counts=counts, trace=trace)
    handler = tfh.PreemptionCheckpointHandler(resolver, checkpoint, args.ckpt_dir)
    data = dataset(tf, args)
    multi_worker_dataset = (
        strategy.experimental_distribute_dataset(data) if resolver is not None else data
    )
    if not args.no_track:
        multi_worker_dataset = handler.track_input(multi_worker_dataset)

    @tf.function
    def train_step(iterator):
        strategy.run(lambda ids: record(tf, counts, trace, ids), args=(next(iterator),))

    steps_per_epoch = args.steps_per_epoch or IDS // GLOBAL_BATCH
    steps = 0
    for _epoch in range(handler.total_run_calls // steps_per_epoch, args.epochs):
        iterator = iter(multi_worker_dataset)
        for _step in range(handler.total_run_calls % steps_per_epoch, steps_per_epoch):
            handler.run(train_step, iterator)
            steps += 1
            if args.preempt_at == handler.total_run_calls and args.index == args.preempt_worker:
                hold(handler, f"step {args.preempt_at}")
            if args.kill_at == handler.total_run_calls and args.index == args.preempt_worker:
                os.kill(os.getpid(), signal.SIGKILL)
    finish(args, counts.numpy(), trace.numpy(), steps)
    handler.close()


def run_fit(args) -> None:
    if args.stack == "tf_keras":
        import tf_failure_handling as tfh

        tfh.patch()
        import tensorflow as tf
        import tf_keras as keras
    else:
        os.environ.setdefault("KERAS_BACKEND", "tensorflow")
        import keras
        import tensorflow as tf
        from tf_failure_handling.keras import PreemptionCheckpoint

    strategy, _, _ = strategy_for(tf, args)
    steps = [0]

    class Ids(keras.Model):
        def __init__(self):
            super().__init__()
            if args.stack == "tf_keras":
                self.counts = tf.Variable(
                    tf.zeros([IDS], tf.int64),
                    trainable=False,
                    synchronization=tf.VariableSynchronization.ON_READ,
                    aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
                )
                self.trace = tf.Variable(
                    tf.constant(0, tf.int64),
                    trainable=False,
                    synchronization=tf.VariableSynchronization.ON_READ,
                    aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
                )
            else:
                self.counts = keras.Variable(
                    initializer="zeros",
                    shape=(IDS,),
                    dtype="int64",
                    trainable=False,
                    aggregation="only_first_replica",
                    synchronization="on_read",
                    name="counts",
                )
                self.trace = keras.Variable(
                    initializer="zeros",
                    shape=(),
                    dtype="int64",
                    trainable=False,
                    aggregation="only_first_replica",
                    synchronization="on_read",
                    name="trace",
                )

        def call(self, x):
            return x

        def train_step(self, data):
            record(tf, self.counts, self.trace, data)
            return {"ids": tf.reshape(tf.cast(tf.size(data), tf.float32), [1])}

    class Probe(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            steps[0] += 1
            handler = (
                getattr(self.model, "_preemption_handler", None)
                if args.stack == "tf_keras"
                else callback.handler
            )
            if (
                args.preempt_at is not None
                and handler is not None
                and handler._run_counter == args.preempt_at
                and args.index == args.preempt_worker
            ):
                hold(handler, f"step {args.preempt_at}")

    with strategy.scope():
        model = Ids()
        model.compile(optimizer="sgd")
        if args.stack == "keras3":
            model.build((None,))
    if args.stack == "tf_keras":
        callback = keras.callbacks.BackupAndRestore(args.ckpt_dir, save_before_preemption=True)
    else:
        callback = PreemptionCheckpoint(args.ckpt_dir)
    model.fit(
        dataset(tf, args),
        epochs=args.epochs,
        steps_per_epoch=args.steps_per_epoch,
        callbacks=[callback, Probe()],
        verbose=0,
    )
    finish(args, model.counts.numpy(), model.trace.numpy(), steps[0])


def main(argv=None) -> int:
    args = parse_args(argv)
    # The package's INFO lines (where the input resumes) into the worker's stderr log.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("tf_failure_handling").setLevel(logging.INFO)
    if args.stack == "custom":
        run_custom(args)
    else:
        run_fit(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
