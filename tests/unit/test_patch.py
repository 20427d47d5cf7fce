"""patch()/unpatch() route tf.distribute's names to this package and back.

The namespaces are enumerated here independently of ``_patch``: by walking the
attributes of ``tf``, ``tf.compat.v2`` and ``tf.compat.v1`` (not ``sys.modules``)
down through every TensorFlow module they reach, plus the modules that define the
classes. A name TF exports one of its classes under that ``patch()`` missed fails.
"""

import subprocess
import sys
import textwrap
import types

import pytest

tf = pytest.importorskip("tensorflow", reason="patch() replaces names inside TensorFlow")

import tf_failure_handling as tfh  # noqa: E402
from tensorflow.python.distribute.coordinator import cluster_coordinator  # noqa: E402
from tensorflow.python.distribute.failure_handling import (  # noqa: E402
    failure_handling,
    preemption_watcher,
)
from tf_failure_handling import _patch  # noqa: E402
from tf_failure_handling.coordinator import ClusterCoordinator  # noqa: E402

from .conftest import NO_METADATA_SERVER  # noqa: E402

#: TF's class -> ours, taken from the defining modules before any test patches.
OURS_FOR = {
    failure_handling.PreemptionCheckpointHandler: tfh.PreemptionCheckpointHandler,
    failure_handling.TerminationConfig: tfh.TerminationConfig,
    preemption_watcher.PreemptionWatcher: tfh.PreemptionWatcher,
    cluster_coordinator.ClusterCoordinator: ClusterCoordinator,
}
TF_FOR = {ours: theirs for theirs, ours in OURS_FOR.items()}


def _real(module):
    """The module a ``TFModuleWrapper`` (tf.compat.v1's namespaces) wraps, else itself."""
    return vars(module).get("_tfmw_wrapped_module", module)


def exported_names() -> dict:
    """``{"<module __name__>.<attribute>": TF's or our class}`` for every attribute, in a
    TensorFlow module reachable from ``tf`` (or in a defining module), whose value is one
    of the four classes, TF's or ours."""
    roots = (
        tf,
        tf.compat.v2,
        tf.compat.v1,
        failure_handling,
        preemption_watcher,
        cluster_coordinator,
    )
    wanted = set(OURS_FOR) | set(TF_FOR)
    found, seen = {}, set()
    stack = list(roots)
    while stack:
        real = _real(stack.pop())
        if id(real) in seen:
            continue
        seen.add(id(real))
        for name, value in list(vars(real).items()):
            if isinstance(value, type) and value in wanted:
                found[f"{real.__name__}.{name}"] = value
            elif (
                type(value) is types.ModuleType or type(value).__name__ == "TFModuleWrapper"
            ) and getattr(_real(value), "__name__", "").startswith("tensorflow"):
                # Lazily loaded modules (LazyLoader subclasses) are not entered.
                stack.append(value)
    return found


@pytest.fixture
def patched():
    tfh.patch()
    yield
    tfh.unpatch()


def test_every_namespace_tf_exports_the_classes_in_holds_ours_after_patch():
    before = exported_names()
    assert all(v in OURS_FOR for v in before.values()), "a test left TF patched"
    # The names the issue found unpatched, and the ones TF's own layout guarantees.
    v2, compat_v2 = "tensorflow._api.v2.distribute", "tensorflow._api.v2.compat.v2.distribute"
    for name in (
        f"{v2}.experimental.PreemptionCheckpointHandler",
        f"{compat_v2}.experimental.PreemptionCheckpointHandler",
        f"{compat_v2}.experimental.TerminationConfig",
        f"{compat_v2}.experimental.PreemptionWatcher",
        f"{compat_v2}.coordinator.ClusterCoordinator",
        f"{compat_v2}.experimental.coordinator.ClusterCoordinator",
        f"{failure_handling.__name__}.WorkerPreemptionHandler",
        f"{cluster_coordinator.__name__}.ClusterCoordinator",
    ):
        assert name in before, f"{name} not found among {sorted(before)}"

    tfh.patch()
    try:
        tfh.patch()  # idempotent: a second call must not save our class as "original"
        after = exported_names()
    finally:
        tfh.unpatch()
    restored = exported_names()

    assert set(after) == set(before)
    still_tf = sorted(name for name, value in after.items() if value in OURS_FOR)
    assert not still_tf, f"TF's class after patch(): {still_tf}"
    wrong = {n: v for n, v in after.items() if v is not OURS_FOR[before[n]]}
    assert not wrong, f"not the matching class of ours: {wrong}"
    assert restored == before, {n: v for n, v in restored.items() if before[n] is not v}


def test_a_namespace_imported_while_patched_gets_ours_and_unpatch_gives_tf_back(patched):
    # An API module created after patch() copies the name from the defining module.
    late = types.ModuleType("tensorflow._api.v2.late_for_test")
    late.PreemptionCheckpointHandler = failure_handling.PreemptionCheckpointHandler
    sys.modules[late.__name__] = late
    try:
        assert late.PreemptionCheckpointHandler is tfh.PreemptionCheckpointHandler
        tfh.unpatch()
        assert late.PreemptionCheckpointHandler is TF_FOR[tfh.PreemptionCheckpointHandler]
    finally:
        del sys.modules[late.__name__]


def test_patched_name_builds_our_handler_from_an_unchanged_script(tmp_path):
    tfh.patch()
    try:
        config = tf.distribute.experimental.TerminationConfig(exit_fn=lambda: None)
        handler = tf.distribute.experimental.PreemptionCheckpointHandler(
            None, tf.train.Checkpoint(v=tf.Variable(1.0)), str(tmp_path / "ckpt"), config
        )
    finally:
        tfh.unpatch()
    try:
        assert isinstance(handler, tfh.PreemptionCheckpointHandler)
        assert handler.run(lambda x: x * 2, 21) == 42
        assert handler._run_counter == 1
    finally:
        handler.close()


# ------------------------------------------------------------------ tf_keras


def _mwms_instance():
    """A MultiWorkerMirroredStrategy for isinstance checks, without building a cluster."""
    cls = tf.distribute.MultiWorkerMirroredStrategy
    return cls.__new__(cls)


def test_tf_keras_save_before_preemption_is_enabled_off_gcp_only_while_patched():
    worker_training_state = pytest.importorskip(_patch._TF_KERAS_MODULE)
    check = worker_training_state.support_on_demand_checkpoint_callback
    mwms = _mwms_instance()
    default = tf.distribute.get_strategy()
    assert not check(mwms), "tf_keras' own check: no GCE metadata server, so no"
    tfh.patch()
    try:
        patched = worker_training_state.support_on_demand_checkpoint_callback
        assert patched is not check
        assert patched(mwms)
        # Strategies tf_keras' own check refuses everywhere stay refused.
        assert not patched(default)
    finally:
        tfh.unpatch()
    assert worker_training_state.support_on_demand_checkpoint_callback is check


HOOK_SCRIPT = textwrap.dedent(
    """
    import os, sys
    os.environ["GCE_METADATA_IP"] = {metadata!r}
    import tensorflow as tf
    import tf_failure_handling as tfh

    assert "tf_keras" not in sys.modules
    tfh.patch()
    import tf_keras  # noqa: F401 - the import patch() waited for
    from tf_keras.src.distribute import worker_training_state as wts

    cls = tf.distribute.MultiWorkerMirroredStrategy
    assert wts.support_on_demand_checkpoint_callback(cls.__new__(cls)), "not patched"
    tfh.unpatch()
    assert not wts.support_on_demand_checkpoint_callback(cls.__new__(cls)), "not restored"
    print("OK")
    """
)


@pytest.mark.timeout(120)
def test_tf_keras_imported_after_patch_is_patched_on_import():
    pytest.importorskip("tf_keras")
    out = subprocess.run(
        [sys.executable, "-c", HOOK_SCRIPT.format(metadata=NO_METADATA_SERVER)],
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert out.returncode == 0 and out.stdout.strip() == "OK", out.stderr[-3000:]
