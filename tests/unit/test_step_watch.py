"""The step watch inside ``watch_preemption_scope``, where a library counts its own steps
(tf_keras ``fit``'s batch loop adds to ``_run_counter``): a step that has not ended past
the peer timeout, with a peer that does not answer a health probe, has this worker's
collectives aborted (issue 62, "A hung worker"), on a simulated cluster.

The real case, tf_keras ``fit`` with a paused worker and a heartbeat timeout of 600 s, is
``tests/integration/test_tf_keras.py -k paused_in_fit``.
"""

from __future__ import annotations

import contextlib
import threading
from typing import ClassVar

import pytest
from tf_failure_handling import TerminationConfig, _errors, testing

from .conftest import RecordingCheckpoint

#: The handler's bound on a blocked step (its peer timeout), short for the test.
PEER_TIMEOUT = 0.5
#: Bound on waiting for the abort: only turns a hang into a failure.
ABORT_BOUND = 30.0
#: How long a step outside any scope waits before it checks that nothing aborted it:
#: several of the watch's looks past the bound (one a second, after PEER_TIMEOUT).
UNWATCHED_WAIT = 4.0
LOST = "/job:worker/replica:0/task:1"


class AbortingService(testing.InMemoryCoordinationService):
    """Worker 1 does not answer the peer probe; ``abort_collective_ops`` is recorded."""

    aborted: ClassVar[list] = []
    event: ClassVar[threading.Event] = threading.Event()

    def check_collective_ops_peer_health(self, task: str, timeout_in_ms: int) -> None:
        if task == LOST:
            raise _errors.make("UnavailableError", f"{task} does not answer")

    def abort_collective_ops(self, code: int, message: str) -> None:
        type(self).aborted.append((code, message))
        type(self).event.set()


def _blocked_step(tmp_path, scopes: int, wait: float):
    """Worker 0 counts one step itself, then blocks inside a ``watch_preemption_scope``
    (``scopes`` 1; 2: after a nested one was entered and left; 0: outside any) until its
    collectives are aborted or ``wait`` s pass; worker 1 stays until then. Returns worker
    0's result, whose value is whether it was aborted."""
    AbortingService.aborted, AbortingService.event = [], threading.Event()
    cluster = testing.SimulatedCluster(
        2, root=tmp_path, timeout=ABORT_BOUND * 2, service_factory=AbortingService
    )
    done = threading.Event()

    def worker(ctx):
        config = TerminationConfig(peer_timeout=PEER_TIMEOUT)
        handler = ctx.handler(
            RecordingCheckpoint(w=testing.FakeVariable(0.0)), ctx.checkpoint_dir, config
        )
        if ctx.index == 1:
            done.wait(ABORT_BOUND * 2)
            return None
        try:
            handler._run_counter += 1  # as tf_keras does after each batch
            scope = handler.watch_preemption_scope() if scopes else contextlib.nullcontext()
            with scope:
                if scopes == 2:  # a nested block left: the outer one still watches
                    with handler.watch_preemption_scope():
                        pass
                return AbortingService.event.wait(wait)
        finally:
            done.set()

    return cluster.run(worker)[0]


@pytest.mark.parametrize("scopes", [1, 2], ids=["one_scope", "after_a_nested_one"])
def test_a_step_blocked_inside_the_scope_is_aborted_when_a_peer_does_not_answer(tmp_path, scopes):
    result = _blocked_step(tmp_path, scopes, ABORT_BOUND)
    assert result.error is None, result.error
    assert result.value is True, f"no abort within {ABORT_BOUND:g} s"
    ((code, message),) = AbortingService.aborted
    assert code == _errors.module().UNAVAILABLE
    assert "worker(s) 1 did not answer" in message, message
    assert "run 2 of this worker was blocked" in message, message


def test_a_step_outside_run_and_the_scope_is_not_watched(tmp_path):
    """Outside ``run()`` and any scope (tf_keras' end of an epoch) nothing is aborted."""
    result = _blocked_step(tmp_path, 0, UNWATCHED_WAIT)
    assert result.error is None, result.error
    assert result.value is False and AbortingService.aborted == []
