"""How long a ``make`` target takes from a fresh clone: one more row of its table in
``docs/figures/how-long-make-<target>-takes.md`` (docs/development.md includes it).

    python benches/time_make.py [--label TEXT] [--here] [--env CI=true ...] TARGET

The checkout's HEAD is cloned into a temporary folder (``--here``: this checkout, as
it is) and ``make TARGET`` runs there with ``CI=true`` (``--env`` replaces that).
The row is what this script measured: the wall time, the CPU time of make and every
process it waited for (user + system, ``wait4``), the load average before the run,
and make's exit status; the footer names this command, its commit, the date and the
machine. Earlier rows are kept: the table is the record of every run measured so.

``make figures`` does not run it (``make test`` alone takes most of an hour on 2
cores): run it when a change may have changed how long a target takes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _report  # benches/: the script's directory is on sys.path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "dev"))
import timed  # noqa: E402  (dev/timed.py writes and reads build/job-times.tsv)

HEADER = ("run", "commit", "date (UTC)", "load before", "wall", "CPU (user + system)", "make")


def minutes(seconds: float) -> str:
    """``40 min 46 s``; ``59 s`` below a minute."""
    whole = round(seconds)
    return f"{whole // 60} min {whole % 60} s" if whole >= 60 else f"{whole} s"


def run(command: list, cwd: Path, env: dict) -> tuple:
    """(exit status, wall seconds, user seconds, system seconds) of ``command`` and
    every process it waited for."""
    started = time.monotonic()
    process = subprocess.Popen(command, cwd=cwd, env=env)
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    return process.returncode, time.monotonic() - started, usage.ru_utime, usage.ru_stime


def rows_of(path: Path) -> list:
    """The rows of the table already in ``path`` (none if it is not there)."""
    if not path.exists():
        return []
    lines = [line for line in path.read_text().splitlines() if line.startswith("|")]
    return [_report.cells(line) for line in lines[2:]]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("target", help="the make target (test, demo, check ...)")
    p.add_argument("--label", default="", help="what the row is (idle, loaded, ...)")
    p.add_argument("--here", action="store_true", help="run in this checkout, not a fresh clone")
    p.add_argument("--env", action="append", default=None, help="VAR=VALUE (default CI=true)")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "figures")
    args = p.parse_args(argv)
    commit = _report._git("rev-parse", "--short=7", "HEAD") or "unknown"
    env = dict(os.environ)
    env.pop(_report.FIGURES_ENV, None)
    for pair in args.env if args.env is not None else ["CI=true"]:
        name, _, value = pair.partition("=")
        env[name] = value
    load = os.getloadavg()[0]
    folder = None
    if args.here:
        where = ROOT
    else:
        folder = Path(tempfile.mkdtemp(prefix="tfh-time-make-"))
        where = folder / "clone"
        subprocess.run(["git", "clone", "--quiet", str(ROOT), str(where)], check=True)
        # What stands beside the checkout stands beside the clone: ../shared (TF's own
        # handler tests, which make test runs from there, as CI has them).
        shared = ROOT.parent / "shared"
        if shared.is_dir():
            (folder / "shared").symlink_to(shared, target_is_directory=True)
    when = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    print(f"== make {args.target} in {where} (commit {commit}, load {load:.1f})", flush=True)
    times = where / "build" / "job-times.tsv"
    times.unlink(missing_ok=True)  # the job table below is this run's, or none
    rc, wall, user, system = run(["make", args.target], where, env)
    result = "passed" if rc == 0 else f"failed (exit {rc})"
    label = args.label or ("fresh clone" if folder else "this checkout")
    row = [
        label,
        commit,
        when,
        f"{load:.1f}",
        minutes(wall),
        f"{user:.0f} s + {system:.0f} s",
        result,
    ]
    print(f"== make {args.target}: {result} in {minutes(wall)}", flush=True)
    jobs = job_rows(times)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
    path = args.out / f"how-long-make-{args.target}-takes.md"
    table = _report.markdown(HEADER, [*rows_of(path), row])
    os.environ[_report.FIGURES_ENV] = str(args.out)
    _report.write_figure(f"how long make {args.target} takes", table)
    print(f"{path}: row added")
    if jobs:
        title = f"where make {args.target} spends its time"
        _report.write_figure(
            title, f"Run of {when} UTC, a clone of {commit} ({result}):\n\n" + jobs
        )
        print(f"{args.out / _report.slug(title)}.md: the run's jobs")
    return rc


#: The job table's columns (``dev/timed.py`` writes ``build/job-times.tsv``).
JOB_HEADER = ("job", "wall", "CPU, processes waited for", "CPU, every process", "exit")


def job_rows(path: Path) -> str:
    """The jobs of the run (``build/job-times.tsv``, read by ``dev/timed.py``) as a
    table, the longest first, with the CPU totals; empty if the run wrote none."""
    rows = sorted(timed.read(path), key=lambda r: -r[1])
    if not rows:
        return ""
    every = [r[4] for r in rows if r[4] is not None]
    body = [
        [name, minutes(wall), f"{cpu} s", "-" if all_ is None else f"{all_} s", str(code)]
        for name, wall, cpu, code, all_ in rows
    ]
    total = f"{sum(every)} s" if len(every) == len(rows) else "-"
    body.append(["all jobs", "", f"{sum(r[2] for r in rows)} s", total, ""])
    return _report.markdown(JOB_HEADER, body)


if __name__ == "__main__":
    sys.exit(main())
