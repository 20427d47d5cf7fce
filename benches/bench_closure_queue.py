"""The closure queue: TensorFlow's ``_CoordinatedClosureQueue`` and ours, in one process.

Three workloads, each timed over ``--closures`` stand-in closures (objects with a
``tag`` attribute), in interleaved rounds (TF, ours, TF, ours, ...); medians:

1. ``put`` + ``get`` + ``mark_finished`` on one thread;
2. one producer (the main thread: ``put`` each, then ``wait()``) and one consumer
   thread (``get`` + ``mark_finished`` until ``stop()``);
3. the same with two consumer threads.

Prints the time per closure, closures per second and ours/TF throughput.

    python benches/bench_closure_queue.py [--closures 20000] [--rounds 7]

Run it on a release build (``maturin develop --release``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from typing import Any, Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


class Closure:
    """Stand-in closure: the queue only sets and reads ``tag``."""

    __slots__ = ("tag",)

    def __init__(self) -> None:
        self.tag = None


def single_thread(make: Callable[[], Any], closures: list) -> float:
    q = make()
    put, get, finished = q.put, q.get, q.mark_finished
    start = time.perf_counter()
    for c in closures:
        put(c)
        get()
        finished()
    elapsed = time.perf_counter() - start
    q.stop()
    return elapsed


def producer_consumers(consumers: int) -> Callable[[Callable[[], Any], list], float]:
    def run(make: Callable[[], Any], closures: list) -> float:
        q = make()

        def consume() -> None:
            get, finished = q.get, q.mark_finished
            while get() is not None:
                finished()

        threads = [threading.Thread(target=consume, daemon=True) for _ in range(consumers)]
        for t in threads:
            t.start()
        time.sleep(0.02)  # consumers are blocked in get()
        put = q.put
        start = time.perf_counter()
        for c in closures:
            put(c)
        q.wait()
        elapsed = time.perf_counter() - start
        q.stop()
        for t in threads:
            t.join()
        return elapsed

    return run


WORKLOADS = [
    ("put+get+mark_finished, 1 thread", single_thread),
    ("1 producer + 1 consumer thread", producer_consumers(1)),
    ("1 producer + 2 consumer threads", producer_consumers(2)),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--closures", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()

    from tensorflow.python.distribute.coordinator import cluster_coordinator as cc
    from tf_failure_handling._closure_queue import ClosureQueue

    impls = {"tf": cc._CoordinatedClosureQueue, "ours": ClosureQueue}
    closures = [Closure() for _ in range(args.closures)]
    n = len(closures)
    print(f"closure queue, {n} closures per round, median of {args.rounds} interleaved rounds")
    print(f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    header = (
        f"{'workload':34} {'TF µs/closure':>14} {'ours':>8}"
        f" {'TF closures/s':>14} {'ours':>11} {'ratio':>7}"
    )
    print(header)
    print("-" * len(header))
    for name, workload in WORKLOADS:
        samples: dict = {k: [] for k in impls}
        workload(ClosureQueue, closures[:1000])  # warm up
        for _ in range(args.rounds):
            for key, make in impls.items():
                samples[key].append(workload(make, closures))
        tf_s, ours_s = (statistics.median(samples[k]) for k in ("tf", "ours"))
        print(
            f"{name:34} {tf_s / n * 1e6:14.2f} {ours_s / n * 1e6:8.3f}"
            f" {n / tf_s:14,.0f} {n / ours_s:11,.0f} {tf_s / ours_s:6.1f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
