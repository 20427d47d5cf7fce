"""One MultiWorkerMirroredStrategy worker driven by a PreemptionCheckpointHandler.

Run as a standalone script (one process per worker, all on 127.0.0.1)::

    python mwms_worker.py --ports 23001,23002 --index 0 --impl tf \
        --ckpt-dir /tmp/ckpt --steps 80 --step-sleep 0.03

``--impl tf`` uses ``tf.distribute.experimental.PreemptionCheckpointHandler`` /
``TerminationConfig``; ``--impl ours`` uses ``tf_failure_handling``'s classes.

Everything the tests (and the demo) need to know is printed on stdout as one
JSON object per line, prefixed with ``EVENT ``:

* ``start``: ``restored`` (``handler.total_run_calls`` after construction), ``pid``,
  ``index``, ``impl``; ``rss`` (bytes resident right after the handler's construction,
  where the peak below starts: :func:`reset_peak_rss`), ``wchar`` (bytes written so far),
  ``pair`` (``[pair_a, pair_b]`` as restored, with ``--paired-gap``; else null).
* ``progress``: every ``--progress-every`` steps: ``step`` (run calls done), ``loss``.
* ``save``: every ``tf.train.CheckpointManager.save`` call in this process (whoever
  makes it): ``runs`` (the ``checkpointed_runs`` value being saved), ``t_start``,
  ``t_end`` (``time.time()``), ``directory``, ``path``; with ``--peak-per-save``,
  ``peak_before`` (the peak resident bytes up to its start), ``rss`` at its start and
  ``peak_rss`` during it (then ``exit``'s ``peak_rss`` is since the last save's start).
* ``signal``: when the worker sends itself SIGTERM (``--signal-self-at-step``).
* ``exit``: when a ``SystemExit`` leaves the training loop (``code``), with ``peak_rss``
  (the process's peak resident bytes since the ``start`` event, ``VmHWM``) and
  ``wchar`` (bytes written so far, ``/proc/self/io``).
* ``error``: when an exception leaves the training loop (``type``, ``message``).
* ``fault``: when a fault ``--fault`` installed fires (``shares_faults.py``).
* ``done``: after a full run: ``steps``, ``weights`` (flat lists of floats).

The training (model, batches, update) is ``examples/mwms_custom_loop.py``'s, imported
from there; this script adds the tests' instruments around it. The training data is
a deterministic function of the global step index (and of the worker index), so a
resumed run sees exactly the batches an uninterrupted one does.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import importlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

T_PROCESS_START = time.monotonic()
#: The examples' folder: the training itself is ``mwms_custom_loop.py`` there.
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


EVENT_PREFIX = "EVENT "

#: Child processes the test harnesses started and have not reaped yet; whatever
#: is left at exit (pytest killed by its timeout, say) is killed then.
LIVE_PROCESSES: set = set()


def kill_process(proc: subprocess.Popen) -> None:
    """Kills ``proc`` if it still runs, reaps it (bounded) and forgets it."""
    if proc.poll() is None:
        proc.kill()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    LIVE_PROCESSES.discard(proc)


@atexit.register
def kill_live_processes() -> None:
    for proc in list(LIVE_PROCESSES):
        kill_process(proc)


def worker_command(
    script, *, ports, index: int, impl: str, ckpt_dir, steps: int, step_sleep: float
) -> list[str]:
    """The command line of one worker process of ``script`` (this file's options)."""
    return [
        sys.executable,
        str(script),
        "--ports",
        ",".join(str(p) for p in ports),
        "--index",
        str(index),
        "--impl",
        impl,
        "--ckpt-dir",
        str(ckpt_dir),
        "--steps",
        str(steps),
        "--step-sleep",
        str(step_sleep),
    ]


@contextlib.contextmanager
def reporting_the_end():
    """Emits ``exit`` (with the code) when the body exits the process, ``error`` (type and
    the message's end) when it raises; the exception goes on either way."""
    try:
        yield
    except SystemExit as e:
        emit("exit", code=e.code)
        raise
    except BaseException as e:
        emit("error", type=type(e).__name__, message=str(e)[-2000:])
        raise


def emit(event: str, **fields) -> None:
    """Print one instrumentation event as a JSON line and flush it."""
    fields = {"event": event, "t": time.time(), **fields}
    sys.stdout.write(EVENT_PREFIX + json.dumps(fields, sort_keys=True) + "\n")
    sys.stdout.flush()


def child_environment() -> dict[str, str]:
    """The environment for a TF process of the test clusters: quiet, unbuffered, loopback only."""
    env = dict(os.environ)
    env.pop("TF_CONFIG", None)
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env["PYTHONUNBUFFERED"] = "1"
    # A crash (SIGSEGV, SIGABRT) leaves every thread's Python traceback in stderr,
    # which the harness shows. (SIGTERM is not among faulthandler's signals.)
    env["PYTHONFAULTHANDLER"] = "1"
    # TF (and the package) probe the GCE metadata server to detect the
    # platform: keep that probe on the loopback interface.
    env.setdefault("GCE_METADATA_IP", "127.0.0.1:9")
    # No other cloud or scheduler either, whatever machine runs the tests: a test
    # that wants one points the workers at a fake metadata server explicitly.
    env.setdefault("TF_FAILURE_HANDLING_CLOUD", "none")
    for name in ("SLURM_JOB_ID", "SLURM_JOB_END_TIME", "KUBERNETES_SERVICE_HOST"):
        env.pop(name, None)
    env.setdefault("NO_PROXY", "127.0.0.1,localhost")
    env.setdefault("no_proxy", "127.0.0.1,localhost")
    return env


def require_loopback(cluster: dict) -> None:
    """Refuses a cluster spec with any address but 127.0.0.1; keeps TF's probes local."""
    for addresses in cluster.values():
        for address in addresses:
            assert address.startswith("127.0.0.1:"), f"127.0.0.1 only, got {address}"
    os.environ.pop("TF_CONFIG", None)
    os.environ.setdefault("GCE_METADATA_IP", "127.0.0.1:9")


def poll_until(predicate, timeout: float, poll: float) -> bool:
    """Calls ``predicate()`` every ``poll`` s until it is true (True) or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(poll)
    return bool(predicate())


def parse_events(text: str) -> list[dict]:
    """The ``EVENT`` records :func:`emit` wrote to stdout (a partial last line is ignored)."""
    events = []
    for line in text.splitlines(keepends=True):
        if not line.startswith(EVENT_PREFIX) or not line.endswith("\n"):
            continue
        try:
            events.append(json.loads(line[len(EVENT_PREFIX) :]))
        except json.JSONDecodeError:
            continue
    return events


def tail(path, lines: int = 40) -> str:
    """The last ``lines`` lines of a log file, for failure messages."""
    try:
        text = path.read_text(errors="replace")
    except OSError as e:
        return f"<cannot read {path}: {e}>"
    return "\n".join(text.splitlines()[-lines:])


def last_traceback(path, lines: int = 60) -> str:
    """The last Python traceback in a log file and the exception lines after it (at most
    ``lines`` lines), or "" if there is none: why a process exited, put first in a
    failure message, where a long log tail may be cut off."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    starts = [i for i, line in enumerate(text) if line.startswith("Traceback (most recent")]
    if not starts:
        return ""
    block = text[starts[-1] :]
    # The frames are indented; the exception and its message follow them.
    end = next((i for i, line in enumerate(block[1:], 1) if not line.startswith(" ")), None)
    if end is not None:
        block = block[: end + 8]
    return "\n".join(block[:lines])


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--ports", required=True, help="comma-separated ports of all workers (all on 127.0.0.1)"
    )
    p.add_argument("--index", type=int, required=True, help="this worker's index")
    p.add_argument("--impl", choices=("tf", "ours"), default="tf")
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--steps", type=int, default=80, help="total run calls")
    p.add_argument(
        "--step-sleep",
        type=float,
        default=0.03,
        help="seconds slept (python side) inside each step",
    )
    p.add_argument(
        "--grace",
        type=float,
        default=0.0,
        help="TerminationConfig grace_period (0 = handler default)",
    )
    p.add_argument(
        "--watcher-file",
        default=None,
        help="termination_watcher_fn = the file exists ({index} is replaced by --index)",
    )
    p.add_argument(
        "--watcher-hold",
        default=None,
        help="with --watcher-file: every call after the first waits until the notice file "
        "or this file exists (each call prints watcher_fn)",
    )
    p.add_argument(
        "--exit-code",
        type=int,
        default=None,
        help="exit_fn = sys.exit(CODE) (default: the handler's own)",
    )
    p.add_argument(
        "--fail-at-step",
        type=int,
        default=None,
        help="raise an OpError inside the train function at this step",
    )
    p.add_argument(
        "--signal-self-at-step",
        type=int,
        default=None,
        help="send SIGTERM to this process before this step",
    )
    p.add_argument(
        "--previous-handler",
        choices=tuple(PREVIOUS_HANDLERS),
        default="none",
        help="a SIGTERM handler installed before the preemption handler is built",
    )
    p.add_argument(
        "--stale-handler",
        action="store_true",
        help="build a first handler on the same checkpoint and leave it open (tf_keras' "
        "second fit), then the one that trains",
    )
    p.add_argument("--progress-every", type=int, default=10)
    p.add_argument(
        "--peak-per-save",
        action="store_true",
        help="each save event says the resident bytes at its start (rss) and the peak "
        "during it (peak_rss): the peak is reset at each save's start",
    )
    p.add_argument(
        "--ballast-mb",
        type=int,
        default=0,
        help="MiB of float32 variables more in the model, made under strategy.scope() in "
        f"variables of at most {BALLAST_VARIABLE_MIB} MiB (saved with it)",
    )
    p.add_argument(
        "--hold-first-save",
        default=None,
        help="the first save prints a save_begun event, then waits (bounded) for this file "
        "to exist: a test sends a notice while the handler is in its save",
    )
    p.add_argument(
        "--fault",
        default=None,
        help="a fault of a shares save, injected into TensorFlow (shares_faults.py)",
    )
    p.add_argument(
        "--heartbeat-timeout",
        type=float,
        default=None,
        help="the coordination service's heartbeat timeout, in seconds (TF's default is 10): "
        "a long one keeps TensorFlow from aborting a step blocked on a paused peer",
    )
    p.add_argument(
        "--paired-gap",
        type=float,
        default=None,
        help="each step also adds the same amount to model.pair_a and model.pair_b, in two "
        "separate all-reduces this many seconds apart (an invariant, pair_a == pair_b, that "
        "a torn save breaks); start and done report both",
    )
    return p.parse_args(argv)


def build_pair(strategy, model, index: int):
    """``model.pair_a`` and ``model.pair_b`` (mirrored, saved with the model) and
    ``add_step(which, step)``: one all-reduce that adds the workers' mean of
    ``(step + 1) * (index + 1)`` to ``pair_<which>``. A step that adds to both in two calls has two
    collectives; a worker lost between them leaves ``pair_a`` ahead of ``pair_b`` on the
    survivors, which a save of the last whole step must not keep."""
    import tensorflow as tf

    with strategy.scope():
        model.pair_a = tf.Variable(0.0, name="pair_a", aggregation=tf.VariableAggregation.MEAN)
        model.pair_b = tf.Variable(0.0, name="pair_b", aggregation=tf.VariableAggregation.MEAN)

    def adder(var):
        @tf.function
        def add(amount):
            strategy.run(var.assign_add, args=(amount,))

        return add

    adders = {"a": adder(model.pair_a), "b": adder(model.pair_b)}

    def add_step(which: str, step: int) -> None:
        adders[which](tf.constant(float((step + 1) * (index + 1))))

    return add_step


#: One ballast variable holds at most this many MiB (a few variables, as a model has).
BALLAST_VARIABLE_MIB = 32


def add_ballast(strategy, model, mib: int) -> None:
    """``mib`` MiB of float32 variables on ``model`` (``model.ballast``), made under
    ``strategy.scope()``: what a bigger model adds to a save; and one ``SyncOnRead``
    variable of SUM aggregation (``model.ballast_on_read``, 1.0 on each replica)."""
    import tensorflow as tf

    sizes = []
    while mib > 0:
        sizes.append(min(mib, BALLAST_VARIABLE_MIB))
        mib -= sizes[-1]
    with strategy.scope():
        # A SyncOnRead variable: its save reads an all-reduce across the workers, so a
        # worker that left its reads out of a save would hold the others up.
        model.ballast_on_read = tf.Variable(
            1.0,
            synchronization=tf.VariableSynchronization.ON_READ,
            aggregation=tf.VariableAggregation.SUM,
            name="ballast_on_read",
        )
        model.ballast = [
            tf.Variable(tf.random.stateless_uniform([n * 2**18], seed=[i, 50]), name=f"ballast_{i}")
            for i, n in enumerate(sizes)
        ]


def reset_peak_rss() -> int | None:
    """Resets this process's peak resident set (``VmHWM``) to what is resident now
    (``5`` to ``/proc/self/clear_refs``, Linux 4.0+); returns that, in bytes (None
    without /proc)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return None
    return proc_status_bytes("VmRSS")


def proc_status_bytes(field: str) -> int | None:
    """A ``kB`` field of ``/proc/self/status`` (``VmHWM``, ``VmRSS``), in bytes."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def written_bytes() -> int | None:
    """Bytes this process has passed to write() and its kin (``wchar`` of /proc/self/io:
    files on any local file system, page cache or not; not ``ram://``)."""
    try:
        with open("/proc/self/io") as f:
            for line in f:
                if line.startswith("wchar:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _install_faulthandler_chain() -> None:
    import faulthandler

    faulthandler.register(signal.SIGTERM, chain=True)


#: SIGTERM handlers a process may have before the preemption handler: absltest and TF's
#: multi-process harness register faulthandler with chain=True; a script may exit itself.
PREVIOUS_HANDLERS = {
    "none": lambda: None,
    "faulthandler-chain": _install_faulthandler_chain,
    "python-exit-3": lambda: signal.signal(signal.SIGTERM, lambda *_: sys.exit(3)),
}


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports that are free on 127.0.0.1 right now (the examples'
    launcher's)."""
    return example("launch_local").free_ports(n)


def tf_config(ports: list[int], index: int) -> dict:
    return {
        "cluster": {"worker": [f"127.0.0.1:{port}" for port in ports]},
        "task": {"type": "worker", "index": index},
    }


def example(name: str):
    """The module ``examples/<name>.py``: the tests use the examples' code, so that
    the examples cannot rot."""
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    return importlib.import_module(name)


def custom_loop_example():
    """``examples/mwms_custom_loop.py``: the model, the batches and the update this
    worker trains with (the example ``make demo`` runs)."""
    return example("mwms_custom_loop")


def batch_for(step: int, index: int):
    """The (x, y) batch worker ``index`` trains on at global step ``step``."""
    return custom_loop_example().batch_for(step, index)


def handler_classes(impl: str):
    """(PreemptionCheckpointHandler, TerminationConfig) for ``impl``."""
    if impl == "ours":
        import tf_failure_handling as tfh

        return tfh.PreemptionCheckpointHandler, tfh.TerminationConfig
    import tensorflow as tf

    return (
        tf.distribute.experimental.PreemptionCheckpointHandler,
        tf.distribute.experimental.TerminationConfig,
    )


#: The handler of this worker, once built (for ``handler_plan``).
HANDLER: list = []
#: What ``handler_plan`` reports of tf_failure_handling's ``_core_state()``.
PLAN_KEYS = (
    "deadline",
    "planned_deadline",
    "final_round_at",
    "margin",
    "longest_save",
    "step_estimate",
    "published_final",
)


def handler_plan():
    """tf_failure_handling's grace plan and clock now (None for TF's handler)."""
    handler = HANDLER[0] if HANDLER else None
    state = getattr(handler, "_core_state", None)
    if state is None:
        return None
    plan = {k: v for k, v in state().items() if k in PLAN_KEYS}
    plan["clock"] = time.monotonic()
    return plan


def held_watcher_fn(notice_file: str, hold_file: str):
    """A watcher fn that sees ``notice_file`` and, after its first call, does not return
    until ``notice_file`` or ``hold_file`` exists: a poll that is under way at shutdown."""
    calls = [0]

    def watcher() -> bool:
        calls[0] += 1
        emit("watcher_fn", call=calls[0])
        while calls[0] > 1 and not os.path.exists(notice_file) and not os.path.exists(hold_file):
            time.sleep(0.01)
        return os.path.exists(notice_file)

    return watcher


def _shown(directory: str) -> str:
    """A local folder as an absolute path; a ``ram://`` or ``gs://`` one as it is."""
    return directory if "://" in directory else os.path.abspath(directory)


#: Bound on --hold-first-save's wait (a test that never writes the file fails its own
#: bound first; this only keeps the worker from waiting forever).
HOLD_BOUND = 300.0


def instrument_checkpoint_manager_saves(
    hold_file: str | None = None, peak_per_save: bool = False
) -> None:
    """Make every ``tf.train.CheckpointManager.save`` print a ``save`` event (the first
    one held until ``hold_file`` exists, when given; with ``peak_per_save``, with ``rss``
    when it started and ``peak_rss`` during it, the peak reset at its start)."""
    import tensorflow as tf

    cls = tf.train.CheckpointManager
    if getattr(cls.save, "_mwms_worker_instrumented", False):
        return
    original = cls.save
    held: list = []

    def save(self, *args, **kwargs):
        runs_var = getattr(self.checkpoint, "checkpointed_runs", None)
        runs = None if runs_var is None else int(runs_var.numpy())
        if hold_file and not held:
            held.append(True)
            emit("save_begun", runs=runs)
            end = time.monotonic() + HOLD_BOUND
            while not os.path.exists(hold_file):
                if time.monotonic() > end:
                    raise RuntimeError(f"{hold_file} did not appear within {HOLD_BOUND:g}s")
                time.sleep(0.05)
        plan = handler_plan()
        peak_before = proc_status_bytes("VmHWM") if peak_per_save else None
        rss = reset_peak_rss() if peak_per_save else None
        t_start = time.time()
        path = original(self, *args, **kwargs)
        t_end = time.time()
        emit(
            "save",
            runs=runs,
            t_start=t_start,
            t_end=t_end,
            directory=_shown(self.directory),
            path=path,
            plan=plan,
            rss=rss,
            peak_rss=None if rss is None else proc_status_bytes("VmHWM"),
            peak_before=peak_before,
        )
        return path

    save._mwms_worker_instrumented = True
    cls.save = save


def build_training(strategy):
    """The example's variables, optimizer state and update, as one distributed step
    function that can also fail on demand (``fail``: a real ``InvalidArgumentError``
    from an op inside the train function, before the all-reduce)."""
    import tensorflow as tf

    example = custom_loop_example()
    model, optimizer = example.build_model(strategy)
    replica_step = example.replica_step_fn(model, optimizer)

    def step_fn(x, y, fail):
        x = tf.debugging.check_numerics(tf.where(fail, x * float("inf"), x), "injected failure")
        return replica_step(x, y)

    @tf.function
    def distributed_step(x, y, fail):
        per_replica = strategy.run(step_fn, args=(x, y, fail))
        return strategy.reduce(tf.distribute.ReduceOp.MEAN, per_replica, axis=None)

    return model, optimizer, distributed_step


def configure_heartbeat_timeout(seconds: float) -> None:
    """The coordination service MultiWorkerMirroredStrategy would configure, with a
    heartbeat timeout of ``seconds`` (the strategy keeps a configuration it finds)."""
    import tensorflow as tf
    from tensorflow.python.distribute import collective_all_reduce_strategy, multi_worker_util
    from tensorflow.python.eager import context

    # The strategy's own import of the proto (its module moved between TF versions).
    coordination_config_pb2 = collective_all_reduce_strategy.coordination_config_pb2

    spec = tf.distribute.cluster_resolver.TFConfigClusterResolver().cluster_spec()
    context.context().configure_coordination_service(
        service_type="standalone",
        service_leader=multi_worker_util.coordination_leader(spec),
        heartbeat_timeout_in_ms=int(seconds * 1000),
        coordinated_jobs=[
            coordination_config_pb2.CoordinatedJob(name=job, num_tasks=spec.num_tasks(job))
            for job in ("chief", "worker")
            if job in spec.jobs
        ],
    )


def main(argv=None) -> int:
    args = parse_args(argv)
    ports = [int(p) for p in args.ports.split(",") if p]
    os.environ["TF_CONFIG"] = json.dumps(tf_config(ports, args.index))
    # Keep TF's GCE probe on the loopback interface (refused at once => not GCE).
    os.environ.setdefault("GCE_METADATA_IP", "127.0.0.1:9")

    import tensorflow as tf

    handler_cls, config_cls = handler_classes(args.impl)
    instrument_checkpoint_manager_saves(args.hold_first_save, args.peak_per_save)
    if args.fault:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        importlib.import_module("shares_faults").install(args.fault, emit)

    if args.heartbeat_timeout is not None:
        configure_heartbeat_timeout(args.heartbeat_timeout)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    model, optimizer, distributed_step = build_training(strategy)
    if args.ballast_mb:
        add_ballast(strategy, model, args.ballast_mb)
    add_pair = None
    if args.paired_gap is not None:
        add_pair = build_pair(strategy, model, args.index)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)

    config_kwargs = {}
    if args.watcher_file:
        watcher_file = args.watcher_file.format(index=args.index)
        config_kwargs["termination_watcher_fn"] = lambda: os.path.exists(watcher_file)
        if args.watcher_hold:
            config_kwargs["termination_watcher_fn"] = held_watcher_fn(
                watcher_file, args.watcher_hold
            )
    if args.exit_code is not None:
        exit_code = args.exit_code
        config_kwargs["exit_fn"] = lambda: sys.exit(exit_code)
    if args.grace > 0:
        config_kwargs["grace_period"] = args.grace
    termination_config = config_cls(**config_kwargs) if config_kwargs else None

    PREVIOUS_HANDLERS[args.previous_handler]()
    if args.stale_handler:
        stale = handler_cls(
            strategy.cluster_resolver,
            checkpoint,
            checkpoint_dir=args.ckpt_dir,
            termination_config=termination_config,
        )
        stale.run(lambda: None)  # kept open and never closed, as tf_keras does

    t_handler = time.monotonic()
    handler = handler_cls(
        strategy.cluster_resolver,
        checkpoint,
        checkpoint_dir=args.ckpt_dir,
        termination_config=termination_config,
    )
    HANDLER.append(handler)
    start = int(handler.total_run_calls)
    rss = reset_peak_rss()
    emit(
        "start",
        rss=rss,
        wchar=written_bytes(),
        restored=start,
        pid=os.getpid(),
        index=args.index,
        impl=args.impl,
        steps=args.steps,
        setup_s=round(t_handler - T_PROCESS_START, 3),
        handler_init_s=round(time.monotonic() - t_handler, 3),
        pair=pair_values(model),
    )

    def train_step(step: int):
        x, y = batch_for(step, args.index)
        fail = args.fail_at_step is not None and step == args.fail_at_step
        loss = distributed_step(tf.constant(x), tf.constant(y), tf.constant(fail))
        if add_pair is not None:
            add_pair("a", step)
            time.sleep(args.paired_gap)
            add_pair("b", step)
        if args.step_sleep > 0:
            time.sleep(args.step_sleep)
        return loss

    step = start
    try:
        for step in range(start, args.steps):
            if args.signal_self_at_step is not None and step == args.signal_self_at_step:
                emit("signal", step=step, signum=int(signal.SIGTERM))
                os.kill(os.getpid(), signal.SIGTERM)
            loss = handler.run(train_step, step)
            if (step + 1) % args.progress_every == 0:
                emit("progress", step=step + 1, loss=float(loss))
    except SystemExit as e:
        emit(
            "exit",
            code=e.code,
            step=step,
            peak_rss=proc_status_bytes("VmHWM") if rss is not None else None,
            wchar=written_bytes(),
        )
        raise
    except BaseException as e:
        emit("error", type=type(e).__name__, message=str(e)[-2000:], step=step)
        raise

    emit(
        "done",
        steps=args.steps,
        total_run_calls=int(handler.total_run_calls),
        weights={
            "kernel": [float(v) for v in model.kernel.numpy().ravel()],
            "bias": [float(v) for v in model.bias.numpy().ravel()],
            **({} if add_pair is None else dict(zip(("pair_a", "pair_b"), pair_values(model)))),
        },
    )
    return 0


def pair_values(model):
    """``[pair_a, pair_b]`` (``--paired-gap``), else None."""
    if not hasattr(model, "pair_a"):
        return None
    return [float(model.pair_a.numpy()), float(model.pair_b.numpy())]


if __name__ == "__main__":
    sys.exit(main())
