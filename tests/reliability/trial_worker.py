"""The processes of the real-process fault trials (``process_trials.py``).

Three modes::

    python trial_worker.py mwms [trial options] [mwms_worker.py options]
    python trial_worker.py ps-coordinator --cluster JSON --impl ours --closures 5000 ...
    python trial_worker.py ps-preemption serve|coordinator [--control-dir DIR] ...

``mwms`` runs ``tests/integration/mwms_worker.py`` (one MultiWorkerMirroredStrategy
worker; its ``EVENT`` lines and options are unchanged) with what the trials add:

* ``--hosts`` puts each worker on its own address (default 127.0.0.1 for every
  worker; a partition trial puts one worker on a veth address inside a network
  namespace the trial created);
* ``--slow-save S`` makes every ``tf.train.CheckpointManager.save`` slow and
  observable: ``save_begin`` is printed, then ``S/2`` seconds pass before TF writes
  the checkpoint files, ``save_written`` is printed once they are in place, and
  another ``S/2`` seconds pass before the manager records them in the
  ``checkpoint`` state file (``save`` is printed when ``save`` returns, as always).
  A SIGKILL between ``save_begin`` and ``save`` leaves a partial checkpoint: none
  at all, or data files that the state file does not name. ``--save-gate PATH``
  makes each half wait, after its sleep, until ``PATH-1`` (``PATH-2``) exists, so a
  trial decides how far a save it kills gets;
* every coordination-service key the handler sets is printed as ``kv_set``
  (``key``, ``value``, ``ok``, ``t_start``), so a trial sees when the leader
  published the agreed step and when each worker acknowledged it;
  ``--ack-delay S`` makes each acknowledgement wait ``S`` seconds first, which
  stretches the acknowledgement round, and ``--ack-gate FILE`` then until ``FILE``
  exists, which holds the round open until the trial's second notice was sent.

``ps-coordinator`` is the chief of a ParameterServerStrategy cluster whose servers
``tests/integration/ps_cluster.py`` runs. It schedules ``--closures`` (or more)
indexed closures in waves of random size (``--seed``) with a ``join`` after each,
prints ``progress`` after every wave, and keeps going until the trial writes
``--control-dir/faults_done`` (it killed and restarted workers meanwhile) and
``--post-waves`` more waves ran. Closure ``i`` reads the next element of the
per-worker dataset, adds ``i + 1`` to ``contrib[i]`` (one op) and to ``total`` (both
on the PS) and returns ``(worker index, i, x)``. At the end it prints ``summary``
with what every RemoteValue gave and what the PS variables hold, so the trial can
tell lost closures (unresolved, wrong result, or ``contrib[i] == 0``) from
duplicates (``contrib[i] > i + 1``: at-least-once execution, as TF documents).

``ps-preemption`` runs ``tests/integration/ps_preemption_script.py`` (its ``serve``
and ``coordinator`` modes, options and ``EVENT`` lines unchanged) for the
``ps_preemption`` trials. Its servers get only what every mode here gets (the stack
dump on :data:`STACKS_SIGNAL`, the package's log on stderr); its coordinator also
takes ``--control-dir DIR`` and prints what the trial aims its faults at:

* ``join_begin`` / ``join_end`` (or ``join_raised``) around each
  ``ClusterCoordinator.join()``;
* ``bound_begin`` / ``bound_end`` around the handler's wait for the scheduled
  closures before its save (``closure_drain.wait_for_closures``; ``bound_end`` has what
  it returned: queued and in flight at the bound), ``save_begin`` / ``save_end`` around
  ``CheckpointManager.save``;
* ``drain_begin`` / ``drain_end`` around a worker's drain (``WorkerDrain.run``),
  ``release_begin`` / ``release_end`` around each release of a task.

Four of those places are gates: a ``schedule()`` call, a ``join()``, the checkpoint
save (before any file is written) and a worker's release at the end of its drain. A
gate is armed when the trial writes ``DIR/arm-schedule`` (``-join``, ``-save``,
``-drain``) holding an id; the next call that passes it removes the file, prints
``gate`` (point, id, runs) and waits until ``DIR/open-<id>`` exists (at most
:data:`ACK_GATE_TIMEOUT`), so a fault lands inside that moment however slow (or
fast) the machine. The join gate cannot hold the coordinator's own thread (a notice
in ``join()`` is seen by that thread, waiting on the closures): the ``schedule()``
call that takes its arm holds the coordinator's worker threads instead (each waits
before running its next closure, ``worker_loop.Worker._process_closure``), the next
``join()`` (or the first ``fetch()``/``get()`` of a result, which would otherwise wait
for a closure the held threads never run) prints ``gate``, and opening it lets them go
-- closures are in flight and queued while the fault lands. Unarmed, a gate costs one
``stat``. A hook whose target the package no longer has is reported (``hook_missing``)
and left out: the trial then sees that moment never come.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import logging
import os
import random
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

INTEGRATION = Path(__file__).resolve().parent.parent / "integration"
if str(INTEGRATION) not in sys.path:
    sys.path.insert(0, str(INTEGRATION))

import mwms_worker  # noqa: E402 - found through the path set above
from mwms_worker import emit  # noqa: E402
from tf_failure_handling._native import ACK_PREFIX  # noqa: E402 - TF's key name

T_PROCESS_START = time.monotonic()
#: Bound on waiting for ``--ack-gate`` or a ``--save-gate`` (a hang bound: the trial
#: opens a gate as soon as its moment came, or kills the process waiting at it).
ACK_GATE_TIMEOUT = 120.0


# ----------------------------------------------------------------------------- mwms
def parse_mwms_args(argv):
    p = argparse.ArgumentParser(
        description="an mwms_worker.py worker with trial hooks", allow_abbrev=False
    )
    p.add_argument(
        "--hosts",
        default="",
        help="comma-separated host of each worker (default 127.0.0.1 for every one)",
    )
    p.add_argument("--slow-save", type=float, default=0.0, help="seconds each save takes")
    p.add_argument(
        "--save-gate",
        default="",
        help="with --slow-save: each save waits for PATH-1 before writing its data files "
        "and for PATH-2 before the state file names them ({index}: this worker's)",
    )
    p.add_argument("--ack-delay", type=float, default=0.0, help="seconds before each ack")
    p.add_argument("--ack-gate", default="", help="each ack waits until this file exists")
    return p.parse_known_args(argv)


def use_hosts(hosts: list) -> None:
    """Makes ``mwms_worker`` build TF_CONFIG with ``hosts`` instead of 127.0.0.1."""

    def tf_config(ports, index):
        return {
            "cluster": {"worker": [f"{h}:{port}" for h, port in zip(hosts, ports)]},
            "task": {"type": "worker", "index": index},
        }

    mwms_worker.tf_config = tf_config


def slow_down_saves(seconds: float, gate: str = "") -> None:
    """Every CheckpointManager.save takes ``seconds`` more, in two observable halves.

    With ``gate``, each half then waits until ``gate-1`` (resp. ``gate-2``) exists:
    the trial decides how far a save it is going to kill gets.
    """
    import tensorflow as tf

    mwms_worker.instrument_checkpoint_manager_saves()  # prints ``save`` when done
    cls = tf.train.CheckpointManager
    instrumented_save = cls.save
    record_state = cls._record_state
    state = threading.local()
    half = seconds / 2

    def save(self, *args, **kwargs):
        runs_var = getattr(self.checkpoint, "checkpointed_runs", None)
        runs = None if runs_var is None else int(runs_var.numpy())
        emit("save_begin", runs=runs, directory=os.path.abspath(self.directory))
        time.sleep(half)
        wait_for_gate(gate, 1)
        state.runs, state.written = runs, False
        try:
            return instrumented_save(self, *args, **kwargs)
        finally:
            state.runs = None

    def _record_state(self):
        # The first call of a save comes right after TF wrote the data files and
        # before the `checkpoint` state file names them.
        if getattr(state, "runs", None) is not None and not state.written:
            state.written = True
            emit("save_written", runs=state.runs, directory=os.path.abspath(self.directory))
            time.sleep(half)
            wait_for_gate(gate, 2)
        return record_state(self)

    save._mwms_worker_instrumented = True  # keeps mwms_worker from wrapping it again
    cls.save = save
    cls._record_state = _record_state


def wait_for_gate(gate: str, number: int) -> None:
    if gate:
        path = f"{gate}-{number}"
        mwms_worker.poll_until(lambda: os.path.exists(path), ACK_GATE_TIMEOUT, 0.005)


def observe_coordination_keys(ack_delay: float, ack_gate: str = "") -> None:
    """Prints every key the handler sets; holds acknowledgements back.

    Each acknowledgement waits ``ack_delay`` seconds, then (with ``ack_gate``) until
    that file exists: the trial creates it once its second notice is sent.
    """
    from tf_failure_handling._cluster import coordination as _coordination

    original = _coordination.Client.set

    def set(self, key, value, *args, **kwargs):
        if key.startswith(ACK_PREFIX):
            if ack_delay > 0:
                time.sleep(ack_delay)
            if ack_gate:
                mwms_worker.poll_until(lambda: os.path.exists(ack_gate), ACK_GATE_TIMEOUT, 0.005)
        t_start = time.time()
        try:
            ok = original(self, key, value, *args, **kwargs)
        except BaseException as e:
            emit("kv_set", key=key, value=value, ok=None, error=repr(e)[:300], t_start=t_start)
            raise
        emit("kv_set", key=key, value=value, ok=ok, t_start=t_start)
        return ok

    _coordination.Client.set = set


def _index(rest: list) -> str:
    return rest[rest.index("--index") + 1] if "--index" in rest else "0"


def run_mwms(argv) -> int:
    trial, rest = parse_mwms_args(argv)
    # The handler's protocol log, with wall-clock times, on stderr (for diagnosis).
    log = logging.getLogger("tf_failure_handling")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(created).3f %(threadName)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    if trial.hosts:
        use_hosts(trial.hosts.split(","))
    impl = rest[rest.index("--impl") + 1] if "--impl" in rest else "tf"
    if trial.slow_save > 0:
        slow_down_saves(trial.slow_save, trial.save_gate.format(index=_index(rest)))
    if impl == "ours":
        observe_coordination_keys(trial.ack_delay, trial.ack_gate)
    return mwms_worker.main(rest)


# ----------------------------------------------------------------------------- ps
def parse_ps_args(argv):
    p = argparse.ArgumentParser(description="PS-cluster coordinator with indexed closures")
    p.add_argument("--cluster", required=True, help="cluster spec as JSON (127.0.0.1 only)")
    p.add_argument("--impl", choices=("tf", "ours"), default="ours")
    p.add_argument("--closures", type=int, default=5000, help="at least this many closures")
    p.add_argument("--seed", type=int, default=0, help="draws the wave sizes")
    p.add_argument("--wave-min", type=int, default=100)
    p.add_argument("--wave-max", type=int, default=500)
    p.add_argument("--post-waves", type=int, default=2, help="waves after faults_done")
    p.add_argument("--control-dir", required=True)
    p.add_argument("--max-seconds", type=float, default=300.0)
    p.add_argument("--connect-timeout", type=float, default=90.0)
    return p.parse_args(argv)


def run_ps_coordinator(argv) -> int:
    args = parse_ps_args(argv)
    cluster = json.loads(args.cluster)
    mwms_worker.require_loopback(cluster)
    import ps_coordinator_script as pcs  # sibling of mwms_worker: Job, servers, errors

    emit("start", pid=os.getpid(), impl=args.impl, closures=args.closures)
    try:
        api = pcs.impl_api(args.impl)
        pcs.wait_for_servers(cluster, args.connect_timeout)
        job = pcs.Job(cluster, api)
        emit("connected", after_s=round(time.monotonic() - T_PROCESS_START, 3))
        run_indexed_waves(job, args)
    except BaseException as e:  # noqa: BLE001 - reported, then a non-zero exit
        emit("error", traceback=traceback.format_exc()[-3000:], **pcs.error_record(e))
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    emit("done", seconds=round(time.monotonic() - T_PROCESS_START, 3))
    sys.stdout.flush()
    sys.stderr.flush()
    # As ps_coordinator_script: skip a teardown that TF's threads can make slow.
    os._exit(0)


def run_indexed_waves(job, args) -> None:
    tf = job.tf
    rng = random.Random(args.seed)
    capacity = max(args.closures * 4, 1 << 15)  # room for the waves after the faults
    with job.strategy.scope():
        # contrib[i] += i + 1 in one op: a closure's effect on the PS is all or nothing,
        # so contrib[i] / (i + 1) is how often closure i ran to completion (or at least
        # through its update) -- 0 is a lost closure, 2+ a re-execution.
        contrib = tf.Variable(tf.zeros([capacity], tf.int64), name="contrib")
    total = job.v  # a second, separate update: total += i + 1
    get_worker_index = job.api["get_worker_index"]

    @tf.function
    def indexed_step(iterator, i):
        x = next(iterator)
        contrib.scatter_add(tf.IndexedSlices(tf.reshape(i + 1, [1]), tf.reshape(i, [1])))
        total.assign_add(i + 1)
        return get_worker_index(), i, x

    faults_done = Path(args.control_dir) / "faults_done"
    rvs: list = []
    t0 = time.monotonic()
    waves = post_waves = 0
    faults_seen_at = None
    while True:
        if faults_seen_at is None and faults_done.exists():
            faults_seen_at = len(rvs)
            emit("faults_done_seen", scheduled=len(rvs), wave=waves)
        size = rng.randint(args.wave_min, args.wave_max)
        if len(rvs) + size > capacity:
            emit("gave_up", reason="out of closure indices", done=len(rvs))
            break
        t_wave = time.monotonic()
        start = len(rvs)
        for i in range(start, start + size):
            index = tf.constant(i, tf.int64)
            rvs.append(job.coordinator.schedule(indexed_step, args=(job.iterator, index)))
        job.coordinator.join()
        waves += 1
        if faults_seen_at is not None:
            post_waves += 1
        emit(
            "progress",
            wave=waves,
            size=size,
            done=len(rvs),
            join_s=round(time.monotonic() - t_wave, 3),
        )
        if len(rvs) >= args.closures and post_waves >= args.post_waves:
            break
        if time.monotonic() - t0 > args.max_seconds:
            emit("gave_up", reason="max seconds", done=len(rvs))
            break

    unresolved, wrong, by_worker = [], [], {}
    for i, rv in enumerate(rvs):
        try:
            worker, index, _x = rv.fetch()
        except Exception as e:  # noqa: BLE001 - every failure is reported
            unresolved.append({"index": i, **_short_error(e)})
            continue
        if int(index) != i:
            wrong.append({"index": i, "returned": int(index)})
        by_worker[str(int(worker))] = by_worker.get(str(int(worker)), 0) + 1
    values = contrib.numpy()
    counts = [int(values[i]) // (i + 1) for i in range(len(rvs))]
    uneven = [i for i in range(len(rvs)) if int(values[i]) % (i + 1)]
    emit(
        "summary",
        scheduled=len(rvs),
        waves=waves,
        faults_seen_at=faults_seen_at,
        unresolved=len(unresolved),
        unresolved_sample=unresolved[:5],
        wrong_results=wrong[:5],
        wrong_count=len(wrong),
        count_by_worker=by_worker,
        never_ran=[i for i, c in enumerate(counts) if c == 0][:20],
        never_ran_count=sum(c == 0 for c in counts),
        duplicates=sum(c - 1 for c in counts if c > 1),
        duplicated_closures=sum(c > 1 for c in counts),
        uneven=uneven[:20],
        contrib_beyond_scheduled=int(values[len(rvs) :].sum()),
        contrib_sum=int(values.sum()),
        # Updates of `total` are separate from those of `contrib`: a closure cut short
        # by a kill may have applied one and not the other before it ran again.
        total=int(total.numpy()),
        exactly_once=sum(i + 1 for i in range(len(rvs))),
        seconds=round(time.monotonic() - t0, 3),
    )


def _short_error(e: BaseException) -> dict:
    return {"type": type(e).__name__, "message": str(e)[:300]}


# ----------------------------------------------------------------------------- ps-preemption
#: The coordinator's handler, once built (its run count goes into the gate events).
_PS_HANDLER: list = []


def _runs():
    handler = _PS_HANDLER[-1] if _PS_HANDLER else None
    return getattr(handler, "_run_counter", None)


#: Cleared while the join gate holds the coordinator's worker threads (module docstring).
_DISPATCH = threading.Event()
_DISPATCH.set()
#: The id of an armed join gate, from the schedule() call that took it to the join().
_JOIN_GATE: list = []
#: Per worker thread: the closure it took from our coordinator's queue, whose
#: ``closure_begin`` is printed (``closure``, ``fields``), and whether it is in
#: ``_process_closure`` (``processing``).
_TAKEN = threading.local()


def _take_arm(control: Path, point: str):
    """The id the trial armed gate ``point`` with (the arm is removed), or None."""
    arm = control / f"arm-{point}"
    if not arm.exists():
        return None
    try:
        gate_id = arm.read_text().strip()
        arm.unlink()
    except FileNotFoundError:  # another thread took it
        return None
    return gate_id


def _wait_open(control: Path, point: str, gate_id: str) -> None:
    opened = mwms_worker.poll_until(
        lambda: (control / f"open-{gate_id}").exists(), ACK_GATE_TIMEOUT, 0.005
    )
    emit("gate_open" if opened else "gate_timeout", point=point, id=gate_id)


def ps_gate(control: Path, point: str) -> None:
    """Waits at gate ``point`` if the trial armed it (see the module docstring)."""
    gate_id = _take_arm(control, point)
    if gate_id is not None:
        emit("gate", point=point, id=gate_id, runs=_runs())
        _wait_open(control, point, gate_id)


def _open_dispatch_when_told(control: Path, gate_id: str) -> None:
    try:
        _wait_open(control, "join", gate_id)
    finally:
        _DISPATCH.set()


def _jsonable(value):
    try:
        json.dumps(value)
        return value
    except TypeError:
        return repr(value)[:300]


def _wrap(owner, name: str, make) -> None:
    """Replaces ``owner.name`` by ``make(original)``; reports a target that is gone."""
    original = getattr(owner, name, None)
    if original is None:
        emit("hook_missing", target=f"{getattr(owner, '__name__', owner)}.{name}")
        return
    setattr(owner, name, make(original))


def _function_names(in_flight) -> list:
    """The names of the functions ``wait_for_closures`` names in flight (worker index ->
    function): the trial tells the handler's closures from those scheduled outside it."""
    if not isinstance(in_flight, dict):
        return []
    names = []
    for fn in in_flight.values():
        name = getattr(fn, "__name__", None) or getattr(fn, "name", None)
        names.append(str(name) if name else repr(fn)[:80])
    return names


def _closure_name(closure) -> str:
    """The closure's function name (its concrete function's, e.g.
    ``__inference_train_step_id_97``)."""
    function = getattr(closure, "_concrete_function", None) or getattr(closure, "_function", None)
    name = getattr(function, "name", None) or getattr(function, "__name__", None)
    name = name.decode() if isinstance(name, bytes) else name
    return str(name) if name else type(closure).__name__


#: The function of ps_preemption_script.py whose second argument is the run id.
RUN_FUNCTION = "train_step_id"


def _closure_run(closure, name: str):
    """The handler's run index of ``closure``: our coordinator's closures carry it
    (``_tfh_run``); on TensorFlow's, which keeps none, the script's ``train_step_id``
    closure's second argument is it. None for any other closure."""
    run = getattr(closure, "_tfh_run", None)
    if run is not None:
        return int(run)
    args = getattr(closure, "_args", None) or ()
    if RUN_FUNCTION in name and len(args) >= 2 and hasattr(args[1], "numpy"):
        try:
            return int(args[1].numpy())
        except Exception:  # noqa: BLE001 - not a readable id: none
            return None
    return None


def _closure_finished(closure) -> bool:
    """Whether ``_process_closure`` finished ``closure`` (False: it failed, and TF's
    failure handling put it back in the queue or gave its RemoteValue the error)."""
    ref = getattr(closure, "_output_remote_value_ref", None)
    remote_value = ref() if callable(ref) else None
    status = getattr(remote_value, "_status", None)
    if status is None:  # no RemoteValue left to tell (the caller dropped it)
        return True
    ready = getattr(status, "name", str(status)) == "READY"
    return ready and getattr(remote_value, "_error", None) is None


def instrument_ps_coordinator(control: Path, tf_coordinator: bool = False) -> None:
    """The events and gates of the ``ps-preemption`` coordinator (module docstring).
    With ``tf_coordinator`` the script runs TensorFlow's own ``ClusterCoordinator``,
    whose ``schedule``, ``join`` and worker threads get the gates instead of ours."""
    import tensorflow as tf
    import tf_failure_handling as tfh
    from tensorflow.python.distribute.coordinator import cluster_coordinator as tf_cc
    from tf_failure_handling._coordinator import remote_values, worker_loop

    def handler_init(original):
        def __init__(self, *args, **kwargs):
            original(self, *args, **kwargs)
            _PS_HANDLER.append(self)

        return __init__

    def schedule(original):
        def gated(self, *args, **kwargs):
            ps_gate(control, "schedule")
            if not _JOIN_GATE:
                gate_id = _take_arm(control, "join")
                if gate_id is not None:  # hold closures until the join is under way
                    _DISPATCH.clear()
                    _JOIN_GATE.append(gate_id)
            return original(self, *args, **kwargs)

        return gated

    def closure_fields(closure, worker) -> dict:
        name = _closure_name(closure)
        return {"run": _closure_run(closure, name), "worker": worker, "fn": name}

    def queue_get(original):
        # Our coordinator's queue: a closure is the worker's, in flight, from the moment
        # get() hands it over (before the worker thread records it as taken, which the
        # save's wait reads). A resource closure (a per-worker value) is no run.
        def observed(self, *args, **kwargs):
            closure = original(self, *args, **kwargs)
            if closure is not None and not isinstance(closure, tf_cc.ResourceClosure):
                tag = kwargs.get("tag", args[1] if len(args) > 1 else None)
                _TAKEN.closure, _TAKEN.fields = closure, closure_fields(closure, tag)
                emit("closure_begin", **_TAKEN.fields)
            return closure

        return observed

    def queue_put_back(original):
        # A closure taken and put back untouched (a strict hold that came while the
        # thread waited in get()): its attempt ends here, never run.
        def observed(self, closure, *args, **kwargs):
            taken = getattr(_TAKEN, "closure", None)
            if taken is closure and not getattr(_TAKEN, "processing", False):
                emit("closure_end", ok=False, put_back=True, **_TAKEN.fields)
                _TAKEN.closure = None
            return original(self, closure, *args, **kwargs)

        return observed

    def process_closure(original):
        def gated(self, closure, *args, **kwargs):
            # The harness's own account of the closure, on its own clock: which run
            # (the handler's run index; None for a closure scheduled outside
            # handler.run), on which worker, from when to when, and whether it finished.
            # Begun in our queue's get() (above); TensorFlow's coordinator's here.
            if getattr(_TAKEN, "closure", None) is closure:
                fields = _TAKEN.fields
            else:
                fields = closure_fields(closure, getattr(self, "worker_index", None))
                emit("closure_begin", **fields)
            _TAKEN.processing = True
            ok = False
            try:
                if not _DISPATCH.is_set():
                    _DISPATCH.wait(ACK_GATE_TIMEOUT)
                result = original(self, closure, *args, **kwargs)
                ok = _closure_finished(closure)
                return result
            finally:
                _TAKEN.processing, _TAKEN.closure = False, None
                emit("closure_end", ok=ok, **fields)

        return gated

    def join_moment(via: str) -> None:
        """The armed join gate's moment came: a join(), or a wait on one result (a
        fetch()/get() in the loop waits for a closure that the held worker threads
        would never run otherwise)."""
        try:
            gate_id = _JOIN_GATE.pop()
        except IndexError:
            return
        emit("gate", point="join", id=gate_id, runs=_runs(), via=via)
        threading.Thread(
            target=_open_dispatch_when_told,
            args=(control, gate_id),
            name="trial-join-gate",
            daemon=True,
        ).start()

    def join(original):
        def observed(self, *args, **kwargs):
            emit("join_begin", runs=_runs())
            join_moment("join")
            try:
                result = original(self, *args, **kwargs)
            except BaseException as e:
                emit("join_raised", type=type(e).__name__, runs=_runs())
                raise
            emit("join_end", runs=_runs())
            return result

        return observed

    def result_wait(original):
        def observed(self, *args, **kwargs):
            join_moment("fetch")
            return original(self, *args, **kwargs)

        return observed

    def bound(original):
        def observed(*args, **kwargs):
            emit("bound_begin", runs=_runs())
            result = original(*args, **kwargs)
            if hasattr(result, "queued"):  # wait_for_closures' Unfinished
                seen = {
                    "queued": result.queued,
                    "in_flight": _jsonable(result.in_flight),
                    "in_flight_names": _function_names(result.in_flight),
                    "unnamed": getattr(result, "unnamed", 0),
                }
            else:  # join_within's (queued, in flight)
                seen = _jsonable(result)
            emit("bound_end", result=seen, runs=_runs())
            return result

        return observed

    def save(original):
        def gated(self, *args, **kwargs):
            emit("save_begin", runs=_runs())
            ps_gate(control, "save")
            path = original(self, *args, **kwargs)
            emit("save_end", runs=_runs(), path=_jsonable(path))
            return path

        return gated

    def drain_run(original):
        def observed(self, *args, **kwargs):
            index = getattr(self, "index", None)
            emit("drain_begin", index=index)
            try:
                return original(self, *args, **kwargs)
            finally:
                emit("drain_end", index=index)

        return observed

    def release(original):
        def gated(self, task, *args, **kwargs):
            emit("release_begin", task=str(task))
            if "/job:worker/" in str(task):
                ps_gate(control, "drain")
            ok = original(self, task, *args, **kwargs)
            emit("release_end", task=str(task), ok=_jsonable(ok))
            return ok

        return gated

    _wrap(tfh.PreemptionCheckpointHandler, "__init__", handler_init)
    coordinator_class = tf_cc.ClusterCoordinator if tf_coordinator else tfh.ClusterCoordinator
    _wrap(coordinator_class, "schedule", schedule)
    _wrap(coordinator_class, "join", join)
    _wrap(
        tf_cc.Worker if tf_coordinator else worker_loop.Worker, "_process_closure", process_closure
    )
    if not tf_coordinator:
        from tf_failure_handling._coordinator import closure_queue

        _wrap(closure_queue.ClosureQueue, "get", queue_get)
        _wrap(closure_queue.ClosureQueue, "put_back", queue_put_back)
    from tensorflow.python.distribute.coordinator import values as tf_values

    for cls in (tf_values.RemoteValueImpl, remote_values.ClosureRemoteValue):
        for name in ("fetch", "get"):
            if name in vars(cls):
                _wrap(cls, name, result_wait)
    # The wait for the closures before the save (named join_within before issue 32),
    # the drain and the poller: one ps_control module until issue 51 split it.
    try:
        from tf_failure_handling._coordinator import closure_drain, cluster_poller, worker_drain
    except ImportError:
        from tf_failure_handling._coordinator import ps_control

        closure_drain = cluster_poller = worker_drain = ps_control
    name = "wait_for_closures" if hasattr(closure_drain, "wait_for_closures") else "join_within"
    _wrap(closure_drain, name, bound)
    _wrap(tf.train.CheckpointManager, "save", save)
    _wrap(worker_drain.WorkerDrain, "run", drain_run)
    _wrap(cluster_poller.ClusterPoller, "release", release)


def run_ps_preemption(argv) -> int:
    """``ps_preemption_script.py serve|coordinator ...`` with the trial's hooks."""
    import ps_preemption_script  # sibling of mwms_worker, found through INTEGRATION

    if argv[:1] == ["coordinator"]:
        p = argparse.ArgumentParser(description="the ps_preemption trial's coordinator")
        p.add_argument("--control-dir", required=True, help="where the trial arms the gates")
        trial, rest = p.parse_known_args(argv[1:])
        instrument_ps_coordinator(Path(trial.control_dir), "--tf-coordinator" in rest)
        argv = ["coordinator", *rest]
    emit("process_start", pid=os.getpid(), mode=argv[:1])
    return ps_preemption_script.main(argv)


MODES = {"mwms": run_mwms, "ps-coordinator": run_ps_coordinator, "ps-preemption": run_ps_preemption}
#: A trial that finds a process hung sends it this signal first: every thread's
#: Python stack goes to stderr (the handler watches SIGTERM, and SIGUSR1 under SLURM).
STACKS_SIGNAL = signal.SIGUSR2


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in MODES:
        sys.exit(f"usage: {sys.argv[0]} {{{'|'.join(MODES)}}} ...")
    faulthandler.register(STACKS_SIGNAL, all_threads=True)
    sys.exit(MODES[sys.argv[1]](sys.argv[2:]))
