"""The stable-ABI (abi3) wheel against the version-specific one: run(), queue, classifier.

Builds both release wheels of this checkout for one interpreter (a virtualenv with
TensorFlow, such as ``.venv``), then for each of ``--rounds`` rounds installs each
wheel in turn (``--force-reinstall --no-deps``) and runs ``bench_run.py``,
``bench_closure_queue.py`` and ``bench_classify.py`` against it, one log per
build and round in ``--out``. Prints tf-failure-handling's figures per build, one
value per round: the README's "One abi3 wheel" table. The virtualenv is left with
the abi3 wheel installed (``make build`` restores the editable build).

    python benches/compare_builds.py [--python .venv/bin/python] [--rounds 3]
    python benches/compare_builds.py --summarize DIR     # the table from earlier logs
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCHES = ROOT / "benches"
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
    "both, as the coordinator calls them": (r"^\| both, as the coordinator calls them", 2),
}


def cell(log: str, pattern: str, column: int) -> str:
    for line in log.splitlines():
        if re.match(pattern, line):
            value = [c.strip() for c in line.strip().strip("|").split("|")][column]
            # "3.6M closures/s (280 ns)" -> "3.6M closures/s"
            return re.sub(r"\s*\(.*\)$", "", value) or "?"
    return "?"


def summarize(out: Path, rounds: int) -> str:
    lines = ["| | " + " | ".join(f"{b} ({rounds} rounds)" for b in BUILDS) + " |"]
    lines.append("| --- |" + " --- |" * len(BUILDS))
    logs = {
        (build, r): (out / f"{build}-{r}.log").read_text(errors="replace")
        for build in BUILDS
        for r in range(1, rounds + 1)
        if (out / f"{build}-{r}.log").exists()
    }
    for row, (pattern, column) in ROWS.items():
        values = []
        for build in BUILDS:
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
                *(str(Path(python).parent / "maturin"), "build", "--quiet", "--release"),
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
    args = parser.parse_args()
    if args.summarize:
        print(summarize(args.summarize, args.rounds))
        return 0
    out = args.out or Path(tempfile.mkdtemp(prefix="compare-builds-"))
    out.mkdir(parents=True, exist_ok=True)
    wheels = build_wheels(args.python, out / "wheels")
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
                    )
            print(f"round {r}: {build} done ({out / f'{build}-{r}.log'})", flush=True)
    print("\nREADME, One abi3 wheel:\n")
    print(summarize(out, args.rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
