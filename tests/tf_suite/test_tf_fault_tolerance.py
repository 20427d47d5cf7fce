"""TensorFlow's fault-tolerance suite against our ``ClusterCoordinator``, one process per test.

Every test method of TF's ``BaseFaultToleranceTest`` (read from the wheel's
``fault_tolerance_test_base.py`` with ``ast``, nothing imported), crossed with the
test classes of ``tf_fault_tolerance.py``, runs as TF's BUILD shards it: its own
``python tests/tf_suite/tf_fault_tolerance.py Class.testName`` process, which
starts its own cluster of worker and parameter-server processes. That process is
forked from the test clusters' fork server (``integration/forkserver.py``), which
imported TensorFlow once: the script runs as ``python`` would run it, and the
``import tensorflow`` it would pay is saved (``TFH_TEST_FORKSERVER=0``: Popen).

Verdict (``verdict.py``, which says how a failure's signature is read):

* passes with ours (``TFH_TF_SUITE_IMPL=ours``): passed. A test TF's own code
  skips (``skipTest``, e.g. "Worker number is less than 2." with one worker)
  counts as passed and says so: a pytest skip would fail under ``CI=true``
  (``tests/conftest.py``), and there is nothing of ours to run;
* fails with ours -- a failed or errored test, no exit within :data:`CHILD_TIMEOUT`
  ("hang"), a process still running :data:`EXIT_GRACE` s after unittest printed
  its result ("hang at exit": TF's coordination-service handler leaves a
  non-daemon timer thread running while a coordinator is alive), a crash -- the
  same test runs with TF's own classes (``TFH_TF_SUITE_IMPL=tf``). Each failure has
  a signature: its kind, the exception type, and the failing step of the test (the
  innermost frame in TF's test source). The test is an ``xfail`` only when TF's
  classes fail it with the same signature; otherwise it fails, with both signatures
  and both outputs' tails. Under ``CI=true`` the xfail must also be on the written
  list, ``expected_failures.py``, with that signature, or the test fails.

A hung process gets SIGTERM first (absltest has faulthandler dump every thread's
stack on it, which gives a hang's step), then its process group SIGKILL.
``conftest.py`` prints, per TF class, how many tests passed, were xfails (listed or
not), skipped and failed.

The bound per process only turns a hang into a failure; the tests take 20-60 s
each, most of it starting and restarting the cluster's processes. Within one
pytest run the tests run one after the other: they kill and restart processes on
timers (``time.sleep(2)`` then ``check_alive``). ``make test`` runs the two test
classes as two jobs (``TFH_TF_SUITE_CLASSES``), beside its other jobs.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from ci import is_ci
from integration.forkserver import popen

from tf_suite.expected_failures import EXPECTED_FAILURES
from tf_suite.verdict import Signature, decide, signature

HERE = Path(__file__).resolve().parent
MODULE = HERE / "tf_fault_tolerance.py"
IMPL_ENV = "TFH_TF_SUITE_IMPL"
#: Seconds one test process may take before it is killed and counted as a hang (until
#: unittest prints its summary; then the exit has :data:`EXIT_GRACE`). In make test's
#: parallel phase on 2 cores, starting a test's cluster alone took up to 190 s, and
#: testOneWorkerPreemptionWithCancellation ran 298 s in CI: a bound turns a hang into
#: a failure, it does not judge speed.
CHILD_TIMEOUT = 600.0
#: Seconds a test process may keep running after unittest printed its summary.
EXIT_GRACE = 30.0
#: Seconds a hung process has, after SIGTERM, to dump its threads' stacks and exit.
DUMP_GRACE = 10.0
#: Lines of a process's output shown in a failure or xfail message.
TAIL_LINES = 60
_BASE_CLASS = "BaseFaultToleranceTest"
_BASE_RELPATH = Path("python", "distribute", "coordinator", "fault_tolerance_test_base.py")


def _tensorflow_dir() -> Path | None:
    """TensorFlow's package directory, found without importing TensorFlow."""
    spec = importlib.util.find_spec("tensorflow")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def base_test_names(path: Path) -> list[str]:
    """The ``test*`` methods of ``BaseFaultToleranceTest`` in TF's file, in its order."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == _BASE_CLASS:
            return [
                f.name
                for f in node.body
                if isinstance(f, ast.FunctionDef) and f.name.startswith("test")
            ]
    raise LookupError(f"no class {_BASE_CLASS} in {path}")


def suite_class_names(path: Path = MODULE) -> list[str]:
    """The runnable test classes of ``tf_fault_tolerance.py`` (those that are TestCases)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        node.name
        for node in tree.body
        if isinstance(node, ast.ClassDef)
        and any(ast.unparse(base).endswith("TestCase") for base in node.bases)
    ]


def _cases() -> list:
    tf_dir = _tensorflow_dir()
    base = None if tf_dir is None else tf_dir / _BASE_RELPATH
    if base is None or not base.is_file():
        why = "tensorflow is not installed" if tf_dir is None else f"{base} is missing"
        return [pytest.param(None, marks=pytest.mark.skip(reason=why), id="no-tensorflow")]
    names = base_test_names(base)
    return [f"{cls}.{name}" for cls in selected_classes() for name in names]


#: TF's ``fault_tolerance_test.py``: one worker and one PS, two workers and two PS.
#: ``make test`` runs these; ``TFH_TF_SUITE_CLASSES=all`` (``make tf-suite-all``) adds
#: the coordination-service variants of ``fault_tolerance_coordination_service_test.py``.
DEFAULT_CLASSES = ("MultiWorkerFaultToleranceTest", "SingleWorkerFaultToleranceTest")
CLASSES_ENV = "TFH_TF_SUITE_CLASSES"


def selected_classes() -> list[str]:
    available = suite_class_names()
    wanted = os.environ.get(CLASSES_ENV, "").strip()
    if wanted == "all":
        return available
    names = [c.strip() for c in wanted.split(",") if c.strip()] or list(DEFAULT_CLASSES)
    unknown = sorted(set(names) - set(available))
    if unknown:
        raise ValueError(f"{CLASSES_ENV}: no such test class {unknown}; have {available}")
    return names


@dataclass
class ChildResult:
    """One run of one test in its own process."""

    impl: str
    outcome: str  # "passed", "skipped", "failed", "hang" or "hang at exit"
    returncode: int | None
    seconds: float
    output: str
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.outcome in ("passed", "skipped")

    @property
    def signature(self) -> Signature | None:
        """How it failed (None if it did not): see ``verdict.py``."""
        return signature(self.outcome, self.returncode, self.output)

    def tail(self, lines: int = TAIL_LINES) -> str:
        return "\n".join(self.output.splitlines()[-lines:])

    def describe(self) -> str:
        code = "killed" if self.returncode is None else f"exit code {self.returncode}"
        extra = f"; {self.detail}" if self.detail else ""
        sig = self.signature
        said = f"\n   signature: {sig}" if sig is not None else ""
        return f"{self.impl}: {self.outcome} ({code}, {self.seconds:.0f} s{extra}){said}"


def _kill_group(pgid: int) -> None:
    """Kills what is left of the process group the child leads (after a normal exit,
    typically multiprocessing's forkserver, which would exit by itself a moment later)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


_COORDINATOR_LINE = re.compile(r"^tf_suite: ClusterCoordinator is (\S+)$", re.M)
_RAN = re.compile(r"^Ran (\d+) tests? in ", re.M)
_SKIP_REASON = re.compile(r"skipped '([^'\n]*)'")


def _summary_printed(log_path: Path) -> bool:
    """Whether unittest's ``Ran N tests`` line is in the log's last few KiB."""
    with open(log_path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - 8192))
        return _RAN.search(f.read().decode(errors="replace")) is not None


def _wait_exit(proc, log_path: Path, timeout: float, exit_grace: float) -> str:
    """Waits for the child to exit: "exited", "hang" (no summary and no exit within ``timeout``
    s) or "hang-at-exit" (still running ``exit_grace`` s after unittest printed its
    summary, whenever that was)."""
    start = time.monotonic()
    summary_at = None
    checked = 0.0
    while True:
        if proc.poll() is not None:
            return "exited"
        now = time.monotonic()
        if summary_at is None and now - checked >= 1.0:
            checked = now
            if _summary_printed(log_path):
                summary_at = now
        if summary_at is not None:
            # The exit always gets its grace: a test that ends near the bound is not
            # a hang at exit (CI: "Ran 1 test in 298 s", killed 2 s later at 300 s).
            if now - summary_at >= exit_grace:
                return "hang-at-exit"
        elif now - start >= timeout:
            return "hang"
        time.sleep(0.2)


def _dump_and_end(proc, grace: float = DUMP_GRACE) -> None:
    """Sends SIGTERM to the child alone, on which absltest's faulthandler dumps every
    thread's stack before the default action ends it; waits up to ``grace`` s for it
    to exit."""
    proc.send_signal(signal.SIGTERM)
    end = time.monotonic() + grace
    while time.monotonic() < end and proc.poll() is None:
        time.sleep(0.2)


def _unittest_verdict(output: str) -> tuple[str, str]:
    """``(outcome, note)`` from the child's unittest output: passed, skipped or failed."""
    ran = _RAN.search(output)
    if ran is None or ran.group(1) != "1":
        return "failed", f"expected 1 test to run, got {ran.group(1) if ran else 'none'}"
    summary = output[ran.end() :]
    if not re.search(r"^OK\b", summary, re.M):
        return "failed", ""
    if re.search(r"^OK \(.*skipped=1", summary, re.M):
        reason = _SKIP_REASON.search(output)
        return "skipped", f"TF's test skipped itself: {reason.group(1) if reason else '?'}"
    return "passed", ""


def run_child(
    case: str,
    impl: str,
    log_dir: Path,
    timeout: float = CHILD_TIMEOUT,
    exit_grace: float = EXIT_GRACE,
) -> ChildResult:
    """Runs ``case`` (``Class.testName``) with ``impl``'s classes in a new session (and
    process group): ``python tests/tf_suite/tf_fault_tolerance.py CASE``, forked from
    the test clusters' fork server (``integration/forkserver.py``, which imported
    TensorFlow once; ``TFH_TEST_FORKSERVER=0`` starts it with ``subprocess.Popen``)."""
    log_path = log_dir / f"{case}.{impl}.log"
    env = dict(os.environ, **{IMPL_ENV: impl})
    start = time.monotonic()
    with open(log_path, "wb") as log:
        proc = popen(
            [sys.executable, str(MODULE), case],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=HERE.parent.parent,
            start_new_session=True,
        )
        try:
            how = _wait_exit(proc, log_path, timeout, exit_grace)
            if how != "exited":
                _dump_and_end(proc)
        finally:
            # The cluster's processes and multiprocessing's forkserver are in the
            # child's group, which keeps the group's id (the child's pid) while any of
            # them runs.
            _kill_group(proc.pid)
            code = proc.wait()
    seconds = time.monotonic() - start
    output = log_path.read_text(errors="replace")
    coordinator = _COORDINATOR_LINE.search(output)
    used = f"ClusterCoordinator: {coordinator.group(1)}" if coordinator else ""
    if how == "hang" and _RAN.search(output) is not None:
        how = "hang-at-exit"  # the bound ran out after unittest's result, before the grace
    if how == "hang":
        return ChildResult(impl, "hang", None, seconds, output, f"no exit within {timeout:.0f} s")
    if how == "hang-at-exit":
        said, _ = _unittest_verdict(output)
        note = (
            f"unittest reported the test {said}, then the process did not exit (stopped "
            f"at {seconds:.0f} s: a non-daemon thread or a finalizer still running at exit)"
        )
        return ChildResult(impl, "hang at exit", None, seconds, output, f"{note}; {used}")
    if coordinator is None:
        note = "tf_fault_tolerance.py did not say which ClusterCoordinator it used"
        return ChildResult(impl, "failed", code, seconds, output, note)
    outcome, note = _unittest_verdict(output)
    if code != 0 and outcome != "failed":
        outcome, note = "failed", f"unittest said {outcome} but the exit code is {code}"
    return ChildResult(impl, outcome, code, seconds, output, "; ".join(filter(None, [note, used])))


#: Lines of a child's output worth reading whatever its tail holds: what TF's tests
#: log about the error they check (``testWorkerPreemptionErrorType`` logs "Got
#: exception ... error message is ..." and then asserts on its text), and the
#: traceback's last lines (gRPC's errors can fill the last 60 lines at exit).
_NOTABLE = re.compile(r"Got exception|error message is|^\s*(?:\w+\.)*\w+Error\b|^Traceback")
NOTABLE_LINES = 20


def _notable(output: str) -> str:
    found = [ln for ln in output.splitlines() if _NOTABLE.search(ln)]
    return "\n".join(ln[:2000] for ln in found[-NOTABLE_LINES:])


def _report(results: list[ChildResult]) -> str:
    parts = []
    for r in results:
        notable = _notable(r.output)
        seen = f"-- lines of note --\n{notable}\n" if notable else ""
        parts.append(f"== {r.describe()}\n{seen}-- last {TAIL_LINES} lines --\n{r.tail()}")
    return "\n\n".join(parts)


@pytest.mark.timeout(2 * (CHILD_TIMEOUT + EXIT_GRACE + DUMP_GRACE) + 120)
@pytest.mark.parametrize("case", _cases())
def test_tf_fault_tolerance(case: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    props = request.node.user_properties
    ours = run_child(case, "ours", tmp_path)
    if ours.ok:
        decision = decide(case, None, None, EXPECTED_FAILURES, is_ci())
        own = "skipped by TF" if ours.outcome == "skipped" else "passed"
        props.append(("tf_suite", "listed, passed" if decision.message else own))
        # Visible with -s or -rA: a skip inside TF's test counts as a pass here.
        print(ours.describe())
        if decision.message:
            print(f"{case}: {decision.message}")
        return
    theirs = run_child(case, "tf", tmp_path)
    decision = decide(case, ours.signature, theirs.signature, EXPECTED_FAILURES, is_ci())
    report = _report([ours, theirs])
    if decision.verdict == "xfail":
        props.append(("tf_suite", "xfail listed" if decision.listed else "xfail not listed"))
        pytest.xfail(f"{decision.message}\n\n{report}")
    pytest.fail(f"{case}: {decision.message}\n\n{report}", False)
