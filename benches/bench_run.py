"""``run()`` overhead over a bare call: TensorFlow's handler and ours, in one process.

Both handlers run in local mode on a real ``tf.train.Checkpoint`` with a trivial
step function. Each of ``--rounds`` rounds measures the bare call, TF's
``run()`` and ours one after the other (each the median of ``--repeats`` loops
of ``--calls`` calls; TF's loops are a quarter as long); a handler's overhead in
a round is its time per call minus the bare call's. Prints the medians over the
rounds, the ratio of the median overheads and the range of the per-round
ratios, then the README's table.

    python benches/bench_run.py [--calls 200000] [--repeats 5] [--rounds 9]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import _report

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
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=9)
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
    # noise hits them alike: each round measures the bare call, TF's run() and
    # ours, one after the other.
    for fn in (bare, with_tf, with_ours):
        fn(10_000)
    rounds: dict = {"bare": [], "tf": [], "ours": []}
    for _ in range(args.rounds):
        rounds["bare"].append(per_call_ns(bare, args.calls, args.repeats))
        rounds["tf"].append(per_call_ns(with_tf, args.calls // 4, args.repeats))
        rounds["ours"].append(per_call_ns(with_ours, args.calls, args.repeats))
    over = {k: [max(v - b, 0.1) for v, b in zip(rounds[k], rounds["bare"])] for k in ("tf", "ours")}
    med = {k: statistics.median(v) for k, v in rounds.items()}
    tf_over, ours_over = statistics.median(over["tf"]), statistics.median(over["ours"])
    per_round = _report.ratio_range(t / o for t, o in zip(over["tf"], over["ours"]))

    print(
        f"python {sys.version.split()[0]}, tensorflow {tf.__version__}, "
        f"tf_failure_handling {tfh.__version__}; median of {args.rounds} rounds"
    )
    print(f"{'':28}{'per call':>12}{'overhead':>12}")
    print(f"{'fn()':28}{med['bare']:>10.1f}ns{'':>12}")
    print(f"{'TF handler.run(fn)':28}{med['tf']:>10.1f}ns{tf_over:>10.1f}ns")
    print(f"{'tf_failure_handling .run(fn)':28}{med['ours']:>10.1f}ns{ours_over:>10.1f}ns")
    print(
        f"overhead ratio TF / ours: {tf_over / ours_over:.1f}x, per round {per_round}"
        " (goal: >= 10x)"
    )

    def ns(x: float) -> str:
        return _report.duration(x * 1e-9)

    _report.print_readme_table(
        "run() overhead",
        ("", "per call", "overhead"),
        [
            ("`fn()`", ns(med["bare"]), ""),
            ("TensorFlow `handler.run(fn)`", ns(med["tf"]), ns(tf_over)),
            ("tf-failure-handling `handler.run(fn)`", ns(med["ours"]), ns(ours_over)),
            (
                "**ratio** (per round)",
                "",
                f"**{_report.ratio(tf_over / ours_over)}** less ({per_round})",
            ),
        ],
    )
    our_handler.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
