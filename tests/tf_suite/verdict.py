"""How a TF-suite test failed, and whether that failure may be an ``xfail``.

A test of TensorFlow's fault-tolerance suite that fails with our ``ClusterCoordinator``
runs again with TensorFlow's own classes. It is an ``xfail`` only when both runs fail
*the same way*: their :class:`Signature` s, parsed from each process's output by
:func:`signature`, are equal. Under ``CI=true`` it must also be on the written list,
:data:`tf_suite.expected_failures.EXPECTED_FAILURES`, with that same signature
(:func:`decide`). Nothing here imports TensorFlow.

A signature is three fields:

* ``kind``: ``failed assertion`` (unittest's ``FAIL``), ``error`` (unittest's
  ``ERROR``), ``hang`` (no exit within the bound), ``hang at exit`` (still running
  after unittest printed its result), ``crash (SIGSEGV)`` (killed by a signal of its
  own), ``exit code N`` (a non-zero exit unittest did not explain);
* ``exception``: the type of the exception the test raised, TensorFlow's error classes
  as ``tf.errors.X`` (``AssertionError``, ``tf.errors.UnavailableError``); ``-`` when
  none was raised (a hang, a crash without a traceback);
* ``step``: the failing step of the test, the innermost frame in the test's own source
  (``fault_tolerance_test_base.py``, or ``tf_fault_tolerance.py`` for the tests it
  defines): ``file:line function``. For a hang it is read from the stacks faulthandler
  dumps when the process gets SIGTERM (absltest registers that): the innermost
  test-source frame of the main thread (``setUp``, the test method, a function it
  calls). ``-`` when the test finished (a hang at exit after a passing test; a hang
  after unittest printed its result is one), ``?`` when no frame was found.

Line numbers are those of the TensorFlow wheel in ``.venv`` (TF 2.21); a new TF
release moves them, and the list's entries with them.
"""

from __future__ import annotations

import re
import signal
from collections import Counter, defaultdict
from dataclasses import dataclass

#: The files whose frames are the test's steps.
TEST_SOURCES = ("fault_tolerance_test_base.py", "tf_fault_tolerance.py")

_TF_ERRORS = "tensorflow.python.framework.errors_impl."
_BLOCK = re.compile(
    r"^(FAIL|ERROR): (\S+)[^\n]*\n(.*?)(?=^Ran \d+ tests? in |^={70}$|\Z)", re.M | re.S
)
_TRACEBACK = "Traceback (most recent call last):"
# A frame of a traceback (``File "p", line 3, in f``) or of a faulthandler dump
# (``File "p", line 3 in f``), at the start of a line: the cluster's processes'
# output that multi_process_runner relays starts with ``[worker-0]:`` and is left out.
_FRAME = re.compile(r'^ {2}File "([^"]+)", line (\d+),? in (\S+)', re.M)
_THREAD = re.compile(r"^(?:Current thread|Thread) 0x[0-9a-f]+ [^\n]*\n", re.M)
_RAN = re.compile(r"^Ran (\d+) tests? in ", re.M)


@dataclass(frozen=True)
class Signature:
    kind: str
    exception: str = "-"
    step: str = "-"

    def __str__(self) -> str:
        return f"{self.kind}, {self.exception}, at {self.step}"


@dataclass(frozen=True)
class Expected:
    """An entry of the written list: the signature both classes fail with, and why."""

    signature: Signature
    reason: str


def _exception_type(line: str) -> str:
    name = line.split(":", 1)[0].strip()
    if name.startswith(_TF_ERRORS):
        return "tf.errors." + name[len(_TF_ERRORS) :]
    return name or "?"


def _step(frames: list[tuple[str, str, str]]) -> str:
    """``file:line function`` of the innermost frame in the test's sources, or ``?``.
    ``frames`` are ``(path, line, function)``, outermost first."""
    for path, line, func in reversed(frames):
        name = path.rsplit("/", 1)[-1]
        if name in TEST_SOURCES and func != "<module>":
            return f"{name}:{line} {func}"
    return "?"


def parse_traceback(text: str) -> tuple[str, str] | None:
    """``(exception type, step)`` of the last traceback in ``text`` (the one raised out
    of the test when exceptions are chained), or None without one."""
    at = text.rfind(_TRACEBACK)
    if at < 0:
        return None
    lines = text[at + len(_TRACEBACK) :].splitlines()[1:]
    body = []
    exc = "?"
    for line in lines:
        if line.startswith(" ") or not line.strip():
            body.append(line)
            continue
        exc = _exception_type(line)
        break
    frames = _FRAME.findall("\n".join(body))
    return exc, _step(frames)


def _stacks(text: str) -> list[list[tuple[str, str, str]]]:
    """The thread stacks faulthandler dumped in ``text``, each outermost frame first
    (faulthandler prints the most recent call first)."""
    heads = list(_THREAD.finditer(text))
    stacks = []
    for i, head in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
        frames = []
        for line in text[head.end() : end].splitlines():
            m = _FRAME.match(line)
            if m is None:
                break
            frames.append(m.groups())
        stacks.append(frames[::-1])
    return stacks


def _is_main(frames: list[tuple[str, str, str]]) -> bool:
    """Whether a stack is the main thread's: it runs ``tf_fault_tolerance.py`` itself."""
    return any(p.rsplit("/", 1)[-1] == TEST_SOURCES[1] and f == "<module>" for p, _, f in frames)


def hang_step(text: str) -> str:
    """The step a hung test was at: the innermost test-source frame of the main thread in
    the last dump faulthandler printed (``setUp``, a ``test*`` method, a function it
    calls), else of the last stack running a ``test*`` function of those sources."""
    stacks = _stacks(text)
    for frames in reversed(stacks):
        if _is_main(frames):
            return _step(frames)
    for frames in reversed(stacks):
        if any(p.rsplit("/", 1)[-1] in TEST_SOURCES and f.startswith("test") for p, _, f in frames):
            return _step(frames)
    return "?"


def _unittest_failure(output: str) -> Signature | None:
    """The signature of the test unittest reported as FAIL or ERROR, if it did."""
    blocks = list(_BLOCK.finditer(output))
    if not blocks:
        return None
    block = blocks[-1]
    kind = "failed assertion" if block.group(1) == "FAIL" else "error"
    parsed = parse_traceback(block.group(3))
    exc, step = parsed if parsed else ("?", "?")
    return Signature(kind, exc, step)


def _signal_name(returncode: int) -> str:
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def signature(outcome: str, returncode: int | None, output: str) -> Signature | None:
    """How one run of one test failed, from its outcome (``run_child``'s: passed,
    skipped, failed, hang, hang at exit), exit code (None when we killed it) and
    output; None when it did not fail."""
    if outcome in ("passed", "skipped"):
        return None
    failure = _unittest_failure(output)
    if outcome == "hang" and _RAN.search(output) is not None:
        # The bound ran out after unittest's result, before the exit grace did.
        outcome = "hang at exit"
    if outcome == "hang":
        return Signature("hang", "-", hang_step(output))
    if outcome == "hang at exit":
        if failure is None:
            return Signature("hang at exit")
        return Signature("hang at exit", failure.exception, failure.step)
    if returncode is not None and returncode < 0:
        # faulthandler (absl enables it) prints the crashing thread's stack.
        return Signature(f"crash ({_signal_name(returncode)})", "-", hang_step(output))
    if failure is not None:
        return failure
    if _RAN.search(output) is None:
        # It never got to run the test: an import error, a sys.exit of the module.
        parsed = parse_traceback(output)
        if parsed is not None:
            return Signature("error", *parsed)
    return Signature(f"exit code {returncode}")


@dataclass(frozen=True)
class Decision:
    """What the pytest test does: ``pass``, ``xfail`` or ``fail``, with a message."""

    verdict: str
    message: str
    listed: bool = False


def decide(
    case: str,
    ours: Signature | None,
    theirs: Signature | None,
    expected: dict[str, Expected],
    ci: bool,
) -> Decision:
    """The verdict on ``case`` from the two runs' signatures (``theirs`` is None when
    TF's classes passed, or did not run because ours passed) and the written list."""
    entry = expected.get(case)
    if ours is None:
        if entry is not None:
            return Decision("pass", f"passes with ours, but listed as failing: {entry.reason}")
        return Decision("pass", "")
    if theirs is None:
        return Decision("fail", f"fails with ours ({ours}), passes with TensorFlow's classes")
    if ours != theirs:
        return Decision(
            "fail",
            f"fails with ours and with TensorFlow's classes, but not the same way: "
            f"ours {ours}; TensorFlow's {theirs}",
        )
    if entry is None:
        msg = f"fails the same way with TensorFlow's classes ({ours}), and is not listed"
        if ci:
            return Decision("fail", f"CI=true: {msg} in tests/tf_suite/expected_failures.py")
        return Decision("xfail", f"{msg} (under CI=true this fails)")
    if entry.signature != ours:
        msg = (
            f"fails the same way with TensorFlow's classes ({ours}), but the list expects "
            f"{entry.signature}"
        )
        if ci:
            return Decision("fail", f"CI=true: {msg}")
        return Decision("xfail", f"{msg} (under CI=true this fails)")
    return Decision(
        "xfail", f"fails the same way with TensorFlow's classes ({ours}): {entry.reason}", True
    )


# ------------------------------------------------------------ the summary

_CASE = re.compile(r"test_tf_fault_tolerance\[(\w+)\.(\w+)\]")


def _class_counts(stats: dict) -> tuple[dict[str, Counter], list[str], list[str]]:
    """Outcome counts per TF class, the listed tests that passed, and a line per xfail
    (its reason's first line, which has the signature), from the reports."""
    seen: dict[str, tuple[str, str]] = {}
    xfails = []
    for category, reports in stats.items():
        for report in reports:
            m = _CASE.search(getattr(report, "nodeid", "") or "")
            if m is None or getattr(report, "when", "call") not in ("setup", "call", "teardown"):
                continue
            props = dict(getattr(report, "user_properties", ()))
            if category == "xfailed":
                what = props.get("tf_suite", "xfail not listed")
                why = (getattr(report, "wasxfail", "") or "").strip().splitlines()
                xfails.append(f"{m.group(1)}.{m.group(2)}: {what}; {why[0] if why else ''}")
            elif category in ("failed", "error"):
                what = "failed"
            elif category == "skipped":
                what = "skipped"
            elif category == "passed" and report.when == "call":
                what = props.get("tf_suite", "passed")
            else:
                continue
            key = f"{m.group(1)}.{m.group(2)}"
            if seen.get(key, ("", ""))[1] != "failed":  # a failure anywhere wins
                seen[key] = (m.group(1), what)
    counts: dict[str, Counter] = defaultdict(Counter)
    stale = []
    for key, (cls, what) in sorted(seen.items()):
        counts[cls][what] += 1
        if what == "listed, passed":
            stale.append(key)
    return counts, stale, sorted(xfails)


def summary_lines(stats: dict, selected: list[str], available: list[str]) -> list[str]:
    counts, stale, xfails = _class_counts(stats)
    lines = []
    for cls in selected:
        c = counts.get(cls, Counter())
        passed = c["passed"] + c["skipped by TF"] + c["listed, passed"]
        xfail = c["xfail listed"] + c["xfail not listed"]
        own_skip = f" ({c['skipped by TF']} skipped in TF's own code)" if c["skipped by TF"] else ""
        lines.append(
            f"TF suite ({cls}): {passed} passed{own_skip}, {xfail} xfail "
            f"({c['xfail listed']} listed, {c['xfail not listed']} not listed), "
            f"{c['skipped']} skipped, {c['failed']} failed"
        )
    lines.extend(f"TF suite: {x}" for x in xfails)
    for key in stale:
        lines.append(
            f"TF suite: {key} passed with ours but is listed in expected_failures.py "
            "(remove the entry once it passes run after run)"
        )
    left = [c for c in available if c not in selected]
    if left:
        lines.append(
            f"TF suite: not run here: {', '.join(left)} (TFH_TF_SUITE_CLASSES=all, "
            "make tf-suite-all)"
        )
    return lines
