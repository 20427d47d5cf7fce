"""What the test clusters' fork server saves: CPU and wall time of real-TensorFlow tests
with every worker started by ``subprocess.Popen`` (``TFH_TEST_FORKSERVER=0``) and forked
from a server that imported TensorFlow once (tests/integration/forkserver.py).

Each round runs each test once per way, alternately, in a fresh pytest process; the CPU
is that process's and every child's it reaped (the workers, the server): what ``make
test``'s two cores spend. Medians of ``--rounds``.

    python benches/bench_test_workers.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import _report

ROOT = Path(__file__).resolve().parents[1]
#: One test of each kind of cluster: an MWMS pair run three times (the `[tf]`
#: reference and ours alike), a PS cluster whose worker is killed and restarted, and
#: Keras 3 ``fit`` on two workers.
TESTS = (
    "tests/integration/test_mwms_handler.py::test_sigterm_saves_at_agreed_step_and_resumes[ours-both]",
    "tests/integration/test_ps_coordinator.py::test_worker_killed_and_restarted[ours]",
    "tests/integration/test_keras3.py::test_mwms_sigterm_saves_at_one_batch_and_fit_resumes_there[chief]",
)
#: Bounds one pytest run; only turns a hang into a failure.
RUN_BOUND = 900.0


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def one_run(test: str, forkserver: bool) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one pytest run of ``test``."""
    env = dict(os.environ, TFH_TEST_FORKSERVER="1" if forkserver else "0")
    cpu, start = children_cpu(), time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_BOUND,
    )
    wall, cpu = time.monotonic() - start, children_cpu() - cpu
    if done.returncode != 0:
        raise SystemExit(f"{test} failed (forkserver={forkserver}):\n{done.stdout[-3000:]}")
    return cpu, wall


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    rows = []
    for test in TESTS:
        runs: dict[bool, list] = {False: [], True: []}
        for _ in range(args.rounds):
            for way in (False, True):
                runs[way].append(one_run(test, way))
                cpu, wall = runs[way][-1]
                print(f"{test} forkserver={way}: {cpu:.1f} s CPU, {wall:.1f} s", flush=True)
        popen_cpu = _report.median(c for c, _ in runs[False])
        fork_cpu = _report.median(c for c, _ in runs[True])
        popen_wall = _report.median(w for _, w in runs[False])
        fork_wall = _report.median(w for _, w in runs[True])
        rows.append(
            (
                f"`{test.split('::')[1]}`",
                f"{popen_cpu:.1f} s",
                f"{fork_cpu:.1f} s",
                _report.ratio(popen_cpu / fork_cpu),
                f"{popen_wall:.1f} s",
                f"{fork_wall:.1f} s",
            )
        )
    _report.print_readme_table(
        f"Test workers started by Popen and by the fork server ({args.rounds} rounds)",
        ["test", "CPU, Popen", "CPU, fork server", "ratio", "wall, Popen", "wall, fork server"],
        rows,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
