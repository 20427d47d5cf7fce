"""Can a MultiWorkerMirroredStrategy step that fails on a lost peer leave its updates torn?

Issue 62 asks whether the survivors of a lost worker may save the variables as they find
them. This probe answers with real runs: ``--workers`` MWMS workers on 127.0.0.1 train a
step that makes two all-reduces, each feeding the update of its own variable::

    g1 = all_reduce(1); a += g1        # a and b grow by the same amount each step
    g2 = all_reduce(1); b += g2        # invariant of every whole step: a == b

At step ``--at`` the target kills itself (SIGKILL, from inside its step, so the moment is
exact, not a race):

* ``between``: after the first all-reduce, before the second. The survivors' first
  collective has completed, their second cannot.
* ``after``: after both updates, before a third all-reduce (the step's loss, as a custom
  loop reduces it). The survivors' updates of the step are all applied, and the step still
  fails.

Each survivor prints, on its step's error: the error's type, the step that failed, and
``a`` and ``b`` as it then holds them (its own copies, no collective). ``between`` shows a
torn step when ``a != b``; ``after`` shows a step whose updates are whole although the
step failed (``a == b == at + 1`` steps' worth), which a save must not count as not run.

    python dev/torn_step_probe.py [--variants between,after] [--targets 1,0]
        [--workers 2] [--at 5] [--python PYTHON]

Only 127.0.0.1 is addressed.

What it found (TensorFlow 2.21, 2 workers, ``--at 5``, the chief and the non-chief as
target, 2026-12-07): every survivor raised ``UnavailableError``; with ``between`` it
held ``a = 12, b = 10`` (the failed step's first update applied, its second not: a torn
step), with ``after`` ``a = b = 12`` (the failed step applied whole). So the variables
a survivor finds are not a state of the run at any step it can name: the save must come
from a copy of the last step that returned.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

from lost_peer_probe import PREFIX, say, start_workers

#: How long the workers may take to start, reach the step and fail (a bound on a hang).
RUN_BOUND = 240.0


def worker(args) -> int:
    import numpy as np
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    with strategy.scope():
        a = tf.Variable(0.0, name="a")
        b = tf.Variable(0.0, name="b")
    die_at = args.at if index == args.target else -1

    def gate(step):
        if int(step) == die_at:
            say(role="killed", index=index, step=int(step))
            os.kill(os.getpid(), signal.SIGKILL)
        return np.float32(0.0)

    @tf.function
    def train(step):
        def replica(step):
            ctx = tf.distribute.get_replica_context()
            g1 = ctx.all_reduce("sum", tf.constant(1.0))
            a.assign_add(g1)
            if args.variant == "between":
                with tf.control_dependencies([g1]):
                    g1 = tf.py_function(gate, [step], tf.float32)
            g2 = ctx.all_reduce("sum", g1 * 0.0 + 1.0)
            b.assign_add(g2)
            if args.variant == "after":
                with tf.control_dependencies([a.read_value(), b.read_value()]):
                    g2 = tf.py_function(gate, [step], tf.float32)
            return ctx.all_reduce("sum", g2)

        return strategy.run(replica, args=(step,))

    for step in range(args.steps):
        try:
            train(tf.constant(step, tf.int64))
        except Exception as e:  # noqa: BLE001 - the probe records what came
            values = (float(a.numpy()), float(b.numpy()))
            say(
                role="survivor",
                index=index,
                failed_step=step,
                type=type(e).__name__,
                a=values[0],
                b=values[1],
                torn=values[0] != values[1],
            )
            sys.stdout.flush()
            os._exit(3)  # TF's exit can hang on the lost peer; the probe only needs the line
        say(role="progress", index=index, step=step)
    say(role="finished", index=index)
    return 0


def scenario(python: str, variant: str, target: int, workers: int, at: int) -> list:
    args = ["--variant", variant, "--target", str(target), "--at", str(at)]
    args += ["--steps", str(at + 5)]
    prefix = f"torn-step-{variant}{target}-"
    tmp, procs, outs = start_workers(python, __file__, workers, prefix, args)
    end = time.monotonic() + RUN_BOUND
    try:
        while time.monotonic() < end and any(p.poll() is None for p in procs):
            time.sleep(0.2)
        hung = [i for i, p in enumerate(procs) if p.poll() is None]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
    results = []
    for i in range(workers):
        text = Path(outs[i].name).read_text(errors="replace")
        lines = [json.loads(x[len(PREFIX) :]) for x in text.splitlines() if x.startswith(PREFIX)]
        ends = [e for e in lines if e["role"] in ("survivor", "killed", "finished")]
        if not ends:
            why = "hung" if i in hung else "no line"
            ends = [{"role": why, "index": i, "stderr": Path(tmp, f"w{i}.err").read_text()[-800:]}]
        for e in ends:
            e.update(variant=variant, target=target, workers=workers, at=at)
            results.append(e)
    return results


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="mode")
    w = sub.add_parser("worker")
    w.add_argument("--variant", required=True, choices=("between", "after"))
    w.add_argument("--target", type=int, required=True)
    w.add_argument("--at", type=int, required=True)
    w.add_argument("--steps", type=int, required=True)
    w.add_argument("--dir", required=True)
    p.add_argument("--variants", default="between,after")
    p.add_argument("--targets", default="1,0")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--at", type=int, default=5)
    p.add_argument("--python", default=sys.executable)
    args = p.parse_args(argv)
    if args.mode == "worker":
        return worker(args)
    for variant in args.variants.split(","):
        for target in args.targets.split(","):
            for e in scenario(args.python, variant, int(target), args.workers, args.at):
                print(json.dumps(e, sort_keys=True)[:2000], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
