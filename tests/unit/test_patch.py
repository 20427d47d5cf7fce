"""patch()/unpatch() route tf.distribute's names to this package and back."""

import pytest

tf = pytest.importorskip("tensorflow", reason="patch() replaces names inside TensorFlow")

import tf_failure_handling as tfh  # noqa: E402
from tensorflow.python.distribute.failure_handling import failure_handling  # noqa: E402


def test_patch_and_unpatch_round_trip():
    original_handler = tf.distribute.experimental.PreemptionCheckpointHandler
    original_config = tf.distribute.experimental.TerminationConfig
    assert original_handler is not tfh.PreemptionCheckpointHandler
    try:
        tfh.patch()
        tfh.patch()  # idempotent: a second call must not save our class as "original"
        assert (
            tf.distribute.experimental.PreemptionCheckpointHandler
            is tfh.PreemptionCheckpointHandler
        )
        assert tf.distribute.experimental.TerminationConfig is tfh.TerminationConfig
        assert failure_handling.PreemptionCheckpointHandler is tfh.PreemptionCheckpointHandler
        assert failure_handling.WorkerPreemptionHandler is tfh.PreemptionCheckpointHandler
    finally:
        tfh.unpatch()
    assert tf.distribute.experimental.PreemptionCheckpointHandler is original_handler
    assert tf.distribute.experimental.TerminationConfig is original_config
    assert failure_handling.PreemptionCheckpointHandler is original_handler


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
