"""The coordinator (chief) of a ParameterServerStrategy cluster on 127.0.0.1.

Run as a standalone script, in its own process, after (or while) ``ps_cluster.py``
starts the worker and PS servers::

    python ps_coordinator_script.py --cluster '{"chief": ["127.0.0.1:23000"], ...}' \
        --impl tf --scenario basic --closures 1000

``--impl tf`` uses ``tf.distribute.experimental.coordinator.ClusterCoordinator`` (and
TF's ``RemoteValue``/``PerWorkerValues``/``experimental_get_current_worker_index``);
``--impl ours`` uses ``tf_failure_handling``'s.

Every scheduled closure is the same ``tf.function``: ``x = next(iterator)`` from a
per-worker dataset ``range(1, ...)`` (so each incarnation of a worker's iterator yields
1, 2, 3, ...), ``v.assign_add(x)`` on a PS variable, and it returns
``(experimental_get_current_worker_index(), x)``.

Scenarios (``--scenario``):

* ``basic``: schedule ``--closures`` closures, ``join``, fetch everything.
* ``kill``: waves of ``--wave`` closures with a ``join`` after each, until at least
  ``--closures`` ran, the file ``--control-dir/restarted`` exists (the test killed and
  restarted worker 1's server) and at least ``--post-restart-min`` closures of the waves
  scheduled after that ran on worker 1 (or ``--max-seconds`` passed).
* ``error``: ``--closures`` closures, the one at ``--fail-at`` fails an Assert; count
  resolved/cancelled/failed; then ``--after-error`` more closures must work.
* ``bad_input``: the errors ``schedule``/``ClusterCoordinator`` raise for bad input.
* ``cache``: one ``tf.function`` scheduled with argument structures that change
  (dtype, shape, Python values, keyword arguments, a new per-worker iterator) and
  functions with an ``input_signature`` (compatible shapes, then incompatible
  arguments): which calls traced, what each closure returned, what each rejected
  call raised.

Everything the tests need is printed on stdout as ``EVENT {json}`` lines (flushed):
``start``, ``servers_up``, ``connected``, ``progress`` (kill), ``summary`` (per phase),
``check`` (bad_input, one per case), ``error`` (an unexpected exception), ``done``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
import traceback

from mwms_worker import emit, require_loopback  # sibling script: shared loopback helpers

T_PROCESS_START = time.monotonic()
# tf.int64 max is fine for the dataset's upper bound: the iterator never ends.
DATASET_END = 1 << 40


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cluster", required=True, help="cluster spec as JSON (127.0.0.1 only)")
    p.add_argument("--impl", choices=("tf", "ours"), default="tf")
    p.add_argument(
        "--scenario", choices=("basic", "kill", "error", "bad_input", "cache"), default="basic"
    )
    p.add_argument("--closures", type=int, default=1000)
    p.add_argument("--wave", type=int, default=50, help="kill: closures per wave")
    p.add_argument("--control-dir", default=".", help="kill: where `restarted` appears")
    p.add_argument(
        "--post-restart-min",
        type=int,
        default=20,
        help="kill: closures that must run on worker 1 after the restart",
    )
    p.add_argument("--max-seconds", type=float, default=90.0, help="kill: stop after this")
    p.add_argument("--fail-at", type=int, default=100, help="error: failing closure index")
    p.add_argument("--after-error", type=int, default=20, help="error: closures scheduled after")
    p.add_argument("--connect-timeout", type=float, default=60.0)
    return p.parse_args(argv)


def wait_for_servers(cluster: dict, timeout: float) -> None:
    """Block until every worker/PS address accepts a TCP connection (all 127.0.0.1)."""
    addresses = [a for job in ("worker", "ps") for a in cluster.get(job, [])]
    deadline = time.monotonic() + timeout
    pending = list(addresses)
    while pending:
        host, port = pending[0].rsplit(":", 1)
        assert host == "127.0.0.1", f"refusing to connect to {host}: 127.0.0.1 only"
        try:
            with socket.create_connection((host, int(port)), timeout=1.0):
                pending.pop(0)
                continue
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"servers not listening after {timeout}s: {pending}")
        time.sleep(0.1)


def impl_api(impl: str) -> dict:
    """The coordinator API of ``impl``: TF's classes or tf_failure_handling's."""
    import tensorflow as tf

    if impl == "ours":
        import tf_failure_handling as tfh

        return {
            "ClusterCoordinator": tfh.ClusterCoordinator,
            "RemoteValue": tfh.RemoteValue,
            "PerWorkerValues": tfh.PerWorkerValues,
            "get_worker_index": tfh.experimental_get_current_worker_index,
        }
    return {
        "ClusterCoordinator": tf.distribute.experimental.coordinator.ClusterCoordinator,
        "RemoteValue": tf.distribute.experimental.coordinator.RemoteValue,
        "PerWorkerValues": tf.distribute.experimental.coordinator.PerWorkerValues,
        "get_worker_index": tf.distribute.coordinator.experimental_get_current_worker_index,
    }


def error_record(e: BaseException) -> dict:
    """The error's type and message, without the Python stacks TF prepends.

    A graph error starts with one "Detected at node ... (most recent call last):"
    stack per op that saw it; how many depends on which worker's op failed first,
    so the cause itself could fall past a fixed cut. Those stack lines are dropped.
    """
    lines = [
        line
        for line in str(e).splitlines()
        if line.strip()
        and not line.startswith("Detected at node")
        and not line.lstrip().startswith("File ")
    ]
    return {"type": type(e).__name__, "message": "\n".join(lines)[:1500]}


class Job:
    """The strategy, coordinator, PS variable, per-worker iterator and step function."""

    def __init__(self, cluster: dict, api: dict):
        import tensorflow as tf

        self.tf = tf
        self.api = api
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(cluster), rpc_layer="grpc"
        )
        self.strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
        self.coordinator = api["ClusterCoordinator"](self.strategy)
        with self.strategy.scope():
            self.v = tf.Variable(tf.constant(0, tf.int64), name="total")
        v = self.v
        get_worker_index = api["get_worker_index"]

        def dataset_fn():
            return tf.data.Dataset.range(1, DATASET_END)

        self.per_worker_dataset = self.coordinator.create_per_worker_dataset(dataset_fn)
        self.iterator = iter(self.per_worker_dataset)

        @tf.function
        def step_fn(iterator):
            x = next(iterator)
            v.assign_add(x)
            return get_worker_index(), x

        @tf.function
        def failing_step_fn(iterator, index, fail_at):
            x = next(iterator)
            tf.debugging.Assert(
                tf.not_equal(index, fail_at), ["closure", index, "fails on purpose"]
            )
            v.assign_add(x)
            return get_worker_index(), x

        self.step_fn = step_fn
        self.failing_step_fn = failing_step_fn

    def schedule_step(self):
        return self.coordinator.schedule(self.step_fn, args=(self.iterator,))

    def value(self) -> int:
        return int(self.v.numpy())


def fetch_results(remote_values) -> tuple[list, list]:
    """([(worker, x) or None per closure], [error record or None per closure])."""
    results, errors = [], []
    for rv in remote_values:
        try:
            worker, x = rv.fetch()
            results.append((int(worker), int(x)))
            errors.append(None)
        except Exception as e:  # noqa: BLE001 - every failure is reported
            results.append(None)
            errors.append(error_record(e))
    return results, errors


def summarize(results) -> dict:
    """Counts and per-worker x statistics of resolved results."""
    per_worker: dict[str, list[int]] = {}
    for r in results:
        if r is not None:
            per_worker.setdefault(str(r[0]), []).append(r[1])
    return {
        "resolved": sum(r is not None for r in results),
        "count_by_worker": {w: len(xs) for w, xs in per_worker.items()},
        "sum_x": sum(sum(xs) for xs in per_worker.values()),
        # Each incarnation of a worker's iterator yields 1, 2, 3, ...: values seen
        # twice on one worker mean its dataset was rebuilt.
        "duplicate_x_by_worker": {w: len(xs) - len(set(xs)) for w, xs in per_worker.items()},
        "consecutive_by_worker": {
            w: sorted(xs) == list(range(1, len(xs) + 1)) for w, xs in per_worker.items()
        },
        "min_x_by_worker": {w: min(xs) for w, xs in per_worker.items()},
        "max_x_by_worker": {w: max(xs) for w, xs in per_worker.items()},
    }


# ----------------------------------------------------------------------------- scenarios
def run_basic(job: Job, args) -> None:
    t0 = time.monotonic()
    rvs = [job.schedule_step() for _ in range(args.closures)]
    t_scheduled = time.monotonic()
    all_remote_values = all(isinstance(rv, job.api["RemoteValue"]) for rv in rvs)
    job.coordinator.join()
    t_joined = time.monotonic()
    done_after_join = bool(job.coordinator.done())
    # coordinator.fetch on the whole structure, then each RemoteValue on its own.
    fetched = job.coordinator.fetch(rvs)
    results, errors = fetch_results(rvs)
    same = all(r is not None and (int(f[0]), int(f[1])) == r for f, r in zip(fetched, results))
    emit(
        "summary",
        phase="all",
        scheduled=len(rvs),
        value=job.value(),
        errors=[e for e in errors if e is not None][:5],
        all_remote_values=all_remote_values,
        iterator_is_per_worker_values=isinstance(job.iterator, job.api["PerWorkerValues"]),
        done_after_join=done_after_join,
        coordinator_fetch_matches=same,
        fetch_passthrough=job.coordinator.fetch({"a": 3, "b": [rvs[0]]})["a"] == 3,
        schedule_s=round(t_scheduled - t0, 3),
        join_s=round(t_joined - t0, 3),
        **summarize(results),
    )


def run_kill(job: Job, args) -> None:
    restarted_marker = os.path.join(args.control_dir, "restarted")
    t0 = time.monotonic()
    pre_rvs, post_rvs, wave = [], [], 0
    post_on_worker1 = 0
    restarted_seen_at = None
    joins = 0
    while True:
        if restarted_seen_at is None and os.path.exists(restarted_marker):
            restarted_seen_at = len(pre_rvs)
            emit("restart_seen", scheduled=len(pre_rvs), wave=wave)
        phase = pre_rvs if restarted_seen_at is None else post_rvs
        wave_rvs = [job.schedule_step() for _ in range(args.wave)]
        phase.extend(wave_rvs)
        t_wave = time.monotonic()
        job.coordinator.join()
        joins += 1
        wave += 1
        # join returned: every result is on the coordinator already.
        wave_results, _ = fetch_results(wave_rvs)
        on_worker1 = sum(r is not None and r[0] == 1 for r in wave_results)
        if phase is post_rvs:
            post_on_worker1 += on_worker1
        emit(
            "progress",
            wave=wave,
            done=len(pre_rvs) + len(post_rvs),
            post=len(post_rvs),
            post_on_worker1=post_on_worker1,
            on_worker1=on_worker1,
            join_s=round(time.monotonic() - t_wave, 3),
        )
        total = len(pre_rvs) + len(post_rvs)
        if (
            total >= args.closures
            and restarted_seen_at is not None
            and post_on_worker1 >= args.post_restart_min
        ):
            break
        if time.monotonic() - t0 > args.max_seconds:
            emit("gave_up", seconds=round(time.monotonic() - t0, 3), done=total)
            break
    for phase, rvs in (("before_restart", pre_rvs), ("after_restart", post_rvs)):
        results, errors = fetch_results(rvs)
        emit(
            "summary",
            phase=phase,
            scheduled=len(rvs),
            errors=[e for e in errors if e is not None][:5],
            **summarize(results),
        )
    results, errors = fetch_results(pre_rvs + post_rvs)
    emit(
        "summary",
        phase="all",
        scheduled=len(pre_rvs) + len(post_rvs),
        value=job.value(),
        joins=joins,
        seconds=round(time.monotonic() - t0, 3),
        errors=[e for e in errors if e is not None][:5],
        **summarize(results),
    )


def run_error(job: Job, args) -> None:
    tf = job.tf
    fail_at = tf.constant(args.fail_at, tf.int64)
    rvs, raised_by, raised = [], None, None
    for i in range(args.closures):
        try:
            rvs.append(
                job.coordinator.schedule(
                    job.failing_step_fn,
                    args=(job.iterator, tf.constant(i, tf.int64), fail_at),
                )
            )
        except Exception as e:  # noqa: BLE001 - the injected error may surface here
            raised_by, raised = f"schedule#{i}", error_record(e)
            break
    if raised is None:
        try:
            job.coordinator.join()
        except Exception as e:  # noqa: BLE001 - the injected error surfaces here
            raised_by, raised = "join", error_record(e)
    # After the error is raised, it is cleared: a second join returns.
    second_join = None
    try:
        job.coordinator.join()
    except Exception as e:  # noqa: BLE001
        second_join = error_record(e)
    done_after = bool(job.coordinator.done())
    results, errors = fetch_results(rvs)
    status = ["resolved" if r is not None else e["type"] for r, e in zip(results, errors)]
    counts: dict[str, int] = {}
    for s in status:
        counts[s] = counts.get(s, 0) + 1
    failing = errors[args.fail_at] if args.fail_at < len(errors) else None
    emit(
        "summary",
        phase="error",
        scheduled=len(rvs),
        raised_by=raised_by,
        raised=raised,
        second_join_error=second_join,
        done_after=done_after,
        status_counts=counts,
        failing_closure_error=failing,
        resolved_indices=[i for i, s in enumerate(status) if s == "resolved"],
        other_errors=[
            {"index": i, **e}
            for i, e in enumerate(errors)
            if e is not None and i != args.fail_at and e["type"] != "CancelledError"
        ][:5],
        **summarize(results),
    )

    # A closure cancelled while its IteratorGetNext ran on a worker can leave that
    # worker's iterator at end of sequence (tf.data, with TF's coordinator as with
    # ours: both cancel in-flight closures through the same CancellationManager), so
    # the closures scheduled after the error read from a fresh per-worker iterator,
    # as a user resuming after an error would.
    job.iterator = iter(job.per_worker_dataset)
    before = job.value()
    rvs = [job.schedule_step() for _ in range(args.after_error)]
    job.coordinator.join()
    results, errors = fetch_results(rvs)
    after = job.value()
    emit(
        "summary",
        phase="after_error",
        scheduled=len(rvs),
        value_delta=after - before,
        errors=[e for e in errors if e is not None][:5],
        **summarize(results),
    )


def attempt(name: str, fn) -> None:
    """Run ``fn`` and emit a ``check`` event with what it raised (or returned)."""
    try:
        result = fn()
    except Exception as e:  # noqa: BLE001 - the exception type is what is checked
        emit(
            "check",
            name=name,
            raised=type(e).__name__,
            raised_mro=[c.__name__ for c in type(e).__mro__],
            message=str(e)[:500],
        )
        return
    emit("check", name=name, raised=None, result=repr(result)[:200])


def run_bad_input(job: Job, args) -> None:
    tf = job.tf
    coordinator = job.coordinator
    cls = job.api["ClusterCoordinator"]

    @tf.function
    def returns_seven():
        return tf.constant(7, tf.int64)

    @tf.function
    def plus_one(x):
        return x + 1

    def python_fn():
        return 1

    attempt("schedule_non_callable", lambda: coordinator.schedule(42))
    attempt("schedule_python_function", lambda: coordinator.schedule(python_fn))
    attempt("schedule_lambda", lambda: coordinator.schedule(lambda: 1))
    rv = coordinator.schedule(returns_seven)
    coordinator.join()
    attempt("fetch_ok", lambda: int(rv.fetch()))
    attempt("schedule_remote_value_arg", lambda: coordinator.schedule(plus_one, args=(rv,)))
    attempt("schedule_remote_value_kwarg", lambda: coordinator.schedule(plus_one, kwargs={"x": rv}))
    attempt("coordinator_mirrored", lambda: cls(tf.distribute.MirroredStrategy()))
    attempt("coordinator_default_strategy", lambda: cls(tf.distribute.get_strategy()))
    attempt("coordinator_not_a_strategy", lambda: cls(object()))

    class LooksLikeAStrategy:
        """Has the attribute TF's ``__new__`` reads, but is not a PS strategy."""

        _cluster_coordinator = None

    attempt("coordinator_duck_strategy", lambda: cls(LooksLikeAStrategy()))
    attempt("coordinator_is_singleton", lambda: cls(job.strategy) is coordinator)
    # What Keras' model.fit/evaluate do: TF's class must hand back the same coordinator.
    attempt(
        "tf_class_gives_same_coordinator",
        lambda: (
            tf.distribute.experimental.coordinator.ClusterCoordinator(job.strategy) is coordinator
        ),
    )
    attempt("coordinator_strategy", lambda: coordinator.strategy is job.strategy)
    attempt("fetch_passthrough", lambda: coordinator.fetch([3, {"k": "s"}]))

    # Scheduling still works after all of that.
    def still_works():
        a = coordinator.schedule(plus_one, args=(tf.constant(41, tf.int64),))
        b = job.schedule_step()
        coordinator.join()
        return int(a.fetch()), int(b.fetch()[1])

    attempt("schedule_after_bad_input", still_works)


def run_cache(job: Job, args) -> None:
    """Argument structures that must retrace, and input signatures that must hold."""
    tf = job.tf
    v = job.v
    get_worker_index = job.api["get_worker_index"]
    coordinator = job.coordinator
    traces: list[str] = []  # appended while tracing only

    @tf.function
    def step(iterator, delta, scale):
        traces.append(f"step {delta.dtype.name if hasattr(delta, 'dtype') else delta!r} {scale}")
        x = next(iterator)
        v.assign_add(x)
        return get_worker_index(), x, delta * scale

    def check(name: str, rvs: list, want) -> None:
        coordinator.join()
        got = []
        for rv in rvs:
            value = rv.fetch()
            value = value[2] if isinstance(value, tuple) else value
            got.append(value.tolist() if hasattr(value, "tolist") else value)
        emit("check", name=name, raised=None, result=repr(got), want=repr(want))

    # Each structure twice, interleaved, so that a wrong cache hit shows in a result.
    calls = [
        ("int64 scalar", (job.iterator, tf.constant(3, tf.int64), 1), {}, 3),
        ("float32 scalar", (job.iterator, tf.constant(1.5, tf.float32), 1), {}, 1.5),
        ("int64 vector", (job.iterator, tf.constant([1, 2], tf.int64), 1), {}, [1, 2]),
        ("python 7", (job.iterator, 7, 1), {}, 7),
        ("python 8", (job.iterator, 8, 1), {}, 8),
        ("keyword scale", (job.iterator, tf.constant(3, tf.int64)), {"scale": 2}, 6),
        ("keyword delta", (job.iterator,), {"delta": tf.constant(4, tf.int64), "scale": 1}, 4),
    ]
    for _ in range(2):
        for name, a, kw, want in calls:
            check(
                name, [coordinator.schedule(step, args=a, kwargs=kw) for _ in range(3)], [want] * 3
            )
    # A new iterator of the same per-worker dataset: same spec, no new trace.
    fresh = iter(job.per_worker_dataset)
    rvs = [coordinator.schedule(step, args=(fresh, tf.constant(5, tf.int64), 1)) for _ in range(4)]
    coordinator.join()
    # Each worker's iterator starts at the first element: the elements a worker read,
    # sorted, are 1..n. Which worker ran how many closures is the scheduler's (under
    # load one worker can run all four), so the check is per worker.
    read: dict = {}
    for rv in rvs:
        worker, x, _ = rv.fetch()
        read.setdefault(int(worker), []).append(int(x))
    got = {w: sorted(xs) for w, xs in sorted(read.items())}
    emit(
        "check",
        name="fresh iterator",
        raised=None,
        result=repr(got),
        want=repr({w: list(range(1, len(xs) + 1)) for w, xs in got.items()}),
    )
    emit("traces", name="step", traces=traces)

    # Input signatures: one trace for every compatible shape, incompatible calls refused.
    sig_traces: list[str] = []

    def total(x):
        sig_traces.append(f"total {x.dtype.name}")
        return tf.reduce_sum(x) * 2

    total_int = tf.function(total, input_signature=[tf.TensorSpec([None], tf.int64)])
    total_float = tf.function(total, input_signature=[tf.TensorSpec([None], tf.float32)])
    for n in (2, 3, 5, 3):
        x = tf.range(n, dtype=tf.int64)
        check(f"signature int64 [{n}]", [coordinator.schedule(total_int, args=(x,))], [n * (n - 1)])
    check(
        "signature float32 [2]",
        [coordinator.schedule(total_float, args=(tf.constant([0.5, 1.0]),))],
        [3.0],
    )
    for name, fn, a in (
        ("signature int64 given float32", total_int, (tf.constant([1.0]),)),
        ("signature int64 given a matrix", total_int, (tf.constant([[1]], tf.int64),)),
        ("signature float32 given int64", total_float, (tf.constant([1], tf.int64),)),
        ("signature int64 given two arguments", total_int, (tf.constant([1], tf.int64), 1)),
    ):
        attempt(name, lambda fn=fn, a=a: coordinator.schedule(fn, args=a))
    check(
        "signature int64 after refusals",
        [coordinator.schedule(total_int, args=(tf.constant([4, 5], tf.int64),))],
        [18],
    )
    emit("traces", name="total", traces=sig_traces)
    cache = getattr(coordinator, "_functions", None)  # tf_failure_handling's only
    if cache is not None:
        emit("cache_stats", hits=cache.hits, misses=cache.misses, uncacheable=cache.uncacheable)


SCENARIOS = {
    "basic": run_basic,
    "kill": run_kill,
    "error": run_error,
    "bad_input": run_bad_input,
    "cache": run_cache,
}


def main(argv=None) -> int:
    args = parse_args(argv)
    cluster = json.loads(args.cluster)
    require_loopback(cluster)
    emit("start", pid=os.getpid(), impl=args.impl, scenario=args.scenario)
    try:
        api = impl_api(args.impl)
        emit(
            "imported",
            coordinator_class=f"{api['ClusterCoordinator'].__module__}."
            f"{api['ClusterCoordinator'].__qualname__}",
            import_s=round(time.monotonic() - T_PROCESS_START, 3),
        )
        wait_for_servers(cluster, args.connect_timeout)
        emit("servers_up", after_s=round(time.monotonic() - T_PROCESS_START, 3))
        t_connect = time.monotonic()
        job = Job(cluster, api)
        emit("connected", connect_s=round(time.monotonic() - t_connect, 3))
        SCENARIOS[args.scenario](job, args)
    except BaseException as e:  # noqa: BLE001 - reported, then a non-zero exit
        emit("error", traceback=traceback.format_exc()[-3000:], **error_record(e))
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    emit("done", seconds=round(time.monotonic() - T_PROCESS_START, 3))
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: TF's coordinator threads and remote contexts can make
    # a normal exit slow or hang; everything worth keeping was printed already.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
