"""The protocol driver's inbox: every input arrives in one place and none is lost.

``_native.Inbox`` (``src/inbox.rs``) carries the notices of every source, the step keys
the reader posts, a reader's failure and the stop of ``close()``; one driver loop
(``Driver._drive``, ``_protocol/driver.py``) takes them. The outcomes that count
as success:

* the binding keeps the inbox's contract (order, stop, drain, timeouts, a failure's
  exception object intact);
* a notice, a step key and a stop that arrive together are all dealt with: the step
  key is acknowledged, the notices are counted as handled (not claimed: the handler is
  closing), and the driver ends;
* an acknowledgement is never queued behind a claim's retries: with the claim failing
  until the test lets it through, the acknowledgement is written first.

No verdict depends on timing: the driver is held inside a call, or the claim fails,
until the test has posted what it needs; timeouts only turn a hang into a failure.
"""

from __future__ import annotations

import threading
import time

import pytest
from tf_failure_handling import (
    PreemptionWatcher,
    TerminationConfig,
    _errors,
    _native,
    testing,
)
from tf_failure_handling._platforms import notice_sources as _sources
from tf_failure_handling._platforms import platform as _platform
from tf_failure_handling._protocol import keys

from .conftest import HANG, wait_until

CLUSTER = {"worker": ["localhost:0", "localhost:1"]}
ACK_0 = "RECEIVED_SIGNAL_RUN_TO_CHECKPOINT_0"


# ------------------------------------------------------------ the binding


def test_inbox_order_stop_and_drain_through_the_binding():
    inbox = _native.Inbox()
    assert inbox.recv(0) is None, "an empty inbox answers a zero timeout with None"
    assert inbox.post(_native.Inbox.Input.Notice("a metadata service", deadline=123.0))
    assert inbox.post(_native.Inbox.Input.StepKey("RUN_TO_CHECKPOINT", "7"))
    assert inbox.post(_native.Inbox.Input.KeyReadFailed("LAST_RUN_TO_CHECKPOINT"))

    first = inbox.recv(0)  # queued inputs are served even with no time left
    assert isinstance(first, _native.Inbox.Input.StepKey)
    assert (first.round, first.value) == ("RUN_TO_CHECKPOINT", "7")
    second = inbox.recv(HANG)
    assert isinstance(second, _native.Inbox.Input.KeyReadFailed)
    assert second.round == "LAST_RUN_TO_CHECKPOINT"
    third = inbox.recv(HANG)
    assert isinstance(third, _native.Inbox.Input.Notice)
    assert (third.source, third.signal, third.deadline) == ("a metadata service", None, 123.0)

    with pytest.raises(ValueError, match="not a step key"):
        inbox.post(_native.Inbox.Input.StepKey("SOME_KEY", "1"))

    assert inbox.post(_native.Inbox.Input.Notice("before the stop"))
    assert inbox.post(_native.Inbox.Input.Stop())
    assert isinstance(inbox.recv(), _native.Inbox.Input.Stop), "stop wins and never blocks"
    assert isinstance(inbox.recv(), _native.Inbox.Input.Stop), "stop is sticky"
    assert not inbox.post(_native.Inbox.Input.Notice("after the stop"))
    assert not inbox.post(_native.Inbox.Input.StepKey("RUN_TO_CHECKPOINT", "8"))
    left = inbox.drain()
    assert [type(i) for i in left] == [_native.Inbox.Input.Notice]
    assert left[0].source == "before the stop"


def test_a_readers_failure_reaches_the_driver_with_its_exception():
    """The inbox carries the round; the notice sources hand the driver the exception
    object itself (TF's type, its message)."""
    sources = _sources.NoticeSources(_platform.environment(), [], watch_metadata=False)
    try:
        error = _errors.make("UnavailableError", "the service is gone")
        assert sources.read_failed("LAST_RUN_TO_CHECKPOINT", error)
        failed = sources.receive(HANG)
        assert isinstance(failed, _sources.KeyReadFailed)
        assert failed.round_key == "LAST_RUN_TO_CHECKPOINT"
        assert failed.error is error, "the exception object (TF's type) reaches the driver"
    finally:
        sources.close()
    assert not sources.read_failed("LAST_RUN_TO_CHECKPOINT", error), "closed: refused"


def test_stop_from_another_thread_wakes_a_blocked_receive():
    inbox = _native.Inbox()
    got = []
    receiver = threading.Thread(target=lambda: got.append(inbox.recv()))
    receiver.start()
    assert inbox.post(_native.Inbox.Input.Stop())
    receiver.join(HANG)
    assert not receiver.is_alive(), "stop did not wake the receive"
    assert isinstance(got[0], _native.Inbox.Input.Stop)


# ------------------------------------------------------------ the driver


class GatedService(testing.InMemoryCoordinationService):
    """Sets of ``key`` wait at a gate (``hold``) or fail (``fail``) until released."""

    def __init__(self, key: str, mode: str) -> None:
        super().__init__()
        self.key, self.mode = key, mode
        self.entered = threading.Event()
        self.released = threading.Event()
        self.writes: list = []  # successful sets, in order
        self.failures = 0

    def set_config_key_value(self, key: str, value: str) -> None:
        if key == self.key and not self.released.is_set():
            self.entered.set()
            if self.mode == "hold":
                assert self.released.wait(HANG), "the test never released the gate"
            else:
                self.failures += 1
                raise _errors.make("UnavailableError", f"{key} fails until released")
        super().set_config_key_value(key, value)
        self.writes.append(key)


def _worker_0(make_handler, tmp_path, service):
    """Worker 0 of 2 on ``service``, with bounds far beyond the test's length."""
    config = TerminationConfig(exit_fn=lambda: None, peer_timeout=HANG * 10)
    resolver = testing.SimpleClusterResolver(CLUSTER, "worker", 0)
    with testing.use_coordination_service(service):
        return make_handler(
            testing.FakeCheckpoint(w=testing.FakeVariable(0)), tmp_path / "ckpt", config, resolver
        )


# Backstop above its own bounds in sequence: three waits of HANG (+ 30 s).
@pytest.mark.timeout(3 * HANG + 30)
def test_a_notice_a_step_key_and_a_stop_arriving_together_are_all_handled(make_handler, tmp_path):
    service = GatedService("TERMINATED_WORKER", "hold")
    h = _worker_0(make_handler, tmp_path, service)
    driver = h._driver.thread

    # The driver takes a first notice and is held inside its claim...
    h._notify_termination()
    assert service.entered.wait(HANG), "the claim never started"
    # ...while a second notice, a step key (as the reader posts it) and the stop of
    # close() arrive together.
    h._notify_termination()
    assert h._driver.sources.inbox.post(_native.Inbox.Input.StepKey("RUN_TO_CHECKPOINT", "7"))
    closer = threading.Thread(target=h.close)
    closer.start()
    # Once close() has stopped the inbox it refuses posts; until then a repeat of the
    # same step key is one more of an input already queued.
    repeat = _native.Inbox.Input.StepKey("RUN_TO_CHECKPOINT", "7")
    wait_until(lambda: not h._driver.sources.inbox.post(repeat), what="close() to stop the inbox")
    service.released.set()
    closer.join(HANG)
    assert not closer.is_alive() and not driver.is_alive(), "the driver did not end"

    # The step key was taken by the resolver and acknowledged on the way out: a
    # leader waiting for it does not have to wait out its peer timeout.
    assert h._core_state()["agreed_step"] == 7
    assert service.value(ACK_0) == "1"
    # The claim in progress completed (it was already in flight) and was won, so its
    # announce got one last attempt: the peers' watchers learn of the notice only
    # from it. Both notices are accounted for; the second was not claimed.
    assert service.value("TERMINATED_WORKER") == "0"
    assert h._notices_handled == 2
    announced = service.value(keys.PREEMPTION_NOTICE_KEY)
    assert announced is not None and announced.startswith("worker 0: termination notice"), announced
    assert h._thread_error is None


# Backstop above its own bounds in sequence: two waits of HANG (+ 30 s).
@pytest.mark.timeout(2 * HANG + 30)
def test_a_notice_that_waited_for_the_writes_before_it_is_taken_once_they_end(
    make_handler, tmp_path
):
    """A second notice that arrives while the first one's claim is in flight waits for
    that notice's writes (claim, then announce), and is acted on once they end, with
    no other input to wake the driver. Found while the Rust failures table was moved
    onto the protocol object: the driver went back to its receive with no timeout,
    and the notice waited for the next input (none came: it was never handled)."""
    service = GatedService("TERMINATED_WORKER", "hold")
    h = _worker_0(make_handler, tmp_path, service)
    h._notify_termination()
    assert service.entered.wait(HANG), "the claim never started"
    h._notify_termination(deadline=time.monotonic() + 3600.0)  # queued behind the claim
    service.released.set()
    wait_until(lambda: h._notices_handled == 2, what="the second notice to be handled")
    assert service.value("TERMINATED_WORKER") == "0"
    assert service.value(keys.PREEMPTION_NOTICE_KEY) is not None, "the first one's announce"
    assert h._thread_error is None


# Backstop above its own bounds in sequence: three waits of HANG (+ 30 s).
@pytest.mark.timeout(3 * HANG + 30)
def test_a_notice_that_came_before_a_newer_handler_is_not_handed_to_it(
    make_handler, tmp_path, monkeypatch
):
    """A signal reaches the handlers installed when it comes (TensorFlow's semantics):
    one that reached an older handler before a newer one was built is not handed on
    when the older one's driver takes it later, however much later; one that comes
    after the newer one took over is. Found in TensorFlow's failure_handler_test under
    load: a test's SIGTERM, sent as it ended, was taken by the earlier test's handler
    22 ms late, handed to the next test's handler, which saved and exited 42 where
    the test expected training to go on."""

    def ckpt():
        return testing.FakeCheckpoint(w=testing.FakeVariable(0))

    older = make_handler(ckpt(), tmp_path / "older", TerminationConfig(exit_fn=lambda: None))
    responses = older._driver._notices
    original, entered, release = responses.start, threading.Event(), threading.Event()

    def held(notice):
        entered.set()
        assert release.wait(HANG), "the test never let the older driver go on"
        return original(notice)

    monkeypatch.setattr(responses, "start", held)
    older._notify_termination()  # arrives now, before the newer handler exists
    assert entered.wait(HANG), "the older driver never took the notice"
    newer = make_handler(ckpt(), tmp_path / "newer", TerminationConfig(exit_fn=lambda: None))
    release.set()
    wait_until(lambda: older._notices_handled == 1, what="the older driver to finish")
    assert not newer._core_state()["leading"], "the newer handler acted on an earlier notice"
    assert not older._core_state()["leading"], "the superseded handler acted on it"

    older._notify_termination()  # after the take-over: the newer handler's
    wait_until(lambda: newer._core_state()["leading"], what="the notice handed on")
    assert older._thread_error is None and newer._thread_error is None


# Backstop above its own bounds in sequence: three waits of HANG (+ 30 s).
@pytest.mark.timeout(3 * HANG + 30)
def test_an_acknowledgement_is_not_queued_behind_a_claims_retries(make_handler, tmp_path):
    # The claim fails until the test lets it through, as soon as the acknowledgement is
    # written: well within the core's bound (the transient-failure window, the peer
    # timeout being far longer).
    service = GatedService("TERMINATED_WORKER", "fail")
    h = _worker_0(make_handler, tmp_path, service)

    h._notify_termination()
    assert service.entered.wait(HANG), "the claim never started"
    # A leader (worker 1) published while this worker's claim is being retried.
    assert h._driver.sources.inbox.post(_native.Inbox.Input.StepKey("RUN_TO_CHECKPOINT", "5"))
    wait_until(lambda: service.value(ACK_0) == "1", what="the acknowledgement")
    assert "TERMINATED_WORKER" not in service.writes, "the claim was let through early"
    assert service.failures >= 1

    service.released.set()
    wait_until(lambda: h._notices_handled == 1, what="the claim to finish")
    assert service.writes[:2] == [ACK_0, "TERMINATED_WORKER"], service.writes
    assert h._thread_error is None
    # The agreed step came from the leader: this worker follows it, whatever its claim.
    assert h._core_state()["agreed_step"] == 5


# Backstop above its own bounds in sequence: two waits of HANG (+ 30 s).
@pytest.mark.timeout(2 * HANG + 30)
def test_this_processs_watchers_learn_of_a_notice_only_once_the_cluster_has_it(
    make_handler, tmp_path
):
    """A script that closes and exits when its own watcher reports (the leader hosts the
    coordination service) must not take the service down before the peers' watchers
    could read the notice: the key is written first, then this process's watchers get it.
    Found under load: worker 0 exited after its in-process message, and worker 1's
    watcher never saw the key."""
    service = GatedService(keys.PREEMPTION_NOTICE_KEY, "hold")
    h = _worker_0(make_handler, tmp_path, service)
    with testing.use_coordination_service(service):
        watcher = PreemptionWatcher()
    try:
        h._notify_termination()
        assert service.entered.wait(HANG), "the announce never started"
        # The announce is held inside its write: nothing reached this process yet.
        assert watcher.preemption_message is None
        service.released.set()
        message = watcher.wait(HANG)
        assert message is not None and message.startswith("worker 0: termination notice")
        assert service.value(keys.PREEMPTION_NOTICE_KEY) == message
    finally:
        service.released.set()
        watcher.close()
        h.close()
