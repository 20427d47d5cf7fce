"""What a MultiWorkerMirroredStrategy survivor sees when a peer is lost, or when it is not.

Issue 62's classification is table-tested against the errors TensorFlow really gives.
This probe collects them: for each scenario it starts ``--workers`` MWMS workers on
127.0.0.1 (one process each, TensorFlow's coordination service as MWMS sets it up),
trains a small model whose step makes several all-reduces, and at step ``--at`` of the
target does one of:

* ``kill``: SIGKILL (an OOM kill, a segfault, a lost host);
* ``stop``: SIGSTOP (a hung process or frozen host), SIGCONT at the end;
* ``app``: the target's step fails with an InvalidArgumentError of its own, which it
  reports to the cluster as TensorFlow's handler does (``report_error_to_cluster``);
* ``bug``: every worker's step fails with the same InvalidArgumentError (a bug in the
  user's step);
* ``oom``: the target's step fails with a ResourceExhaustedError of its own, which it
  reports to the cluster.

Each worker prints, on the first error out of its step: the exception's type, its
message, the step it had finished, how long after the fault it came, and whether a
bare ``checkpoint.write()`` then worked (and how long it took), each bounded. The
probe prints one JSON line per worker and scenario, and with ``--out FILE`` writes
them all (``tests/fixtures/lost_peer/`` keeps one file per TensorFlow version).

    python dev/lost_peer_probe.py [--scenarios kill:1,kill:0,stop:1,app:1,bug:1,oom:1]
        [--workers 2] [--at 20] [--out FILE] [--python PYTHON]

``kill:1`` is a scenario ``kill`` with worker 1 (a non-chief) as the target; worker 0
is the chief and hosts the coordination service. Only 127.0.0.1 is addressed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: How long a survivor waits for its step's error after the fault before it says none
#: came (a stopped chief freezes the coordination service: TF's collectives never fail).
ERROR_BOUND = 90.0
#: How long a bare checkpoint write may take before it counts as hung.
WRITE_BOUND = 30.0
#: How long the workers may take to start and reach the fault's step.
START_BOUND = 240.0
PREFIX = "PROBE "


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def say(**fields) -> None:
    print(PREFIX + json.dumps(fields, sort_keys=True), flush=True)


# --------------------------------------------------------------------- worker side


def worker(args) -> int:
    import tensorflow as tf
    from tensorflow.python.eager import context

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    mean = tf.VariableAggregation.MEAN
    with strategy.scope():
        a = tf.Variable(tf.ones([64, 64]), aggregation=mean, name="a")
        b = tf.Variable(tf.zeros([64]), aggregation=mean, name="b")
        step_var = tf.Variable(0, dtype=tf.int64, name="step")
    checkpoint = tf.train.Checkpoint(a=a, b=b, step=step_var)
    fault_here = args.index == index and args.fault in ("app", "oom")
    fault_all = args.fault == "bug"

    @tf.function
    def train(fail):
        def replica(fail):
            x = tf.random.stateless_normal([8, 64], seed=[1, 2])
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(tf.matmul(x, a) + b))
            ga, gb = tape.gradient(loss, [a, b])
            ctx = tf.distribute.get_replica_context()
            # Several collectives a step: the gradients one by one, then the loss.
            ga = ctx.all_reduce("mean", ga)
            gb = ctx.all_reduce("mean", gb)
            a.assign_sub(0.001 * ga)
            b.assign_sub(0.001 * gb)
            tf.debugging.assert_equal(fail, 0, message="the probe's own step failure")
            return ctx.all_reduce("sum", loss)

        return strategy.run(replica, args=(fail,))

    done = 0
    fault_time = None
    if args.abort_after:
        import threading

        def watch():
            # The handler's step watch, by hand: no step for --abort-after s, then a
            # health probe of every peer, and the collectives aborted if one fails.
            seen, since = -1, time.monotonic()
            tasks = json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"]
            while True:
                time.sleep(0.5)
                if done != seen:
                    seen, since = done, time.monotonic()
                    continue
                if time.monotonic() - since < args.abort_after:
                    continue
                for peer in range(len(tasks)):
                    if peer == index:
                        continue
                    task = f"/job:worker/replica:0/task:{peer}"
                    try:
                        context.context().check_collective_ops_peer_health(task, 2000)
                    except Exception as e:  # noqa: BLE001
                        say(role="watch", index=index, probe=task, answer=type(e).__name__)
                        context.context().abort_collective_ops(
                            14, f"lost without notice: {task} (no step for {args.abort_after:g} s)"
                        )
                        return
                since = time.monotonic()

        threading.Thread(target=watch, daemon=True).start()
    while done < args.steps:
        fail = 0
        if done == args.at and (fault_here or fault_all):
            fail = 1
            fault_time = time.time()
        try:
            if fail and args.fault == "oom":
                raise tf.errors.ResourceExhaustedError(
                    None, None, "OOM when allocating tensor with shape[1<<40] (the probe's own)"
                )
            train(tf.constant(fail))
            step_var.assign_add(1)
        except Exception as e:  # noqa: BLE001 - the probe records what came
            t_error = time.time()
            seen = {
                "index": index,
                "type": type(e).__name__,
                "module": type(e).__module__,
                "code": getattr(e, "error_code", None),
                "message": str(e),
                "step": done,
            }
            if fault_here or (fault_all and index == args.index):
                # The failing worker itself: report to the cluster as TF's handler does.
                reported = None
                if isinstance(e, tf.errors.OpError):
                    try:
                        context.context().report_error_to_cluster(e.error_code, e.message)
                        reported = "reported"
                    except Exception as r:  # noqa: BLE001
                        reported = f"{type(r).__name__}: {r}"
                say(role="faulty", reported=reported, **seen)
                return 1
            written, took, why = _write(checkpoint, args.dir, index)
            say(
                role="survivor",
                t_error=t_error,
                fault_time=fault_time,
                written=written,
                write_seconds=took,
                write_error=why,
                **seen,
            )
            sys.stdout.flush()
            if args.clean_exit:
                say(role="exiting", index=index, t=time.time())
                sys.exit(3)
            os._exit(3)  # TF's exit can hang on the lost peer; the probe only needs the line
        done += 1
        say(role="progress", index=index, step=done, t=time.time())
        if args.step_sleep:
            time.sleep(args.step_sleep)
    say(role="finished", index=index, step=done)
    return 0


def _write(checkpoint, directory: str, index: int):
    import threading

    out: dict = {}

    def run():
        t0 = time.monotonic()
        try:
            checkpoint.write(os.path.join(directory, f"survivor-{index}", "ckpt"))
            out["ok"] = time.monotonic() - t0
        except Exception as e:  # noqa: BLE001
            out["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(WRITE_BOUND)
    if "ok" in out:
        return True, round(out["ok"], 3), None
    return False, None, out.get("error", f"no return within {WRITE_BOUND}s")


# ------------------------------------------------------------------- harness side


def start_workers(python: str, script: str, workers: int, prefix: str, args: list) -> tuple:
    """Starts ``workers`` MWMS workers of ``script worker <args>`` on 127.0.0.1, each with
    its TF_CONFIG (``--dir`` is added: the scenario's folder). Returns the folder, the
    processes and their stdout files (``w<i>.out``; stderr in ``w<i>.err``)."""
    ports = free_ports(workers)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    tmp = tempfile.mkdtemp(prefix=prefix)
    procs, outs = [], []
    for i in range(workers):
        env = dict(
            os.environ,
            TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}}),
            TF_CPP_MIN_LOG_LEVEL="2",
            CUDA_VISIBLE_DEVICES="",
        )
        out = open(os.path.join(tmp, f"w{i}.out"), "w+")
        err = open(os.path.join(tmp, f"w{i}.err"), "w+")
        cmd = [python, script, "worker", *args, "--dir", tmp]
        procs.append(subprocess.Popen(cmd, stdout=out, stderr=err, env=env))
        outs.append(out)
    return tmp, procs, outs


def scenario(
    python: str, fault: str, target: int, workers: int, at: int, steps: int, extra=()
) -> list:
    args = ["--fault", fault, "--index", str(target), "--at", str(at), "--steps", str(steps)]
    args += list(extra)
    tmp, procs, outs = start_workers(python, __file__, workers, f"lost-peer-{fault}{target}-", args)

    def lines(i):
        outs[i].flush()
        text = Path(outs[i].name).read_text(errors="replace")
        return [
            json.loads(line[len(PREFIX) :]) for line in text.splitlines() if line.startswith(PREFIX)
        ]

    results = []
    try:
        end = time.monotonic() + START_BOUND
        while not any(e.get("step", 0) >= at and e["role"] == "progress" for e in lines(target)):
            if time.monotonic() > end or procs[target].poll() is not None:
                if fault in ("app", "oom", "bug"):
                    break  # the fault is the step's own: it ends the target by itself
                return [
                    {
                        "scenario": f"{fault}:{target}",
                        "error": f"target never reached step {at}",
                        "stderr": Path(tmp, f"w{target}.err").read_text()[-2000:],
                    }
                ]
            time.sleep(0.05)
        t_fault = time.time()
        if fault == "kill":
            procs[target].send_signal(signal.SIGKILL)
        elif fault == "stop":
            procs[target].send_signal(signal.SIGSTOP)
        survivors = [i for i in range(workers) if not (fault in ("kill", "stop") and i == target)]
        end = time.monotonic() + ERROR_BOUND + WRITE_BOUND
        while time.monotonic() < end and any(procs[i].poll() is None for i in survivors):
            time.sleep(0.2)
        for i in range(workers):
            got = [e for e in lines(i) if e["role"] in ("survivor", "faulty", "finished")]
            if got:
                for e in got:
                    e.update(scenario=f"{fault}:{target}", workers=workers)
                    if e.get("t_error"):
                        e["after_fault"] = round(e["t_error"] - (e.get("fault_time") or t_fault), 2)
                    results.append(e)
            elif i in survivors:
                results.append(
                    {
                        "scenario": f"{fault}:{target}",
                        "workers": workers,
                        "role": "survivor",
                        "index": i,
                        "type": None,
                        "message": f"no error within {ERROR_BOUND}s",
                    }
                )
    finally:
        for p in procs:
            if p.poll() is None:
                with_cont = fault == "stop"
                if with_cont:
                    p.send_signal(signal.SIGCONT)
                p.kill()
                p.wait(10)
    return results


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="mode")
    w = sub.add_parser("worker")
    w.add_argument("--fault", required=True)
    w.add_argument("--index", type=int, required=True)
    w.add_argument("--at", type=int, required=True)
    w.add_argument("--steps", type=int, required=True)
    w.add_argument("--dir", required=True)
    w.add_argument("--step-sleep", type=float, default=0.02)
    w.add_argument("--abort-after", type=float, default=0.0)
    w.add_argument("--clean-exit", action="store_true")
    p.add_argument("--scenarios", default="kill:1,kill:0,stop:1,app:1,bug:1,oom:1")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--at", type=int, default=20)
    p.add_argument("--out", default=None)
    p.add_argument("--python", default=sys.executable)
    p.add_argument(
        "--abort-after",
        type=float,
        default=0.0,
        help="each worker aborts its collectives when no step ended for this long and a "
        "peer fails a health probe (0: never)",
    )
    p.add_argument("--clean-exit", action="store_true", help="survivors exit by sys.exit")
    args = p.parse_args(argv)
    if args.mode == "worker":
        return worker(args)
    version = subprocess.run(
        [args.python, "-c", "import tensorflow as tf; print(tf.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()[-1]
    everything = []
    for item in args.scenarios.split(","):
        fault, target = item.split(":")
        extra = ["--abort-after", str(args.abort_after)] + ["--clean-exit"] * args.clean_exit
        got = scenario(args.python, fault, int(target), args.workers, args.at, 10_000, extra)
        for e in got:
            print(json.dumps(e, sort_keys=True)[:3000], flush=True)
        everything += got
    if args.out:
        Path(args.out).write_text(
            json.dumps({"tensorflow": version, "results": everything}, indent=1) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
