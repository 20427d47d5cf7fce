"""User callbacks that misbehave: the documented fallbacks, and nothing saved is lost.

* A ``termination_watcher_fn`` that blocks delays only its own polling thread:
  other notices are still acted on, and ``close()`` does not wait for it.
* An ``exit_fn`` that returns instead of ending the process: the checkpoint is
  complete, a warning says so, and training goes on without further handling.
* A ``save_fn`` that fails: the error reaches the caller, and the checkpoint
  saved before it is intact.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest
from tf_failure_handling import TerminationConfig, testing

from .conftest import RecordingCheckpoint, wait_for_attention, wait_until


def test_a_blocking_watcher_fn_does_not_hide_other_notices(make_handler, tmp_path):
    release = threading.Event()
    calls = []

    def blocking_watcher() -> bool:
        calls.append(time.monotonic())
        release.wait(30)
        return False

    ckpt = RecordingCheckpoint(w=testing.FakeVariable(0))
    h = make_handler(
        ckpt, tmp_path / "ckpt", TerminationConfig(termination_watcher_fn=blocking_watcher)
    )
    try:
        wait_until(lambda: calls, what="the watcher fn to be called")
        h._notify_termination()  # any other source: a signal, a metadata notice
        wait_for_attention(h)
        with pytest.raises(SystemExit) as info:
            for _ in range(3):
                h.run(lambda: None)
        assert info.value.code == 42
        assert ckpt.saved_runs == [1]
        started = time.monotonic()
        h.close()  # the watcher fn stays blocked until `release`: waiting for it would hang
        assert time.monotonic() - started < 30.0, "close() waited for the blocked watcher fn"
    finally:
        release.set()
        # Let the released call finish here, not in (and log into) the next test.
        poller = h._driver.sources._poller
        poller.join(30.0)
        assert not poller.is_alive()


def test_a_slow_watcher_fn_is_reported_once(make_handler, tmp_path, caplog, monkeypatch):
    import functools

    from tf_failure_handling import _native
    from tf_failure_handling._platforms import notice_sources as _sources

    # The core's schedule, quicker: a call every 10 ms, one over 50 ms is slow.
    quick = functools.partial(_native.WatcherFnPoll, interval=0.01, slow=0.05)
    monkeypatch.setattr(_sources, "WatcherFnPoll", quick)
    calls = []

    def slow_watcher() -> bool:
        calls.append(1)
        time.sleep(0.1)
        return False

    caplog.set_level(logging.WARNING, logger="tf_failure_handling")
    h = make_handler(
        RecordingCheckpoint(w=testing.FakeVariable(0)),
        tmp_path / "ckpt",
        TerminationConfig(termination_watcher_fn=slow_watcher),
    )
    wait_until(lambda: len(calls) >= 3, what="three watcher fn calls")
    h.close()
    slow = [r for r in caplog.records if "termination_watcher_fn took" in r.getMessage()]
    assert len(slow) == 1, [r.getMessage() for r in caplog.records]


def test_an_exit_fn_that_returns_leaves_a_complete_checkpoint(make_handler, tmp_path, caplog):
    exits = []
    w = testing.FakeVariable(0)
    ckpt = RecordingCheckpoint(w=w)
    caplog.set_level(logging.WARNING, logger="tf_failure_handling")
    h = make_handler(ckpt, tmp_path / "ckpt", TerminationConfig(exit_fn=lambda: exits.append(1)))
    for _ in range(3):
        h.run(lambda: w.assign_add(1))
    h._notify_termination()
    wait_for_attention(h)
    for _ in range(5):  # no SystemExit: training goes on
        h.run(lambda: w.assign_add(1))
    assert exits == [1]
    # Local mode agrees on the next run, as TF: run 4.
    assert ckpt.saved_runs == [4], "saved once, at the agreed step, and never again"
    assert h._run_counter == 8
    assert any("exit_fn returned" in r.getMessage() for r in caplog.records)
    # A later notice is not acted on (the handler is done), and nothing is overwritten.
    h._notify_termination()
    for _ in range(3):
        h.run(lambda: w.assign_add(1))
    assert exits == [1] and ckpt.saved_runs == [4]

    # The checkpoint restores run 4 with the state of run 4.
    w2 = testing.FakeVariable(0)
    h2 = make_handler(RecordingCheckpoint(w=w2), tmp_path / "ckpt")
    assert h2._run_counter == 4 and w2.numpy() == 4


def test_a_failing_save_fn_keeps_the_previous_checkpoint(make_handler, tmp_path):
    directory = tmp_path / "ckpt"
    w = testing.FakeVariable(0)
    h = make_handler(RecordingCheckpoint(w=w), directory)
    for _ in range(2):
        h.run(lambda: w.assign_add(1))
    h._notify_termination()
    wait_for_attention(h)
    with pytest.raises(SystemExit):
        for _ in range(3):
            h.run(lambda: w.assign_add(1))
    h.close()
    saved = sorted(p.name for p in directory.iterdir())

    def failing_save(*args, **kwargs):
        raise OSError("disk full")

    w = testing.FakeVariable(0)
    h = make_handler(RecordingCheckpoint(w=w), directory, TerminationConfig(save_fn=failing_save))
    assert h._run_counter == 3
    h.run(lambda: w.assign_add(1))
    h._notify_termination()
    wait_for_attention(h)
    with pytest.raises(OSError, match="disk full"):
        for _ in range(3):
            h.run(lambda: w.assign_add(1))
    assert sorted(p.name for p in directory.iterdir()) == saved
    w3 = testing.FakeVariable(0)
    h3 = make_handler(RecordingCheckpoint(w=w3), directory)
    assert h3._run_counter == 3 and w3.numpy() == 3
