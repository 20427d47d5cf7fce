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

#: Empty since ours honours a replaced ``failure_handling_util.detect_platform`` and polls
#: TensorFlow's ``termination_watcher_function_gce`` as TensorFlow does
#: (``_platforms/tf_hooks.py``): the GCE tests' mocked notices reach ours. Before that,
#: all three GCE methods were listed here, and whether they passed depended on their
#: 30 steps finishing within the test's 30 s wait (CI, loaded: they did not).
NOTICE_UNHEARD: dict[tuple[str, str], str] = {}

NOT_TESTS: dict[str, str] = {
    "test_session": (
        "TensorFlowTestCase.test_session, a deprecated helper named like a test: "
        "unittest collects it and TF's base class skips it ('Not a test.')"
    ),
}
