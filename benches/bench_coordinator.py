"""``ClusterCoordinator`` end to end, garbage collector running: TF's and ours on a real cluster.

A real ParameterServerStrategy cluster on 127.0.0.1: ``--workers`` worker
servers (2 by default) and 1 PS server (``tests/integration/ps_cluster.py
serve``), and a coordinator process that runs this file with ``--child``. The
job: a per-worker dataset and a ``tf.function`` that takes
``next(iterator)``, updates three PS variables with it and returns
``(worker index, x)``. TensorFlow is imported, and the garbage collector is
left enabled and running as it does for a user: nothing here freezes,
disables or tunes it.

Each coordinator process, after ``--warmup`` untimed closures (tracing, the
per-worker iterators):

1. ``--waves`` rounds of waves through the coordinator (TF's or ours), one wave
   per loop length of ``--closures`` (400 and 3,000 by default): that many
   ``schedule()`` calls in a loop, then ``join()``, timed from the first
   ``schedule`` to the end of the ``join``; every result fetched and checked
   afterwards (each closure resolved; the first PS variable grew by the sum of
   the ``x`` values). ``gc.callbacks`` records every collection, so a wave
   reports the collections (by generation) and the time spent in them inside
   its ``schedule()`` loop;
2. ``--direct-waves`` waves per loop length of **sequential direct calls**, on
   the same cluster: one thread per worker calls the same concrete function
   directly, one call at a time (the worker's device, a synchronous executor,
   no coordinator, no queue) and copies its outputs to the coordinator (one
   ``identity_n``); the same checks. This is not a floor: the coordinators'
   worker threads use asynchronous executors, so the next closure's dispatch
   overlaps the previous remote call, and both coordinators can beat it;
3. one untimed counting wave (the longest loop length): around each
   ``schedule()`` call (its arguments made before), the growth of the youngest
   generation (``gc.get_objects(0)``: the objects the call leaves for the
   collector to track, traverse and promote towards the full collection) and of
   the collector's allocation count (``gc.get_count()[0]``: what starts the young
   collections; it counts objects of collector-managed types whether tracked or
   not, and misses those CPython takes from its free lists, such as small
   tuples); medians over the calls that no collection interrupted.

Per closure, in the worker threads (each closure's worker-thread work is
wrapped, for TF's coordinator and ours alike, by timestamps):

* ``dispatch``: from the worker thread's ``_process_closure`` entry to the
  start of the remote call (argument selection per worker, scopes);
* ``execution``: the remote call, ``closure._function(...)``;
* ``completion and fetch``: from the call's return to the end of
  ``_process_closure`` (the result set on the ``RemoteValue``, copied to the
  coordinator, the closure marked finished).

Also ``schedule()`` per call (wall time of the loop, garbage collections
included, and the main thread's CPU time) and the coordinator process's CPU
time per closure. Figures are medians over all waves of a kind and loop length.
Each round starts a fresh cluster for TF's coordinator and then one for ours;
ratios are of medians, with the range of the per-round ratios (ours against
TF's run of the same round). The load average is printed at the start, after
each run and at the end: the machine may be shared.

    python benches/bench_coordinator.py [--rounds 3] [--waves 3] [--closures 400 3000]
        [--workers 2] [--direct-waves 1]

Every address is 127.0.0.1 (``require_loopback``).
"""

from __future__ import annotations

import argparse
import gc
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


class GcWatch:
    """Every garbage collection of the process (``gc.callbacks``): generation, start, end."""

    def __init__(self) -> None:
        self.collections: list = []  # (generation, start, end), perf_counter seconds
        self._start = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        now = time.perf_counter()
        if phase == "start":
            self._start = now
        else:
            self.collections.append((info["generation"], self._start, now))

    def inside(self, t0: float, t1: float) -> dict:
        """Collections per generation that ran within ``[t0, t1]``, and their time there."""
        counts = [0, 0, 0]
        seconds = 0.0
        for generation, start, end in self.collections:
            if end > t0 and start < t1:
                counts[generation] += 1
                seconds += min(end, t1) - max(start, t0)
        return {"collections": counts, "seconds": seconds}


def coordinator_wave(job: BenchJob, closures: int, wave: int, stages, watch, emit) -> None:
    stages.take()
    before = job.value()
    cpu0 = process_cpu()
    t0 = time.perf_counter()
    c0 = time.thread_time()
    rvs = [job.schedule_step() for _ in range(closures)]
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
        gc_loop=watch.inside(t0, t1),
        stages=medians(samples),
        timed=len(samples),
        workers=sorted({int(w) for w, _ in results}),
    )


def count_allocations(job: BenchJob, closures: int, emit) -> None:
    """Per ``schedule()`` call: the collector's allocation count and its youngest
    generation's growth (see the module docstring), medians over undisturbed calls."""
    get_count = gc.get_count
    get_objects = gc.get_objects
    schedule = job.coordinator.schedule
    step = job.step
    args = (job.iterator,)  # made by the caller, outside what is counted
    allocated: list = []
    tracked: list = []
    rvs: list = []
    for _ in range(closures):
        g0 = len(get_objects(0))
        a0 = get_count()[0]
        rv = schedule(step, args=args)
        a1 = get_count()[0]
        g1 = len(get_objects(0))
        rvs.append(rv)
        if a1 >= a0 and g1 >= g0:  # no collection reset the counts meanwhile
            allocated.append(a1 - a0)
            tracked.append(g1 - g0)
    job.coordinator.join()
    for rv in rvs:
        rv.fetch()
    emit(
        "allocations",
        closures=closures,
        allocated=statistics.median(allocated),
        tracked=statistics.median(tracked),
        samples=len(allocated),
    )


def direct_waves(job: BenchJob, closures: int, waves: int, emit) -> None:
    """Sequential direct calls: the same concrete function, one thread per worker, one
    call at a time, no coordinator."""
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
    for wave in range(waves):
        before = job.value()
        results: list = []
        failures: list = []
        out_samples: list = []
        counts = [closures // n + (i < closures % n) for i in range(n)]
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
        if job.value() - before != added or len(results) != closures:
            raise AssertionError(
                f"direct calls: PS variable grew by {job.value() - before}, not {added}"
            )
        emit(
            "wave",
            mode="direct",
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
        del warm
        watch = GcWatch()
        stages = StageTimes(job.coordinator._cluster.workers)
        for wave in range(args.waves):
            for closures in args.closures:
                coordinator_wave(job, closures, wave, stages, watch, emit)
        for closures in args.closures:
            direct_waves(job, closures, args.direct_waves, emit)
        count_allocations(job, max(args.closures), emit)
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
def one_run(impl: str, workers: int, args: argparse.Namespace, root: Path, name: str) -> tuple:
    """Start a cluster and a coordinator of ``impl``; return its ``wave`` events and its
    ``allocations`` event."""
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
            "--direct-waves",
            str(args.direct_waves),
            "--closures",
            *[str(c) for c in args.closures],
        ]
        cluster.coordinator = Proc("coordinator", cmd, cluster.workdir)
        cluster.wait_event(lambda e: e["event"] == "done", args.timeout, f"{name} to finish")
        return cluster.events("wave"), cluster.events("allocations")[0]
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
    parser.add_argument("--waves", type=int, default=3, help="waves per loop length")
    parser.add_argument(
        "--closures",
        type=int,
        nargs="+",
        default=[400, 3000],
        help="loop lengths: schedule() calls per wave",
    )
    parser.add_argument("--direct-waves", type=int, default=1, help="per loop length")
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--workers", type=int, nargs="+", default=[2])
    parser.add_argument("--timeout", type=float, default=900.0, help="per coordinator process")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cluster", help=argparse.SUPPRESS)
    parser.add_argument("--impl", choices=("tf", "ours"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)

    sys.path.insert(0, str(TESTS))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    impls = ("tf", "ours")
    lengths = args.closures
    # waves[(workers, kind, length)], kind in tf, ours, direct
    waves: dict = {}
    # per_round[(workers, impl, length)]: the run's median closures/s and schedule() wall
    per_round: dict = {}
    allocations: dict = {}  # (workers, impl) -> [allocations event per run]
    print(
        f"ClusterCoordinator end to end: {args.workers} workers + 1 PS on 127.0.0.1,"
        f" {args.rounds} rounds (TF, then ours, a fresh cluster each), {args.waves} waves of"
        f" each of {lengths} schedule() calls (after {args.warmup} untimed), then"
        f" {args.direct_waves} wave(s) of sequential direct calls per length and a counting"
        f" wave; garbage collector enabled; {os.cpu_count()} CPUs, load average {loadavg()}",
        flush=True,
    )
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tfh-bench-coordinator-") as tmp:
        for r in range(args.rounds):
            for n in args.workers:
                for impl in impls:
                    events, counted = one_run(impl, n, args, Path(tmp), f"{impl}{n}w{r}")
                    allocations.setdefault((n, impl), []).append(counted)
                    line = [f"  round {r} {n} workers {impl:4}"]
                    for length in lengths:
                        mine = [e for e in events if e["closures"] == length]
                        coordinator = [e for e in mine if e["mode"] == "coordinator"]
                        direct = [e for e in mine if e["mode"] == "direct"]
                        if len(coordinator) != args.waves or len(direct) != args.direct_waves:
                            raise RuntimeError(
                                f"{impl} {n} workers round {r}: {len(mine)} waves of {length}"
                            )
                        waves.setdefault((n, impl, length), []).extend(coordinator)
                        waves.setdefault((n, "direct", length), []).extend(direct)
                        rates = [e["closures"] / e["total_s"] for e in coordinator]
                        walls = [e["schedule_s"] for e in coordinator]
                        per_round.setdefault((n, impl, length), []).append(
                            (statistics.median(rates), statistics.median(walls))
                        )
                        full = sum(e["gc_loop"]["collections"][2] for e in coordinator)
                        line.append(
                            f"| {length}: closures/s "
                            + " ".join(f"{x:4.0f}" for x in rates)
                            + ", direct "
                            + " ".join(f"{e['closures'] / e['total_s']:4.0f}" for e in direct)
                            + ", schedule() "
                            + " ".join(_report.duration(x) for x in walls)
                            + f", full GCs in the loops {full}"
                        )
                    line.append(
                        f"| per schedule(): {counted['tracked']:g} tracked,"
                        f" allocation count {counted['allocated']:g} | load {loadavg()}"
                    )
                    print(" ".join(line), flush=True)
    print(f"{time.monotonic() - started:.0f} s; load average at the end {loadavg()}")

    def med(n: int, kind: str, length: int, field: str) -> float:
        return statistics.median(e[field] for e in waves[(n, kind, length)])

    def rate(n: int, kind: str, length: int) -> float:
        return statistics.median(e["closures"] / e["total_s"] for e in waves[(n, kind, length)])

    def stage(n: int, kind: str, length: int, name: str) -> float:
        values = [
            e["stages"][name] for e in waves[(n, kind, length)] if e["stages"][name] is not None
        ]
        return statistics.median(values)

    def gc_loops(n: int, impl: str, length: int) -> tuple:
        """(full collections in all loops, loops, GC seconds per call over all loops).

        The time is a mean, not a median: a full collection falls in few loops
        and costs each of them ~100 ms; the mean is what it costs a user per call.
        """
        kind = waves[(n, impl, length)]
        full = sum(e["gc_loop"]["collections"][2] for e in kind)
        seconds = sum(e["gc_loop"]["seconds"] for e in kind)
        return full, len(kind), seconds / sum(e["closures"] for e in kind)

    def counted(n: int, impl: str, field: str) -> float:
        return statistics.median(e[field] for e in allocations[(n, impl)])

    for n in args.workers:
        tf_alloc, our_alloc = counted(n, "tf", "allocated"), counted(n, "ours", "allocated")
        tf_tracked, our_tracked = counted(n, "tf", "tracked"), counted(n, "ours", "tracked")
        print(
            f"{n} workers: per schedule(), objects left for the garbage collector to track"
            f" TF {tf_tracked:g}, ours {our_tracked:g}; allocation count TF {tf_alloc:g},"
            f" ours {our_alloc:g}"
        )
        for length in lengths:
            tf_rate, our_rate = rate(n, "tf", length), rate(n, "ours", length)
            direct_rate = rate(n, "direct", length)
            rounds = list(zip(per_round[(n, "ours", length)], per_round[(n, "tf", length)]))
            rate_spread = _report.ratio_range(o[0] / t[0] for o, t in rounds)
            wall_spread = _report.ratio_range(t[1] / o[1] for o, t in rounds)
            tf_wall, our_wall = (
                med(n, "tf", length, "schedule_s"),
                med(n, "ours", length, "schedule_s"),
            )
            tf_full, loops, tf_gc = gc_loops(n, "tf", length)
            our_full, _, our_gc = gc_loops(n, "ours", length)
            print(
                f"{n} workers, {length} closures: schedule() per call TF"
                f" {_report.duration(tf_wall)}, ours {_report.duration(our_wall)}"
                f" ({_report.ratio(tf_wall / our_wall)} cheaper, {wall_spread} per round);"
                f" closures/s TF {tf_rate:.0f}, ours {our_rate:.0f}, ours/TF"
                f" {our_rate / tf_rate:.2f}x ({rate_spread}); full collections inside the"
                f" {loops} loops: TF {tf_full}, ours {our_full}"
            )

            def row(label: str, fn, direct_value: str = "") -> tuple:
                t, o = fn("tf"), fn("ours")
                return (
                    label,
                    _report.duration(t),
                    _report.duration(o),
                    direct_value,
                    _report.ratio(t / o),
                )

            rows = [
                (
                    "objects a `schedule()` leaves for the garbage collector to track"
                    " (allocation count)",
                    f"{tf_tracked:g} ({tf_alloc:g})",
                    f"{our_tracked:g} ({our_alloc:g})",
                    "",
                    f"{_report.ratio(tf_tracked / our_tracked)}"
                    f" ({_report.ratio(tf_alloc / our_alloc)})",
                ),
                (
                    "`schedule()` per call, wall (garbage collections included)",
                    _report.duration(tf_wall),
                    _report.duration(our_wall),
                    "",
                    f"{_report.ratio(tf_wall / our_wall)} ({wall_spread})",
                ),
                row(
                    "`schedule()` per call, CPU of the calling thread",
                    lambda k, n=n, length=length: med(n, k, length, "schedule_cpu_s"),
                ),
                (
                    "garbage collection inside the `schedule()` loops: full collections"
                    " (in how many loops); time per call, mean over the loops",
                    f"{tf_full} ({loops}); {_report.duration(tf_gc)}",
                    f"{our_full} ({loops}); {_report.duration(our_gc)}",
                    "",
                    "",
                ),
                (
                    "closures/s through `schedule()` + `join()` (wall time per closure)",
                    f"{tf_rate:.0f} ({_report.duration(1 / tf_rate)})",
                    f"{our_rate:.0f} ({_report.duration(1 / our_rate)})",
                    f"{direct_rate:.0f} ({_report.duration(1 / direct_rate)})",
                    f"{_report.ratio(our_rate / tf_rate)} ({rate_spread})",
                ),
                row(
                    "dispatch (worker thread, to the remote call)",
                    lambda k, n=n, length=length: stage(n, k, length, "dispatch"),
                ),
                row(
                    "execution (the remote call)",
                    lambda k, n=n, length=length: stage(n, k, length, "execution"),
                    _report.duration(stage(n, "direct", length, "execution")),
                ),
                row(
                    "completion and fetch (result to the coordinator, closure finished)",
                    lambda k, n=n, length=length: stage(n, k, length, "completion"),
                    _report.duration(stage(n, "direct", length, "completion")),
                ),
                row(
                    "coordinator process CPU per closure",
                    lambda k, n=n, length=length: med(n, k, length, "cpu_s"),
                    _report.duration(med(n, "direct", length, "cpu_s")),
                ),
            ]
            _report.print_readme_table(
                f"ClusterCoordinator end to end, {n} workers, {length} closures per loop",
                (
                    "",
                    "TensorFlow",
                    "tf-failure-handling",
                    "sequential direct calls",
                    "ratio, ours better (per round)",
                ),
                rows,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
