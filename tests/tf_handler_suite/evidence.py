"""Whether the handler under test heard the notice a test sent, and saved: a pass must
mean something.

TensorFlow's tests do not check it themselves: ``failure_handler_test.py`` sends its
SIGTERM once a Python thread sees an event set at the end of an epoch, and when training
ends first (its eight epochs take about half a second in one process) it checks
nothing; ``gce_failure_handler_test.py`` sends its notices through TensorFlow's
``failure_handling_util.termination_watcher_function_gce``, mocked (ours polls it, as
TF's handler does, once the mocked ``detect_platform`` says GCE:
``_platforms/tf_hooks.py``), and when training ends before the mock fires it checks
nothing either. This module reads, per test, what ``launcher.py`` kept:

* the log (``TFH_HANDLER_SUITE_LOG``): the package's lines (logger
  ``tf_failure_handling``), the test file's own (TF's logger: ``sending sigterm``,
  ``Training finished.``, the GCE mock's ``Termination notice available.``) and, with
  TF's classes, ``failure_handling.py``'s; each with its time and pid, a test's lines
  between its ``start`` and ``stop`` markers;
* with ours, the preemption records the handler wrote beside the checkpoints
  (``<checkpoint_dir>/preemption_records/*.jsonl``; none with a ``save_fn``), from the
  copy of the test's temporary folder.

and says, for a test that sent a notice, one of (:class:`Check`):

* ``saved``: the handler received it and a checkpoint was saved;
* ``late``: it received it, but only in processes whose training had already finished
  (``Training finished.`` logged before the notice) or, with ours, where no step was left
  to save at: its ``notice`` line says ``runs`` (``run()`` calls completed when it took
  the notice) and ``in_run`` (one under way, its check made), and its claim line the same
  when the claim was won (a leader publishes only then), so the leader's first check that
  can publish a step comes at run count ``runs + in_run`` and publishes one more
  (``RUN_TO_CHECKPOINT`` is the run count + 1, as in TensorFlow). A step is saved at the
  check of the ``run()`` after it, so a save needs a call with that run count: when that
  step, or the agreed step, is the training's length (``EPOCHS_TO_RUN *
  STEPS_PER_EPOCH``) or past it, no call is left to save at. The test checked nothing
  either;
* ``missed``: the test sent a notice, the handler logged none;
* ``not saved``: it received one while training, and nothing was saved;
* ``no notice``: the test sent none (``test_error_propagation``; a GCE test whose mock
  did not fire before training ended; a mock of an earlier test's handler that fired
  after this test's handler took over, which ours logs and drops).

and, for every test, whether the handler under test was built at all (its
``PreemptionCheckpointHandler initialized or restored`` line: with ours, from the
package's logger, so in every process the test started ``patch()`` had run).
Nothing here imports TensorFlow or the package.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

_LINE = re.compile(r"^(\d+\.\d+) pid=(\d+) (\S+) ([A-Z]+) (.*)$")
MARKER = "tf_handler_suite"
OURS_LOGGER = "tf_failure_handling"
TF_LOGGER = "tensorflow"

#: What the test file logs when it sends a notice (``failure_handler_test.py``: both
#: spellings), and what the GCE mock logs when it returns one.
_SENT = ("sending sigterm", "sending SIGTERM", "Termination notice available.")
_TRAINING_FINISHED = "Training finished."
#: Ours logs each record line as ``Preemption <stage>: <the line's JSON>``.
_OURS_STAGE = re.compile(r"^Preemption (\w+): (\{.*\})$")
#: TF's handler: a notice received (its own or a peer's), a checkpoint saved.
#: Ours' ``WATCHER_FN_AFTER_TAKE_OVER`` (src/sources/watcher_fn.rs; not imported: nothing
#: here imports the package), checked against it by tests/tf_handler_suite/test_reading.py.
_WATCHER_FN_DROPPED = "The termination_watcher_fn of an earlier handler fired after"
_TF_NOTICE = re.compile(r"^Member \S+ has received termination notice")
#: Ours, when this worker won the claim: the run count then and whether a run() was under
#: way (``notices.CLAIMED_IN_RUN``, checked by tests/tf_handler_suite/test_reading.py).
_OURS_CLAIMED = re.compile(
    r"^Member \S+ has received termination notice \(.*\); claimed at run count (\d+)"
    r"(, a run\(\) under way)?\.$"
)
_TF_SAVED = "Checkpoint finished at path"
_BUILT = "PreemptionCheckpointHandler initialized or restored"


@dataclass
class Line:
    time: float
    pid: int
    logger: str
    message: str


def read_log(path: Path) -> dict[str, list[Line]]:
    """The log's lines per test id; lines of a message's continuation (a traceback)
    are left out.

    A line belongs to the test whose ``start`` marker came last before it, with one
    exception: the tests of a file share their main process, whose handlers of earlier
    tests are still open (neither TF's tests nor TF's handler close them), and a test
    that sends itself SIGTERM ends right after sending it: the handler's lines about
    that notice can come after the next test started. So a line of the handler's
    loggers (ours, TF's ``failure_handling.py``) in the main process before that
    process's first ``initialized`` line in the test belongs to the test before (ours'
    notice lines belong to both: see :func:`check`)."""
    per_test: dict[str, list[Line]] = defaultdict(list)
    if not path.is_file():
        return per_test
    current = previous = None
    main_pid = None
    built_in_current = False
    for raw in path.read_text(errors="replace").splitlines():
        m = _LINE.match(raw)
        if m is None:
            continue
        line = Line(float(m.group(1)), int(m.group(2)), m.group(3), m.group(5))
        if line.logger == MARKER:
            what, _, test_id = line.message.partition(" ")[2].partition(" ")
            if what == "start":
                previous, current = current, test_id
                main_pid = line.pid
                built_in_current = False
                per_test[test_id]
            continue
        owner = current
        if line.pid == main_pid and _handler_line(line):
            if line.message.startswith(_BUILT):
                built_in_current = True
            elif not built_in_current and previous is not None:
                owner = previous
                stage = _stage(line)
                if stage is not None and stage[0] == "notice" and current:
                    # Ours watches from inside its constructor: this test's handler may
                    # have taken it. Kept here too; :func:`check` counts it only when a
                    # later stage line names its preemption.
                    per_test[current].append(line)
        if owner is not None:
            per_test[owner].append(line)
    return per_test


def _handler_line(line: Line) -> bool:
    """A line of the handler's own logging: ours, or TF's ``failure_handling.py`` (the
    test file logs through TF's logger too, but never these)."""
    if line.logger == OURS_LOGGER:
        return True
    return line.logger == TF_LOGGER and (
        line.message.startswith(_BUILT)
        or bool(_TF_NOTICE.match(line.message))
        or line.message.startswith(_TF_SAVED)
    )


def read_records(folder: Path) -> list[dict]:
    """Every record line under ``folder`` (any ``preemption_records`` folder in it)."""
    found = []
    if not folder.is_dir():
        return found
    for path in sorted(folder.rglob("preemption_records/*.jsonl")):
        for raw in path.read_text(errors="replace").splitlines():
            try:
                obj = json.loads(raw)
            except ValueError:
                continue
            if isinstance(obj, dict):
                found.append(obj)
    return found


@dataclass
class Check:
    """What the evidence says about one test."""

    outcome: str  # "saved", "late", "missed", "not saved", "no notice"
    built: bool
    detail: str = ""
    records: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.built and self.outcome in ("saved", "late", "no notice")


def _stage(line: Line) -> tuple[str, dict] | None:
    m = _OURS_STAGE.match(line.message)
    if m is None:
        return None
    try:
        fields = json.loads(m.group(2))
    except ValueError:
        return None
    return m.group(1), fields if isinstance(fields, dict) else {}


def check(impl: str, lines: list[Line], kept: Path | None, last_step: int | None = None) -> Check:
    """The check of one test from its log lines and (ours) its kept folder.

    A process's lines count from its first ``initialized`` line in the test: the tests
    of a file share their main process, where the handlers of earlier tests are still
    open (neither TF's tests nor TF's handler close them) and their last notice can be
    logged just after the next test started. Ours: a notice logged before that line
    counts when a later stage line names its preemption (the handler under test took it
    while it was being built)."""
    ours = impl == "ours"
    handler_logger = OURS_LOGGER if ours else TF_LOGGER
    built_at: dict[int, float] = {}
    finished: dict[int, float] = {}
    notices: dict[int, float] = {}
    agreed: dict[int, int] = {}
    # Ours: the run count at the leader's first check that could publish a step for the
    # process's first notice (after the notice, and after its claim was won).
    first_step: dict[int, int] = {}
    saves = 0
    # Ours: notice lines logged before their process's ``initialized`` line, by their
    # preemption id. The handler under test watches from inside its constructor, so a
    # notice can come (and be logged) before the constructor's last line; it is this
    # test's when a stage line of the same preemption follows the construction (an
    # earlier test's handler's notice has an id of its own).
    early: dict[str, Line] = {}

    def _take_notice(ln: Line, fields: dict) -> None:
        if ln.pid not in notices:
            runs = fields.get("runs")
            if isinstance(runs, int):
                first_step[ln.pid] = runs + (1 if fields.get("in_run") else 0)
        notices.setdefault(ln.pid, ln.time)

    for ln in lines:
        if ln.logger == handler_logger and ln.message.startswith(_BUILT):
            built_at.setdefault(ln.pid, ln.time)
        if ln.pid not in built_at:
            if ours and ln.logger == OURS_LOGGER:
                stage = _stage(ln)
                if stage is not None and stage[0] == "notice":
                    early.setdefault(str(stage[1].get("preemption")), ln)
            continue
        if ln.logger == TF_LOGGER and ln.message.startswith(_TRAINING_FINISHED):
            finished.setdefault(ln.pid, ln.time)
        elif ours and ln.logger == OURS_LOGGER:
            stage = _stage(ln)
            if stage is not None and stage[0] != "notice":
                noticed = early.pop(str(stage[1].get("preemption")), None)
                if noticed is not None and noticed.pid == ln.pid:
                    _take_notice(noticed, _stage(noticed)[1])
            if stage is not None and stage[0] == "notice":
                _take_notice(ln, stage[1])
            elif stage is None and (claimed := _OURS_CLAIMED.match(ln.message)):
                # A leader publishes only once its claim is won: its first check that
                # can publish is the first after the claim line.
                at_claim = int(claimed.group(1)) + (1 if claimed.group(2) else 0)
                first_step[ln.pid] = max(first_step.get(ln.pid, at_claim), at_claim)
            elif stage is not None and stage[0] == "agreement":
                step = stage[1].get("step")
                if isinstance(step, int):
                    agreed[ln.pid] = max(agreed.get(ln.pid, step), step)
            elif stage is not None and stage[0] == "save_end":
                saves += 1
        elif not ours and ln.logger == TF_LOGGER:
            if _TF_NOTICE.match(ln.message):
                notices.setdefault(ln.pid, ln.time)
            elif ln.message.startswith(_TF_SAVED):
                saves += 1
    # The GCE mock logs from the handler's own watcher thread: only a handler of this
    # test's counts (one of an earlier test, still open in the main process, polls too).
    sent = [
        ln
        for ln in lines
        if ln.logger == TF_LOGGER
        and ln.message.startswith(_SENT)
        and (ln.message.startswith(_SENT[:2]) or built_at.get(ln.pid, ln.time + 1) <= ln.time)
    ]
    if ours:
        # A call of an earlier test's mock under way when this test's handler took over
        # fires after it: ours logs that it drops it, and that notice is not this test's.
        dropped = sum(
            1
            for ln in lines
            if ln.logger == OURS_LOGGER and ln.message.startswith(_WATCHER_FN_DROPPED)
        )
        sent = sent[dropped:] if dropped else sent
    stages: dict[str, int] = {}
    if ours and kept is not None:
        for rec in read_records(kept):
            stage = str(rec.get("stage"))
            stages[stage] = stages.get(stage, 0) + 1
    built = bool(built_at)
    built_note = "" if built else "; the handler under test logged no construction"
    said = f"{len(sent)} sent, received in {len(notices)} process(es), {saves} save(s)"
    if stages:
        kept_lines = ", ".join(f"{k} {v}" for k, v in sorted(stages.items()))
        said += f"; records kept at the test's end: {kept_lines}"
    if not notices:
        return Check("missed" if sent else "no notice", built, said + built_note, stages)
    if not sent:
        # Seen with ours: a handler of this test took over the notice an earlier test's
        # SIGTERM gave a handler of that test, still open in the same process.
        said += "; the test itself sent none"
    if saves:
        return Check("saved", built, said + built_note, stages)

    def too_late(pid: int, t: float) -> bool:
        if pid in finished and finished[pid] <= t:
            return True
        # The step the leader's first check after the notice publishes (its run count
        # there + 1), or the agreed step, is the training's length or beyond: the save
        # would be at the check of a run() call that never comes.
        if last_step is None:
            return False
        return max(agreed.get(pid, -1), first_step.get(pid, -2) + 1) >= last_step

    if all(too_late(pid, t) for pid, t in notices.items()):
        said += "; each notice came after its process's training had ended or agreed on a "
        said += "step past its last"
        return Check("late", built, said + built_note, stages)
    return Check("not saved", built, said + built_note, stages)
