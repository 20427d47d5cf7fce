"""A training that survives SLURM's time limits and preemptions.

Run by ``one_node.sbatch`` (one task, no cluster resolver) and ``multi_node.sbatch``
(``srun``, one task per worker, MultiWorkerMirroredStrategy through TensorFlow's
``SlurmClusterResolver``). The step counter is a ``tf.Variable`` in the checkpoint:
a requeued run restores it and carries on where the saved one stopped.

When SLURM announces the end (SIGUSR1 from ``--signal``, SIGTERM from a preemption or
``scancel``), ``PreemptionCheckpointHandler`` saves at one agreed step and exits with
42; under SLURM it also puts the job back in the queue when the end was the time
limit or a preemption (not a user's ``scancel``).

Prints ``EVENT {json}`` lines (start, progress, done, exit) that the tests read.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time


def emit(event: str, **fields) -> None:
    record = {
        "event": event,
        "time": time.time(),
        "job": os.environ.get("SLURM_JOB_ID"),
        "task": int(os.environ.get("SLURM_PROCID", "0") or 0),
        "restart": int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0),
        "pid": os.getpid(),
        **fields,
    }
    sys.stdout.write("EVENT " + json.dumps(record, sort_keys=True) + "\n")
    sys.stdout.flush()


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ckpt-dir", required=True, help="checkpoints (shared by all tasks)")
    p.add_argument("--steps", type=int, default=1000, help="train until this step")
    p.add_argument("--step-time", type=float, default=0.1, help="seconds each step takes")
    p.add_argument("--impl", choices=("ours", "tf"), default="ours", help="whose handler")
    p.add_argument(
        "--multi-worker",
        action="store_true",
        help="MultiWorkerMirroredStrategy with SlurmClusterResolver (one task per worker)",
    )
    p.add_argument("--port-base", type=int, default=8888, help="SlurmClusterResolver's ports")
    p.add_argument(
        "--grace",
        type=float,
        default=None,
        help="TerminationConfig(grace_period=...): train on after the first save",
    )
    p.add_argument("--progress-every", type=int, default=10)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s: %(message)s"
    )
    import tensorflow as tf

    if args.impl == "ours":
        import tf_failure_handling as tfh

        Handler, Config = tfh.PreemptionCheckpointHandler, tfh.TerminationConfig
    else:
        Handler = tf.distribute.experimental.PreemptionCheckpointHandler
        Config = tf.distribute.experimental.TerminationConfig

    if args.multi_worker:
        # TF's SlurmClusterResolver hands out one GPU range per task and lists no
        # task at all on a node without GPUs (gpus_per_node=0 even divides by zero):
        # on CPU, pretend one "GPU" per task and leave CUDA_VISIBLE_DEVICES alone.
        gpus = None
        if not tf.config.list_physical_devices("GPU"):
            gpus = int(os.environ.get("SLURM_STEP_NUM_TASKS") or os.environ["SLURM_NTASKS"])
        resolver = tf.distribute.cluster_resolver.SlurmClusterResolver(
            port_base=args.port_base,
            gpus_per_node=gpus,
            gpus_per_task=None if gpus is None else 1,
            auto_set_gpu=gpus is None,
        )
        strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver)
    else:
        resolver = None
        strategy = tf.distribute.get_strategy()

    with strategy.scope():
        step = tf.Variable(0, dtype=tf.int64, name="step")
        weight = tf.Variable(tf.ones((4, 4)), name="weight")
    checkpoint = tf.train.Checkpoint(step=step, weight=weight)
    handler = Handler(resolver, checkpoint, args.ckpt_dir, Config(grace_period=args.grace))
    emit("start", step=int(step.numpy()), impl=args.impl)

    x = tf.random.stateless_normal((8, 4), seed=(1, 2))

    def replica_step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.matmul(x, weight)))
        weight.assign_sub(0.001 * tape.gradient(loss, weight))
        return loss

    @tf.function
    def train_step():
        loss = strategy.run(replica_step)
        step.assign_add(1)
        return strategy.reduce(tf.distribute.ReduceOp.MEAN, loss, axis=None)

    try:
        while int(step.numpy()) < args.steps:
            handler.run(train_step)
            time.sleep(args.step_time)
            if int(step.numpy()) % args.progress_every == 0:
                emit("progress", step=int(step.numpy()))
    except SystemExit as e:
        emit("exit", code=e.code, step=int(step.numpy()))
        raise
    emit("done", step=int(step.numpy()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
