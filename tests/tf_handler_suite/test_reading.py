"""Unit tests of how ``run.py`` reads a run: absltest's status lines, the log's lines
per test, the notice check, the tests a file defines. No TensorFlow: synthetic output."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tf_handler_suite import cases, evidence, verdict

T = "__main__.PreemptionCheckpointTest."


def _log(tmp_path: Path, rows: list[str]) -> Path:
    path = tmp_path / "log.txt"
    path.write_text("\n".join(rows) + "\n")
    return path


def _line(t: float, pid: int, logger: str, message: str) -> str:
    return f"{t:.3f} pid={pid} {logger} INFO {message}"


def _marker(t: float, what: str, test: str) -> str:
    return _line(t, 1, "tf_handler_suite", f"tf_handler_suite {what} {T}{test}")


BUILT = "PreemptionCheckpointHandler initialized or restored: worker single_worker"
NOTICE = 'Preemption notice: {"stage": "notice", "pid": 1}'
SAVE_END = 'Preemption save_end: {"stage": "save_end", "pid": 1}'


def test_status_lines_give_each_ended_test_and_the_one_still_running():
    out = (
        "[ RUN      ] C.test_a\n[       OK ] C.test_a\n"
        "[ RUN      ] C.test_b\n[worker-0]:    noise\n[  FAILED  ] C.test_b\n"
        "[ RUN      ] C.test_session\n[  SKIPPED ] C.test_session - Not a test.\n"
        "[ RUN      ] C.test_c\n"
    )
    ended, running = verdict.from_output(out)
    assert {k: v.result for k, v in ended.items()} == {
        "C.test_a": "passed",
        "C.test_b": "failed",
        "C.test_session": "skipped",
    }
    assert ended["C.test_session"].message == "Not a test."
    assert running == "C.test_c"
    got = verdict.outcomes(Path("/nonexistent.xml"), out, "hang")
    assert got["C.test_c"].result == "hang"


def test_a_notice_logged_after_the_next_test_started_belongs_to_the_test_that_sent_it(tmp_path):
    log = _log(
        tmp_path,
        [
            _marker(1.0, "start", "test_a"),
            _line(1.1, 1, "tf_failure_handling", BUILT),
            _line(1.5, 1, "tensorflow", "Training finished."),
            _line(1.9, 1, "tensorflow", "sending sigterm"),
            _marker(2.0, "stop", "test_a"),
            _marker(2.0, "start", "test_b"),
            _line(2.01, 1, "tf_failure_handling", NOTICE),
            _line(2.1, 1, "tf_failure_handling", BUILT),
            _line(2.2, 1, "tensorflow", "sending sigterm"),
            _line(2.3, 1, "tf_failure_handling", NOTICE),
            _line(2.4, 1, "tf_failure_handling", SAVE_END),
            _line(2.5, 1, "tensorflow", "Training finished."),
            _marker(3.0, "stop", "test_b"),
        ],
    )
    per_test = evidence.read_log(log)
    a = evidence.check("ours", per_test[T + "test_a"], None)
    b = evidence.check("ours", per_test[T + "test_b"], None)
    assert (a.outcome, a.built) == ("late", True)
    assert (b.outcome, b.built) == ("saved", True)


@pytest.mark.parametrize(
    ("rows", "outcome"),
    [
        ([_line(1.1, 1, "tensorflow", "sending sigterm")], "missed"),
        ([], "no notice"),
        (
            [
                _line(1.1, 1, "tensorflow", "Training finished."),
                _line(1.2, 1, "tf_failure_handling", NOTICE),
            ],
            "late",
        ),
        (
            [
                _line(1.1, 1, "tensorflow", "sending sigterm"),
                _line(1.2, 1, "tf_failure_handling", NOTICE),
            ],
            "not saved",
        ),
    ],
)
def test_the_notice_check(tmp_path, rows, outcome):
    log = _log(
        tmp_path,
        [
            _marker(1.0, "start", "test_a"),
            _line(1.05, 1, "tf_failure_handling", BUILT),
            *rows,
            _marker(3.0, "stop", "test_a"),
        ],
    )
    got = evidence.check("ours", evidence.read_log(log)[T + "test_a"], None)
    assert got.outcome == outcome
    assert got.ok == (outcome in ("no notice", "late"))


def test_tf_s_own_lines_are_read_for_tf_s_classes(tmp_path):
    log = _log(
        tmp_path,
        [
            _marker(1.0, "start", "test_a"),
            _line(1.1, 7, "tensorflow", "PreemptionCheckpointHandler initialized or restored."),
            _line(1.2, 7, "tensorflow", "Member single_worker has received termination notice."),
            _line(1.3, 7, "tensorflow", "Checkpoint finished at path /x"),
            _marker(2.0, "stop", "test_a"),
        ],
    )
    lines = evidence.read_log(log)[T + "test_a"]
    assert evidence.check("tf", lines, None).outcome == "saved"
    # Ours was not the handler: its check says so.
    assert not evidence.check("ours", lines, None).built


def test_combination_names_are_tf_s(tmp_path):
    source = tmp_path / "x_test.py"
    source.write_text(
        "class T(object):\n"
        "  @combinations.generate(combinations.combine(b_arg=[True, False], a_arg=['MS', 'X_y']))\n"
        "  def test_one(self, a_arg, b_arg):\n    pass\n"
        "  def test_two(self):\n    pass\n"
    )
    assert cases.test_names(source) == [
        "T.test_one_test_aarg_MS_barg_True",
        "T.test_one_test_aarg_MS_barg_False",
        "T.test_one_test_aarg_Xy_barg_True",
        "T.test_one_test_aarg_Xy_barg_False",
        "T.test_two",
    ]
    assert cases.method_of("T.test_one_test_aarg_MS_barg_True") == "test_one"


def _notice_at(runs: int, in_run: bool) -> str:
    fields = {"stage": "notice", "source": "SIGTERM", "runs": runs, "in_run": in_run}
    return "Preemption notice: " + json.dumps(fields)


@pytest.mark.parametrize(
    ("runs", "in_run", "outcome"),
    [
        # The last run() (index 119 of 120) was under way, its check made: no step left.
        (119, True, "late"),
        # Every run() had completed: none left either.
        (120, False, "late"),
        # The last run() had not started: its check publishes 120, saved at the check of
        # a 121st call that never comes (RUN_TO_CHECKPOINT is the run count + 1).
        (119, False, "late"),
        # The fresh-clone run of 2026-12-02 (a GCE test of 30 runs, the notice during
        # run() index 28): the run before the last under way; the next check publishes
        # the training's length. Here, of 120:
        (118, True, "late"),
        # The run() before the last had not started: its check publishes 119, saved at
        # the last call's check. It had to save.
        (118, False, "not saved"),
        (117, True, "not saved"),
        (100, True, "not saved"),
    ],
)
def test_a_notice_during_the_last_step_is_late(tmp_path, runs, in_run, outcome):
    # The CI run of 2026-11-29: the SIGTERM came while the last step ran, before the
    # test logged "Training finished.", and nothing was saved.
    log = _log(
        tmp_path,
        [
            _marker(1.0, "start", "test_a"),
            _line(1.05, 1, "tf_failure_handling", BUILT),
            _line(1.1, 1, "tensorflow", "sending sigterm"),
            _line(1.2, 1, "tf_failure_handling", _notice_at(runs, in_run)),
            _line(1.3, 1, "tensorflow", "Training finished."),
            _marker(3.0, "stop", "test_a"),
        ],
    )
    got = evidence.check("ours", evidence.read_log(log)[T + "test_a"], None, last_step=120)
    assert got.outcome == outcome


@pytest.mark.parametrize(
    ("runs", "claimed", "outcome"),
    [
        # The notice came during index 100 of 120; the claim was won during the last
        # run(): the leader's first check that could publish came after it, at 120.
        (100, "; claimed at run count 119, a run() under way.", "late"),
        (100, "; claimed at run count 119.", "late"),
        # Won in time for the check at 118: it had to save.
        (100, "; claimed at run count 118.", "not saved"),
        (100, "; claimed at run count 117, a run() under way.", "not saved"),
    ],
)
def test_a_claim_won_too_late_to_publish_is_late(tmp_path, runs, claimed, outcome):
    """A leader publishes only once its claim is won: a claim slower than the steps left
    (a loaded machine) leaves no step to save at, as a late notice does."""
    from tf_failure_handling._protocol.notices import CLAIMED_IN_RUN

    assert claimed.endswith(".") and (CLAIMED_IN_RUN in claimed) == ("under way" in claimed)
    log = _log(
        tmp_path,
        [
            _marker(1.0, "start", "test_a"),
            _line(1.05, 1, "tf_failure_handling", BUILT),
            _line(1.1, 1, "tensorflow", "sending sigterm"),
            _line(1.2, 1, "tf_failure_handling", _notice_at(runs, True)),
            _line(
                1.3,
                1,
                "tf_failure_handling",
                "Member 0 has received termination notice (SIGTERM)" + claimed,
            ),
            _line(1.4, 1, "tensorflow", "Training finished."),
            _marker(3.0, "stop", "test_a"),
        ],
    )
    got = evidence.check("ours", evidence.read_log(log)[T + "test_a"], None, last_step=120)
    assert got.outcome == outcome


def _stage_line(stage: str, preemption: str, **fields) -> str:
    return f"Preemption {stage}: " + json.dumps(
        {"stage": stage, "preemption": preemption, **fields}
    )


@pytest.mark.parametrize(
    ("later_preemption", "outcome"),
    [
        # The fresh-clone run of 2026-12-02 (GCE test_multiple_workers_preempted_
        # consecutively, OneDevice): the mocked watcher fired while the handler was
        # being built; its notice line came before "initialized", then it saved.
        ("p-1", "saved"),
        # A notice of an earlier test's handler, logged before this one was built, with
        # a preemption of its own: not this test's.
        ("p-2", "missed"),
    ],
)
def test_a_notice_taken_while_the_handler_was_built_is_its_own(tmp_path, later_preemption, outcome):
    # The test before shares the main process (pid 1): a handler line before this
    # test's "initialized" goes to it, and ours' notice line to both.
    log = _log(
        tmp_path,
        [
            _marker(0.5, "start", "test_0"),
            _line(0.6, 1, "tf_failure_handling", BUILT),
            _marker(1.0, "start", "test_a"),
            _line(1.01, 1, "tensorflow", "Termination notice available."),
            _line(1.02, 1, "tf_failure_handling", _stage_line("notice", "p-1", runs=0)),
            _line(1.05, 1, "tf_failure_handling", BUILT),
            _line(1.06, 1, "tensorflow", "Termination notice available."),
            _line(1.1, 1, "tf_failure_handling", _stage_line("agreement", later_preemption)),
            _line(1.2, 1, "tf_failure_handling", _stage_line("save_end", later_preemption)),
            _marker(3.0, "stop", "test_a"),
        ],
    )
    got = evidence.check("ours", evidence.read_log(log)[T + "test_a"], None, last_step=120)
    assert got.outcome == outcome


def test_an_earlier_handlers_watcher_fn_firing_after_the_take_over_is_not_this_tests(tmp_path):
    """An earlier test's mocked GCE watcher, called before this test's handler took over,
    fires after it: ours logs that it drops it. That notice is no notice of this test."""
    # The core logs it (src/sources/watcher_fn.rs, WATCHER_FN_AFTER_TAKE_OVER).
    source = Path(__file__).resolve().parents[2] / "src" / "sources" / "watcher_fn.rs"
    found = re.search(r'WATCHER_FN_AFTER_TAKE_OVER: &str =\s*"([^"]*)"', source.read_text())
    assert found is not None, "the message's constant moved"
    WATCHER_FN_AFTER_TAKE_OVER = found.group(1)
    assert WATCHER_FN_AFTER_TAKE_OVER.startswith(evidence._WATCHER_FN_DROPPED)
    log = _log(
        tmp_path,
        [
            _marker(1.0, "start", "test_a"),
            _line(1.05, 1, "tf_failure_handling", BUILT),
            _line(1.1, 1, "tensorflow", "Termination notice available."),
            _line(1.11, 1, "tf_failure_handling", WATCHER_FN_AFTER_TAKE_OVER),
            _line(1.5, 1, "tensorflow", "Training finished."),
            _marker(3.0, "stop", "test_a"),
        ],
    )
    got = evidence.check("ours", evidence.read_log(log)[T + "test_a"], None)
    assert got.outcome == "no notice"


def test_failures_are_named_last_in_pytests_short_summary_form():
    from tf_handler_suite import run

    lines = {
        "a": run.Line("a", "f_test.py", "test_a", status="ok"),
        "b": run.Line("b", "g_test.py", "test_b", status="FAIL", why="hang\n after 900 s"),
    }
    assert run.failed_lines({"a": lines["a"]}) == []
    out = run.failed_lines(lines)
    assert out[0].startswith("=== short test summary info")
    assert out[1:] == ["FAILED tests/tf_handler_suite/run.py::g_test.py::b - hang after 900 s"]
