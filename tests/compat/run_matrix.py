"""The compatibility matrix: the built wheel against TensorFlow versions and Pythons.

For each combination (TensorFlow ``X.Y`` on Python ``A.B``) this script

1. creates (or reuses) a virtualenv ``.compat/tf<X.Y>-py<A.B>`` from pyenv's
   newest ``A.B`` (``$(pyenv root)/versions``) and installs ``tensorflow-cpu==X.Y.*``,
   the matching ``tf-keras==X.Y.*``, Keras 3.15 (the release the Keras support is
   written for, as the Makefile pins; on Python 3.10, which Keras 3.15 does not
   support, the Keras that TensorFlow's dependency brings) and pytest;
2. installs the wheel from ``dist/`` that fits that Python (``--force-reinstall
   --no-deps``: the wheel, never an editable build) and checks that
   ``tf_failure_handling`` imports from the virtualenv's ``site-packages``, not
   from the checkout's ``python/`` directory (the tests run without Rust on the
   ``PATH``);
3. runs, from the source tree, the unit tests (``tests/unit``, which include the
   failure classifier checked against that TensorFlow's own ``_is_worker_failure``
   and ``_is_ps_failure``) and a real-TensorFlow subset: MWMS workers saving at
   one agreed step on SIGTERM and resuming (TensorFlow's handler and ours), the
   non-chief saves each mode promises (``memory``: the non-chief's record says
   ``copy: none``, nothing of it on the storage; ``shares``: one data file per worker
   merged into one checkpoint, no whole copy, and whole or absent when a share is
   wrong), a worker killed under a ParameterServerStrategy coordinator, and the
   classifier against the errors that TensorFlow version raises (``tests/compat``);
4. prints the matrix, in the README's format, and writes it to
   ``.compat/matrix.md``.

    python tests/compat/run_matrix.py                 # every combination
    python tests/compat/run_matrix.py --ends          # oldest TF on oldest Python, newest on newest
    python tests/compat/run_matrix.py --only 2.16/3.11 --only 2.21/3.13
    python tests/compat/run_matrix.py --ends --venvs-only  # step 1 alone (make test)

Combinations run one at a time (the machine's cores are shared), or ``--jobs N``
side by side (``make test`` runs its two ends so: one after the other they were the
run's last job by about eight minutes, with one core idle). The exit code is 1 if any
combination failed, 0 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VENVS = ROOT / ".compat"

#: (TensorFlow, Python). TF 2.16-2.21 on Python 3.11; TF 2.21 on 3.10, 3.12 and 3.13;
#: and TF 2.16 on 3.10, the oldest of both (the low end ``--ends`` runs). All exist as
#: ``tensorflow-cpu`` wheels on PyPI (checked with ``pip index versions``: Python 3.13
#: has only TF 2.20 and 2.21; Python 3.9 is below TF 2.21's floor and not supported).
COMBINATIONS = [
    ("2.16", "3.11"),
    ("2.17", "3.11"),
    ("2.18", "3.11"),
    ("2.19", "3.11"),
    ("2.20", "3.11"),
    ("2.21", "3.11"),
    ("2.16", "3.10"),
    ("2.21", "3.10"),
    ("2.21", "3.12"),
    ("2.21", "3.13"),
]
ENDS = [("2.16", "3.10"), ("2.21", "3.13")]

#: The real-TensorFlow subset, run after the unit tests.
REAL_TF_TESTS = [
    "tests/integration/test_mwms_handler.py::test_sigterm_saves_at_agreed_step_and_resumes",
    # The non-chief saves through TensorFlow's private saver code (tests/unit/tf_internals.py
    # pins it per release): memory (copy: none) and shares (one checkpoint, whole or absent).
    "tests/integration/test_save_memory.py",
    "tests/integration/test_mwms_handler.py::test_the_workers_write_one_checkpoint_together_on_request",
    "tests/integration/test_shares_whole.py",
    "tests/integration/test_ps_coordinator.py::test_worker_killed_and_restarted",
    "tests/compat",
]

#: Keras 3 as the Makefile pins it (``TESTED_KERAS`` of ``_integrations/keras_internals.py``).
#: Keras 3.13 and later need Python 3.11: Python 3.10 gets 3.12, the newest it can install
#: (one of its ``TESTED_KERAS_RELEASES``).
KERAS = "keras==3.15.*"
KERAS_ON_310 = "keras==3.12.*"
KERAS_MIN_PYTHON = (3, 11)
# matplotlib: the wheel's [plot] extra, which the records report's picture test needs;
# portpicker: its port server, which tests/unit/test_portserver.py runs.
TEST_DEPS = ["pytest", "pytest-timeout", "hypothesis", "matplotlib>=3.5", "portpicker==1.6.*"]

#: Bounds that turn a hang into a failure (the whole pytest run of one combination;
#: one pip install, which downloads TensorFlow).
PYTEST_TIMEOUT_S = 3600
PIP_TIMEOUT_S = 1800
#: How much of a failed combination's log is printed (CI shows nothing else of it).
LOG_TAIL_LINES = 80


@dataclass
class Result:
    tf: str
    python: str
    tf_installed: str = "-"
    python_full: str = "-"
    keras: str = "-"
    wheel: str = "-"
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    seconds: float = 0.0
    verdict: str = "not run"
    note: str = ""


def pyenv_root() -> Path:
    """pyenv's root: ``pyenv root``, else ``$PYENV_ROOT``, else ``~/.pyenv``."""
    try:
        out = subprocess.run(["pyenv", "root"], capture_output=True, text=True, timeout=60)
        if out.returncode == 0 and out.stdout.strip():
            return Path(out.stdout.strip())
    except OSError:
        pass
    return Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")


def pyenv_python(version: str) -> Path:
    """The newest pyenv interpreter ``version.*``."""
    root = pyenv_root()
    candidates = sorted(
        (
            p
            for p in (root / "versions").glob(f"{version}.*")
            if re.fullmatch(rf"{re.escape(version)}\.\d+", p.name)
        ),
        key=lambda p: int(p.name.rsplit(".", 1)[1]),
    )
    if not candidates:
        raise FileNotFoundError(
            f"no Python {version} under {root / 'versions'}: the compatibility matrix needs "
            f"pyenv's CPython {version} (pyenv install {version})"
        )
    return candidates[-1] / "bin" / "python"


def wheel_for(python: str, dist: Path) -> Path:
    """The wheel in ``dist`` that installs on CPython ``python`` (``3.11``): ``cp311-cp311``, or
    an ``abi3`` wheel whose floor is at or below it."""
    major, minor = (int(x) for x in python.split("."))
    found = []
    for wheel in sorted(dist.glob("tf_failure_handling-*.whl")):
        parts = wheel.stem.split("-")
        pytag, abitag = parts[-3], parts[-2]
        if not pytag.startswith("cp3"):
            continue
        floor = int(pytag[3:])
        if (abitag == f"cp{major}{minor}" and floor == minor) or (
            abitag == "abi3" and floor <= minor
        ):
            found.append(wheel)
    if not found:
        raise FileNotFoundError(f"no wheel for CPython {python} in {dist} (run `make wheel`)")
    return max(found, key=lambda p: p.stat().st_mtime)


def run(cmd: list[str], timeout: float, log, **kwargs) -> subprocess.CompletedProcess:
    log.write(f"$ {' '.join(map(str, cmd))}\n")
    log.flush()
    return subprocess.run(
        cmd, stdout=log, stderr=subprocess.STDOUT, timeout=timeout, text=True, **kwargs
    )


def prepare_venv(result: Result, log) -> Path | None:
    """Creates the virtualenv with TensorFlow and the test dependencies, or keeps it when
    its ``.deps`` stamp names the same ones; its Python, or None (with ``result.verdict``
    and ``note`` set) when that fails. Needs no wheel: ``make test`` runs it
    (``--venvs-only``) while the wheel is being built."""
    venv = VENVS / f"tf{result.tf}-py{result.python}"
    py = venv / "bin" / "python"
    stamp = venv / ".deps"
    new = tuple(int(x) for x in result.python.split(".")) >= KERAS_MIN_PYTHON
    keras = [KERAS if new else KERAS_ON_310]
    deps = [f"tensorflow-cpu=={result.tf}.*", f"tf-keras=={result.tf}.*", *keras, *TEST_DEPS]
    if not (stamp.exists() and stamp.read_text().strip() == json.dumps(deps)):
        base = pyenv_python(result.python)
        if run([str(base), "-m", "venv", "--clear", str(venv)], 300, log).returncode != 0:
            result.verdict, result.note = "error", "venv creation failed"
            return None
        run([str(py), "-m", "pip", "install", "--quiet", "--upgrade", "pip"], PIP_TIMEOUT_S, log)
        if (
            run([str(py), "-m", "pip", "install", "--quiet", *deps], PIP_TIMEOUT_S, log).returncode
            != 0
        ):
            result.verdict, result.note = "error", "pip could not install " + " ".join(deps)
            return None
        stamp.write_text(json.dumps(deps))
    return py


def prepare(result: Result, dist: Path, log) -> Path | None:
    """:func:`prepare_venv`, then the wheel installed and checked; None (with
    ``result.verdict`` and ``note`` set) when either fails."""
    py = prepare_venv(result, log)
    if py is None:
        return None
    venv = py.parent.parent
    wheel = wheel_for(result.python, dist)
    result.wheel = wheel.name
    install = [
        str(py),
        "-m",
        "pip",
        "install",
        "--quiet",
        "--force-reinstall",
        "--no-deps",
        str(wheel),
    ]
    if run(install, PIP_TIMEOUT_S, log).returncode != 0:
        result.verdict, result.note = "error", f"pip could not install {wheel.name}"
        return None
    # From the checkout's root, as the tests run: the package must come from the venv.
    probe = (
        "import json, sys, keras, tensorflow as tf, tf_failure_handling as t;"
        "print(json.dumps([t.__file__, tf.__version__, sys.version.split()[0], keras.__version__]))"
    )
    out = subprocess.run(
        [str(py), "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    if out.returncode != 0:
        result.verdict, result.note = (
            "error",
            "import failed: " + out.stderr.strip().splitlines()[-1],
        )
        return None
    location, result.tf_installed, result.python_full, result.keras = json.loads(
        out.stdout.strip().splitlines()[-1]
    )
    if not Path(location).resolve().is_relative_to(venv.resolve()):
        result.verdict, result.note = (
            "error",
            f"tf_failure_handling imported from {location}, not the wheel",
        )
        return None
    return py


def junit_counts(path: Path) -> tuple[int, int, int]:
    """(passed, failed, skipped) from a pytest JUnit XML report."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    total = sum(int(s.get("tests", 0)) for s in suites)
    failed = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
    skipped = sum(int(s.get("skipped", 0)) for s in suites)
    return total - failed - skipped, failed, skipped


def junit_failures(path: Path) -> list[str]:
    """``module::test`` of each failed or erroring test case in a JUnit XML report."""
    if not path.exists():
        return []
    found = []
    for case in ET.parse(path).getroot().iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            found.append(f"{case.get('classname', '?')}::{case.get('name', '?')}")
    return found


def run_combination(result: Result, dist: Path) -> Result:
    VENVS.mkdir(exist_ok=True)
    name = f"tf{result.tf}-py{result.python}"
    log_path = VENVS / f"{name}.log"
    start = time.monotonic()
    with log_path.open("w") as log:
        py = prepare(result, dist, log)
        if py is not None:
            report = VENVS / f"{name}.xml"
            report.unlink(missing_ok=True)
            cmd = [str(py), "-m", "pytest", "-q", "-p", "no:randomly", f"--junitxml={report}"]
            cmd += ["tests/unit", *REAL_TF_TESTS]
            env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
            env["TF_CPP_MIN_LOG_LEVEL"] = "2"
            # As a user without Rust: no cargo or rustc on the PATH.
            env["PATH"] = os.pathsep.join(
                d
                for d in env.get("PATH", "").split(os.pathsep)
                if ".cargo" not in d and ".rustup" not in d
            )
            try:
                done = run(cmd, PYTEST_TIMEOUT_S, log, cwd=ROOT, env=env)
                if report.exists():
                    result.passed, result.failed, result.skipped = junit_counts(report)
                if done.returncode == 0:
                    result.verdict = "pass"
                else:
                    result.verdict = "FAIL"
                    result.note = f"pytest exit {done.returncode}, see {log_path.relative_to(ROOT)}"
            except subprocess.TimeoutExpired:
                result.verdict, result.note = (
                    "FAIL",
                    f"pytest still running after {PYTEST_TIMEOUT_S} s",
                )
    result.seconds = time.monotonic() - start
    return result


def table(results: list[Result]) -> str:
    lines = [
        "| TensorFlow | Python | Keras | wheel | passed | failed | skipped | time | result |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        verdict = r.verdict + (f" ({r.note})" if r.note else "")
        # tf_failure_handling-0.1.0-cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64.whl
        # -> cp311-cp311-manylinux2014_x86_64
        parts = r.wheel.removesuffix(".whl").split("-")
        wheel = "-".join([*parts[2:4], parts[4].split(".")[0]]) if len(parts) == 5 else r.wheel
        lines.append(
            f"| {r.tf_installed if r.tf_installed != '-' else r.tf} "
            f"| {r.python_full if r.python_full != '-' else r.python} | {r.keras} | {wheel} "
            f"| {r.passed} | {r.failed} | {r.skipped} | {r.seconds:.0f} s | {verdict} |"
        )
    return "\n".join(lines)


def parse_combination(text: str) -> tuple[str, str]:
    tf, _, py = text.partition("/")
    if not re.fullmatch(r"2\.\d+", tf) or not re.fullmatch(r"3\.\d+", py):
        raise argparse.ArgumentTypeError(f"expected TF/PYTHON such as 2.16/3.11, got {text!r}")
    return tf, py


def venvs_only(combos: list[tuple[str, str]], jobs: int) -> int:
    """Creates the combinations' virtualenvs side by side, a line each; 1 if one failed
    (the tail of its log printed), else 0."""
    VENVS.mkdir(exist_ok=True)

    def one(tf: str, py: str) -> str | None:
        result, start = Result(tf=tf, python=py), time.monotonic()
        log_path = VENVS / f"tf{tf}-py{py}.venv.log"
        with log_path.open("w") as log:
            ok = prepare_venv(result, log) is not None
        took = time.monotonic() - start
        if ok:
            print(f"TF {tf} on Python {py}: virtualenv ready in {took:.0f} s", flush=True)
            return None
        tail = log_path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
        return "\n".join(
            [f"TF {tf} on Python {py}: {result.note}; last lines of {log_path}:"]
            + [f"    {line}" for line in tail]
        )

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        failures = [f for f in pool.map(lambda combo: one(*combo), combos) if f]
    for failure in failures:
        print(failure, flush=True)
    return 1 if failures else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--ends", action="store_true", help="only " + ", ".join(f"{t}/{p}" for t, p in ENDS)
    )
    parser.add_argument(
        "--only", action="append", type=parse_combination, default=[], metavar="TF/PY"
    )
    parser.add_argument("--dist", type=Path, default=ROOT / "dist", help="where the wheels are")
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        metavar="N",
        help="combinations run side by side (default 1: one at a time)",
    )
    parser.add_argument(
        "--venvs-only",
        action="store_true",
        help="only create the virtualenvs with TensorFlow (no wheel, no tests)",
    )
    args = parser.parse_args()
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    combos = args.only or (ENDS if args.ends else COMBINATIONS)
    if args.venvs_only:
        return venvs_only(combos, args.jobs)
    printing = threading.Lock()

    def one(tf: str, py: str) -> Result:
        with printing:
            print(f"TF {tf} on Python {py} ...", flush=True)
        result = run_combination(Result(tf=tf, python=py), args.dist)
        lines = [
            f"TF {tf} on Python {py}: {result.verdict}: {result.passed} passed, "
            f"{result.failed} failed, {result.skipped} skipped in {result.seconds:.0f} s "
            f"{result.note}"
        ]
        if result.verdict != "pass":
            # One line per failed test first, as pytest's summary writes them: the tail
            # of the log below may be cut where CI shows it.
            report = VENVS / f"tf{tf}-py{py}.xml"
            lines += [f"FAILED {case} (TF {tf} on Python {py})" for case in junit_failures(report)]
            log_path = VENVS / f"tf{tf}-py{py}.log"
            tail = log_path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
            lines.append(f"  last {len(tail)} lines of {log_path}:")
            lines += [f"    {line}" for line in tail]
        with printing:
            print("\n".join(lines), flush=True)
        return result

    # Each combination has its own virtualenv, log and report; the tests pick free
    # ports and their own temporary directories, so side by side they share nothing.
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(lambda combo: one(*combo), combos))
    matrix = table(results)
    print("\nREADME, compatibility matrix:\n")
    print(matrix)
    (VENVS / "matrix.md").write_text(matrix + "\n")
    return 0 if all(r.verdict == "pass" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
