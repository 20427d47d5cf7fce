"""``ClusterCoordinator`` end to end: where a closure's time goes, TF's and ours, and the floor.

A real ParameterServerStrategy cluster on 127.0.0.1: ``--workers`` worker
servers (2, then 4) and 1 PS server (``tests/integration/ps_cluster.py
serve``), and a coordinator process that runs this file with ``--child``. The
job: a per-worker dataset and a ``tf.function`` that takes
``next(iterator)``, updates three PS variables with it and returns
``(worker index, x)``.

Each coordinator process, after ``--warmup`` untimed closures (tracing, the
per-worker iterators):

1. ``--waves`` waves through the coordinator (TF's or ours): ``--closures``
   ``schedule()`` calls, then ``join()``, timed from the first ``schedule`` to
   the end of the ``join``; every result fetched and checked afterwards (each
   closure resolved; the first PS variable grew by the sum of the ``x``
   values);
2. the same number of waves of **the floor**, on the same cluster: one thread
   per worker calls the same concrete function directly (the worker's device,
   a synchronous executor, no coordinator, no queue) and copies its outputs
   to the coordinator (one ``identity_n``), ``--closures`` calls in all; the
   same checks.

Per closure, in the worker threads (each closure's worker-thread work is
wrapped, for TF's coordinator and ours alike, by timestamps):

* ``dispatch``: from the worker thread's ``_process_closure`` entry to the
  start of the remote call (argument selection per worker, scopes);
* ``execution``: the remote call, ``closure._function(...)``;
* ``completion and fetch``: from the call's return to the end of
  ``_process_closure`` (the result set on the ``RemoteValue``, copied to the
  coordinator, the closure marked finished).

Also ``schedule()`` per call (wall time in the wave, and the main thread's
CPU time, which is what a ``schedule()`` costs whatever the worker threads
do meanwhile) and the coordinator process's CPU time per closure. Figures are
medians over all waves of a kind; the floor's are over the floor waves of
every run. Each round starts a fresh cluster for TF's coordinator and then
one for ours, for each worker count; ratios are of medians, with the range of
the per-round ratios (ours against TF's run of the same round; against the
floor waves of both runs of the round). The load average is printed at the
start, after each run and at the end: the machine may be shared.

    python benches/bench_coordinator.py [--rounds 3] [--waves 3] [--closures 300]
        [--workers 2 4]

Every address is 127.0.0.1 (``require_loopback``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import _report

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent / "tests"
STARTUP_TIMEOUT = 180.0
DATASET_END = 1 << 40
STAGES = ("dispatch", "execution", "completion")


# ----------------------------------------------------------------------------- coordinator
class BenchJob:
    """Strategy, coordinator, three PS variables, per-worker iterator, step function."""

    def __init__(self, cluster: dict, impl: str) -> None:
        import tensorflow as tf

        if impl == "ours":
            import tf_failure_handling as tfh

            coordinator_class = tfh.ClusterCoordinator
            get_worker_index = tfh.experimental_get_current_worker_index
        else:
            coordinator_class = tf.distribute.experimental.coordinator.ClusterCoordinator
            get_worker_index = tf.distribute.coordinator.experimental_get_current_worker_index
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(cluster), rpc_layer="grpc"
        )
        self.tf = tf
        self.strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
        self.coordinator = coordinator_class(self.strategy)
        with self.strategy.scope():
            self.total = tf.Variable(tf.constant(0, tf.int64), name="total")
            self.doubled = tf.Variable(tf.constant(0, tf.int64), name="doubled")
            self.count = tf.Variable(tf.constant(0, tf.int64), name="count")
        total, doubled, count = self.total, self.doubled, self.count
        self.per_worker_dataset = self.coordinator.create_per_worker_dataset(
            lambda: tf.data.Dataset.range(1, DATASET_END)
        )
        self.iterator = iter(self.per_worker_dataset)

        @tf.function
        def step(iterator):
            x = next(iterator)
            total.assign_add(x)
            doubled.assign_add(2 * x)
            count.assign_add(tf.constant(1, tf.int64))
            return get_worker_index(), x

        self.step = step

    def schedule_step(self):
        return self.coordinator.schedule(self.step, args=(self.iterator,))

    def value(self) -> int:
        return int(self.total.numpy())


class StageTimes:
    """Per-closure timestamps taken in the worker threads (same hooks for TF and ours)."""

    def __init__(self, workers: list) -> None:
        self.samples: list = []  # (dispatch, execution, completion) seconds
        self._local = threading.local()
        for worker in workers:
            original = worker._process_closure  # bound method of the worker's class
            worker._process_closure = self._wrap(original)

    def _wrap(self, original):
        local = self._local
        clock = time.perf_counter
        samples = self.samples

        def process_closure(closure):
            function = closure._function

            def timed(*args, **kwargs):
                local.call_start = clock()
                try:
                    return function(*args, **kwargs)
                finally:
                    local.call_end = clock()

            closure._function = timed
            local.call_start = local.call_end = None
            start = clock()
            try:
                return original(closure)
            finally:
                end = clock()
                closure._function = function
                if local.call_start is not None and local.call_end is not None:
                    samples.append(
                        (
                            local.call_start - start,
                            local.call_end - local.call_start,
                            end - local.call_end,
                        )
                    )

        return process_closure

    def take(self) -> list:
        taken = list(self.samples)
        self.samples.clear()
        return taken


def medians(samples: list) -> dict:
    if not samples:
        return {stage: None for stage in STAGES}
    return {stage: statistics.median(s[i] for s in samples) for i, stage in enumerate(STAGES)}


def process_cpu() -> float:
    t = os.times()
    return t.user + t.system


def coordinator_waves(job: BenchJob, args, emit) -> None:
    stages = StageTimes(job.coordinator._cluster.workers)
    for wave in range(args.waves):
        stages.take()
        before = job.value()
        cpu0 = process_cpu()
        t0 = time.perf_counter()
        c0 = time.thread_time()
        rvs = [job.schedule_step() for _ in range(args.closures)]
        c1 = time.thread_time()
        t1 = time.perf_counter()
        job.coordinator.join()
        t2 = time.perf_counter()
        cpu1 = process_cpu()
        samples = stages.take()
        results = [rv.fetch() for rv in rvs]
        added = sum(int(x) for _, x in results)
        if job.value() - before != added:
            raise AssertionError(f"PS variable grew by {job.value() - before}, not {added}")
        emit(
            "wave",
            mode="coordinator",
            wave=wave,
            closures=len(rvs),
            total_s=t2 - t0,
            schedule_s=(t1 - t0) / len(rvs),
            schedule_cpu_s=(c1 - c0) / len(rvs),
            cpu_s=(cpu1 - cpu0) / len(rvs),
            stages=medians(samples),
            timed=len(samples),
            workers=sorted({int(w) for w, _ in results}),
        )


def floor_waves(job: BenchJob, args, emit) -> None:
    """The same concrete function, called by one thread per worker, no coordinator."""
    from tensorflow.python.distribute.coordinator import coordinator_context
    from tensorflow.python.eager import context, executor
    from tensorflow.python.framework import ops
    from tensorflow.python.ops import array_ops

    with job.strategy.scope():
        # What TF's Closure traces with: worker 0's slice, as its type spec.
        concrete = job.step.get_concrete_function(job.iterator._values[0]._type_spec)
    local_device = f"/job:{context.get_server_def().job_name}"
    workers = job.coordinator._cluster.workers
    iterators = [rv._get_values() for rv in job.iterator._values]

    class DispatchTarget:  # what experimental_get_current_worker_index reads
        def __init__(self, index: int) -> None:
            self.worker_index = index

    def run(index: int, calls: int, out: list, failures: list) -> None:
        try:
            device = workers[index].device_name
            iterator = iterators[index]
            samples = []
            with context.executor_scope(executor.new_executor(enable_async=False)):
                with coordinator_context.with_dispatch_context(DispatchTarget(index)):
                    for _ in range(calls):
                        t0 = time.perf_counter()
                        with ops.device(device):
                            outputs = concrete(iterator)
                        t1 = time.perf_counter()
                        with ops.device(local_device):
                            local = array_ops.identity_n(list(outputs))
                        t2 = time.perf_counter()
                        out.append((int(local[0]), int(local[1])))
                        samples.append((0.0, t1 - t0, t2 - t1))
            out_samples.extend(samples)
        except BaseException as e:  # noqa: BLE001 - reported by the caller
            failures.append(e)

    n = len(workers)
    for wave in range(args.waves):
        before = job.value()
        results: list = []
        failures: list = []
        out_samples: list = []
        counts = [args.closures // n + (i < args.closures % n) for i in range(n)]
        threads = [
            threading.Thread(target=run, args=(i, counts[i], results, failures)) for i in range(n)
        ]
        cpu0 = process_cpu()
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        t1 = time.perf_counter()
        cpu1 = process_cpu()
        if failures:
            raise failures[0]
        added = sum(x for _, x in results)
        if job.value() - before != added or len(results) != args.closures:
            raise AssertionError(f"floor: PS variable grew by {job.value() - before}, not {added}")
        emit(
            "wave",
            mode="floor",
            wave=wave,
            closures=len(results),
            total_s=t1 - t0,
            cpu_s=(cpu1 - cpu0) / len(results),
            stages=medians(out_samples),
            timed=len(out_samples),
            workers=sorted({w for w, _ in results}),
        )


def child(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(TESTS / "integration"))
    from mwms_worker import emit, require_loopback
    from ps_coordinator_script import wait_for_servers

    cluster = json.loads(args.cluster)
    require_loopback(cluster)
    try:
        wait_for_servers(cluster, STARTUP_TIMEOUT)
        job = BenchJob(cluster, args.impl)
        warm = [job.schedule_step() for _ in range(args.warmup)]
        job.coordinator.join()
        for rv in warm:
            rv.fetch()
        coordinator_waves(job, args, emit)
        floor_waves(job, args, emit)
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
def one_run(impl: str, workers: int, args: argparse.Namespace, root: Path, name: str) -> list:
    """Start a cluster and a coordinator of ``impl``; return its ``wave`` events."""
    from integration.ps_cluster import NUM_PS, Proc, PsCluster

    cluster = PsCluster(root, impl=impl, name=name, num_workers=workers)
    try:
        for task in range(workers):
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


def loadavg() -> str:
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--waves", type=int, default=3)
    parser.add_argument("--closures", type=int, default=300, help="closures per wave")
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--timeout", type=float, default=400.0, help="per coordinator process")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cluster", help=argparse.SUPPRESS)
    parser.add_argument("--impl", choices=("tf", "ours"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)

    sys.path.insert(0, str(TESTS))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    impls = ("tf", "ours")
    # waves[(workers, kind)], kind in tf, ours, floor; per_round[(workers, impl)]
    waves: dict = {}
    per_round: dict = {}
    round_floor: dict = {}  # (workers, round) -> floor rates of both runs of the round
    print(
        f"ClusterCoordinator end to end: {args.workers} workers + 1 PS on 127.0.0.1,"
        f" {args.rounds} rounds (TF, then ours, a fresh cluster each), {args.waves} waves of"
        f" {args.closures} closures (after {args.warmup} untimed), then as many floor waves;"
        f" {os.cpu_count()} CPUs, load average {loadavg()}",
        flush=True,
    )
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tfh-bench-coordinator-") as tmp:
        for r in range(args.rounds):
            for n in args.workers:
                for impl in impls:
                    events = one_run(impl, n, args, Path(tmp), f"{impl}{n}w{r}")
                    coordinator = [e for e in events if e["mode"] == "coordinator"]
                    floor = [e for e in events if e["mode"] == "floor"]
                    if len(coordinator) != args.waves or len(floor) != args.waves:
                        raise RuntimeError(f"{impl} {n} workers round {r}: {len(events)} waves")
                    waves.setdefault((n, impl), []).extend(coordinator)
                    waves.setdefault((n, "floor"), []).extend(floor)
                    rates = [e["closures"] / e["total_s"] for e in coordinator]
                    floor_rates = [e["closures"] / e["total_s"] for e in floor]
                    per_round.setdefault((n, impl), []).append(statistics.median(rates))
                    round_floor.setdefault((n, r), []).extend(floor_rates)
                    used = sorted({w for e in coordinator for w in e["workers"]})
                    print(
                        f"  round {r} {n} workers {impl:4} closures/s "
                        + " ".join(f"{x:5.0f}" for x in rates)
                        + "  floor "
                        + " ".join(f"{x:5.0f}" for x in floor_rates)
                        + "  schedule() "
                        + " ".join(_report.duration(e["schedule_s"]) for e in coordinator)
                        + f"  workers used {used}  load {loadavg()}",
                        flush=True,
                    )
    print(f"{time.monotonic() - started:.0f} s; load average at the end {loadavg()}")

    def med(n: int, kind: str, field: str) -> float:
        return statistics.median(e[field] for e in waves[(n, kind)])

    def rate(n: int, kind: str) -> float:
        return statistics.median(e["closures"] / e["total_s"] for e in waves[(n, kind)])

    def stage(n: int, kind: str, name: str) -> float:
        values = [e["stages"][name] for e in waves[(n, kind)] if e["stages"][name] is not None]
        return statistics.median(values)

    for n in args.workers:
        tf_rate, our_rate, floor_rate = rate(n, "tf"), rate(n, "ours"), rate(n, "floor")
        spread = _report.ratio_range(
            o / t for o, t in zip(per_round[(n, "ours")], per_round[(n, "tf")])
        )
        # Ours against the floor measured in the same round (both runs of it).
        floor_spread = _report.ratio_range(
            o / statistics.median(round_floor[(n, r)]) for r, o in enumerate(per_round[(n, "ours")])
        )
        sched = med(n, "tf", "schedule_cpu_s") / med(n, "ours", "schedule_cpu_s")
        print(
            f"{n} workers: closures/s TF {tf_rate:.0f}, ours {our_rate:.0f}, floor"
            f" {floor_rate:.0f}; ours/TF {our_rate / tf_rate:.2f}x ({spread}), ours/floor"
            f" {our_rate / floor_rate:.2f}x ({floor_spread}); schedule() CPU TF/ours {sched:.0f}x"
        )

        def row(label: str, fn, floor_value: str = "") -> tuple:
            t, o = fn("tf"), fn("ours")
            return (
                label,
                _report.duration(t),
                _report.duration(o),
                floor_value,
                _report.ratio(t / o),
            )

        rows = [
            (
                "closures/s through `schedule()` + `join()` (wall time per closure)",
                f"{tf_rate:.0f} ({_report.duration(1 / tf_rate)})",
                f"{our_rate:.0f} ({_report.duration(1 / our_rate)})",
                f"{floor_rate:.0f} ({_report.duration(1 / floor_rate)})",
                f"{_report.ratio(our_rate / tf_rate)} ({spread}); ours/floor "
                f"{_report.ratio(our_rate / floor_rate)} ({floor_spread})",
            ),
            row("`schedule()` per call, wall", lambda k, n=n: med(n, k, "schedule_s")),
            row(
                "`schedule()` per call, CPU of the calling thread",
                lambda k, n=n: med(n, k, "schedule_cpu_s"),
            ),
            row(
                "dispatch (worker thread, to the remote call)",
                lambda k, n=n: stage(n, k, "dispatch"),
            ),
            row(
                "execution (the remote call)",
                lambda k, n=n: stage(n, k, "execution"),
                _report.duration(stage(n, "floor", "execution")),
            ),
            row(
                "completion and fetch (result to the coordinator, closure finished)",
                lambda k, n=n: stage(n, k, "completion"),
                _report.duration(stage(n, "floor", "completion")),
            ),
            row(
                "coordinator process CPU per closure",
                lambda k, n=n: med(n, k, "cpu_s"),
                _report.duration(med(n, "floor", "cpu_s")),
            ),
        ]
        _report.print_readme_table(
            f"ClusterCoordinator end to end, {n} workers",
            ("", "TensorFlow", "tf-failure-handling", "floor", "ratio, ours better (per round)"),
            rows,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
