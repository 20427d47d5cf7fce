"""An orbit ``Controller`` whose ``SaveCheckpointIfPreempted`` action uses our handler.

orbit builds ``tf.distribute.experimental.PreemptionCheckpointHandler`` itself, inside
``orbit.actions.SaveCheckpointIfPreempted``; ``tf_failure_handling.patch()`` makes that
name ours, so the action saves on every platform's notice and every wait is bounded.
After each train loop the action asks the handler whether to save (orbit passes the
global step as the checkpoint number); on a notice it saves and exits 42 (143 on GCE),
and the restarted ``Controller`` restores the checkpoint and goes on::

    python examples/launch_local.py --workers 1 --preempt worker:0@30 -- \\
        examples/orbit_controller.py --model-dir /tmp/orbit-model

orbit ships inside ``tf-models-official`` (``pip install --no-deps
tf-models-official`` beside TensorFlow: its own requirements pin another TensorFlow).
Prints ``starting at step N``, ``step N loss X``, ``preempted: ...`` and ``finished at
step N`` (N: orbit's global step).
"""

from __future__ import annotations

import sys
import time

import tf_failure_handling
from common import parser, reporting, say

tf_failure_handling.patch()  # before orbit builds its handler

FEATURES = 4
BATCH = 16
LEARNING_RATE = 0.05


def parse_args(argv=None):
    p = parser(__doc__, steps=100, step_time=0.02)
    p.add_argument("--model-dir", required=True)
    return p.parse_args(argv)


def build_trainer(dataset=None):
    """An orbit ``StandardTrainer`` for a small regression: one SGD step per train loop
    on ``dataset``'s (features, labels) batches, ``global_step`` counting the steps.

    The input's position is not in the checkpoint: a restarted run reads ``dataset``
    from its beginning (the default repeats 1,024 rows, so that does not matter)."""
    import orbit
    import tensorflow as tf

    if dataset is None:
        x = tf.random.stateless_normal((1024, FEATURES), seed=(1, 2))
        y = tf.reduce_sum(x, axis=1, keepdims=True) * 0.5 + 1.0
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(BATCH)

    class Trainer(orbit.StandardTrainer):
        def __init__(self):
            self.global_step = orbit.utils.create_global_step()
            self.kernel = tf.Variable(tf.zeros((FEATURES, 1)))
            self.bias = tf.Variable(tf.zeros((1,)))
            self.loss = tf.Variable(0.0)
            super().__init__(train_dataset=dataset)

        def train_loop_begin(self):
            pass

        def train_step(self, iterator):
            features, labels = next(iterator)
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(features @ self.kernel + self.bias - labels))
            g_kernel, g_bias = tape.gradient(loss, [self.kernel, self.bias])
            self.kernel.assign_sub(LEARNING_RATE * g_kernel)
            self.bias.assign_sub(LEARNING_RATE * g_bias)
            self.loss.assign(loss)
            self.global_step.assign_add(1)

        def train_loop_end(self):
            return {"loss": self.loss.read_value()}

    return Trainer()


def checkpointing(trainer, model_dir: str, **action_options):
    """The trainer's ``CheckpointManager`` and orbit's ``SaveCheckpointIfPreempted``
    action over it (numbered by ``global_step``); ``action_options`` go to the action."""
    import orbit
    import tensorflow as tf

    checkpoint = tf.train.Checkpoint(
        kernel=trainer.kernel, bias=trainer.bias, global_step=trainer.global_step
    )
    manager = tf.train.CheckpointManager(checkpoint, model_dir, max_to_keep=1)
    save_if_preempted = orbit.actions.SaveCheckpointIfPreempted(
        tf.distribute.get_strategy().cluster_resolver,
        manager,
        checkpoint_number=trainer.global_step,
        **action_options,
    )
    return manager, save_if_preempted


def main(argv=None) -> int:
    args = parse_args(argv)
    import orbit

    trainer = build_trainer()
    manager, save_if_preempted = checkpointing(trainer, args.model_dir)

    def step() -> int:
        return int(trainer.global_step.numpy())

    def progress(output) -> None:
        if step() % args.log_every == 0:
            say(f"step {step()} loss {float(output['loss']):.6f}")
        time.sleep(args.step_time)

    controller = orbit.Controller(
        global_step=trainer.global_step,
        trainer=trainer,
        steps_per_loop=1,
        checkpoint_manager=manager,  # the Controller restores the latest checkpoint
        train_actions=[progress, save_if_preempted],
    )
    say(f"starting at step {step()}")
    with reporting(step):
        controller.train(args.steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
