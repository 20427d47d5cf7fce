"""Failure classification per call: TensorFlow's ``_is_worker_failure`` /
``_is_ps_failure`` and ours, side by side in one process.

Each function classifies the same errors -- a worker ``UnavailableError``, a
PS ``UnavailableError``, a plain ``InvalidArgumentError`` and a
``ClosureInputError`` wrapping the worker error -- one at a time and as a mix.
A third row, "ps, then worker", times what the coordinator's failure handling
asks of the classifier for one failed closure: both verdicts for each error,
in one timed loop. TF's coordinator calls ``_is_ps_failure(e)`` (its
transient-PS-failure check) and then ``_is_worker_failure(e)`` (its
preemption check); ours calls ``classify_failure(e)`` once, which returns
both.

A sample is the mean time per error over ``--calls`` errors, minus the same
loop with no call; the figure is the median of ``--repeats`` samples, with
TF's and our samples interleaved so that both see the same machine. Prints a
table with the ratio of the medians and the range of the per-repeat ratios,
then the README's table (the mix rows).

Build the extension with ``maturin develop --release`` first.

    python benches/bench_classify.py [--calls 100000] [--repeats 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import _report

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

MIX = "mix of the four"
#: The row that times both classifications per error in one loop.
BOTH = "ps, then worker"


def loop_ns(fn, items: list, calls: int) -> float:
    """Mean ns per item of ``fn(x)`` over ``calls`` items cycling through ``items``."""
    rounds = max(1, calls // len(items))
    start = time.perf_counter_ns()
    for _ in range(rounds):
        for x in items:
            fn(x)
    return (time.perf_counter_ns() - start) / (rounds * len(items))


def loop_both_ns(first, second, items: list, calls: int) -> float:
    """Mean ns per item of ``first(x)`` and then ``second(x)``, in one loop."""
    rounds = max(1, calls // len(items))
    start = time.perf_counter_ns()
    for _ in range(rounds):
        for x in items:
            first(x)
            second(x)
    return (time.perf_counter_ns() - start) / (rounds * len(items))


def empty_ns(items: list, calls: int) -> float:
    """The loop of :func:`loop_ns` without the call."""
    rounds = max(1, calls // len(items))
    start = time.perf_counter_ns()
    for _ in range(rounds):
        for _x in items:
            pass
    return (time.perf_counter_ns() - start) / (rounds * len(items))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()

    from tensorflow.python.distribute.coordinator import cluster_coordinator as cc
    from tensorflow.python.framework import errors
    from tf_failure_handling import _failure

    os.environ.pop("TF_PS_HANDLE_UNKNOWN_ERROR", None)
    worker = errors.UnavailableError(
        None,
        None,
        "Socket closed\nAdditional GRPC error information from remote target "
        '/job:worker/replica:0/task:3:\n:{"created":"@1700000000.1",'
        '"description":"Error received from peer","grpc_status":14}',
    )
    ps = errors.UnavailableError(
        None,
        None,
        "failed to connect to all addresses\nAdditional GRPC error information from "
        'remote target /job:ps/replica:0/task:1:\n:{"grpc_status":14}',
    )
    invalid = errors.InvalidArgumentError(
        None, None, "Incompatible shapes: [32,10] vs. [16,10] [Op:AddV2]"
    )
    wrapped = cc.ClosureInputError(worker)
    cases = {
        "worker Unavailable": [worker],
        "PS Unavailable": [ps],
        "InvalidArgument": [invalid],
        "ClosureInputError(worker)": [wrapped],
        MIX: [worker, ps, invalid, wrapped],
    }
    pairs = {
        "is_worker_failure": (cc._is_worker_failure, _failure.is_worker_failure),
        "is_ps_failure": (cc._is_ps_failure, _failure.is_ps_failure),
    }
    for tf_fn, our_fn in pairs.values():
        for items in cases.values():
            for x in items:
                assert tf_fn(x) == our_fn(x), (tf_fn, x)
    for x in cases[MIX]:
        assert _failure.classify_failure(x) == (cc._is_ps_failure(x), cc._is_worker_failure(x))

    def timer(name: str):
        """``(tf_loop, our_loop)``, each ``(items, calls) -> ns per item``."""
        if name != BOTH:
            tf_fn, our_fn = pairs[name]
            return (
                lambda items, calls: loop_ns(tf_fn, items, calls),
                lambda items, calls: loop_ns(our_fn, items, calls),
            )
        tf_ps, _ = pairs["is_ps_failure"]
        tf_worker, _ = pairs["is_worker_failure"]
        return (
            lambda items, calls: loop_both_ns(tf_ps, tf_worker, items, calls),
            lambda items, calls: loop_ns(_failure.classify_failure, items, calls),
        )

    print(f"python {sys.version.split()[0]}, {args.calls} calls x {args.repeats} repeats")
    print(
        f"{'function':<18} {'errors':<26} {'TF ns':>8} {'ours ns':>8} {'ratio':>7}"
        f" {'per repeat':>11}"
    )
    worst: dict = {}
    mix: dict = {}
    for fname in (*pairs, BOTH):
        tf_loop, our_loop = timer(fname)
        for cname, items in cases.items():
            tf_s, our_s = [], []
            for _ in range(args.repeats):
                base = empty_ns(items, args.calls)
                tf_s.append(tf_loop(items, args.calls) - base)
                our_s.append(our_loop(items, args.calls) - base)
            t, o = statistics.median(tf_s), statistics.median(our_s)
            per_repeat = _report.ratio_range(a / b for a, b in zip(tf_s, our_s))
            worst[fname] = min(worst.get(fname, float("inf")), t / o)
            if cname == MIX:
                mix[fname] = (t, o, per_repeat)
            print(f"{fname:<18} {cname:<26} {t:8.0f} {o:8.0f} {t / o:6.1f}x {per_repeat:>11}")
    base = statistics.median(empty_ns(cases[MIX], args.calls) for _ in range(5))
    print(f"(loop overhead subtracted: {base:.0f} ns per iteration)")
    for fname, ratio in worst.items():
        print(f"worst ratio, {fname}: {ratio:.1f}x")

    labels = {
        "is_worker_failure": "`_is_worker_failure` (mix of worker, PS, app and wrapped errors)",
        "is_ps_failure": "`_is_ps_failure` (same mix)",
        BOTH: "both verdicts, as the coordinator needs them for a failed closure (same mix, "
        "one loop): TF `_is_ps_failure` then `_is_worker_failure`; ours one "
        "`classify_failure` call",
    }
    _report.print_readme_table(
        "failure classification, per call",
        ("", "TensorFlow", "tf-failure-handling", "ratio (per repeat)"),
        [
            (
                labels[fname],
                _report.duration(t * 1e-9),
                _report.duration(o * 1e-9),
                f"{_report.ratio(t / o)} ({per_repeat})",
            )
            for fname, (t, o, per_repeat) in mix.items()
        ],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
