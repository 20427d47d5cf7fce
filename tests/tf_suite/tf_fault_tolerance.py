"""TensorFlow's fault-tolerance tests for ``ClusterCoordinator``, run against ours.

TensorFlow's wheel ships the tests themselves
(``tensorflow/python/distribute/coordinator/fault_tolerance_test_base.py``:
``BaseFaultToleranceTest`` and its ``Model``); TF's repository runs them through two
thin files that the wheel does not ship, ``fault_tolerance_test.py`` and
``fault_tolerance_coordination_service_test.py``. This module is our own
counterpart of those two: the same test classes (names, numbers of workers and
parameter servers, coordination service on or off) on the wheel's base class, and
TF's ``multi_process_runner.test_main()`` as the entry point.

Which ``ClusterCoordinator`` runs is chosen by ``TFH_TF_SUITE_IMPL``:

* ``ours`` (the default): ``tf_failure_handling.patch()`` runs before anything
  builds a coordinator, so ``cluster_coordinator.ClusterCoordinator``, the name
  the base class calls, is this package's class;
* ``tf``: nothing is patched; TF's own classes run the same tests, for comparison.

The main process prints ``tf_suite: ClusterCoordinator is <module>.<class>`` on
stderr before the tests start, so a runner can check which one ran.

Run one test as TF's BUILD shards them::

    python tests/tf_suite/tf_fault_tolerance.py \
        SingleWorkerFaultToleranceTest.testWorkerPreemptionBetweenFunctions

``tests/tf_suite/test_tf_fault_tolerance.py`` runs every test so, one process each.

Not included: TF's ``InitFaultToleranceTest`` (its own test body, not the base
class's: preemptions while the strategy connects, before any coordinator exists).
"""

from __future__ import annotations

import os
import sys

IMPL_ENV = "TFH_TF_SUITE_IMPL"
IMPLS = ("ours", "tf")
IMPL = os.environ.get(IMPL_ENV, "ours").strip().lower() or "ours"
if IMPL not in IMPLS:
    sys.exit(f"{IMPL_ENV}={IMPL!r}: expected one of {', '.join(IMPLS)}")

if IMPL == "ours":
    # Before TF's test modules are imported and before any coordinator exists.
    import tf_failure_handling

    tf_failure_handling.patch()

from tensorflow.python.compat import v2_compat  # noqa: E402
from tensorflow.python.distribute import multi_process_runner  # noqa: E402
from tensorflow.python.distribute.coordinator import (  # noqa: E402
    cluster_coordinator,
    fault_tolerance_test_base,
)
from tensorflow.python.eager import def_function, test  # noqa: E402

_Base = fault_tolerance_test_base.BaseFaultToleranceTest


def coordinator_class_name() -> str:
    """The class the base's ``cluster_coordinator.ClusterCoordinator(...)`` builds."""
    cls = cluster_coordinator.ClusterCoordinator
    return f"{cls.__module__}.{cls.__qualname__}"


def _check_implementation() -> None:
    """Refuses to run if the coordinator the tests will build is not the one asked for."""
    name = coordinator_class_name()
    if IMPL == "ours":
        from tf_failure_handling import coordinator as ours

        ok = cluster_coordinator.ClusterCoordinator is ours.ClusterCoordinator
    else:
        ok = name.startswith("tensorflow.")
    if not ok:
        sys.exit(f"tf_suite: {IMPL_ENV}={IMPL} but ClusterCoordinator is {name}")
    print(f"tf_suite: ClusterCoordinator is {name}", file=sys.stderr, flush=True)


# ------------------------------------------------ TF's fault_tolerance_test.py


class MultiWorkerFaultToleranceTest(_Base, test.TestCase):
    """Two workers, two parameter servers."""

    def setUp(self):
        super().setUp(2, 2)


class SingleWorkerFaultToleranceTest(_Base, test.TestCase):
    """One worker, one parameter server: training must go on after the only worker
    comes back."""

    def setUp(self):
        super().setUp(1, 1)


# ---------------------------- TF's fault_tolerance_coordination_service_test.py


class _CoordinationServiceBase(_Base):
    """The base's tests with ``TF_PSS_ENABLE_COORDINATION_SERVICE`` set; with the
    coordination service a PS failure must surface as ``PSUnavailableError``."""

    def setUp(self, num_workers, num_ps):
        super().setUp(num_workers=num_workers, num_ps=num_ps, use_cs=True)

    def testJoinRaisesUnavailableErrorAtPsFailure(self):
        self._run_and_kill_ps_task()
        self.assertRaises(cluster_coordinator.PSUnavailableError, self.cluster_coord.join)

    def testScheduleRaisesUnavailableErrorAtPsFailure(self):
        self._run_and_kill_ps_task()
        noop = def_function.function(lambda: None)
        self.assertRaises(cluster_coordinator.PSUnavailableError, self.cluster_coord.schedule, noop)


class SingleWorkerCoordinationServiceTest(_CoordinationServiceBase, test.TestCase):
    def setUp(self):
        super().setUp(num_workers=1, num_ps=1)


class MultiWorkerCoordinationServiceTest(_CoordinationServiceBase, test.TestCase):
    def setUp(self):
        super().setUp(num_workers=2, num_ps=2)


if __name__ == "__main__":
    v2_compat.enable_v2_behavior()
    if "-c" not in sys.argv[1:]:  # not a process multiprocessing spawned
        _check_implementation()
    # TF's multi_process_lib makes sys.argv[0] the executable of the processes it
    # spawns, and gives up on a ``.py`` path outside bazel. Those processes are
    # started as ``<executable> -c "from multiprocessing... import ..."``: the
    # interpreter runs that itself (the forkserver then imports this file).
    sys.argv[0] = sys.executable
    multi_process_runner.test_main()
