"""What every example shares: its common options and the lines it prints.

Each example prints the same four kinds of line, which ``launch_local.py`` and the
tests (``tests/examples``) read:

* ``starting at step N``: ``N`` > 0 means a checkpoint was restored;
* ``step N loss X``, every ``--log-every`` steps;
* ``preempted: checkpoint saved at step N, exiting with code C``, when the handler
  saved and exits for a restart;
* ``finished at step N``.

Nothing here is needed for preemption handling itself: copy an example without this
file by replacing these calls with ``print``.
"""

from __future__ import annotations

import argparse
import contextlib
import time


def say(message: str) -> None:
    print(message, flush=True)


def parser(doc: str, *, steps: int, step_time: float, log_every: int = 10):
    """An argument parser with the options every example has."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--steps", type=int, default=steps, help="train until this step")
    p.add_argument("--step-time", type=float, default=step_time, help="seconds to sleep per step")
    p.add_argument("--log-every", type=int, default=log_every, help="log every N steps")
    return p


@contextlib.contextmanager
def reporting(step, finished_extra=lambda: ""):
    """Prints how the training in the body ended: saved for a restart (the handler's
    exit, a ``SystemExit``, goes on) or finished. ``step()`` is the current step."""
    try:
        yield
    except SystemExit as e:
        say(f"preempted: checkpoint saved at step {step()}, exiting with code {e.code}")
        raise
    say(f"finished at step {step()}{finished_extra()}")


def keras_progress(callback_class, step, args):
    """A Keras callback (``callback_class``: ``keras.callbacks.Callback`` or tf_keras')
    that prints the starting step, the loss every ``args.log_every`` steps, and sleeps
    ``args.step_time`` after each batch. Put it after the callback that restores."""

    class Progress(callback_class):
        def on_train_begin(self, logs=None):
            say(f"starting at step {step()}")

        def on_train_batch_end(self, batch, logs=None):
            if step() % args.log_every == 0:
                say(f"step {step()} loss {float(logs['loss']):.6f}")
            time.sleep(args.step_time)

    return Progress()
