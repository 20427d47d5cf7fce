"""Runs one job of ``make test`` and records how long it took and how much CPU it used.

    python dev/timed.py NAME COMMAND [ARG ...]

Runs COMMAND, waits for it, and appends one line to ``build/job-times.tsv``: the job's
name, its wall seconds, and the CPU seconds (user + system) of the command and every
process it waited for (``wait4``: a pytest run and the TensorFlow processes its tests
started and waited for; a process the job does not wait for is not counted: SLURM's
daemons and the jobs they run, or a cluster process a test kills and never reaps).
Exits with the command's exit status. ``make test`` empties the
file before its jobs start, and ``dev/prereqs.py summary test`` prints it as a table, the
longest job first: where the run's time went.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

TIMES = Path(__file__).resolve().parents[1] / "build" / "job-times.tsv"


def main(argv: list) -> int:
    if len(argv) < 3:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    name, command = argv[1], argv[2:]
    started = time.monotonic()
    process = subprocess.Popen(command)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.monotonic() - started
    code = process.returncode = os.waitstatus_to_exitcode(status)  # reaped: tell Popen
    TIMES.parent.mkdir(exist_ok=True)
    with TIMES.open("a") as out:
        out.write(f"{name}\t{wall:.0f}\t{usage.ru_utime + usage.ru_stime:.0f}\t{code}\n")
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
