"""The closure queue: TensorFlow's ``_CoordinatedClosureQueue`` and ours, in one process.

Workloads, each over ``--closures`` stand-in closures (objects with a ``tag``
attribute, which is all the queue touches):

* ``put`` + ``get`` + ``mark_finished`` on one thread: the cost of the calls.
* What a ``ClusterCoordinator`` does with its queue: the main thread puts every
  closure (``schedule``) and then ``wait()``s (``join``); each of ``k`` worker
  threads loops ``get(tag=i)`` -> executes the closure -> ``mark_finished()``,
  as TF's ``Worker._process_queue`` does. A real execution waits for a remote
  worker with the GIL released; the stand-ins release it too:

  - ``select()``: ``select.select([], [], [], 0)``, a system call of a few µs;
  - ``time.sleep(0)``: on Linux a ``clock_nanosleep`` of about 60-120 µs here
    (the kernel's timer slack), closer to a short remote call.

  The producer either puts back to back, or also runs the stand-in before each
  ``put`` (``schedule()`` has work of its own per closure), so that every
  operation can cross threads. Our queue's ``put``/``get`` never release the
  GIL when they need not wait, so a producer putting back to back can fill it
  within one GIL switch interval before a worker runs; TF's lock-and-Condition
  queue gets interrupted. The "overlap" column shows how far each run was
  concurrent: the share of closures finished when the last ``put`` returned.
  The "alone" column is the same threads running their stand-ins with no queue
  at all, the ceiling for any queue.

The threads of a round start together at a ``threading.Barrier``; nothing is
synchronised by sleeping. Every workload runs once per queue to warm up (both
queues), then ``--rounds`` rounds, TF's and ours alternately. Prints closures
per second (medians), the ratio of the medians and the range of the per-round
ratios, then the README's table (which adds the wall time per closure).

    python benches/bench_closure_queue.py [--closures 20000] [--rounds 7]

Run it on a release build (``maturin develop --release``).
"""

from __future__ import annotations

import argparse
import os
import select
import sys
import threading
import time
from typing import Any, Callable

import _report

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

#: Bound on one round; a round that takes longer is a hang, not a figure.
ROUND_TIMEOUT = 120.0


class Closure:
    """Stand-in closure: the queue only sets and reads ``tag``."""

    __slots__ = ("tag",)

    def __init__(self) -> None:
        self.tag = None


def syscall() -> None:
    select.select([], [], [], 0)


def sleep0() -> None:
    time.sleep(0)


STAND_INS = {
    "syscall": (syscall, "`select()` syscall"),
    "sleep": (sleep0, "`time.sleep(0)`"),
}


def single_thread(make: Callable[[], Any], closures: list) -> tuple[float, None]:
    q = make()
    put, get, finished = q.put, q.get, q.mark_finished
    start = time.perf_counter()
    for c in closures:
        put(c)
        get()
        finished()
    elapsed = time.perf_counter() - start
    q.stop()
    return elapsed, None


def coordinator(
    workers: int, execute: Callable[[], None], producer_releases: bool
) -> Callable[..., tuple[float, float]]:
    """The coordinator's use of the queue with ``workers`` worker threads.

    With ``producer_releases`` the producer also runs the stand-in before each
    ``put`` (``schedule()`` does work of its own per closure), so that every
    operation can cross threads; without it, it puts back to back.

    The returned function runs one round and returns its time and the share of
    the closures already finished when the last ``put`` returned (near 0 when
    the producer filled the queue before the workers got the GIL).
    """

    def run(make: Callable[[], Any], closures: list) -> tuple[float, float]:
        q = make()
        barrier = threading.Barrier(workers + 1)
        errors: list = []
        done = [0] * workers

        def worker(index: int) -> None:
            get, finished = q.get, q.mark_finished
            try:
                barrier.wait(ROUND_TIMEOUT)
                while get(tag=index) is not None:
                    execute()
                    finished()
                    done[index] += 1
            except BaseException as e:  # noqa: BLE001 - reported by the main thread
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(workers)]
        for t in threads:
            t.start()
        put = q.put
        barrier.wait(ROUND_TIMEOUT)
        start = time.perf_counter()
        if producer_releases:
            for c in closures:
                execute()
                put(c)
        else:
            for c in closures:
                put(c)
        overlap = sum(done) / len(closures)
        finished_in_time = q.wait(ROUND_TIMEOUT)
        elapsed = time.perf_counter() - start
        q.stop()
        for t in threads:
            t.join(ROUND_TIMEOUT)
        if errors or not finished_in_time or any(t.is_alive() for t in threads):
            raise RuntimeError(f"round failed: {errors or 'timed out'}")
        return elapsed, overlap

    return run


def stand_in_alone(
    workers: int, execute: Callable[[], None], producer_releases: bool, n: int
) -> float:
    """The same threads running their stand-ins with no queue: ``n`` stand-ins
    shared by the worker threads (and ``n`` more on the producer thread when it
    runs them too)."""
    barrier = threading.Barrier(workers + 1)
    shares = [n // workers + (i < n % workers) for i in range(workers)]

    def worker(count: int) -> None:
        barrier.wait(ROUND_TIMEOUT)
        for _ in range(count):
            execute()

    threads = [threading.Thread(target=worker, args=(c,), daemon=True) for c in shares]
    for t in threads:
        t.start()
    barrier.wait(ROUND_TIMEOUT)
    start = time.perf_counter()
    if producer_releases:
        for _ in range(n):
            execute()
    for t in threads:
        t.join(ROUND_TIMEOUT)
    return time.perf_counter() - start


def workloads() -> list:
    """(README label, workload, arguments of :func:`stand_in_alone` or None)."""
    rows: list = [("`put`+`get`+`mark_finished`, 1 thread", single_thread, None)]
    cases = [
        (2, "syscall", False),
        (2, "syscall", True),
        (8, "syscall", True),
        (2, "sleep", False),
    ]
    for workers, key, producer_releases in cases:
        execute, label = STAND_INS[key]
        producer = "releases the GIL before each put" if producer_releases else "back to back"
        rows.append(
            (
                f"{workers} worker threads, execution = {label}; producer {producer}",
                coordinator(workers, execute, producer_releases),
                (workers, execute, producer_releases),
            )
        )
    return rows


def percent(share: float) -> str:
    return "<1%" if 0 < share < 0.005 else f"{share:.0%}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--closures", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()

    from tensorflow.python.distribute.coordinator import cluster_coordinator as cc
    from tf_failure_handling._coordinator.closure_queue import ClosureQueue

    impls = {"tf": cc._CoordinatedClosureQueue, "ours": ClosureQueue}
    closures = [Closure() for _ in range(args.closures)]
    n = len(closures)
    print(f"closure queue, {n} closures per round, {args.rounds} rounds, TF and ours alternately")
    print(
        f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, GIL switch interval"
        f" {sys.getswitchinterval() * 1e3:g} ms. Medians of the rounds."
    )
    print("per round: the range of the per-round ratios TF time / our time")
    print("overlap: share of the closures finished when the last put returned (TF/ours)")
    print("alone: the same threads running only their stand-ins, no queue (the ceiling)")
    rows = workloads()
    width = max(len(label) for label, _, _ in rows)
    header = (
        f"{'workload':{width}} {'TF /s':>7} {'ours /s':>8} {'ratio':>6} {'per round':>11}"
        f" {'overlap':>9} {'alone /s':>9}"
    )
    print(header)
    print("-" * len(header))
    table = []
    for label, workload, alone in rows:
        for make in impls.values():  # warm up both
            workload(make, closures[: max(1, n // 10)])
        times: dict = {"tf": [], "ours": [], "alone": []}
        overlaps: dict = {"tf": [], "ours": []}
        for _ in range(args.rounds):
            for key, make in impls.items():
                seconds, overlap = workload(make, closures)
                times[key].append(seconds)
                overlaps[key].append(overlap)
            if alone is not None:
                times["alone"].append(stand_in_alone(*alone, n))
        tf_s, ours_s = _report.median(times["tf"]), _report.median(times["ours"])
        spread = _report.ratio_range(t / o for t, o in zip(times["tf"], times["ours"]))
        overlap = alone_rate = ""
        if alone is not None:
            overlap = "/".join(percent(_report.median(overlaps[k])) for k in impls)
            alone_rate = _report.per_second(n / _report.median(times["alone"]))
        tf_rate, ours_rate = _report.per_second(n / tf_s), _report.per_second(n / ours_s)
        ratio = _report.ratio(tf_s / ours_s)
        print(
            f"{label:{width}} {tf_rate:>7} {ours_rate:>8} {ratio:>6} {spread:>11}"
            f" {overlap:>9} {alone_rate:>9}",
            flush=True,
        )
        table.append(
            (
                label,
                f"{tf_rate} closures/s ({_report.duration(tf_s / n)})",
                f"{ours_rate} closures/s ({_report.duration(ours_s / n)})",
                f"{ratio} ({spread})",
                overlap,
                f"{alone_rate} closures/s" if alone_rate else "",
            )
        )
    _report.print_readme_table(
        "closure queue",
        (
            "workload",
            "TensorFlow",
            "tf-failure-handling",
            "ratio (per round)",
            "overlap (TF/ours)",
            "stand-in alone",
        ),
        table,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
