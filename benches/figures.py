"""``make figures``: every bench and the reliability trials, one after the other, each
table written to ``docs/figures/`` with its command, commit, date and machine.

    python benches/figures.py [--out docs/figures] [--quick]

The README and the docs print no figure by hand: the docs include these files, the
README's speed table is rewritten from them (``benches/headline.py``), and
``tests/unit/test_figures.py`` fails when a figure the README or a page states is in
none of them. How long ``make test`` or ``make demo`` takes from a fresh clone is not
measured here (most of an hour): ``benches/time_make.py TARGET`` adds a row to its own
table there. Every table is written to a temporary folder first and the figures
folder is replaced only when every command succeeded, so a failed run leaves the
last complete set. ``--quick`` runs each bench with few repeats, to check the
pipeline, not to publish (its tables say so in their command line).
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

import headline  # benches/: the script's directory is on sys.path

ROOT = Path(__file__).resolve().parents[1]

#: (script, arguments of the published run, arguments of --quick). Each prints its
#: tables through ``_report.print_readme_table`` (``_report.write_figure``).
COMMANDS = (
    ("benches/bench_run.py", [], ["--calls", "20000", "--rounds", "3"]),
    ("benches/bench_closure_queue.py", [], ["--closures", "2000", "--rounds", "2"]),
    ("benches/bench_coordinator.py", [], ["--rounds", "1"]),
    ("benches/bench_classify.py", [], ["--calls", "10000", "--repeats", "3"]),
    ("benches/bench_notice.py", [], ["--repeats", "1"]),
    ("benches/bench_patch.py", [], ["--repeats", "3"]),
    ("benches/bench_ps_notice.py", ["--repeats", "3"], ["--repeats", "1"]),
    ("benches/bench_records.py", ["--repeats", "300"], ["--repeats", "20"]),
    # The survivors' hold of the last whole step, per step of a 200 MB model (~2 min).
    (
        "benches/bench_lost_worker.py",
        [],
        ["--model-mb", "8", "--steps", "3", "--rounds", "1"],
    ),
    # From a worker lost without notice to the survivor's exit, and the steps lost, TF's
    # handler and ours, 200 MB model (8 runs of 2 fresh TF workers, ~8 min).
    (
        "benches/bench_lost_worker_exit.py",
        [],
        ["--model-mb", "8", "--repeats", "1", "--kill-after", "5"],
    ),
    # The input position against TF's iterator checkpoint (~4 min on 2 cores).
    (
        "benches/bench_input_position.py",
        [],
        ["--repeats", "1", "--positions", "1000", "100000"],
    ),
    # Host memory and bytes of one MWMS preemption save, 200 MiB and 1 GiB models, TF's
    # handler and ours in each mode (16 runs of 2 fresh TF workers, ~4 min).
    ("benches/bench_save_memory.py", ["--repeats", "2"], ["--quick"]),
    # The test clusters' fork server (tests/integration/forkserver.py), ~10 min.
    ("benches/bench_test_workers.py", [], ["--rounds", "1"]),
    # The demo (make demo, about a minute): its preemption report, as docs/records.md
    # shows it, and how long it took (demo/README.md).
    ("demo/run_demo.py", [], []),
    # A mid-sized run of the trials (~27 min on 2 cores: 60 of ps_preemption, the identity
    # trials of issue 48; 25 of lost_worker, issue 62's, medians of 22 and 24 s in two quiet
    # runs; 2 of each other real-process kind); ``make reliability`` is the long mode
    # (10,000 simulated trials, 6 real-process trials of each kind, 60 of ps_preemption and
    # 25 of lost_worker; about two and a half hours).
    (
        "tests/reliability/run.py",
        [
            "--sim-trials",
            "2000",
            "--debug-trials",
            "200",
            "--process-seeds",
            "2",
            "--ps-preemption-seeds",
            "60",
            "--lost-worker-seeds",
            "25",
        ],
        ["--sim-trials", "200", "--debug-trials", "20", "--process-seeds", "1"],
    ),
    # Last but one: they leave the abi3 wheel installed (make figures rebuilds after).
    ("benches/compare_builds.py", ["--rounds", "3"], ["--rounds", "1"]),
    ("benches/compare_builds.py", ["--micro", "--rounds", "5"], ["--micro", "--rounds", "1"]),
    # The SLURM scenarios: a real one-node SLURM (tests/slurm/conftest.py), ~10 min.
    ("-m", ["pytest", "tests/slurm", "-q", "-p", "no:cacheprovider"], ["pytest", "tests/slurm"]),
)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "figures")
    p.add_argument("--quick", action="store_true", help="few repeats: checks the pipeline")
    p.add_argument("--only", nargs="*", help="scripts to run (default: all)")
    args = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="tfh-figures-"))
    # CI=true: a SLURM that cannot start fails the run instead of skipping its table.
    env = dict(os.environ, TFH_FIGURES_DIR=str(tmp), PYTHONUNBUFFERED="1", CI="true")
    failed = []
    for script, full, quick in COMMANDS:
        name = "tests/slurm" if script == "-m" else script
        if args.only and name not in args.only and Path(name).name not in args.only:
            continue
        before = set(tmp.iterdir())
        cmd = [sys.executable, script, *(quick if args.quick else full)]
        print(f"== {' '.join(cmd[1:])}", flush=True)
        started = time.monotonic()
        rc = subprocess.run(cmd, cwd=ROOT, env=env, check=False).returncode
        took = time.monotonic() - started
        written = sorted(p.name for p in set(tmp.iterdir()) - before)
        print(f"== {name}: exit {rc} in {took:.0f} s; wrote {', '.join(written) or 'nothing'}")
        if rc != 0 or not written:
            failed.append(name)
    if failed:
        print(f"FAILED: {', '.join(failed)}; {args.out} left as it was ({tmp} has the rest).")
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    for path in tmp.iterdir():
        shutil.copyfile(path, args.out / path.name)
    shutil.rmtree(tmp)
    print(f"{len(list(args.out.glob('*.md')))} tables in {args.out}.")
    if args.out.resolve() == (ROOT / "docs" / "figures").resolve():
        headline.rewrite(ROOT / "README.md", args.out)
        print("README.md: its speed table rewritten from them (benches/headline.py).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
