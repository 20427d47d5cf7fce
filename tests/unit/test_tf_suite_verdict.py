"""The TF suite's verdict (``tests/tf_suite/verdict.py``) on fake process outputs: the
failure signature read from each output, the rule that makes an xfail (same signature
with TF's classes, and under ``CI=true`` on the written list), the list itself, and the
summary's counts. No TensorFlow process runs."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from tf_suite.expected_failures import EXPECTED_FAILURES
from tf_suite.test_tf_fault_tolerance import (
    _BASE_RELPATH,
    _tensorflow_dir,
    base_test_names,
    suite_class_names,
)
from tf_suite.verdict import Expected, Signature, decide, signature, summary_lines

BASE = "/venv/lib/python3.11/site-packages/tensorflow/python/distribute/coordinator/"
BASE += "fault_tolerance_test_base.py"
CASE = "MultiWorkerFaultToleranceTest.testWorkerPreemptionErrorType"
LOG = "I1126 18:55:41.529155 140190033562496 cluster_coordinator.py:1336] Start cancelling\n"
SEP = "-" * 70
EQ = "=" * 70


def unittest_block(kind: str, traceback: str, test: str = "testWorkerPreemptionErrorType") -> str:
    return (
        f"{LOG}[  FAILED  ] MultiWorkerFaultToleranceTest.{test}\n{EQ}\n"
        f"{kind}: {test} (__main__.MultiWorkerFaultToleranceTest.{test})\n"
        f"MultiWorkerFaultToleranceTest.{test}\n{SEP}\n{traceback}\n{SEP}\n"
        f"Ran 1 test in 12.345s\n\nFAILED ({'failures' if kind == 'FAIL' else 'errors'}=1)\n"
    )


ASSERTION = f'''Traceback (most recent call last):
  File "{BASE}", line 370, in testWorkerPreemptionErrorType
    self.assertTrue(found)
  File "/usr/lib/python3.11/unittest/case.py", line 715, in assertTrue
    raise self.failureException(msg)
AssertionError: False is not true
'''

# Chained: the step is the innermost test-source frame of the last traceback.
UNAVAILABLE = f'''Traceback (most recent call last):
  File "/x/cluster_coordinator.py", line 10, in join
    raise ValueError("first")
ValueError: first

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "{BASE}", line 362, in testWorkerPreemptionErrorType
    run_fn()
  File "{BASE}", line 350, in run_fn
    coordinator.join()
  File "/x/tensorflow/python/framework/errors_impl.py", line 3, in join
    raise UnavailableError(None, None, "worker gone")
tensorflow.python.framework.errors_impl.UnavailableError: worker gone
  Additional GRPC error information: {{...}}
'''

# Cluster processes' output, relayed with a prefix, is not the test's traceback.
WORKER_NOISE = f'''[worker-0]:  Traceback (most recent call last):
[worker-0]:    File "{BASE}", line 1, in testOther
[worker-0]:  RuntimeError: not ours
'''

HANG_DUMP = f'''{LOG}Thread 0x00007f0000000002 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
  File "{BASE}", line 176 in _restart_fn
  File "/usr/lib/python3.11/threading.py", line 975 in run

Current thread 0x00007f0000000001 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
  File "/x/cluster_coordinator.py", line 99 in join
  File "{BASE}", line 480 in testWorkerContinuousFailure
  File "/usr/lib/python3.11/unittest/case.py", line 579 in _callTestMethod
  File "/repo/tests/tf_suite/tf_fault_tolerance.py", line 138 in <module>
'''

OK_SUMMARY = f"{LOG}[       OK ] X.testY\n{SEP}\nRan 1 test in 38.603s\n\nOK\n"


def test_failed_assertion():
    sig = signature("failed", 1, unittest_block("FAIL", ASSERTION))
    assert sig == Signature(
        "failed assertion",
        "AssertionError",
        "fault_tolerance_test_base.py:370 testWorkerPreemptionErrorType",
    )


def test_error_chained_tf_error_nested_function():
    sig = signature("failed", 1, WORKER_NOISE + unittest_block("ERROR", UNAVAILABLE))
    assert sig == Signature(
        "error", "tf.errors.UnavailableError", "fault_tolerance_test_base.py:350 run_fn"
    )


def test_hang_step_from_faulthandler_dump_of_the_test_thread():
    sig = signature("hang", None, HANG_DUMP)
    assert sig == Signature(
        "hang", "-", "fault_tolerance_test_base.py:480 testWorkerContinuousFailure"
    )
    assert signature("hang", None, LOG) == Signature("hang", "-", "?")


SETUP_DUMP = f'''Current thread 0x00007f0000000001 (most recent call first):
  File "/x/multi_process_runner.py", line 300 in start
  File "{BASE}", line 140 in setUp
  File "/repo/tests/tf_suite/tf_fault_tolerance.py", line 88 in setUp
  File "/usr/lib/python3.11/unittest/case.py", line 576 in _callSetUp
  File "/repo/tests/tf_suite/tf_fault_tolerance.py", line 138 in <module>
'''


def test_hang_in_setup():
    sig = signature("hang", None, LOG + SETUP_DUMP)
    assert sig == Signature("hang", "-", "fault_tolerance_test_base.py:140 setUp")


def test_hang_at_exit_keeps_what_unittest_said():
    assert signature("hang at exit", None, OK_SUMMARY) == Signature("hang at exit")
    # The bound ran out after unittest's result: a hang at exit, whatever the dump says.
    assert signature("hang", None, OK_SUMMARY + HANG_DUMP) == Signature("hang at exit")
    sig = signature("hang at exit", None, unittest_block("FAIL", ASSERTION))
    assert sig.kind == "hang at exit"
    assert sig.exception == "AssertionError"
    assert sig.step.endswith(":370 testWorkerPreemptionErrorType")


def test_crash_by_signal():
    out = OK_SUMMARY + "Fatal Python error: Segmentation fault\n\n" + HANG_DUMP.replace(LOG, "")
    sig = signature("failed", -11, out)
    assert sig == Signature(
        "crash (SIGSEGV)", "-", "fault_tolerance_test_base.py:480 testWorkerContinuousFailure"
    )


def test_no_test_ran_and_bad_exit():
    out = (
        "Traceback (most recent call last):\n"
        '  File "/repo/tests/tf_suite/tf_fault_tolerance.py", line 44, in <module>\n'
        "    import tf_failure_handling\n"
        "ModuleNotFoundError: No module named 'tf_failure_handling'\n"
    )
    assert signature("failed", 1, out) == Signature("error", "ModuleNotFoundError", "?")
    assert signature("failed", 3, OK_SUMMARY) == Signature("exit code 3")
    assert signature("passed", 0, OK_SUMMARY) is None
    assert signature("skipped", 0, OK_SUMMARY) is None


ASSERT_SIG = Signature("failed assertion", "AssertionError", "base.py:370 testX")
EXIT_SIG = Signature("hang at exit")
LISTED = {CASE: Expected(ASSERT_SIG, "TF's defect")}


@pytest.mark.parametrize("ci", [False, True])
def test_different_failures_are_not_an_xfail(ci):
    # The example: an assertion of ours, a hang at exit of TF's.
    d = decide(CASE, ASSERT_SIG, EXIT_SIG, LISTED, ci)
    assert d.verdict == "fail"
    assert "not the same way" in d.message and str(EXIT_SIG) in d.message
    assert decide(CASE, ASSERT_SIG, None, LISTED, ci).verdict == "fail"


def test_same_failure_needs_the_list_under_ci():
    assert decide(CASE, ASSERT_SIG, ASSERT_SIG, {}, ci=True).verdict == "fail"
    d = decide(CASE, ASSERT_SIG, ASSERT_SIG, {}, ci=False)
    assert (d.verdict, d.listed) == ("xfail", False)
    d = decide(CASE, ASSERT_SIG, ASSERT_SIG, LISTED, ci=True)
    assert (d.verdict, d.listed) == ("xfail", True)
    assert "TF's defect" in d.message


def test_listed_with_another_signature():
    other = Signature("error", "tf.errors.UnavailableError", "base.py:370 testX")
    assert decide(CASE, other, other, LISTED, ci=True).verdict == "fail"
    assert decide(CASE, other, other, LISTED, ci=False).verdict == "xfail"


def test_listed_test_that_passes_is_reported_not_failed():
    d = decide(CASE, None, None, LISTED, ci=True)
    assert d.verdict == "pass" and "listed" in d.message
    assert decide(CASE, None, None, {}, ci=True) == decide(CASE, None, None, {}, ci=False)


def test_the_written_list_names_real_tests_and_reasons():
    classes = set(suite_class_names())
    tf_dir = _tensorflow_dir()
    names = set(base_test_names(tf_dir / _BASE_RELPATH)) if tf_dir else None
    for case, entry in EXPECTED_FAILURES.items():
        cls, _, test = case.partition(".")
        assert cls in classes, case
        if names is not None:
            assert test in names, case
        assert entry.reason.strip() and "\n" not in entry.reason, case
        assert entry.signature.kind and entry.signature.step, case


def _report(nodeid_case: str, when: str, props: list | None = None, why: str = ""):
    return SimpleNamespace(
        nodeid=f"tests/tf_suite/test_tf_fault_tolerance.py::test_tf_fault_tolerance[{nodeid_case}]",
        when=when,
        user_properties=props or [],
        wasxfail=why,
    )


def test_summary_counts_per_class():
    m = "MultiWorkerFaultToleranceTest"
    s = "SingleWorkerFaultToleranceTest"
    stats = {
        "passed": [
            _report(f"{m}.testA", "call", [("tf_suite", "passed")]),
            _report(f"{m}.testA", "setup"),
            _report(f"{m}.testB", "call", [("tf_suite", "listed, passed")]),
            _report(f"{s}.testA", "call", [("tf_suite", "skipped by TF")]),
        ],
        "xfailed": [
            _report(f"{m}.testC", "call", [("tf_suite", "xfail listed")], "same (sig): why\n\n"),
            _report(f"{s}.testC", "call", [("tf_suite", "xfail not listed")]),
        ],
        "failed": [_report(f"{s}.testD", "call")],
        "": [SimpleNamespace(nodeid="tests/tf_suite/other.py::x", when="call")],
    }
    lines = summary_lines(stats, [m, s], [m, s, "MultiWorkerCoordinationServiceTest"])
    assert lines[0] == (
        f"TF suite ({m}): 2 passed, 1 xfail (1 listed, 0 not listed), 0 skipped, 0 failed"
    )
    assert lines[1] == (
        f"TF suite ({s}): 1 passed (1 skipped in TF's own code), 1 xfail "
        "(0 listed, 1 not listed), 0 skipped, 1 failed"
    )
    assert lines[2] == f"TF suite: {m}.testC: xfail listed; same (sig): why"
    assert lines[3] == f"TF suite: {s}.testC: xfail not listed; "
    assert f"{m}.testB passed with ours but is listed" in lines[4]
    assert "not run here: MultiWorkerCoordinationServiceTest" in lines[5]


class _NeverExits:
    """A child that runs until killed: poll() is None."""

    def poll(self):
        return None


def test_a_summary_printed_near_the_bound_still_gets_the_exit_grace(tmp_path):
    """CI: "Ran 1 test in 298 s" with a 300 s bound was killed 2 s later and called a
    hang at exit. Once the summary is out the exit has its whole grace, whatever the
    bound: here the bound (0 s) has passed at once, and the verdict waits for the grace."""
    from tf_suite.test_tf_fault_tolerance import _wait_exit

    log = tmp_path / "child.log"
    log.write_text("OK\nRan 1 test in 298.180s\n")
    start = time.monotonic()
    assert _wait_exit(_NeverExits(), log, timeout=0.0, exit_grace=1.5) == "hang-at-exit"
    assert time.monotonic() - start >= 1.5
    log.write_text("still running\n")
    assert _wait_exit(_NeverExits(), log, timeout=0.0, exit_grace=1.5) == "hang"
