"""One failed coordination-service call of the protocol never loses a preemption.

Each case injects failures into one get or set of one protocol key, armed before any
handler is built (a step-key reader makes its first get then), on a ``SimulatedCluster``
of 2 or 5 workers; worker 1 gets the notice. The outcome that counts as success:

* a single failure, or a burst shorter than the bound: every worker saves at one step
  (each round) and exits 42, and no error reaches the cluster;
* failures for longer than the bound (the peer timeout here): no worker exits 42 or
  trains on; every worker ends with an ``OpError`` whose message names the key that
  failed, within the bound plus the test's slack.

No verdict depends on the machine's speed. A burst is counted in attempts: it is one
failure fewer than the retry rule's minimum of attempts (``RETRY_MIN_ATTEMPTS``), which
the rule makes whatever the load, even when a loaded machine's pauses outlast the bound
in real time (the bound is 1 s for the leader's calls when there is no grace period).
And every handler plans on one ``VirtualClock`` (``handler._core.configure(clock=...)``),
which the noticed worker advances by ``TICK`` before each of its steps: a grace period
is ``GRACE / TICK`` of its steps, however long a step takes. The planner's step
estimate is the one thing it measures in real time (the native check times steps
itself): the grace period is long enough that only steps of about 10 s each, a hang
rather than a slow machine, could make the final round due at the first round's step
(one save where two are checked). With 3 s, one step of 0.7 s did that under ``make test``'s load.
"""

from __future__ import annotations

import time

import pytest
from reliability.simulation import VirtualClock
from tf_failure_handling import TerminationConfig, _errors, testing

from .conftest import wait_until
from .rust_constants import RETRY_MIN_ATTEMPTS
from .test_handler_cluster import make_worker

CLUSTER_TIMEOUT = 120.0
NOTICED = 1  # the worker that gets the notice (and leads)
PEER = 0  # the worker whose acknowledgement is faulted

#: name -> (get or set, key, needs a grace period). The keys are TF's.
FAULTS = {
    "claim": ("set", "TERMINATED_WORKER", False),
    "announce": ("set", "TF_DEFAULT_PREEMPTION_NOTICE_KEY", False),
    "publish": ("set", "RUN_TO_CHECKPOINT", False),
    "peer-watch": ("get", "RUN_TO_CHECKPOINT", False),
    "acknowledge": ("set", f"RECEIVED_SIGNAL_RUN_TO_CHECKPOINT_{PEER}", False),
    "await": ("get", f"RECEIVED_SIGNAL_RUN_TO_CHECKPOINT_{PEER}", False),
    "shutdown": ("set", "LAST_RUN_TO_CHECKPOINT", False),
    "second-publish": ("set", "LAST_RUN_TO_CHECKPOINT", True),
    "second-peer-watch": ("get", "LAST_RUN_TO_CHECKPOINT", True),
    "second-acknowledge": ("set", f"RECEIVED_SIGNAL_LAST_RUN_TO_CHECKPOINT_{PEER}", True),
    "second-await": ("get", f"RECEIVED_SIGNAL_LAST_RUN_TO_CHECKPOINT_{PEER}", True),
}
#: The grace period of the faults that need one, in seconds of the virtual clock: the
#: noticed worker's steps advance it by ``TICK``, so it spans 300 steps.
GRACE = 30.0
TICK = 0.1


def _run(tmp_path, n, fault, failures, peer_timeout, clock=None):
    """One cluster run with ``failures`` injected; ``clock``, when given, is every
    handler's clock (see the module's documentation)."""
    what, key, grace = FAULTS[fault]
    cluster = testing.SimulatedCluster(n, root=tmp_path, timeout=CLUSTER_TIMEOUT)
    record = {}
    armed = []

    def before_step(ctx, handler, step):
        if clock is not None:
            handler._core.configure(clock=clock.now)
            if ctx.index == NOTICED:
                clock.advance(TICK)

    def config(ctx):
        # Armed before any handler exists: the step-key reader of every worker, PEER's
        # included, starts its first get when its handler is built.
        if ctx.index == PEER:
            inject = getattr(ctx.cluster.service, f"fail_next_{what}")
            for _ in range(failures):
                inject(key)
            armed.append(key)
        wait_until(lambda: armed, 60.0, "the fault to be armed")
        return TerminationConfig(grace_period=GRACE if grace else 0, peer_timeout=peer_timeout)

    start = time.monotonic()
    results = cluster.run(
        make_worker(
            {NOTICED: 3},
            steps=100_000 if grace else 40,
            config=config,
            record=record,
            before_step=before_step,
        )
    )
    return cluster, record, results, time.monotonic() - start


@pytest.mark.timeout(300)
@pytest.mark.parametrize("failures", [1, RETRY_MIN_ATTEMPTS - 1], ids=["once", "burst"])
@pytest.mark.parametrize("n", [2, 5])
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_transient_failure_loses_no_preemption(tmp_path, fault, n, failures):
    clock = VirtualClock()
    cluster, record, results, _ = _run(tmp_path, n, fault, failures, 30.0, clock)
    assert [r.exit_code for r in results] == [42] * n, results
    assert all(r.error is None for r in results), results
    saves = [record[i][0].saved_runs for i in range(n)]
    assert all(s == saves[0] for s in saves), f"workers saved at different steps: {saves}"
    rounds = 2 if FAULTS[fault][2] else 1
    assert len(saves[0]) == rounds, saves
    assert cluster.service.error is None, cluster.service.error
    what, key, _ = FAULTS[fault]
    assert cluster.service.faults_left().get((what, key), 0) < failures, "the fault was not hit"


PERMANENT = ["claim", "publish", "peer-watch", "acknowledge", "await"]
BOUND = 1.0


@pytest.mark.timeout(300)
@pytest.mark.parametrize("n", [2, 5])
@pytest.mark.parametrize("fault", PERMANENT)
def test_a_failure_longer_than_the_bound_is_a_named_error_on_every_worker(tmp_path, fault, n):
    what, key, _ = FAULTS[fault]
    cluster, _, results, took = _run(tmp_path, n, fault, 10**6, peer_timeout=BOUND)
    assert cluster.service.faults_left()[(what, key)] < 10**6, "the fault was never hit"
    errors = _errors.module()
    for r in results:
        assert r.exit_code is None, results
        assert isinstance(r.error, errors.OpError), results
        assert key in str(r.error), (r.index, str(r.error))
    # Within the bound: retries stop at it; the rest is the simulated steps and slack.
    assert took < BOUND + 30.0, took
