"""The notice belongs to the handler until the checkpoint is written: 2 real MWMS workers.

Success for every test here: both workers save at one agreed step and exit 42, with
TF's checkpoint layout (``check_preemption_exit``), however the process was set up
before the handler: an earlier SIGTERM handler (faulthandler with chain=True, as
absltest and TF's multi-process harness install; a Python handler that exits), or an
older handler of the same worker left open (tf_keras' second ``fit``).
"""

from __future__ import annotations

import pytest

from .conftest import STARTUP_BOUND, require_impl
from .test_mwms_handler import (
    DEFAULT_EXIT_CODE,
    EXIT_TIMEOUT,
    STEP_SLEEP,
    STEPS,
    check_preemption_exit,
    notify_after_progress,
)

#: Backstop above each test's own bounds in sequence: progress, then the exit (+ 60 s).
BACKSTOP = STARTUP_BOUND + EXIT_TIMEOUT + 60


@pytest.mark.timeout(BACKSTOP)
@pytest.mark.parametrize("impl", ["tf", "ours"])
@pytest.mark.parametrize("previous", ["faulthandler-chain", "python-exit-3"])
def test_a_handler_installed_before_does_not_prevent_the_save(cluster_factory, impl, previous):
    cluster = cluster_factory(
        name=f"previous-{previous}",
        impl=require_impl(impl),
        steps=STEPS,
        step_sleep=STEP_SLEEP,
        extra_args=["--previous-handler", previous],
    )
    cluster.start()
    notify_after_progress(cluster, (1,))
    check_preemption_exit(cluster, DEFAULT_EXIT_CODE)


@pytest.mark.timeout(BACKSTOP)
@pytest.mark.parametrize("run", range(5))
def test_two_open_handlers_per_worker_save_once_and_exit(cluster_factory, run):
    """5 runs out of 5 (the race this replaced was decided by thread timing)."""
    cluster = cluster_factory(
        name=f"stale-{run}",
        impl=require_impl("ours"),
        steps=STEPS,
        step_sleep=STEP_SLEEP,
        extra_args=["--stale-handler"],
    )
    cluster.start()
    notify_after_progress(cluster, (run % 2,))
    check_preemption_exit(cluster, DEFAULT_EXIT_CODE)
