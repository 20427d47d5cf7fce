"""One process training with orbit's ``Controller`` and its ``SaveCheckpointIfPreempted``
action, after ``tf_failure_handling.patch()`` (orbit builds
``tf.distribute.experimental.PreemptionCheckpointHandler`` itself)::

    python orbit_worker.py --model-dir /tmp/orbit --steps 12 --hold-at 5

The trainer is ``examples/orbit_controller.py``'s (one SGD update per train loop);
``global_step`` counts the updates and numbers the checkpoints (orbit passes it as
``checkpoint_number``).
Events (``EVENT {json}`` lines, see ``mwms_worker.emit``): ``start`` (``restored``:
the global step after the Controller restored), ``step`` (after each train loop),
``reached`` (at a ``--hold-at`` step: the process then waits, bounded, until its
handler has handled one more termination notice), ``save`` (every
``CheckpointManager.save``: ``preemption``, ``number``, ``path``), ``exit``,
``error``, ``done`` (``steps`` run by this process, ``global_step``, ``weights``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from mwms_worker import emit, example, reporting_the_end  # the script's directory is on sys.path

#: Bound on waiting, at a ``--hold-at`` step, for the handler to handle the notice.
HOLD_TIMEOUT = 60.0


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", required=True)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument(
        "--hold-at",
        default="",
        help="comma-separated global steps; at the i-th, wait until the handler has "
        "handled i notices",
    )
    p.add_argument("--keep-running-after-save", action="store_true")
    return p.parse_args(argv)


def instrument_saves(tf) -> None:
    from tensorflow.python.checkpoint import checkpoint_context

    cls = tf.train.CheckpointManager
    original = cls.save

    def save(self, checkpoint_number=None, *args, **kwargs):
        path = original(self, checkpoint_number, *args, **kwargs)
        number = checkpoint_number
        emit(
            "save",
            preemption=checkpoint_context.in_preemption_save_context(),
            number=None if number is None else int(getattr(number, "numpy", lambda: number)()),
            path=path,
        )
        return path

    cls.save = save


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("GCE_METADATA_IP", "127.0.0.1:9")
    import tensorflow as tf
    import tf_failure_handling

    tf_failure_handling.patch()
    import orbit

    instrument_saves(tf)
    # The example's trainer (examples/orbit_controller.py), on one batch repeated: a
    # resumed run then sees the batches an uninterrupted one does, and ends with its
    # weights exactly.
    x = tf.random.stateless_normal((16, 4), seed=(3, 4))
    y = tf.reduce_sum(x, axis=1, keepdims=True) * 0.5 + 1.0
    recipe = example("orbit_controller")
    trainer = recipe.build_trainer(tf.data.Dataset.from_tensors((x, y)).repeat())
    manager, save_if_preempted = recipe.checkpointing(
        trainer, args.model_dir, keep_running_after_save=args.keep_running_after_save
    )
    handler = save_if_preempted._preemption_handler
    holds = [int(s) for s in args.hold_at.split(",") if s]
    ran = [0]

    def probe(_output) -> None:
        ran[0] += 1
        step = int(trainer.global_step.numpy())
        emit("step", step=step)
        if step in holds:
            wanted = holds.index(step) + 1
            emit("reached", step=step, handler=type(handler).__module__)
            deadline = time.monotonic() + HOLD_TIMEOUT
            while handler._notices_handled < wanted:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"notice {wanted} not handled within {HOLD_TIMEOUT}s")
                time.sleep(0.005)

    controller = orbit.Controller(
        global_step=trainer.global_step,
        trainer=trainer,
        steps_per_loop=1,
        checkpoint_manager=manager,
        train_actions=[probe, save_if_preempted],
    )
    emit("start", pid=os.getpid(), restored=int(trainer.global_step.numpy()))
    with reporting_the_end():
        controller.train(args.steps)
    emit(
        "done",
        steps=ran[0],
        global_step=int(trainer.global_step.numpy()),
        weights={
            "kernel": [float(v) for v in trainer.kernel.numpy().ravel()],
            "bias": [float(v) for v in trainer.bias.numpy().ravel()],
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
