"""What holding the last whole step costs a training step (issue 62), on a model of
``--model-mb`` MB: TensorFlow's step (nothing held) against ours (the step, then the
hold the survivors of a lost worker would save).

In a MultiWorkerMirroredStrategy cluster our ``run()`` holds the variables after each
step that returned (``_integrations/tf_last_step.LastStep.hold``): one ``tf.function``
reading every variable, sharing its buffer; TensorFlow copies a buffer when the next
step updates that variable. So the cost is in the next step's updates, and this bench
times whole steps: a step here updates **every** variable (``v.assign_sub(0.001 * v)``
on float32 variables totalling ``--model-mb``), the worst case, where every buffer is
copied once a step. A real step that leaves some variables unchanged costs less.

Each round runs ``--steps`` steps without the hold (TensorFlow's handler holds nothing),
then ``--steps`` with it, after one warm-up round of each; ``--rounds`` rounds. Prints
the median time per step of each, the ratio ours/TF, and the memory held (the held
copy: one model).

    python benches/bench_lost_worker.py [--model-mb 200] [--steps 30] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import _report  # benches/: the script's directory is on sys.path

#: Elements of one variable (4 MB of float32): the model is ``--model-mb`` / 4 of them.
VARIABLE_ELEMENTS = 1 << 20


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-mb", type=int, default=200)
    p.add_argument("--steps", type=int, default=30, help="steps per round and variant")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

    import tensorflow as tf
    from tf_failure_handling._integrations.tf_last_step import LastStep

    count = max(1, args.model_mb * (1 << 20) // (4 * VARIABLE_ELEMENTS))
    variables = [tf.Variable(tf.ones([VARIABLE_ELEMENTS])) for _ in range(count)]
    checkpoint = tf.train.Checkpoint(variables=variables)
    held = LastStep(checkpoint)
    model_mb = count * 4 * VARIABLE_ELEMENTS / (1 << 20)

    @tf.function
    def step():
        for v in variables:
            v.assign_sub(0.001 * v)

    def per_step(hold: bool) -> float:
        started = time.perf_counter()
        for n in range(args.steps):
            step()
            if hold:
                held.hold(n)
        # Every update has run: the last variable's value is read back.
        float(variables[-1][0].numpy())
        return (time.perf_counter() - started) / args.steps

    per_step(False), per_step(True)  # warm-up: tracing, the first copies
    tf_times, our_times = [], []
    for _ in range(args.rounds):
        tf_times.append(per_step(False))
        our_times.append(per_step(True))
    if held.broken is not None or held.run_count != args.steps - 1:
        sys.exit(f"the hold did not run as in a cluster: {held.broken or held.run_count}")
    tf_step, our_step = _report.median(tf_times), _report.median(our_times)
    print(f"model: {count} float32 variables, {model_mb:.0f} MB; every step updates all")
    print(f"TF (nothing held): {', '.join(_report.duration(t) for t in tf_times)}")
    print(f"ours (held):       {', '.join(_report.duration(t) for t in our_times)}")
    _report.print_readme_table(
        f"The hold's cost per step, {model_mb:.0f} MB model ({args.rounds} rounds)",
        ("model", "step, TF (median)", "step + hold, ours (median)", "ours / TF", "held"),
        [
            (
                f"{model_mb:.0f} MB, every variable updated each step",
                _report.duration(tf_step),
                _report.duration(our_step),
                _report.ratio(our_step / tf_step),
                f"{model_mb:.0f} MB (one copy of the model)",
            )
        ],
    )
    print(_report.provenance())
    return 0


if __name__ == "__main__":
    sys.exit(main())
