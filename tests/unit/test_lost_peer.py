"""A step's error that means a peer is gone (issue 62): the protocol asks for a probe of
the peers (``Event.StepFailed`` → ``Action.Probe``), and the probe's answer confirms the
loss (``Event.Probed`` → ``Action.PeerLost``), on simulated clusters.

The simulated service answers TensorFlow's ``check_collective_ops_peer_health`` as the
test says; the step's error is the one real survivors get (the messages of
``tests/fixtures/lost_peer``, which the core's table tests read).
"""

from __future__ import annotations

import logging
from typing import ClassVar

import pytest
from tf_failure_handling import TerminationConfig, _errors, testing

from .conftest import RecordingCheckpoint

#: What a survivor of TF 2.21 gets when its peer (task 1) is SIGKILLed mid-step.
RESET = (
    "Collective ops is aborted by: recvmsg:Connection reset by peer\n"
    "Additional GRPC error information from remote target /job:worker/replica:0/task:1 "
    'while calling /tensorflow.WorkerService/RecvBuf:\n:{"grpc_status":14}'
)
CLUSTER_TIMEOUT = 60.0


class ProbedService(testing.InMemoryCoordinationService):
    """Answers the peer probe: the tasks in ``gone`` fail it; every probe is counted."""

    gone: ClassVar[tuple] = ()
    probes: ClassVar[list] = []

    def check_collective_ops_peer_health(self, task: str, timeout_in_ms: int) -> None:
        type(self).probes.append(task)
        if task in self.gone:
            raise _errors.make("UnavailableError", f"{task} does not answer")


def _service(gone):
    ProbedService.gone, ProbedService.probes = tuple(gone), []
    return ProbedService


def _run(tmp_path, error_name, message, gone=(), config=None):
    """Worker 0's step 3 raises ``error_name(message)``; worker 1 leaves then without
    reporting anything (as a killed peer does). Returns worker 0's result. ``config``:
    the workers' ``TerminationConfig``."""
    cluster = testing.SimulatedCluster(
        2, root=tmp_path, timeout=CLUSTER_TIMEOUT, service_factory=_service(gone)
    )

    def worker(ctx):
        w = testing.FakeVariable(0.0)
        handler = ctx.handler(RecordingCheckpoint(w=w), ctx.checkpoint_dir, config)
        while handler._run_counter < 10:
            if handler._run_counter == 3:
                if ctx.index == 1:
                    raise KeyError("killed")  # gone: reports nothing to the cluster

                def failing():
                    raise _errors.make(error_name, message)

                handler.run(failing)
            handler.run(lambda: w.assign_add(ctx.all_reduce(1.0)))
        return w.numpy()

    return cluster.run(worker)[0]


def test_a_peer_lost_without_notice_is_confirmed_and_named(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="tf_failure_handling")
    result = _run(tmp_path, "UnavailableError", RESET, gone=["/job:worker/replica:0/task:1"])
    error = result.error
    # The step's error type, as TensorFlow raises it, naming the peer the probe confirmed.
    assert type(error) is _errors.module().UnavailableError, error
    assert "peers that did not answer a health probe from worker 0: worker 1" in error.message
    assert ProbedService.probes == ["/job:worker/replica:0/task:1"]
    lost = [r.getMessage() for r in caplog.records if "lost without notice" in r.getMessage()]
    assert lost == [
        "Worker 0: lost without notice: worker 1 (localhost:1) (connection lost, and no "
        "answer to a health probe)."
    ]


def test_a_suspicion_every_peer_answers_loses_no_peer(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="tf_failure_handling")
    result = _run(tmp_path, "UnavailableError", RESET, gone=[])
    assert type(result.error) is _errors.module().UnavailableError
    assert result.error.message == RESET  # nobody to name
    assert ProbedService.probes == ["/job:worker/replica:0/task:1"]
    assert not [r for r in caplog.records if "lost without notice" in r.getMessage()]


@pytest.mark.parametrize(
    "error_name, message",
    [
        ("InvalidArgumentError", "Incompatible shapes: [2] vs. [3]"),
        ("ResourceExhaustedError", "OOM when allocating tensor with shape[1024,1024]"),
    ],
)
def test_a_bug_or_an_oom_is_not_probed(tmp_path, caplog, error_name, message):
    caplog.set_level(logging.INFO, logger="tf_failure_handling")
    result = _run(tmp_path, error_name, message, gone=["/job:worker/replica:0/task:1"])
    assert type(result.error) is getattr(_errors.module(), error_name)
    assert result.error.message == message
    assert ProbedService.probes == []
    assert not [r for r in caplog.records if "lost without notice" in r.getMessage()]


def test_an_error_a_gone_peer_can_cause_is_probed_to_name_it_but_loses_no_peer(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="tf_failure_handling")
    gone = ["/job:worker/replica:0/task:1"]
    result = _run(tmp_path, "DeadlineExceededError", "collective timed out", gone=gone)
    assert type(result.error) is _errors.module().DeadlineExceededError
    assert "did not answer a health probe from worker 0: worker 1" in result.error.message
    assert not [r for r in caplog.records if "lost without notice" in r.getMessage()]


@pytest.mark.parametrize("value", ["sometimes", "exit now"])
def test_a_bad_lost_worker_value_fails_the_handler_at_construction(monkeypatch, tmp_path, value):
    from tf_failure_handling import PreemptionCheckpointHandler

    monkeypatch.setenv("TF_FAILURE_HANDLING_LOST_WORKER", value)
    with pytest.raises(ValueError, match=f"TF_FAILURE_HANDLING_LOST_WORKER={value!r}"):
        PreemptionCheckpointHandler(
            None, testing.FakeCheckpoint(w=testing.FakeVariable(0)), str(tmp_path)
        )


def test_lost_worker_exit_makes_the_survivor_exit_through_exit_fn(tmp_path, caplog):
    """``lost_worker="exit"``: after the loss (and the save, when it has one), the
    survivor exits through ``exit_fn`` instead of raising the step's error."""
    caplog.set_level(logging.INFO, logger="tf_failure_handling")
    exits: list = []

    def exit_fn():
        exits.append(True)
        raise SystemExit(42)

    config = TerminationConfig(exit_fn=exit_fn, lost_worker="exit")
    result = _run(tmp_path, "UnavailableError", RESET, ["/job:worker/replica:0/task:1"], config)
    assert exits == [True]
    assert result.exit_code == 42 and result.error is None, result
    assert "exiting with the restart code (lost_worker: exit)" in caplog.text


def test_lost_worker_raise_from_the_config_wins_over_the_environment(monkeypatch, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="tf_failure_handling")
    monkeypatch.setenv("TF_FAILURE_HANDLING_LOST_WORKER", "exit")
    config = TerminationConfig(exit_fn=lambda: pytest.fail("exit_fn called"), lost_worker="raise")
    result = _run(tmp_path, "UnavailableError", RESET, ["/job:worker/replica:0/task:1"], config)
    assert type(result.error) is _errors.module().UnavailableError, result.error
    assert "the survivors do not save (lost_worker: raise)" in caplog.text


@pytest.mark.parametrize("value", ["Save", "sometimes", 1])
def test_a_bad_lost_worker_option_fails_the_config(value):
    with pytest.raises(ValueError, match="lost_worker must be one of 'save', 'exit', 'raise'"):
        TerminationConfig(lost_worker=value)
