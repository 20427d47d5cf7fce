"""Preemption demo: 2 MultiWorkerMirroredStrategy workers on 127.0.0.1.

1. An uninterrupted reference run.
2. The demo run: SIGTERM to one worker mid-run; every worker saves a checkpoint at
   the same agreed step and exits with the restart code (42).
3. The restart: the workers restore that step and finish.
4. The resumed run's final weights are compared with the reference run's.

Run with the project's virtualenv::

    .venv/bin/python demo/run_demo.py [--steps 80] [--workers 2]

Exit status 0 only if the resumed run ends with the reference run's weights.
The training itself is ``tests/integration/mwms_worker.py`` (one process per worker).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

WORKER_SCRIPT = Path(__file__).resolve().parent.parent / "tests" / "integration" / "mwms_worker.py"


def say(message: str = "") -> None:
    print(message, flush=True)


def _load_worker_module():
    """``mwms_worker`` (the training script) as a module, for its loopback helpers."""
    spec = importlib.util.spec_from_file_location("mwms_worker", WORKER_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_worker = _load_worker_module()
free_ports = _worker.free_ports
EVENT_PREFIX = _worker.EVENT_PREFIX


def choose_impl(requested: str) -> str:
    if requested != "ours":
        return requested
    try:
        importlib.import_module("tf_failure_handling")
    except ImportError as e:
        say(
            f"WARNING: tf_failure_handling is not importable ({e}); "
            "falling back to TF's own PreemptionCheckpointHandler (--impl tf)."
        )
        return "tf"
    return "ours"


class Workers:
    """The worker processes of one run, with their EVENT lines on a queue."""

    def __init__(
        self,
        label: str,
        impl: str,
        ckpt_dir: Path,
        logdir: Path,
        *,
        workers: int,
        steps: int,
        step_sleep: float,
    ):
        self.label = label
        self.events: queue.Queue = queue.Queue()
        self.stderr_paths = [logdir / f"{label}-worker{i}.stderr" for i in range(workers)]
        env = dict(os.environ)
        env.pop("TF_CONFIG", None)
        env["TF_CPP_MIN_LOG_LEVEL"] = "2"
        env["PYTHONUNBUFFERED"] = "1"
        env.setdefault("GCE_METADATA_IP", "127.0.0.1:9")  # keep TF's GCE probe local
        ports = free_ports(workers)
        self.procs = []
        for i in range(workers):
            cmd = _worker.worker_command(
                WORKER_SCRIPT,
                ports=ports,
                index=i,
                impl=impl,
                ckpt_dir=ckpt_dir,
                steps=steps,
                step_sleep=step_sleep,
            )
            with open(self.stderr_paths[i], "wb") as err:
                proc = subprocess.Popen(
                    cmd,
                    stdout=subprocess.PIPE,
                    stderr=err,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    text=True,
                )
            self.procs.append(proc)
            threading.Thread(target=self._read, args=(i, proc), daemon=True).start()

    def _read(self, index: int, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            if line.startswith(EVENT_PREFIX):
                try:
                    self.events.put((index, json.loads(line[len(EVENT_PREFIX) :])))
                except json.JSONDecodeError:
                    pass
        self.events.put((index, {"event": "eof"}))

    def next_event(self, deadline: float):
        """(worker index, event dict); raises TimeoutError after ``deadline``."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        try:
            return self.events.get(timeout=remaining)
        except queue.Empty:
            raise TimeoutError from None

    def wait(self, deadline: float) -> list[int]:
        codes = []
        for proc in self.procs:
            codes.append(proc.wait(timeout=max(0.1, deadline - time.monotonic())))
        return codes

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)

    def stderr_tail(self, index: int, lines: int = 25) -> str:
        text = self.stderr_paths[index].read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])


def drive(
    run: Workers,
    n: int,
    steps: int,
    deadline: float,
    *,
    show_progress: bool,
    signal_worker: int | None = None,
    signal_after: int = 0,
) -> dict:
    """Consume a run's events until every worker's stdout closes; print the story."""
    losses: dict[int, dict[int, float]] = {}
    printed: set[int] = set()
    signalled = False
    finished = set()
    result = {"saves": {i: [] for i in range(n)}, "done": {}, "start": {}}
    while len(finished) < n:
        index, event = run.next_event(deadline)
        kind = event["event"]
        if kind == "eof":
            finished.add(index)
        elif kind == "start":
            result["start"][index] = event["restored"]
            if event["restored"]:
                say(
                    f"  worker {index} restored the checkpoint: resumes at step {event['restored']}"
                )
        elif kind == "progress":
            losses.setdefault(event["step"], {})[index] = event["loss"]
            reported = [s for s, by in losses.items() if len(by) == n and s not in printed]
            for s in sorted(reported):
                printed.add(s)
                if show_progress:
                    say(f"  training: step {s:4d}/{steps}  loss {losses[s][0]:.6f}")
            if (
                signal_worker is not None
                and not signalled
                and all(
                    max((s for s, by in losses.items() if i in by), default=0) >= signal_after
                    for i in range(n)
                )
            ):
                signalled = True
                step_now = max(losses)
                run.procs[signal_worker].send_signal(signal.SIGTERM)
                result["signal_time"] = time.time()
                say(f"  >>> SIGTERM sent to worker {signal_worker} at step ~{step_now}")
        elif kind == "save":
            result["saves"][index].append(event)
            ms = 1000 * (event["t_end"] - event["t_start"])
            say(
                f"  worker {index} saved a checkpoint at agreed step {event['runs']} "
                f"({ms:.0f} ms) -> {event['path']}"
            )
        elif kind == "exit":
            say(f"  worker {index} leaves through exit_fn (code {event['code']})")
        elif kind == "error":
            say(f"  worker {index} failed: {event['type']}: {event['message'][-300:]}")
        elif kind == "done":
            result["done"][index] = event
    result["codes"] = run.wait(deadline)
    return result


def weights_match(a: dict, b: dict) -> tuple[bool, float]:
    import numpy as np

    diff = 0.0
    for name in b:
        x, y = np.asarray(a[name]), np.asarray(b[name])
        if x.shape != y.shape:
            return False, float("inf")
        diff = max(diff, float(np.max(np.abs(x - y))))
        if not np.allclose(x, y, rtol=1e-6, atol=1e-7):
            return False, diff
    return True, diff


def show_records(records_dir: Path, output: Path) -> bool:
    """Copies the run's preemption records to ``output``, prints the report and draws
    the timeline (``python -m tf_failure_handling report``); False if that fails."""
    kept = output / "preemption_records"
    if kept.exists():
        shutil.rmtree(kept)
    output.mkdir(parents=True, exist_ok=True)
    shutil.copytree(records_dir, kept)
    picture = output / "timeline.png"
    command = [sys.executable, "-m", "tf_failure_handling", "report", str(kept)]
    say(f"\nThe preemption records ({' '.join(command[1:])}):")
    done = subprocess.run([*command, "--plot", str(picture)], capture_output=True, text=True)
    say(done.stdout.rstrip())
    if done.returncode != 0:
        say(f"  report failed ({done.returncode}): {done.stderr.strip()}")
        return False
    say(f"Timeline picture: {picture}")
    return True


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="PreemptionCheckpointHandler demo (MWMS).")
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--step-sleep", type=float, default=0.03)
    p.add_argument(
        "--signal-worker", type=int, default=None, help="worker to SIGTERM (default: the last one)"
    )
    p.add_argument(
        "--signal-after",
        type=int,
        default=None,
        help="send SIGTERM once every worker passed this step (default: steps // 3)",
    )
    p.add_argument("--impl", choices=("ours", "tf"), default="ours")
    p.add_argument(
        "--output",
        default=str(Path(__file__).resolve().parent.parent / "demo-output"),
        help="where the preemption records and the timeline picture are kept",
    )
    p.add_argument("--timeout", type=float, default=120.0, help="bound for each phase")
    p.add_argument(
        "--keep",
        action="store_true",
        help="keep the temporary directory (logs, checkpoints) on success",
    )
    args = p.parse_args(argv)
    n = args.workers
    signal_worker = n - 1 if args.signal_worker is None else args.signal_worker
    signal_after = args.signal_after or max(10, (args.steps // 3) // 10 * 10)
    if not 0 <= signal_worker < n or signal_after >= args.steps:
        p.error("--signal-worker must name a worker; --signal-after must be < --steps")

    impl = choose_impl(args.impl)
    handler = (
        "tf_failure_handling.PreemptionCheckpointHandler"
        if impl == "ours"
        else "tf.distribute.experimental.PreemptionCheckpointHandler"
    )
    say(
        f"Demo: {n} MultiWorkerMirroredStrategy workers on 127.0.0.1, {args.steps} "
        f"steps, handler {handler}"
    )
    workdir = Path(tempfile.mkdtemp(prefix="tfh-demo-"))
    ckpt_dir = workdir / "train" / "ckpt"
    started = time.monotonic()
    current = None

    def start(label: str, ckpt: Path, step_sleep: float) -> Workers:
        return Workers(
            label, impl, ckpt, workdir, workers=n, steps=args.steps, step_sleep=step_sleep
        )

    try:
        say("\n[1/3] Uninterrupted reference run ...")
        current = start("reference", workdir / "reference" / "ckpt", 0.0)
        ref = drive(current, n, args.steps, time.monotonic() + args.timeout, show_progress=False)
        if ref["codes"] != [0] * n or len(ref["done"]) != n:
            say(f"reference run failed: exit codes {ref['codes']}\n" + current.stderr_tail(0))
            return 1
        reference = ref["done"][0]["weights"]
        say(f"  finished {args.steps} steps, exit codes {ref['codes']}")

        say(f"\n[2/3] Demo run, SIGTERM to worker {signal_worker} after step {signal_after} ...")
        current = start("preempted", ckpt_dir, args.step_sleep)
        pre = drive(
            current,
            n,
            args.steps,
            time.monotonic() + args.timeout,
            show_progress=True,
            signal_worker=signal_worker,
            signal_after=signal_after,
        )
        saved = sorted({s["runs"] for i in range(n) for s in pre["saves"][i]})
        say(f"  exit codes: {pre['codes']}")
        if pre["done"] or not saved:
            say("  the workers did not stop for the preemption notice")
            return 1
        say(
            f"  agreed step saved by every worker: {saved}; checkpoint: "
            f"{pre['saves'][0][-1]['path'] if pre['saves'][0] else '?'}"
        )
        latest = ckpt_dir / "checkpoint"
        say(f"  checkpoint index file {latest}: {'present' if latest.is_file() else 'MISSING'}")

        say("\n[3/3] Restart with the same checkpoint directory ...")
        current = start("restarted", ckpt_dir, args.step_sleep)
        post = drive(current, n, args.steps, time.monotonic() + args.timeout, show_progress=True)
        say(
            f"  finished: exit codes {post['codes']}, restored step "
            f"{sorted(set(post['start'].values()))}"
        )
        if post["codes"] != [0] * n or len(post["done"]) != n:
            say("  the restarted run did not finish\n" + current.stderr_tail(0))
            return 1
    except (TimeoutError, subprocess.TimeoutExpired):
        say(f"\nTIMEOUT: a phase took longer than {args.timeout:.0f}s")
        if current is not None:
            for i in range(n):
                say(f"--- worker {i} stderr tail ---\n{current.stderr_tail(i)}")
        return 1
    finally:
        if current is not None:
            current.kill()

    ok = all(weights_match(post["done"][i]["weights"], reference)[0] for i in range(n))
    _, diff = weights_match(post["done"][0]["weights"], reference)
    if impl == "ours":
        ok = show_records(ckpt_dir / "preemption_records", Path(args.output)) and ok
    say(f"\nDone in {time.monotonic() - started:.1f}s.")
    if ok and not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        say(f"Logs and checkpoints kept in {workdir}")
    if ok:
        say(
            f"RESULT: the resumed run's final weights EQUAL the uninterrupted run's "
            f"(max |diff| = {diff:.3g})."
        )
        return 0
    say(
        f"RESULT: the resumed run's final weights DIFFER from the uninterrupted run's "
        f"(max |diff| = {diff:.3g})."
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
