"""``run()`` overhead over a bare call: TensorFlow's handler and ours, in one process.

Both handlers run in local mode on a real ``tf.train.Checkpoint`` with a trivial
step function; the overhead of each is its median time per call minus the
median of calling the function directly. Prints the figures and the ratio.

    python benches/bench_run.py [--calls 200000] [--repeats 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def per_call_ns(fn, calls: int, repeats: int) -> float:
    """Median over ``repeats`` of the mean time per call of ``fn`` (which loops ``calls`` times)."""
    samples = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        fn(calls)
        samples.append((time.perf_counter_ns() - start) / calls)
    return statistics.median(samples)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()

    import tensorflow as tf
    import tf_failure_handling as tfh

    def step():
        return None

    tmp = tempfile.mkdtemp(prefix="tfh-bench-")
    tf_handler = tf.distribute.experimental.PreemptionCheckpointHandler(
        None, tf.train.Checkpoint(v=tf.Variable(0.0)), os.path.join(tmp, "tf")
    )
    our_handler = tfh.PreemptionCheckpointHandler(
        None, tf.train.Checkpoint(v=tf.Variable(0.0)), os.path.join(tmp, "ours")
    )

    def bare(n):
        f = step
        for _ in range(n):
            f()

    def with_tf(n):
        run, f = tf_handler.run, step
        for _ in range(n):
            run(f)

    def with_ours(n):
        run, f = our_handler.run, step
        for _ in range(n):
            run(f)

    # Warm up all three, then interleave the measurements so that machine
    # noise hits them alike.
    for fn in (bare, with_tf, with_ours):
        fn(10_000)
    rounds = {"bare": [], "tf": [], "ours": []}
    for _ in range(3):
        rounds["bare"].append(per_call_ns(bare, args.calls, args.repeats))
        rounds["tf"].append(per_call_ns(with_tf, args.calls // 4, args.repeats))
        rounds["ours"].append(per_call_ns(with_ours, args.calls, args.repeats))
    bare_ns = statistics.median(rounds["bare"])
    tf_ns = statistics.median(rounds["tf"])
    ours_ns = statistics.median(rounds["ours"])
    tf_over = tf_ns - bare_ns
    ours_over = max(ours_ns - bare_ns, 0.1)

    print(
        f"python {sys.version.split()[0]}, tensorflow {tf.__version__}, "
        f"tf_failure_handling {tfh.__version__}"
    )
    print(f"{'':28}{'per call':>12}{'overhead':>12}")
    print(f"{'fn()':28}{bare_ns:>10.1f}ns{'':>12}")
    print(f"{'TF handler.run(fn)':28}{tf_ns:>10.1f}ns{tf_over:>10.1f}ns")
    print(f"{'tf_failure_handling .run(fn)':28}{ours_ns:>10.1f}ns{ours_over:>10.1f}ns")
    print(f"overhead ratio TF / ours: {tf_over / ours_over:.1f}x (goal: >= 10x)")
    our_handler.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
