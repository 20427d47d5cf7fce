"""Runs one job of ``make test`` and records how long it took and how much CPU it used.

    python dev/timed.py NAME COMMAND [ARG ...]

Runs COMMAND, waits for it, and appends one line to ``build/job-times.tsv``: the job's
name, its wall seconds, the CPU seconds (user + system) of the command and every
process it waited for (``wait4``: a pytest run and the TensorFlow processes its tests
started and waited for), its exit status, and the CPU seconds of every process the job
started, waited for or not. ``wait4`` misses what a job does not wait for: a cluster
process a test kills and never reaps, a fork server's children, SLURM's daemons and
the jobs they run. The last column counts them too: as root, the job runs in a
cgroup of its own (``cpuacct``, or cgroup v2's ``cpu.stat``), which every process it
starts inherits; ``-`` where no cgroup can be made (not root, no cgroup file system).
Exits with the command's exit status. ``make test`` empties the file before its jobs
start, and ``dev/prereqs.py summary test`` prints it as a table, the longest job
first: where the run's time went.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

TIMES = Path(__file__).resolve().parents[1] / "build" / "job-times.tsv"
#: Where the jobs' cgroups are made: cgroup v1's cpuacct hierarchy, else cgroup v2's.
CGROUP_ROOTS = (
    Path("/sys/fs/cgroup/cpuacct"),
    Path("/sys/fs/cgroup/unified"),
    Path("/sys/fs/cgroup"),
)


def cgroup_roots() -> list:
    """(root, is cgroup v1) of the :data:`CGROUP_ROOTS` that are cgroup hierarchies."""
    found = []
    for root in CGROUP_ROOTS:
        v1 = (root / "cpuacct.usage").exists()
        if v1 or (root / "cgroup.controllers").exists():
            found.append((root, v1))
    return found


def enter_cgroup(name: str) -> Optional[tuple]:
    """Moves this process into a new cgroup for the job (its children inherit it):
    (the new cgroup, the one it left), or None where none can be made or entered."""
    for root, v1 in cgroup_roots():
        left = current_cgroup(root, v1)
        group = root / "tfh-make-test" / f"{name}-{os.getpid()}"
        try:
            group.mkdir(parents=True)
        except OSError:
            continue
        try:
            if left is not None and cgroup_cpu(group) is not None:
                (group / "cgroup.procs").write_text(str(os.getpid()))
                return group, left
        except OSError:
            pass
        leave_cgroup((group, left or root))
    return None


def current_cgroup(root: Path, v1: bool) -> Optional[Path]:
    """This process's cgroup in the hierarchy mounted at ``root`` (/proc/self/cgroup)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if (v1 and "cpuacct" in controllers.split(",")) or (not v1 and controllers == ""):
            return root / path.lstrip("/")
    return None


def cgroup_cpu(group: Path) -> Optional[float]:
    """CPU seconds of every process that has been in ``group``."""
    try:
        if (group / "cpuacct.usage").exists():
            return int((group / "cpuacct.usage").read_text()) / 1e9
        for line in (group / "cpu.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value) / 1e6
    except (OSError, ValueError):
        pass
    return None


def leave_cgroup(entered: tuple) -> None:
    """Moves this process back to the cgroup it left and removes the job's (one that a
    process outlived the job in stays: harmless)."""
    group, left = entered
    try:
        (left / "cgroup.procs").write_text(str(os.getpid()))
    except OSError:
        pass
    try:
        group.rmdir()
    except OSError:
        pass


def read(path: Path) -> list:
    """The lines :func:`main` appended to ``path``: (job, wall s, CPU s of what it
    waited for, exit status, CPU s of every process or None), in the file's order;
    a line of another shape is left out. Lines of four cells (before the cgroup
    column) have None for the last."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        name, *cells = line.split("\t")
        if len(cells) == 3:
            cells.append("-")
        numbers = cells[:3] if cells[3:] == ["-"] else cells
        if len(cells) == 4 and all(c.lstrip("-").isdigit() for c in numbers):
            every = None if cells[3] == "-" else int(cells[3])
            rows.append((name, int(cells[0]), int(cells[1]), int(cells[2]), every))
    return rows


def main(argv: list) -> int:
    if len(argv) < 3:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    name, command = argv[1], argv[2:]
    entered = enter_cgroup(name)  # this process, and so every process the job starts
    started = time.monotonic()
    process = subprocess.Popen(command)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.monotonic() - started
    code = process.returncode = os.waitstatus_to_exitcode(status)  # reaped: tell Popen
    every = None if entered is None else cgroup_cpu(entered[0])
    if entered is not None:
        leave_cgroup(entered)
    TIMES.parent.mkdir(exist_ok=True)
    with TIMES.open("a") as out:
        counted = "-" if every is None else f"{every:.0f}"
        out.write(f"{name}\t{wall:.0f}\t{usage.ru_utime + usage.ru_stime:.0f}\t{code}\t{counted}\n")
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
