"""The TF suite's lines in pytest's summary (``verdict.summary_lines``): per TF test
class, how many tests passed (and how many of those TF's own code skipped), were xfails
(listed in ``expected_failures.py`` or not), were skipped by pytest, and failed; then
the listed tests that passed, and the classes this run left out."""

from __future__ import annotations

import contextlib
import os

from portserver import ADDRESS_ENV, serving

_server = contextlib.ExitStack()


def pytest_configure(config) -> None:
    """TensorFlow's suite picks its tasks' ports with portpicker: through one port server
    (make test's, or this session's own), never from the ephemeral range
    (``tests/portserver.py`` says why)."""
    os.environ[ADDRESS_ENV] = _server.enter_context(serving())


def pytest_unconfigure(config) -> None:
    _server.close()


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    from tf_suite.test_tf_fault_tolerance import selected_classes, suite_class_names
    from tf_suite.verdict import summary_lines

    try:
        selected = selected_classes()
    except ValueError:
        return
    lines = summary_lines(terminalreporter.stats, selected, suite_class_names())
    if lines:
        terminalreporter.section("TensorFlow's fault-tolerance suite")
        for line in lines:
            terminalreporter.write_line(line)
