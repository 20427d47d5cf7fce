"""The stable-ABI (abi3) wheel against the version-specific one: run(), queue, classifier.

Builds both release wheels of this checkout (with ``.venv``'s maturin) for one
interpreter (a virtualenv with TensorFlow, such as ``.venv``), then for each of
``--rounds`` rounds installs each wheel in turn (``--force-reinstall --no-deps``)
and runs ``bench_run.py``, ``bench_closure_queue.py`` and ``bench_classify.py``
against it, one log per
build and round in ``--out``. Prints tf-failure-handling's figures per build, one
value per round: the README's "One abi3 wheel" table. The virtualenv is left with
the abi3 wheel installed (``make build`` restores the editable build).

    python benches/compare_builds.py [--python .venv/bin/python] [--rounds 3]
    python benches/compare_builds.py --summarize DIR     # the table from earlier logs
    python benches/compare_builds.py --micro [--rounds 5]
    python benches/compare_builds.py --wheels before=A.whl after=B.whl [--rounds 5]

``--wheels`` compares wheels built elsewhere (two commits' release wheels, an A/B of
a change) instead of this checkout's two builds; the table is printed, not written.

``--micro`` runs, instead of the three benches, two loops with nothing around them
(no TensorFlow): ``put``+``get``+``mark_finished`` on the closure queue (each a native call) and
``is_worker_failure`` on a ``ValueError``, each the minimum over 15 loops of 100,000
calls, which is what a busy machine disturbs least.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import _report

ROOT = Path(__file__).resolve().parents[1]
BENCHES = ROOT / "benches"
#: The benches this runs against each wheel print their tables but do not write them
#: (their figures are of one wheel, not the docs' tables).
CHILD_ENV = {k: v for k, v in os.environ.items() if k != _report.FIGURES_ENV}
BUILDS = {"version-specific": "python", "abi3": "abi3"}
RUNS = [
    ["bench_run.py", "--rounds", "5"],
    ["bench_closure_queue.py", "--rounds", "5"],
    ["bench_classify.py"],
]

#: README row -> (pattern of the bench's own table row, column of tf-failure-handling's value).
ROWS = {
    "`run()` overhead over `fn()`": (r"^\| tf-failure-handling `handler.run\(fn\)` \|", 2),
    "queue `put`+`get`+`mark_finished`, 1 thread": (
        r"^\| `put`\+`get`\+`mark_finished`, 1 thread",
        2,
    ),
    "queue, 2 workers, `select()`, producer back to back": (
        r"^\| 2 worker threads, execution = `select\(\)` syscall; producer back to back",
        2,
    ),
    "queue, 8 workers, `select()`, producer releases the GIL": (
        r"^\| 8 worker threads, execution = `select\(\)` syscall; producer releases",
        2,
    ),
    "`_is_worker_failure` (mix)": (r"^\| `_is_worker_failure`", 2),
    "`_is_ps_failure` (mix)": (r"^\| `_is_ps_failure`", 2),
    "both verdicts of a failed closure (ours: one `classify_failure`)": (
        r"^\| both verdicts, as the coordinator needs them",
        2,
    ),
}


MICRO = """
import time
from tf_failure_handling import _native
from tf_failure_handling._coordinator.closure_queue import ClosureQueue


class Closure:
    tag = None


def best(loop):
    return min(loop(100_000) for _ in range(15))


def queue(n, q=ClosureQueue(), closure=Closure()):
    put, get, finish = q.put, q.get, q.mark_finished
    start = time.perf_counter_ns()
    for _ in range(n):
        put(closure)
        get()
        finish()
    return (time.perf_counter_ns() - start) / n


def classify(n, error=ValueError("not a failure")):
    is_worker_failure = _native.is_worker_failure
    start = time.perf_counter_ns()
    for _ in range(n):
        is_worker_failure(error)
    return (time.perf_counter_ns() - start) / n


print(f"{best(queue):.0f} {best(classify):.0f}")
"""


def micro(python: str, wheels: dict[str, Path], rounds: int) -> str:
    got: dict[str, list[list[str]]] = {build: [] for build in wheels}
    for _ in range(rounds):
        for build, wheel in wheels.items():
            install(python, wheel)
            out = subprocess.run(
                [python, "-c", MICRO],
                cwd="/",
                capture_output=True,
                text=True,
                check=True,
                env=CHILD_ENV,
            )
            got[build].append(out.stdout.split())
    lines = ["| | " + " | ".join(f"{b} ({rounds} rounds)" for b in wheels) + " |"]
    lines.append("| --- |" + " --- |" * len(wheels))
    for i, row in enumerate(
        ["queue `put`+`get`+`mark_finished`, best of 15", "`is_worker_failure`, best of 15"]
    ):
        cells = [", ".join(f"{r[i]} ns" for r in got[build]) for build in wheels]
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def install(python: str, wheel: Path) -> None:
    subprocess.run(
        [python, "-m", "pip", "install", "-q", "--force-reinstall", "--no-deps", str(wheel)],
        check=True,
    )


def cell(log: str, pattern: str, column: int) -> str:
    for line in log.splitlines():
        if re.match(pattern, line):
            value = _report.cells(line)[column]
            # "3.6M closures/s (280 ns)" -> "3.6M closures/s"
            return re.sub(r"\s*\(.*\)$", "", value) or "?"
    return "?"


def summarize(out: Path, rounds: int, builds: list[str] | None = None) -> str:
    builds = builds or list(BUILDS)
    lines = ["| | " + " | ".join(f"{b} ({rounds} rounds)" for b in builds) + " |"]
    lines.append("| --- |" + " --- |" * len(builds))
    logs = {
        (build, r): (out / f"{build}-{r}.log").read_text(errors="replace")
        for build in builds
        for r in range(1, rounds + 1)
        if (out / f"{build}-{r}.log").exists()
    }
    for row, (pattern, column) in ROWS.items():
        values = []
        for build in builds:
            got = [
                cell(logs[(build, r)], pattern, column)
                for r in range(1, rounds + 1)
                if (build, r) in logs
            ]
            values.append(", ".join(got))
        lines.append(f"| {row} | " + " | ".join(values) + " |")
    return "\n".join(lines)


def build_wheels(python: str, dest: Path) -> dict[str, Path]:
    wheels = {}
    for build, feature in BUILDS.items():
        where = dest / build
        subprocess.run(
            [
                *(str(ROOT / ".venv" / "bin" / "maturin"), "build", "--quiet", "--release"),
                *("--features", feature, "--out", str(where), "-i", python),
            ],
            cwd=ROOT,
            check=True,
        )
        (wheels[build],) = where.glob("*.whl")
    return wheels


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=str(ROOT / ".venv" / "bin" / "python"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="where the logs go")
    parser.add_argument("--summarize", type=Path, default=None, metavar="DIR")
    parser.add_argument("--micro", action="store_true", help="the two bare loops only")
    parser.add_argument(
        "--wheels", nargs="+", default=None, metavar="NAME=WHEEL", help="compare these wheels"
    )
    args = parser.parse_args()
    if args.summarize:
        print(summarize(args.summarize, args.rounds))
        return 0
    out = args.out or Path(tempfile.mkdtemp(prefix="compare-builds-"))
    out.mkdir(parents=True, exist_ok=True)
    given = dict(w.split("=", 1) for w in args.wheels or [])
    wheels = (
        {name: Path(path) for name, path in given.items()}
        if given
        else build_wheels(args.python, out / "wheels")
    )
    if args.micro:
        table = micro(args.python, wheels, args.rounds)
        print(table)
        if not given:
            _report.write_figure("One abi3 wheel, bare loops", table)
        return 0
    for r in range(1, args.rounds + 1):
        for build, wheel in wheels.items():
            subprocess.run(
                [
                    args.python,
                    "-m",
                    "pip",
                    "install",
                    "-q",
                    "--force-reinstall",
                    "--no-deps",
                    str(wheel),
                ],
                check=True,
            )
            with (out / f"{build}-{r}.log").open("w") as log:
                load = Path("/proc/loadavg").read_text().split()[:3]
                log.write(f"# round {r}, {build}, load average {' '.join(load)}\n")
                log.flush()
                for run in RUNS:
                    subprocess.run(
                        [args.python, *run],
                        cwd=BENCHES,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        check=True,
                        env=CHILD_ENV,
                    )
            print(f"round {r}: {build} done ({out / f'{build}-{r}.log'})", flush=True)
    table = summarize(out, args.rounds, list(wheels))
    if given:
        print(table)
        return 0
    print("\nREADME, One abi3 wheel:\n")
    print(table)
    _report.write_figure("One abi3 wheel", table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
