"""Failure classification per call: TensorFlow's ``_is_worker_failure`` /
``_is_ps_failure`` and ours, side by side in one process.

Each function classifies the same errors -- a worker ``UnavailableError``, a
PS ``UnavailableError``, a plain ``InvalidArgumentError`` and a
``ClosureInputError`` wrapping the worker error -- one at a time and as a mix.
A sample is the mean time per call over ``--calls`` calls, minus the same loop
with no call; the figure is the median of ``--repeats`` samples, with TF's and
our samples interleaved so that both see the same machine. Prints a table and
the ratios; the target is ours >= 10x faster than TF's ``_is_worker_failure``.

Build the extension with ``maturin develop --release`` first.

    python benches/bench_classify.py [--calls 100000] [--repeats 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def loop_ns(fn, items: list, calls: int) -> float:
    """Mean ns per call of ``fn`` over ``calls`` calls cycling through ``items``."""
    rounds = max(1, calls // len(items))
    start = time.perf_counter_ns()
    for _ in range(rounds):
        for x in items:
            fn(x)
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
        "mix of the four": [worker, ps, invalid, wrapped],
    }
    pairs = {
        "is_worker_failure": (cc._is_worker_failure, _failure.is_worker_failure),
        "is_ps_failure": (cc._is_ps_failure, _failure.is_ps_failure),
    }
    for tf_fn, our_fn in pairs.values():
        for items in cases.values():
            for x in items:
                assert tf_fn(x) == our_fn(x), (tf_fn, x)

    print(f"python {sys.version.split()[0]}, {args.calls} calls x {args.repeats} repeats")
    print(f"{'function':<18} {'errors':<26} {'TF ns':>8} {'ours ns':>8} {'ratio':>7}")
    worst = {}
    for fname, (tf_fn, our_fn) in pairs.items():
        for cname, items in cases.items():
            tf_s, our_s = [], []
            for _ in range(args.repeats):
                base = empty_ns(items, args.calls)
                tf_s.append(loop_ns(tf_fn, items, args.calls) - base)
                our_s.append(loop_ns(our_fn, items, args.calls) - base)
            t, o = statistics.median(tf_s), statistics.median(our_s)
            worst[fname] = min(worst.get(fname, float("inf")), t / o)
            print(f"{fname:<18} {cname:<26} {t:8.0f} {o:8.0f} {t / o:6.1f}x")
    base = statistics.median(empty_ns(cases["mix of the four"], args.calls) for _ in range(5))
    print(f"(loop overhead subtracted: {base:.0f} ns per iteration)")
    for fname, ratio in worst.items():
        print(f"worst ratio, {fname}: {ratio:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
