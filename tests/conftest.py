"""Suite-wide policy: under ``CI=true`` no test is skipped (see ``ci.py``).

Every skip, whatever raised it (``pytest.skip``, ``skipif``, ``importorskip``, at
collection or inside a test), is turned into a failure that keeps the skip's reason.
Expected failures (``xfail``) are not skips and are left alone.
"""

from __future__ import annotations

import pytest
from ci import is_ci


def _as_failure(report, where: str) -> None:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else longrepr
    report.outcome = "failed"
    report.longrepr = f"CI=true: {where} would have been skipped ({reason})"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if is_ci() and report.skipped and not hasattr(report, "wasxfail"):
        _as_failure(report, "this test")


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    report = outcome.get_result()
    if is_ci() and report.skipped:
        _as_failure(report, f"collecting {collector.nodeid or collector.name}")
