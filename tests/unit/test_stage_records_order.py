"""The lines of one preemption stay one preemption whatever thread writes first, and the
notice's line comes first: the training thread can reach the agreement or the save
while the notice thread is still writing the ``notice`` line (the core answers the
notice first); its lines wait for it (``taking_notice``)."""

from __future__ import annotations

import itertools
import threading
from types import SimpleNamespace

from tf_failure_handling._protocol.records_hooks import StageRecords


class _Recorder:
    """The part of ``records.Recorder`` StageRecords writes through."""

    def __init__(self) -> None:
        self.current = None
        self.lines: list = []
        self._ids = itertools.count()

    def new_preemption(self) -> None:
        self.current = f"p{next(self._ids)}"

    def write(self, stage: str, **fields) -> None:
        self.lines.append((self.current, stage, fields))


def _stage() -> tuple:
    recorder = _Recorder()
    return recorder, StageRecords(recorder, SimpleNamespace(grace_period=0.0), "local 0")


def test_an_agreement_before_the_notice_line_is_one_preemption():
    recorder, stage = _stage()
    stage.agreement("RUN_TO_CHECKPOINT", 6)
    stage.notice("SIGTERM", None, "neither")
    stage.save_start("RUN_TO_CHECKPOINT", 6)
    assert [(p, s) for p, s, _ in recorder.lines] == [
        ("p0", "agreement"),
        ("p0", "notice"),
        ("p0", "save_start"),
    ]
    assert recorder.lines[1][2]["fits"] == "neither"


def test_a_second_notice_writes_nothing_and_a_tighter_one_a_replan_line():
    recorder, stage = _stage()
    stage.notice("SIGTERM", None, "both")
    stage.notice("SIGTERM", None, "both")
    stage.notice("aws", 100.0, "one_save", replan=True)
    assert [(p, s, f.get("replan")) for p, s, f in recorder.lines] == [
        ("p0", "notice", None),
        ("p0", "notice", True),
    ]


def test_a_peer_agreement_opens_the_preemption_with_a_peer_notice():
    recorder, stage = _stage()
    stage.peer_agreement("RUN_TO_CHECKPOINT", "6")
    stage.notice("SIGTERM", None, None)  # this worker's own, later: nothing more
    assert [(s, f.get("source")) for _, s, f in recorder.lines] == [
        ("notice", "peer"),
        ("agreement", None),
    ]


def test_a_stage_reached_while_the_notice_line_is_written_waits_for_it():
    """CI (make test, loaded): a local preemption's objects were agreement, save_start,
    notice: the training thread agreed and began the save while the notice thread was
    between the core's taking of the notice and its line. Success: the notice's line is
    first. Driven by events: the agreement is asked while the notice is taken."""
    recorder, stage = _stage()
    taken, agreed = threading.Event(), threading.Event()

    def training():
        assert taken.wait(60)
        stage.agreement("RUN_TO_CHECKPOINT", 6)
        agreed.set()

    t = threading.Thread(target=training)
    t.start()
    with stage.taking_notice():
        taken.set()
        # The agreement waits for this block: it cannot be written within it.
        assert not agreed.wait(0.5)
        stage.notice("SIGTERM", None, "unknown")
    t.join(60)
    assert agreed.is_set()
    assert [s for _, s, _ in recorder.lines] == ["notice", "agreement"]
