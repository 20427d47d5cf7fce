"""``ClusterCoordinator`` end to end: closures per second through ``schedule()`` + ``join()``.

What a user of the coordinator feels, TensorFlow's and ours alternately, on a
real ParameterServerStrategy cluster on 127.0.0.1: 2 worker servers and 1 PS
server (``tests/integration/ps_cluster.py serve``), and a coordinator process
that runs this file with ``--child``. The coordinator is the integration
tests' ``Job`` (``tests/integration/ps_coordinator_script.py``): a per-worker
dataset and a ``tf.function`` that takes ``next(iterator)``, adds it to a PS
variable and returns ``(worker index, x)``.

In each coordinator process: ``--warmup`` closures (tracing, the per-worker
iterators) and a ``join()``, untimed; then ``--waves`` waves, each
``--closures`` ``schedule()`` calls and one ``join()``, timed from the first
``schedule`` to the end of the ``join``. Every wave's results are fetched and
checked after the clock stops (each closure resolved; the PS variable holds the
sum of the ``x`` values). Each of ``--rounds`` rounds starts a fresh cluster
for TF's coordinator and then one for ours. Prints closures per second and the
time per ``schedule()`` call (medians over all waves of an implementation), the
ratio of the medians (ours over TF for closures/s, TF over ours for the time
per call: above 1 means ours is better) and the range of the per-round ratios,
then the README's table.

    python benches/bench_coordinator.py [--rounds 4] [--waves 4] [--closures 300]

Every address is 127.0.0.1 (``require_loopback``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import _report

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent / "tests"
STARTUP_TIMEOUT = 180.0


# ----------------------------------------------------------------------------- coordinator
def child(args: argparse.Namespace) -> int:
    """The coordinator process: warm up, then time waves of schedule() + join()."""
    sys.path.insert(0, str(TESTS / "integration"))
    from mwms_worker import emit, require_loopback
    from ps_coordinator_script import Job, impl_api, wait_for_servers

    cluster = json.loads(args.cluster)
    require_loopback(cluster)
    try:
        api = impl_api(args.impl)
        wait_for_servers(cluster, STARTUP_TIMEOUT)
        job = Job(cluster, api)
        warm = [job.schedule_step() for _ in range(args.warmup)]
        job.coordinator.join()
        for rv in warm:
            rv.fetch()
        for wave in range(args.waves):
            before = job.value()
            t0 = time.perf_counter()
            rvs = [job.schedule_step() for _ in range(args.closures)]
            t1 = time.perf_counter()
            job.coordinator.join()
            t2 = time.perf_counter()
            results = [rv.fetch() for rv in rvs]
            added = sum(int(x) for _, x in results)
            if job.value() - before != added:
                raise AssertionError(f"PS variable grew by {job.value() - before}, not {added}")
            workers = sorted({int(w) for w, _ in results})
            emit(
                "wave",
                wave=wave,
                closures=len(rvs),
                schedule_s=t1 - t0,
                total_s=t2 - t0,
                workers=workers,
            )
    except BaseException as e:  # noqa: BLE001 - reported, then a non-zero exit
        import traceback

        emit(
            "error", type=type(e).__name__, message=str(e)[:1500], traceback=traceback.format_exc()
        )
        sys.stdout.flush()
        os._exit(1)
    emit("done")
    sys.stdout.flush()
    # As the integration tests' coordinator: skip the interpreter's teardown,
    # which TF's coordinator threads and remote contexts can make slow.
    os._exit(0)


# ----------------------------------------------------------------------------- parent
def one_run(impl: str, args: argparse.Namespace, root: Path, name: str) -> list[dict]:
    """Start a cluster and a coordinator of ``impl``; return its ``wave`` events."""
    from integration.ps_cluster import NUM_PS, NUM_WORKERS, Proc, PsCluster

    cluster = PsCluster(root, impl=impl, name=name)
    try:
        for task in range(NUM_WORKERS):
            cluster.start_server("worker", task)
        for task in range(NUM_PS):
            cluster.start_server("ps", task)
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--child",
            "--cluster",
            json.dumps(cluster.spec),
            "--impl",
            impl,
            "--warmup",
            str(args.warmup),
            "--waves",
            str(args.waves),
            "--closures",
            str(args.closures),
        ]
        cluster.coordinator = Proc("coordinator", cmd, cluster.workdir)
        cluster.wait_event(lambda e: e["event"] == "done", args.timeout, f"{name} to finish")
        return cluster.events("wave")
    finally:
        cluster.kill()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--waves", type=int, default=4)
    parser.add_argument("--closures", type=int, default=300, help="closures per wave")
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--timeout", type=float, default=300.0, help="per coordinator process")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cluster", help=argparse.SUPPRESS)
    parser.add_argument("--impl", choices=("tf", "ours"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)

    sys.path.insert(0, str(TESTS))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    impls = ("tf", "ours")
    waves: dict = {impl: [] for impl in impls}
    per_round: dict = {impl: [] for impl in impls}  # median closures/s of each run
    sched_round: dict = {impl: [] for impl in impls}  # median schedule() s of each run
    print(
        f"ClusterCoordinator end to end: 2 workers + 1 PS on 127.0.0.1, {args.rounds} rounds"
        f" (TF, then ours, a fresh cluster each), {args.waves} waves of {args.closures}"
        f" closures after {args.warmup} untimed",
        flush=True,
    )
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tfh-bench-coordinator-") as tmp:
        for r in range(args.rounds):
            for impl in impls:
                events = one_run(impl, args, Path(tmp), f"{impl}{r}")
                if len(events) != args.waves:
                    raise RuntimeError(f"{impl} round {r}: {len(events)} waves")
                rates = [e["closures"] / e["total_s"] for e in events]
                waves[impl] += events
                per_round[impl].append(statistics.median(rates))
                sched_round[impl].append(
                    statistics.median(e["schedule_s"] / e["closures"] for e in events)
                )
                print(
                    f"  round {r} {impl:4} closures/s "
                    + " ".join(f"{x:6.1f}" for x in rates)
                    + "   schedule() "
                    + " ".join(_report.duration(e["schedule_s"] / e["closures"]) for e in events)
                    + f"   workers used {sorted({w for e in events for w in e['workers']})}",
                    flush=True,
                )

    def rate(impl: str) -> float:
        return statistics.median(e["closures"] / e["total_s"] for e in waves[impl])

    def schedule_s(impl: str) -> float:
        return statistics.median(e["schedule_s"] / e["closures"] for e in waves[impl])

    ratio = rate("ours") / rate("tf")
    spread = _report.ratio_range(o / t for o, t in zip(per_round["ours"], per_round["tf"]))
    sched_ratio = schedule_s("tf") / schedule_s("ours")
    sched_spread = _report.ratio_range(
        t / o for t, o in zip(sched_round["tf"], sched_round["ours"])
    )
    print(
        f"closures/s: TF {rate('tf'):.0f}, ours {rate('ours'):.0f}, ours/TF {ratio:.2f}x"
        f" (per round {spread}); schedule(): TF {_report.duration(schedule_s('tf'))},"
        f" ours {_report.duration(schedule_s('ours'))}; {time.monotonic() - started:.0f} s"
    )
    _report.print_readme_table(
        "ClusterCoordinator end to end",
        ("", "TensorFlow", "tf-failure-handling", "ratio, ours better (per round)"),
        [
            (
                "closures/s through `schedule()` + `join()` (wall time per closure)",
                f"{rate('tf'):.0f} ({_report.duration(1 / rate('tf'))})",
                f"{rate('ours'):.0f} ({_report.duration(1 / rate('ours'))})",
                f"{_report.ratio(ratio)} ({spread})",
            ),
            (
                "`schedule()` per call",
                _report.duration(schedule_s("tf")),
                _report.duration(schedule_s("ours")),
                f"{_report.ratio(sched_ratio)} ({sched_spread})",
            ),
        ],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
