"""The written list of TF-suite tests that may be an ``xfail``: test id -> the signature
both our and TensorFlow's classes fail it with, and a one-line reason naming TF's defect.

Read by ``test_tf_fault_tolerance.py`` through ``verdict.decide``: under ``CI=true`` a
test that fails the same way with both classes but is not here, or not with the
signature written here, fails the run. A listed test that passes with ours is reported
in the run's summary ("listed, passed") but does not fail it: these tests kill and
restart processes on timers, and a failure caused by a race in TF's code can pass on a
quiet machine; failing CI for that pass would make CI's verdict depend on load. Remove
the entry once it has passed several runs in a row.

An entry is filled from real runs (``TFH_TF_SUITE_CLASSES=... pytest tests/tf_suite
-rx``, whose xfail reasons print the signature); line numbers are those of the TF 2.21
wheel's ``fault_tolerance_test_base.py``.
"""

from __future__ import annotations

from tf_suite.verdict import Expected, Signature  # noqa: F401 - the entries' types

EXPECTED_FAILURES: dict[str, Expected] = {}
