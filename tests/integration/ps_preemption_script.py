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
        from tf_failure_handling._coordinator import ps_control

        control = ps_control._installed
        emit(
            "exiting",
            released=control.released.is_set(),
            reason=control.release_reason,
            checkpoint=tf.train.latest_checkpoint(args.ckpt) if args.ckpt else None,
        )
        sys.exit(RESTART_CODE)

    config = tfh.TerminationConfig(exit_fn=exit_fn, peer_timeout=args.peer_timeout)
    tfh.serve(server, config)
    emit("serve-returned")
    return 0


def _read(variable) -> int:
    """The variable's value for an event line. TensorFlow can fail a coordinator's read
    of a PS variable with the UnavailableError of a worker whose process is exiting
    (seen while a drained worker left: "recvmsg:Connection reset by peer" from
    /job:worker/task:1 on a ReadVariableOp); the read is then made again, at most 5
    times, 1 s apart."""
    import tensorflow as tf

    for attempt in range(5):
        try:
            return int(variable.numpy())
        except tf.errors.UnavailableError as e:
            emit("read-retried", attempt=attempt, error=str(e).splitlines()[0])
            time.sleep(1.0)
    return int(variable.numpy())


def coordinator(args) -> int:
    import tensorflow as tf
    import tf_failure_handling as tfh

    cluster = json.loads(args.cluster)
    require_loopback(cluster)
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster), task_type="chief", task_id=0, rpc_layer="grpc"
    )
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coord = tfh.ClusterCoordinator(strategy)
    with strategy.scope():
        counter = tf.Variable(0, dtype=tf.int64, name="counter")
        weights = tf.Variable(tf.eye(64) * 0.5, name="weights")
    checkpoint = tf.train.Checkpoint(counter=counter, weights=weights)
    handler = tfh.PreemptionCheckpointHandler(
        resolver, checkpoint, args.ckpt, tfh.TerminationConfig(peer_timeout=args.peer_timeout)
    )
    runs = handler.total_run_calls
    emit("restored", runs=runs, counter=_read(counter))

    @tf.function
    def train_step(work):
        # Some work, so that closures are in flight when a notice comes: one read of
        # the PS, work on the worker alone, one write to the PS at the end.
        x = tf.identity(weights)
        w = x
        for _ in tf.range(work):
            x = tf.matmul(x, w) * 0.5 + tf.eye(64)
        counter.assign_add(1)
        return tf.reduce_sum(x)

    while handler.total_run_calls < args.steps:
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
        handler.run(coord.schedule, train_step, (args.long_work if long else args.work,))
        runs = handler.total_run_calls
        if runs % 5 == 0:
            emit("progress", runs=runs)
        if runs % args.epoch == 0:
            coord.join()  # an "epoch": most of the training happens in join()
            emit("epoch", runs=runs, counter=_read(counter))
    coord.join()
    emit("done", runs=handler.total_run_calls, counter=_read(counter))
    handler.close()
    return 0


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
    args = p.parse_args(argv)
    _diagnostics()
    return serve(args) if args.mode == "serve" else coordinator(args)


if __name__ == "__main__":
    sys.exit(main())
