"""How each test of a run went, from what absltest wrote, and what that means.

A run of one test file (or of one test method's combinations: ``run.py`` starts one
process per method) writes:

* ``--xml_output_file``: absltest's JUnit XML, one ``testcase`` per test, with a
  ``failure`` or ``error`` element and its message, ``status="notrun"`` when skipped;
  written when the run ends, so none after a hang or a crash;
* its output: absltest's ``[ RUN      ] Class.test`` line when a test starts and
  ``[       OK ]``, ``[  FAILED  ]`` or ``[  SKIPPED ] Class.test - reason`` when it ends.

:func:`outcomes` reads the XML when there is one, else the output: a test that started
and never ended is the one the run hung in (or crashed in), the tests after it did not
run. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import os
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

_RESULTS = {"OK": "passed", "FAILED": "failed", "SKIPPED": "skipped"}
_STATUS = re.compile(r"^\[ *(RUN|OK|FAILED|SKIPPED) *\] (\S+)(?: - (.*))?$", re.M)


@dataclass
class Outcome:
    """One test's result: ``passed``, ``failed``, ``skipped``, ``hang`` (the run stopped
    in it), ``crash`` (the run died in it) or ``not run``."""

    result: str
    message: str = ""
    seconds: float | None = None

    @property
    def ok(self) -> bool:
        return self.result == "passed"


def _short(test_id: str) -> str:
    """``Class.test`` of ``__main__.Class.test``."""
    parts = test_id.split(".")
    return ".".join(parts[-2:])


_FRAME = re.compile(r'^ *File "([^"]+)", line (\d+), in (\S+)', re.M)
_EXC_TYPE = re.compile(r"<class '([^']+)'>")
#: The test files: the innermost frame in one of them is the failing step.
TEST_SOURCES = ("failure_handler_test.py", "gce_failure_handler_test.py")


def describe(element: ET.Element) -> str:
    """``AssertionError: True is not false, at gce_failure_handler_test.py:267 worker_fn``
    from absltest's ``failure`` or ``error`` element (its traceback in the text)."""
    raw_type = element.get("type", "")
    m = _EXC_TYPE.match(raw_type)
    exc = (m.group(1) if m else raw_type).rsplit(".", 1)[-1]
    message = (element.get("message") or "").strip().splitlines()
    said = f"{exc}: {message[0]}" if message else exc
    steps = [
        f"{os.path.basename(p)}:{n} {f}"
        for p, n, f in _FRAME.findall(element.text or "")
        if os.path.basename(p) in TEST_SOURCES
    ]
    return f"{said}, at {steps[-1]}" if steps else said


def from_xml(path: Path) -> dict[str, Outcome]:
    found = {}
    root = ET.parse(path).getroot()
    for case in root.iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}.{case.get('name')}"
        seconds = float(case.get("time") or 0.0)
        bad = [c for c in case if c.tag in ("failure", "error")]
        if bad:
            found[name] = Outcome("failed", describe(bad[0]), seconds)
        elif case.get("status") == "notrun":
            found[name] = Outcome("skipped", "", seconds)
        else:
            found[name] = Outcome("passed", "", seconds)
    return found


def from_output(text: str) -> tuple[dict[str, Outcome], str | None]:
    """The ended tests of absltest's status lines, and the one that started and did
    not end (None if every started test ended)."""
    found: dict[str, Outcome] = {}
    running = None
    for m in _STATUS.finditer(text):
        tag, name, reason = m.group(1), _short(m.group(2)), m.group(3) or ""
        if tag == "RUN":
            running = name
            continue
        found[name] = Outcome(_RESULTS[tag], reason)
        if running == name:
            running = None
    return found, running


def outcomes(xml_path: Path, output: str, how: str) -> dict[str, Outcome]:
    """Every test the run reported. ``how`` is how the process ended: ``exited``,
    ``hang`` (killed at the bound), ``hang at exit`` (killed after its results)."""
    ended, running = from_output(output)
    if xml_path.is_file() and xml_path.stat().st_size:
        try:
            found = from_xml(xml_path)
        except ET.ParseError:
            found = {}
        for name, outcome in found.items():
            # The skip reason is only in the output.
            if outcome.result == "skipped" and name in ended:
                outcome.message = ended[name].message
        if found:
            return found
    if running is not None:
        result = "hang" if how == "hang" else "crash"
        said = "was stopped" if result == "hang" else "ended"
        ended[running] = Outcome(result, f"the run {said} in it ({how})")
    return ended
