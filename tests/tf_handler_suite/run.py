"""TensorFlow 2.21's own tests of its failure-handling module, run unmodified against ours.

    python tests/tf_handler_suite/run.py [--impl ours|tf|both] [--file NAME] [--method M]

``failure_handler_test.py`` and ``gce_failure_handler_test.py`` (TF's tests of
``PreemptionCheckpointHandler``; not in TF's wheel) are read from ``../shared/tf_tests``
beside the repository (``TFH_TF_TESTS_DIR`` elsewhere): see that folder's README. Each
test method of each file (all its combinations) runs as one process, through
``launcher.py``: ``ours`` with ``tf_failure_handling.patch()`` in every process, ``tf``
with TensorFlow's own classes. A process that does not exit within ``--timeout`` seconds
gets SIGTERM (absltest has faulthandler print every thread's stack) and then its process
group SIGKILL: the test it was in is a ``hang``, the tests after it ``not run``.

Prints one line per test (its result with each implementation, and what the evidence
says: ``evidence.py``), then one summary line. The run fails (exit 1) when, with ours:

* a test fails, hangs or does not run, and TF's classes pass it (:data:`expected.
  TF_REFERENCE` lists the tests TF's classes do not pass here; a failure is re-run with
  TF's classes, which says whether it is ours: ``--no-confirm`` skips that), unless
  :data:`expected.EXPECTED_FAILURES` lists it;
* a test that sent a notice passed, but ours did not receive it (``missed``) or received
  it while training and saved nothing (``not saved``), unless the method is listed in
  :data:`expected.NOTICE_UNHEARD`; or ours was not the handler the test built;
* the tests a file reported are not exactly those its source defines (``cases.py``).

The test files missing is a failure under ``CI=true``; elsewhere the run says so, adds
a line to ``build/not-run.txt`` (``make test`` names it at the end) and exits 0.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from tf_handler_suite import cases, evidence, expected, launcher, verdict  # noqa: E402

#: Seconds one process (one test method's combinations) may take. The longest, the 32
#: combinations of test_multiple_workers_preempted_consecutively, take 100 s alone on 2
#: CPUs; the bound only turns a hang into a failure.
TIMEOUT = 900.0
#: Seconds a process may keep running after absltest wrote its results.
EXIT_GRACE = 60.0
#: Seconds a hung process has, after SIGTERM, to print its stacks and exit.
DUMP_GRACE = 10.0
NOT_RUN_FILE = cases.REPO / "build" / "not-run.txt"
LAUNCHER_NAME = "bazel-tf-handler-suite"
TAIL_LINES = 40
#: How the short summary names a test (``failed_lines``): by this file, which is in the
#: repository (TF's test files are not). A CI run whose suite failed listed none of its
#: tests among the failing ones when they were named ``tests/tf_handler_suite/<TF's
#: file>::...``, a path that is not in the repository.
SUITE_PATH = "tests/tf_handler_suite/run.py"


def is_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes", "on")


@dataclass
class Run:
    """One process: one test method of one file with one implementation."""

    impl: str
    file: str
    method: str
    folder: Path
    how: str = ""
    returncode: int | None = None
    seconds: float = 0.0
    outcomes: dict = field(default_factory=dict)
    checks: dict = field(default_factory=dict)

    @property
    def output_path(self) -> Path:
        return self.folder / "output.txt"

    def tail(self, lines: int = TAIL_LINES) -> str:
        text = self.output_path.read_text(errors="replace") if self.output_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def write_launcher(folder: Path) -> Path:
    """The executable ``multi_process_lib`` re-executes: no ``.py``, ``bazel`` in its
    name, this interpreter in its ``#!``."""
    path = folder / LAUNCHER_NAME
    path.write_text(
        f"#!{sys.executable}\n"
        "import sys\n"
        f"sys.path.insert(0, {str(HERE)!r})\n"
        "import launcher\n"
        "launcher.main()\n"
    )
    path.chmod(0o755)
    return path


def _wait(proc: subprocess.Popen, xml_path: Path, timeout: float, exit_grace: float) -> str:
    start = time.monotonic()
    results_at = None
    while proc.poll() is None:
        now = time.monotonic()
        if results_at is None and xml_path.is_file() and xml_path.stat().st_size:
            results_at = now
        if results_at is not None and now - results_at >= exit_grace:
            return "hang at exit"
        if now - start >= timeout:
            return "hang"
        time.sleep(0.5)
    return "exited"


def run_method(
    impl: str,
    test_file: Path,
    method: str,
    folder: Path,
    timeout: float,
    exit_grace: float = EXIT_GRACE,
) -> Run:
    """Runs every combination of ``method`` of ``test_file`` in one process."""
    folder.mkdir(parents=True, exist_ok=True)
    run = Run(impl, test_file.name, method, folder)
    exe = write_launcher(folder)
    xml_path = folder / "results.xml"
    log_path = folder / "log.txt"
    kept = folder / "kept"
    tmp = folder / "tmp"
    kept.mkdir(exist_ok=True)
    tmp.mkdir(exist_ok=True)
    env = dict(
        os.environ,
        **{
            launcher.IMPL_ENV: impl,
            launcher.FILE_ENV: str(test_file),
            launcher.LOG_ENV: str(log_path),
            launcher.EVIDENCE_ENV: str(kept),
            # absltest's own filter (-k): TF's app.run refuses -k on the command line.
            "TESTBRIDGE_TEST_ONLY": f"{method}",
            "TEST_TMPDIR": f"{tmp}/",
        },
    )
    start = time.monotonic()
    with open(run.output_path, "wb") as out:
        proc = subprocess.Popen(
            [str(exe), f"--xml_output_file={xml_path}"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=folder,
            start_new_session=True,
        )
        try:
            run.how = _wait(proc, xml_path, timeout, exit_grace)
            if run.how != "exited":
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(DUMP_GRACE)
                except subprocess.TimeoutExpired:
                    pass
        finally:
            # The workers and multiprocessing's forkserver are in the process's group.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            code = proc.wait()
    run.returncode = None if run.how != "exited" else code
    run.seconds = time.monotonic() - start
    output = run.output_path.read_text(errors="replace")
    run.outcomes = verdict.outcomes(xml_path, output, run.how)
    if run.how == "hang at exit":
        for o in run.outcomes.values():
            if o.ok:
                o.result = "failed"
                o.message = f"passed, then the process was still running {exit_grace:.0f} s later"
    elif run.how == "exited" and code != 0 and all(o.ok for o in run.outcomes.values()):
        for o in run.outcomes.values():
            o.result, o.message = "failed", f"every test passed but the process exited {code}"
    if launcher.CLASS_LINE not in output:
        for o in run.outcomes.values():
            o.result, o.message = "failed", "the launcher did not say which handler ran"
    per_test = evidence.read_log(log_path)
    last_step = cases.steps_per_run_of_training(test_file)
    for test_id, lines in per_test.items():
        name = verdict._short(test_id)
        run.checks[name] = evidence.check(impl, lines, kept / test_id, last_step)
    return run


# ------------------------------------------------------------------ the verdict


@dataclass
class Line:
    """What the run says about one test."""

    name: str
    file: str
    method: str
    ours: verdict.Outcome | None = None
    tf: verdict.Outcome | None = None
    check: evidence.Check | None = None
    tf_check: evidence.Check | None = None
    status: str = ""  # "ok", "FAIL", "listed"
    why: str = ""


def failed_lines(lines: dict[str, Line]) -> list[str]:
    """The failures again, last and in pytest's short-summary form (``FAILED
    path::name - why``): where a CI log is cut to its end and to the lines that name
    failed tests, these are the ones it keeps."""
    failed = [ln for ln in lines.values() if ln.status == "FAIL"]
    if not failed:
        return []
    out = ["=== short test summary info (TensorFlow's handler suite) ==="]
    for ln in failed:
        why = " ".join(ln.why.split())[:300]
        out.append(f"FAILED {SUITE_PATH}::{ln.file}::{ln.name} - {why}")
    return out


def method_dir(file: str, method: str) -> str:
    return f"{file[:-3]}.{method}"


def _missing(name: str) -> verdict.Outcome:
    return verdict.Outcome("not run", "the run did not report it")


def collect(runs: list[Run], names: dict) -> dict[str, Line]:
    """One :class:`Line` per expected test (``names``: test -> (file, method))."""
    lines = {name: Line(name, f, m) for name, (f, m) in names.items()}
    for run in runs:
        for name, outcome in run.outcomes.items():
            if name.split(".", 1)[-1] in expected.NOT_TESTS:
                continue
            line = lines.get(name)
            if line is None:
                line = lines[name] = Line(name, run.file, run.method, why="not in the source")
            setattr(line, run.impl, outcome)
            chk = run.checks.get(name)
            if run.impl == "ours":
                line.check = chk
            else:
                line.tf_check = chk
    return lines


def judge(line: Line, impl: str) -> None:
    """Sets ``line.status`` and ``line.why`` for a run of ``impl`` (ours or tf)."""
    name = line.name
    if impl == "tf":
        got = line.tf or _missing(name)
        ref = expected.TF_REFERENCE.get(name)
        if got.ok or (ref is not None and ref == got.result):
            line.status = "ok"
        else:
            line.status = "FAIL"
            line.why = f"TF's classes: {got.result} {got.message}".strip()
        return
    got = line.ours or _missing(name)
    listed = expected.EXPECTED_FAILURES.get(name)
    unheard = expected.NOTICE_UNHEARD.get((line.file, line.method))
    if line.why == "not in the source":
        line.status, line.why = "FAIL", "reported by the run but not in the test file's source"
        return
    if not got.ok:
        tf = line.tf
        tf_ref = expected.TF_REFERENCE.get(name)
        if tf is not None and not tf.ok:
            said = f"fails with TF's classes too ({tf.result}: {tf.message})"
        elif tf is not None:
            said = "passes with TF's classes"
        elif tf_ref is not None:
            said = f"TF's classes: {tf_ref} (expected.TF_REFERENCE)"
        else:
            said = "passes with TF's classes (expected.TF_REFERENCE)"
        if listed is not None:
            line.status, line.why = "listed", f"{got.result}; {said}; listed: {listed}"
            return
        line.status = "FAIL"
        line.why = f"{got.result}: {got.message}; {said}"
        return
    chk = line.check
    if chk is None:
        line.status, line.why = "FAIL", "passed, but no log lines were kept for it (no markers)"
        return
    if not chk.built:
        line.status, line.why = "FAIL", "passed, but ours logged no PreemptionCheckpointHandler"
        return
    if chk.outcome in ("missed", "not saved") or (
        chk.outcome == "no notice" and unheard is None and _sends_notice(line)
    ):
        if unheard is not None:
            line.status, line.why = "ok", f"notice unheard (listed): {chk.detail}"
            return
        line.status = "FAIL"
        line.why = f"passed, but the notice check says {chk.outcome}: {chk.detail}"
        return
    line.status = "ok"
    if listed is not None:
        line.why = f"listed, passed (remove the entry once it passes run after run): {listed}"
    elif unheard is not None:
        line.why = "notice unheard (listed in NOTICE_UNHEARD)"


#: The methods that send a notice in every combination: a pass without one received is
#: not a pass of ours (``failure_handler_test.py``: the SIGTERM is sent whatever
#: happens, at the latest after the seventh epoch).
NOTICE_METHODS = {
    ("failure_handler_test.py", "test_preemption_checkpointing"),
    ("failure_handler_test.py", "test_grace_period_continue_training"),
    ("failure_handler_test.py", "test_passed_in_save_fn"),
}


def _sends_notice(line: Line) -> bool:
    return (line.file, line.method) in NOTICE_METHODS


def _fmt(o: verdict.Outcome | None) -> str:
    return "-" if o is None else o.result


def report(lines: dict[str, Line], impls: list[str], primary: str) -> list[str]:
    out = []
    for name in sorted(lines, key=lambda n: (lines[n].file, n)):
        line = lines[name]
        results = " ".join(f"{impl}={_fmt(getattr(line, impl))}" for impl in impls)
        chk = line.check if primary == "ours" else line.tf_check
        notice = f" notice={chk.outcome}" if chk is not None else ""
        why = f"  -- {line.why}" if line.why else ""
        out.append(
            f"{line.status:<6} {line.file.split('_test')[0] + ':':<24} {name.split('.', 1)[1]}  "
            f"{results}{notice}{why}"
        )
    return out


def _counts(items: list[str]) -> str:
    found: dict[str, int] = {}
    for item in items:
        found[item] = found.get(item, 0) + 1
    return ", ".join(f"{v} {k}" for k, v in sorted(found.items(), key=lambda kv: -kv[1]))


def _notice_label(line: Line, primary: str) -> str | None:
    chk = line.check if primary == "ours" else line.tf_check
    if chk is None:
        return None
    if chk.outcome == "no notice":
        if primary == "ours" and (line.file, line.method) in expected.NOTICE_UNHEARD:
            return "unheard (listed)"
        return "none sent"
    return chk.outcome


def summary(lines: dict[str, Line], primary: str, seconds: float) -> str:
    """The run's one line: results, TF's when they ran, the notice check, the verdict."""
    results = _counts([(getattr(ln, primary) or _missing(n)).result for n, ln in lines.items()])
    tf = [ln.tf.result for ln in lines.values() if ln.tf is not None]
    theirs = f" (TF's classes, {len(tf)} run: {_counts(tf)})" if primary == "ours" and tf else ""
    notices = _counts([x for x in (_notice_label(ln, primary) for ln in lines.values()) if x])
    bad = sum(1 for ln in lines.values() if ln.status == "FAIL")
    listed = sum(1 for ln in lines.values() if ln.status == "listed")
    word = "FAILED" if bad else "passed"
    return (
        f"tf_handler_suite ({primary}): {word}: {len(lines)} tests: {results}{theirs}; "
        f"notice check: {notices}; {listed} listed failure(s), {bad} failing; {seconds:.0f} s"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", choices=("ours", "tf", "both"), default="ours")
    parser.add_argument(
        "--file", action="append", choices=cases.FILES, help="a test file (default: both)"
    )
    parser.add_argument("--method", action="append", help="a test method (default: all)")
    parser.add_argument(
        "--timeout",
        type=float,
        default=TIMEOUT,
        help=f"seconds per process (default {TIMEOUT:.0f})",
    )
    parser.add_argument("--keep", type=Path, help="keep each run's folder here")
    parser.add_argument(
        "--no-confirm", action="store_true", help="do not re-run ours' failures with TF's classes"
    )
    parser.add_argument(
        "--not-run-file",
        type=Path,
        default=NOT_RUN_FILE,
        help="where a run that cannot start says so (make test's summary)",
    )
    args = parser.parse_args(argv)

    started = time.monotonic()
    folder = cases.tests_dir()
    files = args.file or list(cases.FILES)
    missing = [f for f in files if not (folder / f).is_file()]
    if missing:
        why = f"TensorFlow's handler tests are not in {folder} ({', '.join(missing)})"
        if is_ci():
            print(f"tf_handler_suite: FAILED: CI=true: {why}")
            return 1
        print(f"tf_handler_suite: NOT RUN: {why}; CI=true makes this a failure")
        if args.not_run_file.parent.is_dir():
            with open(args.not_run_file, "a") as f:
                f.write(f"tf-handler-suite\t{why} (check out ../shared beside the repository)\n")
        return 0

    names = {}
    for f in files:
        for name in cases.test_names(folder / f):
            method = cases.method_of(name)
            if args.method and method not in args.method:
                continue
            names[name] = (f, method)
    methods = sorted({v for v in names.values()})
    impls = ["ours", "tf"] if args.impl == "both" else [args.impl]
    primary = "tf" if args.impl == "tf" else "ours"

    work = args.keep or Path(tempfile.mkdtemp(prefix="tf_handler_suite."))
    work.mkdir(parents=True, exist_ok=True)
    runs = []
    for impl in impls:
        for f, method in methods:
            run = run_method(
                impl, folder / f, method, work / impl / method_dir(f, method), args.timeout
            )
            runs.append(run)
            print(
                f"tf_handler_suite: {impl} {f} {method}: {run.how}, {run.seconds:.0f} s, "
                + ", ".join(
                    f"{sum(o.result == r for o in run.outcomes.values())} {r}"
                    for r in ("passed", "failed", "skipped", "hang", "crash")
                    if any(o.result == r for o in run.outcomes.values())
                ),
                flush=True,
            )
    lines = collect(runs, names)
    if primary == "ours" and "tf" not in impls and not args.no_confirm:
        failing = sorted(
            {(ln.file, ln.method) for ln in lines.values() if ln.ours is None or not ln.ours.ok}
        )
        for f, method in failing:
            run = run_method(
                "tf", folder / f, method, work / "tf" / method_dir(f, method), args.timeout
            )
            runs.append(run)
            print(
                f"tf_handler_suite: confirming with TF's classes: {f} {method}: {run.how}, "
                f"{run.seconds:.0f} s",
                flush=True,
            )
        if failing:
            impls = ["ours", "tf"]
            lines = collect(runs, names)
    for line in lines.values():
        judge(line, primary)
    for text in report(lines, impls, primary):
        print(text)
    failed_runs = [
        r for r in runs if r.impl == primary and any(not o.ok for o in r.outcomes.values())
    ]
    for run in failed_runs:
        print(
            f"\n== {run.impl} {run.file} {run.method}: {run.how} (exit {run.returncode}); "
            f"last {TAIL_LINES} lines of {run.output_path}:\n{run.tail()}"
        )
    line = summary(lines, primary, time.monotonic() - started)
    print(line)
    for text in failed_lines(lines):
        print(text)
    bad = any(ln.status == "FAIL" for ln in lines.values())
    if not args.keep:
        if bad:
            print(f"tf_handler_suite: the runs' folders are kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 1 if bad else 0


if __name__ == "__main__":
    from portserver import ADDRESS_ENV, serving

    # TensorFlow's tests pick their tasks' ports with portpicker: through one port
    # server (make test's, or one of this run's own), never from the ephemeral range.
    with serving() as address:
        os.environ[ADDRESS_ENV] = address
        sys.exit(main())
