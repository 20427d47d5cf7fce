"""The coordinator's CPU over a worker's drain (issue 32, item 3).

A real cluster on 127.0.0.1 (coordinator, 2 workers, 1 PS; the processes of
``tests/integration/ps_preemption_script.py``). From run 10 each closure works for
seconds on its worker alone (``--long-work`` iterations of a 64x64 matmul). Worker 1
gets SIGTERM with such a closure in flight: the coordinator holds that worker's
thread, waits for the closure, releases the worker and waits until it is gone. This
prints the coordinator process's CPU time (user + system, from ``/proc``) from the
SIGTERM to the worker's exit, and the share of one core it is.

Before issue 32 the held thread waited on the event it had just seen set, so it
looped on the GIL from the end of its closure to the worker's exit. To compare with
another tree of the package, put it first on ``PYTHONPATH``.

    python benches/bench_drain_cpu.py [--long-work 300000] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from integration.test_ps_preemption import Cluster

DRAIN_BOUND = 600.0  # turns a hang into an error


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--long-work", type=int, default=300_000)
    p.add_argument("--workdir", default=None)
    args = p.parse_args(argv)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="tfh-drain-"))
    c = Cluster(workdir)
    try:
        c.start_servers()
        c.start(
            "coordinator",
            "coordinator",
            "--ckpt",
            str(workdir / "ckpt"),
            "--steps",
            "40",
            "--long-from",
            "10",
            "--long-work",
            str(args.long_work),
            "--epoch",
            "1000",
        )
        c.wait_event("coordinator", "progress", DRAIN_BOUND, lambda e: e["runs"] >= 15)
        time.sleep(1.0)  # the long closures are in flight
        pid = c.procs["coordinator"].popen.pid
        c.procs["worker1"].popen.send_signal(signal.SIGTERM)
        wall, cpu = time.monotonic(), cpu_seconds(pid)
        code = c.procs["worker1"].popen.wait(timeout=DRAIN_BOUND)
        wall, cpu = time.monotonic() - wall, cpu_seconds(pid) - cpu
        print(
            f"worker 1 exited with {code}; from its SIGTERM to its exit: {wall:.1f} s wall, "
            f"coordinator CPU {cpu:.2f} s ({100 * cpu / wall:.1f}% of one core)"
        )
    finally:
        c.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
