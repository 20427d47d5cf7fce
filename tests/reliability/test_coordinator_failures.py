"""Many workers whose first closures fail together (issue 26), in fresh processes.

Each attempt runs ``coordinator_failures_child.py``: 8 in-process worker servers and
one PS on 127.0.0.1, our ``ClusterCoordinator``, 8 failing closures scheduled at
once, ``join()``. Success: ``join()`` raises the closures' ``InvalidArgumentError``
and the coordinator is usable after it (the child prints ``ok``). Before the fix,
2 of 8 such processes hung in ``join()`` on this machine (the first-use lock of the
type-layout check, held with the GIL). The child's ``faulthandler`` bound turns a
hang into exit 1 with every thread's stack; the subprocess timeout backs it up.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from . import coordinator_failures_child as child

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("tensorflow") is None,
    reason="tensorflow is not installed: the coordinator trials need it",
)


@pytest.mark.parametrize("attempt", range(8))
def test_join_raises_when_every_worker_fails_its_first_closure_at_once(attempt: int) -> None:
    try:
        done = subprocess.run(
            [sys.executable, child.__file__],
            capture_output=True,
            text=True,
            timeout=child.SETUP_BOUND + child.HANG_BOUND + 60,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the coordinator process hung past its bounds\n{e.stderr}")
    where = (
        f"hung in schedule() or join(): {child.HANG_BOUND:.0f}s"
        if child.SET_UP in done.stderr
        else f"its set-up (import, servers) did not end in {child.SETUP_BOUND:.0f}s"
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), (
        f"exit {done.returncode} (1 = {where}; stacks below)\n{done.stderr[-8000:]}"
    )
