"""The written lists ``run.py`` judges a run against: each entry with its reason.

* :data:`EXPECTED_FAILURES`: tests that fail with ours and pass with TensorFlow's
  classes, for a known reason. A test here that fails is reported as listed and does not
  fail the run; one that passes is reported ("listed, passed": remove the entry once it
  passes run after run). Empty is the aim.
* :data:`TF_REFERENCE`: the tests that do not pass with TensorFlow's own classes on this
  machine (``run.py --impl tf``, by hand, at the commit that added an entry). With
  ``--impl ours`` every other test is taken to pass with TF's classes: a failure of ours
  is a defect unless it is listed above, and ``run.py`` re-runs it with TF's classes to
  say so (``--no-confirm`` leaves that out).
* :data:`NOTICE_UNHEARD`: test methods whose notice ours cannot hear: the check that ours
  received a notice and saved (``evidence.py``) cannot apply, and a pass says only that
  training ran to the end with ours. Keyed by ``(file, method)``.
* :data:`NOT_TESTS`: methods unittest collects that are not tests (TF's base class skips
  them); they are left out of every count.
"""

from __future__ import annotations

EXPECTED_FAILURES: dict[str, str] = {}

#: ``run.py --impl both`` at the commit that added this module (TF 2.21, 2 CPUs, build
#: of 502bf4e): TensorFlow's classes passed all 82 tests, 232 s one method a process
#: (101 s and 102 s for the two files as one process each, run by hand before).
TF_REFERENCE: dict[str, str] = {}

_GCE_MOCK = (
    "the test's notices come from TensorFlow's failure_handling_util."
    "termination_watcher_function_gce, mocked with mock.patch.object together with "
    "detect_platform (GCE_GPU); ours never calls either (it detects GCE by its own "
    "metadata probe and polls the metadata service itself), so no notice reaches ours, "
    "training runs to the end, and the test's own checks pass without a preemption"
)
NOTICE_UNHEARD: dict[tuple[str, str], str] = {
    ("gce_failure_handler_test.py", "test_basic_run"): _GCE_MOCK,
    ("gce_failure_handler_test.py", "test_multiple_workers_preempted_consecutively"): _GCE_MOCK,
    ("gce_failure_handler_test.py", "test_grace_period_continue_training"): _GCE_MOCK,
}

NOT_TESTS: dict[str, str] = {
    "test_session": (
        "TensorFlowTestCase.test_session, a deprecated helper named like a test: "
        "unittest collects it and TF's base class skips it ('Not a test.')"
    ),
}
