"""From a termination notice to its end, per role, under ParameterServerStrategy.

The cluster of ``tests/integration/test_ps_preemption.py`` (coordinator, 2 workers,
1 PS, processes on 127.0.0.1; each closure ~ a few ms of matmuls and one increment
on the PS, a ``join()`` every 20 runs). After 30 runs one role gets SIGTERM:

* coordinator or PS: SIGTERM -> the checkpoint is written (the ``checkpoint`` file's
  modification time), which includes letting the scheduled closures finish;
* worker: SIGTERM -> the worker process has exited (drained: its closure in flight
  finished, then released by the coordinator).

TensorFlow has no number to compare with: its handler refuses a cluster with a
``ps`` job. ``--repeats`` trials per role; prints the medians and ranges.

    python benches/bench_ps_notice.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from pathlib import Path

import _report

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

ROLES = ("coordinator", "ps0", "worker1")
#: Runs the coordinator is given (its last ``--steps`` wins over the test's 120).
LONG_TRAINING = 1_000_000


def one_trial(role: str, root: Path) -> float:
    from tests.integration.test_ps_preemption import NOTICE_AFTER, Cluster

    c = Cluster(Path(tempfile.mkdtemp(dir=root)))
    try:
        for job, task in (("ps", 0), ("worker", 0), ("worker", 1)):
            c.serve(job, task)
        for name in ("ps0", "worker0", "worker1"):
            c.wait_event(name, "serving", 120)
        # Training that cannot end before the notice is acted on: with the test's 120
        # runs of a few milliseconds, a PS's notice polled after the last run() found
        # no run() left to save at (the handler closed, no checkpoint).
        c.coordinator("--steps", str(LONG_TRAINING))
        c.wait_event("coordinator", "progress", 300, lambda e: e["runs"] >= NOTICE_AFTER)
        sent = time.time()
        c.procs[role].popen.send_signal(signal.SIGTERM)
        if role == "worker1":
            c.wait_exit(role, 120)
            return time.time() - sent
        marker = c.workdir / "ckpt" / "checkpoint"
        end = time.monotonic() + 120
        while not marker.exists():
            if time.monotonic() > end:
                raise TimeoutError(f"no checkpoint 120 s after SIGTERM to {role}")
            time.sleep(0.01)
        return marker.stat().st_mtime - sent
    finally:
        c.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for role in ROLES:
            times = [one_trial(role, Path(tmp)) for _ in range(args.repeats)]
            print(f"{role}: {', '.join(f'{t:.2f}' for t in times)} s", flush=True)
            what = "worker exited" if role == "worker1" else "checkpoint written"
            rows.append(
                (
                    role,
                    what,
                    _report.duration(_report.median(times)),
                    f"{min(times):.2f}{_report.DASH}{max(times):.2f} s",
                )
            )
    _report.print_readme_table(
        f"ParameterServerStrategy notices ({args.repeats} trials per role)",
        ("SIGTERM to", "until", "median", "range"),
        rows,
    )


if __name__ == "__main__":
    main()
