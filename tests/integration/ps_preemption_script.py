"""Processes of the ParameterServerStrategy preemption tests (``test_ps_preemption.py``).

Server mode (a PS or worker task, ``tfh.serve`` instead of ``server.join()``)::

    python ps_preemption_script.py serve --cluster JSON --job ps --task 0

Coordinator mode (the chief: the handler around ``coordinator.schedule``)::

    python ps_preemption_script.py coordinator --cluster JSON --ckpt DIR --steps 120

Every closure adds one to ``counter`` (a variable on the PS). The coordinator prints
``EVENT`` lines: ``restored`` (the run count and the counter restored from the
checkpoint: equal when nothing was lost or applied twice), ``progress`` every 5 runs,
and ``done`` (both at the end). A served task prints ``exiting`` as it leaves after a
notice: whether the coordinator released it and the checkpoint written by then (the
order "released after the save", seen from the task's side). Every address is 127.0.0.1.

Options the reliability trials add (``tests/reliability/processes/ps_preemption.py``;
none changes a run without them):

* ``--ids``: every closure also carries its own id, the run index
  (``handler.total_run_calls`` before the call, restored from the checkpoint, so the
  ids scheduled through ``handler.run`` are exactly ``0..steps-1``), and adds 1 to
  ``applied[id]`` and then, in a second write, to ``applied_b[id]``: per-id counters on
  the PS saved in the checkpoint (a checkpoint with the two different for an id holds
  that closure half applied). ``run`` (the id, before the call), ``restored`` and
  ``done`` (``applied``, ``applied_b``, ``outside``: the per-id counts) say what was
  scheduled and applied;
* ``--outside-every K``: every K runs, an "evaluation" closure is scheduled directly
  (``coord.schedule``, not through ``handler.run``) with the run index as its id; it
  adds 1 to ``outside[id]`` (``outside`` event when scheduled);
* ``--fetch-every N``: every Nth run, ``fetch()`` of the RemoteValue that
  ``handler.run`` returned (``fetch_begin`` / ``fetch_end``);
* ``--grace-period S``: the TerminationConfig's (coordinator and servers);
* ``--tf-coordinator``: TensorFlow's own ``ClusterCoordinator``, not ours;
* ``--fetch-at N --fetch-file F [--fetch-of queued|in-flight]``: a fetch after a notice
  (``test_ps_preemption.py``). Before run N-2 the coordinator joins, prints
  ``fetch_ready`` and waits for ``F.stopped`` (the test has stopped the workers); runs
  N-2 and N-1 then go to the stopped workers and run N stays queued. Once run N is
  scheduled it prints ``fetch_waiting`` and waits for F (the notice was received), then
  ``fetch()``es run N's value (queued) or run N-2's (in flight).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

#: The restart code, as the handler's default exit_fn.
RESTART_CODE = 42

try:
    from .mwms_worker import emit, require_loopback
except ImportError:  # run as a script
    from mwms_worker import emit, require_loopback


def serve(args) -> int:
    import tensorflow as tf
    import tf_failure_handling as tfh

    cluster = json.loads(args.cluster)
    require_loopback(cluster)
    server = tf.distribute.Server(
        tf.train.ClusterSpec(cluster),
        job_name=args.job,
        task_index=args.task,
        protocol="grpc",
        start=True,
    )
    emit("serving", job=args.job, task=args.task, pid=os.getpid())

    def exit_fn():
        # What this task saw when it left: released by the coordinator (or its wait
        # ran out), and the checkpoint the coordinator had written by then.
        from tf_failure_handling._coordinator import task_calls

        control = task_calls._installed
        emit(
            "exiting",
            released=control.released.is_set(),
            reason=control.release_reason,
            checkpoint=tf.train.latest_checkpoint(args.ckpt) if args.ckpt else None,
        )
        sys.exit(RESTART_CODE)

    config = tfh.TerminationConfig(
        exit_fn=exit_fn, peer_timeout=args.peer_timeout, grace_period=args.grace_period
    )
    tfh.serve(server, config)
    emit("serve-returned")
    return 0


def _read(variable, convert=int):
    """The variable's value for an event line. TensorFlow can fail a coordinator's read
    of a PS variable with the UnavailableError of a worker whose process is exiting
    (seen while a drained worker left: "recvmsg:Connection reset by peer" from
    /job:worker/task:1 on a ReadVariableOp); the read is then made again, at most 5
    times, 1 s apart."""
    import tensorflow as tf

    for attempt in range(5):
        try:
            return convert(variable.numpy())
        except tf.errors.UnavailableError as e:
            emit("read-retried", attempt=attempt, error=str(e).splitlines()[0])
            time.sleep(1.0)
    return convert(variable.numpy())


def _counts(array) -> list:
    """A per-id counter's value as a list of ints (an event field)."""
    return [int(v) for v in array]


def coordinator(args) -> int:
    import tensorflow as tf
    import tf_failure_handling as tfh

    cluster = json.loads(args.cluster)
    require_loopback(cluster)
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster), task_type="chief", task_id=0, rpc_layer="grpc"
    )
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    if args.tf_coordinator:
        coord = tf.distribute.coordinator.ClusterCoordinator(strategy)
    else:
        coord = tfh.ClusterCoordinator(strategy)
    with strategy.scope():
        counter = tf.Variable(0, dtype=tf.int64, name="counter")
        weights = tf.Variable(tf.eye(64) * 0.5, name="weights")
        if args.ids:
            applied = tf.Variable(tf.zeros([args.steps], tf.int64), name="applied")
            applied_b = tf.Variable(tf.zeros([args.steps], tf.int64), name="applied_b")
            outside = tf.Variable(tf.zeros([args.steps], tf.int64), name="outside")
    parts = {"counter": counter, "weights": weights}
    if args.ids:
        parts.update(applied=applied, applied_b=applied_b, outside=outside)
    checkpoint = tf.train.Checkpoint(**parts)
    config = tfh.TerminationConfig(peer_timeout=args.peer_timeout, grace_period=args.grace_period)
    handler = tfh.PreemptionCheckpointHandler(resolver, checkpoint, args.ckpt, config)
    runs = handler.total_run_calls

    def counts() -> dict:
        if not args.ids:
            return {}
        return {
            "applied": _read(applied, _counts),
            "applied_b": _read(applied_b, _counts),
            "outside": _read(outside, _counts),
        }

    emit("restored", runs=runs, counter=_read(counter), **counts())

    def _work(work):
        # Some work, so that closures are in flight when a notice comes: one read of
        # the PS, then work on the worker alone (the callers write to the PS after it).
        x = tf.identity(weights)
        w = x
        for _ in tf.range(work):
            x = tf.matmul(x, w) * 0.5 + tf.eye(64)
        return tf.reduce_sum(x)

    @tf.function
    def train_step(work):
        total = _work(work)
        counter.assign_add(1)
        return total

    def _one(index):
        return tf.IndexedSlices(tf.ones([1], tf.int64), tf.reshape(index, [1]))

    @tf.function
    def train_step_id(work, run_id):
        # train_step, and the closure's own id recorded as applied, after the work, in
        # two writes (applied, then applied_b): a checkpoint read between them holds
        # the closure half applied.
        total = _work(work)
        counter.assign_add(1)
        applied.scatter_add(_one(run_id))
        applied_b.scatter_add(_one(run_id))
        return total

    @tf.function
    def eval_step(work, eval_id):
        # A closure scheduled outside handler.run: some work, then its id in outside.
        total = _work(work)
        outside.scatter_add(_one(eval_id))
        return total

    two_before = None
    while handler.total_run_calls < args.steps:
        if args.per_worker_at and handler.total_run_calls == args.per_worker_at:
            _per_worker_fetch_when_told(args, coord)
        if args.fetch_at and handler.total_run_calls == args.fetch_at - 2:
            # Nothing in flight: the test stops the workers, then the next three runs
            # are scheduled (two taken by the stopped workers, the third queued).
            coord.join()
            _wait_for_file(args.fetch_file + ".stopped", "fetch_ready")
        if args.pause_at and handler.total_run_calls == args.pause_at:
            # Nothing scheduled or running: a test stops a task and sends a notice now.
            coord.join()
            emit("paused", runs=handler.total_run_calls, counter=_read(counter))
            end = time.monotonic() + args.pause
            while time.monotonic() < end:
                if args.resume_file and os.path.exists(args.resume_file):
                    break  # the test has sent its notice and seen it received
                time.sleep(0.1)
        long = args.long_from and handler.total_run_calls >= args.long_from
        if long and handler.total_run_calls == args.long_from:
            # Only long closures from here: once one is in flight, say so.
            coord.join()
            _say_when_in_flight(coord)
        work = args.long_work if long else args.work
        run_id = handler.total_run_calls
        if args.ids:
            emit("run", id=run_id)
            rv = handler.run(
                coord.schedule, train_step_id, (work, tf.constant(run_id, dtype=tf.int64))
            )
        else:
            rv = handler.run(coord.schedule, train_step, (work,))
        runs = handler.total_run_calls
        if args.fetch_at and run_id == args.fetch_at - 2:
            two_before = rv
        if args.fetch_at and run_id == args.fetch_at:
            _fetch_when_told(args, rv if args.fetch_of == "queued" else two_before, run_id)
        if args.fetch_every and runs % args.fetch_every == 0:
            emit("fetch_begin", id=run_id)
            value = rv.fetch()
            emit("fetch_end", id=run_id, value=float(value))
        if args.outside_every and args.ids and run_id % args.outside_every == 0:
            coord.schedule(eval_step, (work // 2, tf.constant(run_id, dtype=tf.int64)))
            emit("outside", id=run_id)
        if runs % 5 == 0:
            emit("progress", runs=runs)
        if runs % args.epoch == 0:
            coord.join()  # an "epoch": most of the training happens in join()
            emit("epoch", runs=runs, counter=_read(counter))
    coord.join()
    emit("done", runs=handler.total_run_calls, counter=_read(counter), **counts())
    handler.close()
    return 0


#: How long ``--fetch-at`` waits for each of the test's files at most.
FETCH_FILE_WAIT = 300.0


def _wait_for_file(path: str, event: str) -> None:
    """Prints ``event``, then waits (bounded) until the test has written ``path``."""
    emit(event, runs=None)
    end = time.monotonic() + FETCH_FILE_WAIT
    while not os.path.exists(path):
        if time.monotonic() > end:
            raise TimeoutError(f"{path} did not appear within {FETCH_FILE_WAIT}s")
        time.sleep(0.05)


def _fetch_when_told(args, remote_value, run_id: int) -> None:
    """``--fetch-at``: run ``run_id`` is scheduled: prints ``fetch_waiting``, waits for
    ``--fetch-file`` (the test has sent its notice and seen it received), then fetches
    ``remote_value``."""
    _wait_for_file(args.fetch_file, "fetch_waiting")
    emit("fetch_begin", id=run_id, of=args.fetch_of)
    value = remote_value.fetch()
    emit("fetch_end", id=run_id, value=float(value))


#: How long the watch of ``_say_when_in_flight`` lasts at most.
IN_FLIGHT_WATCH = 300.0


def _say_when_in_flight(coord) -> None:
    """Prints a ``long-in-flight`` event once a worker has taken a closure (a thread
    that polls the closure queue's ``inflight_closure_count``, TensorFlow's name): a test
    sends its notice then, not when closures are only scheduled (a loaded machine may not
    have given any to a worker yet)."""
    queue = coord._cluster.closure_queue

    def watch() -> None:
        end = time.monotonic() + IN_FLIGHT_WATCH
        while time.monotonic() < end:
            count = int(queue.inflight_closure_count)
            if count >= 1:
                emit("long-in-flight", in_flight=count)
                return
            time.sleep(0.02)

    threading.Thread(target=watch, name="in-flight-watch", daemon=True).start()


def _per_worker_fetch_when_told(args, coord) -> None:
    """``--per-worker-at N --per-worker-file F --per-worker-kind K``: a fetch of a
    per-worker value after a notice (``test_ps_preemption.py``). At run N, with nothing
    in flight (a join), prints ``per_worker_ready`` and waits for F (the test has sent
    the notice and seen the workers held), then until every worker thread waits on its
    hold (a thread already waiting for a closure when the hold came could still take
    one, ``Worker.wait_idle``). Then creates a per-worker value -- K
    ``iterator``: a per-worker dataset's iterator; ``variable``: a per-worker variable,
    made on the workers by a function that uses it -- whose resource closures the held
    workers do not run, and fetches it: ``coord.fetch()`` of the iterator's remote
    values, or ``read_all()`` of the variable. Prints ``per_worker_fetch_begin`` and,
    if the fetch returns, ``per_worker_fetch_end``."""
    import tensorflow as tf

    coord.join()
    _wait_for_file(args.per_worker_file, "per_worker_ready")
    for worker in coord._cluster.workers:
        if not worker.wait_idle(FETCH_FILE_WAIT):
            raise TimeoutError(f"worker {worker.worker_index} was not held in {FETCH_FILE_WAIT}s")
    emit("per_worker_held")
    if args.per_worker_kind == "iterator":
        dataset = coord.create_per_worker_dataset(lambda: tf.data.Dataset.range(8))
        values = iter(dataset)._values
        emit("per_worker_fetch_begin", kind=args.per_worker_kind)
        coord.fetch(values)
    else:
        with coord.strategy.scope():
            per_worker = tf.Variable(0, dtype=tf.int64, per_worker_variable=True)

        @tf.function
        def bump():
            per_worker.assign_add(1)

        coord.schedule(bump)  # traced: the per-worker copies are created on the workers
        emit("per_worker_fetch_begin", kind=args.per_worker_kind)
        per_worker.read_all()
    emit("per_worker_fetch_end", kind=args.per_worker_kind)


def _diagnostics() -> None:
    """The package's INFO lines on stderr (a test reads "watching" there before it
    sends a signal; a failure's tail shows them), and every thread's stack on SIGUSR2
    (a test's bound ran out: what the process was waiting for)."""
    import faulthandler
    import logging
    import signal

    package_log = logging.getLogger("tf_failure_handling")
    package_log.setLevel(logging.INFO)
    package_log.addHandler(logging.StreamHandler())
    faulthandler.register(signal.SIGUSR2, all_threads=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--cluster", required=True)
    s.add_argument("--job", required=True, choices=("ps", "worker"))
    s.add_argument("--task", type=int, required=True)
    s.add_argument("--ckpt", default=None, help="the coordinator's checkpoint folder")
    s.add_argument("--peer-timeout", type=float, default=None)
    s.add_argument("--grace-period", type=float, default=None)
    c = sub.add_parser("coordinator")
    c.add_argument("--cluster", required=True)
    c.add_argument("--ckpt", required=True)
    c.add_argument("--steps", type=int, default=120)
    c.add_argument("--work", type=int, default=200)
    c.add_argument("--epoch", type=int, default=20)
    c.add_argument("--peer-timeout", type=float, default=None)
    c.add_argument("--pause-at", type=int, default=0, help="join, then pause, at this run")
    c.add_argument("--pause", type=float, default=0.0, help="seconds of that pause")
    c.add_argument("--resume-file", default=None, help="the pause ends once this file exists")
    c.add_argument(
        "--long-from", type=int, default=0, help="from this run on, closures of --long-work"
    )
    c.add_argument("--long-work", type=int, default=0)
    c.add_argument("--grace-period", type=float, default=None)
    c.add_argument("--ids", action="store_true", help="closures carry their id (docstring)")
    c.add_argument("--fetch-every", type=int, default=0, help="fetch() every Nth run's value")
    c.add_argument(
        "--outside-every", type=int, default=0, help="with --ids: a closure outside handler.run"
    )
    c.add_argument("--fetch-at", type=int, default=0, help="fetch, when told, at this run")
    c.add_argument("--fetch-file", default=None, help="--fetch-at fetches once this exists")
    c.add_argument("--fetch-of", choices=("queued", "in-flight"), default="queued")
    c.add_argument("--tf-coordinator", action="store_true", help="TensorFlow's own coordinator")
    c.add_argument("--per-worker-at", type=int, default=0, help="fetch a per-worker value here")
    c.add_argument("--per-worker-file", default=None, help="--per-worker-at waits for it")
    c.add_argument("--per-worker-kind", choices=("iterator", "variable"), default="iterator")
    args = p.parse_args(argv)
    _diagnostics()
    return serve(args) if args.mode == "serve" else coordinator(args)


if __name__ == "__main__":
    sys.exit(main())
