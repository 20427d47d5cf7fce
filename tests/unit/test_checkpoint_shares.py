"""The workers write one checkpoint together (``TF_FAILURE_HANDLING_NON_CHIEF_SAVES=shares``,
issue 36 part 2): two workers of one process, each its own ``tf.train.Checkpoint`` with the
same variables, over one in-memory coordination service. Real MWMS workers:
tests/integration/test_mwms_handler.py."""

from __future__ import annotations

import re
import threading

import numpy as np
import pytest
from tf_failure_handling import testing
from tf_failure_handling._cluster import coordination
from tf_failure_handling._protocol import checkpoints as ck

tf = pytest.importorskip("tensorflow", reason="the shares are TensorFlow's sharded layout")

ENV = ck.NON_CHIEF_SAVES_ENV
#: Bound on a worker's save thread: only turns a hang into a failure.
JOIN_BOUND = 60.0


def _checkpoint(offset: float = 0.0) -> tf.train.Checkpoint:
    return tf.train.Checkpoint(
        big=tf.Variable(tf.range(4000, dtype=tf.float32) + offset),
        mid=tf.Variable(tf.range(3000, dtype=tf.float32) + offset),
        small=tf.Variable(tf.range(10, dtype=tf.float32) + offset),
    )


def _worker(ckpt_dir, worker: int, service, checkpoint=None, workers=2) -> ck.Checkpoints:
    return ck.Checkpoints(
        checkpoint or _checkpoint(),
        str(ckpt_dir),
        is_chief=worker == 0,
        task_id=worker,
        worker=worker,
        workers=workers,
        coordination=coordination.Client(service, 5.0),
    )


def _save_in_thread(saves: ck.Checkpoints, run_count: int) -> tuple:
    errors: list = []

    def save():
        try:
            saves.save(run_count, (), {}, clock=lambda: 0.0)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            errors.append(e)

    thread = threading.Thread(target=save, name=f"worker-{saves._worker}")
    thread.start()
    return thread, errors


@pytest.fixture
def shares(monkeypatch):
    monkeypatch.setenv(ENV, "shares")
    return testing.InMemoryCoordinationService()


def test_each_worker_writes_a_share_and_the_chief_merges_them(shares, tmp_path):
    ckpt_dir = tmp_path / "ckpt"
    chief, other = _worker(ckpt_dir, 0, shares), _worker(ckpt_dir, 1, shares, _checkpoint(0.5))
    assert chief.shared_by == other.shared_by == 2
    thread, errors = _save_in_thread(other, 7)
    chief.save(7, (), {}, clock=lambda: 0.0)
    thread.join(JOIN_BOUND)
    assert not thread.is_alive() and errors == []
    assert sorted(p.name for p in ckpt_dir.iterdir()) == [
        "checkpoint",
        "ckpt-1.data-00000-of-00002",
        "ckpt-1.data-00001-of-00002",
        "ckpt-1.index",
    ]
    assert not list(tmp_path.glob("workertemp_*")), "no copy beside the checkpoint"
    # TensorFlow reads it back whole: the largest tensor from the chief, the others from
    # worker 1 (whose values are 0.5 higher), as the core's plan splits them.
    restored = _checkpoint(100.0)
    restored.checkpointed_runs = tf.Variable(0, dtype=tf.int64)
    restored.restore(str(ckpt_dir / "ckpt-1")).assert_consumed()
    offsets = {k: float(getattr(restored, k).numpy()[0]) for k in ("big", "mid", "small")}
    assert offsets == {"big": 0.0, "mid": 0.5, "small": 0.5}, offsets
    assert int(restored.checkpointed_runs.numpy()) == 7
    # A second save replaces the first (max_to_keep=1), still in two parts.
    thread, errors = _save_in_thread(other, 9)
    chief.save(9, (), {}, clock=lambda: 0.0)
    thread.join(JOIN_BOUND)
    assert errors == []
    assert sorted(p.name for p in ckpt_dir.glob("ckpt-*")) == [
        "ckpt-2.data-00000-of-00002",
        "ckpt-2.data-00001-of-00002",
        "ckpt-2.index",
    ]
    assert tf.train.latest_checkpoint(str(ckpt_dir)).endswith("ckpt-2")


def test_a_share_that_never_comes_leaves_the_last_checkpoint_as_it_was(
    shares, tmp_path, monkeypatch
):
    monkeypatch.setattr(ck, "SHARES_MIN_WAIT", 0.2)
    ckpt_dir = tmp_path / "ckpt"
    chief = _worker(ckpt_dir, 0, shares)
    with pytest.raises(
        tf.errors.DeadlineExceededError,
        match=r"Worker 1's share of checkpoint ckpt-1 .* was not written",
    ):
        chief.save(7, (), {}, clock=lambda: 0.0)
    assert not list(ckpt_dir.glob("ckpt-*.index")), "no checkpoint without every share"
    assert tf.train.latest_checkpoint(str(ckpt_dir)) is None


def test_a_worker_whose_share_failed_fails_the_chief_at_once(shares, tmp_path):
    ckpt_dir = tmp_path / "ckpt"
    chief = _worker(ckpt_dir, 0, shares)
    shares.set_config_key_value(
        f"{ck.SHARE_KEY}/{ckpt_dir}/1/ckpt-1/1", "error PermissionDeniedError: no room"
    )
    with pytest.raises(
        tf.errors.AbortedError, match=r"Worker 1's share .* could not be written: .*no room"
    ):
        chief.save(7, (), {}, clock=lambda: 0.0)
    assert not list(ckpt_dir.glob("ckpt-*.index"))


def test_workers_with_other_variables_cannot_write_together(shares, tmp_path):
    ckpt_dir = tmp_path / "ckpt"
    chief = _worker(ckpt_dir, 0, shares)
    other = _worker(ckpt_dir, 1, shares, tf.train.Checkpoint(only=tf.Variable([1.0])))
    thread, _ = _save_in_thread(other, 7)
    with pytest.raises(
        tf.errors.FailedPreconditionError, match="holds other tensors than the chief's"
    ):
        chief.save(7, (), {}, clock=lambda: 0.0)
    thread.join(JOIN_BOUND)
    assert not list(ckpt_dir.glob("ckpt-*.index"))


def test_one_worker_or_a_fake_checkpoint_saves_alone(shares, tmp_path):
    alone = _worker(tmp_path / "a", 0, shares, workers=1)
    assert alone.shared_by == 1
    fake = _worker(tmp_path / "b", 1, shares, testing.FakeCheckpoint(w=testing.FakeVariable(0)))
    assert fake.shared_by == 1
    # A non-chief that writes shares keeps its manager's bookkeeping in memory.
    other = _worker(tmp_path / "c", 1, shares)
    assert other.write.directory.startswith("ram://")


@pytest.mark.parametrize("value", ["shards", "share"])
def test_a_value_near_shares_is_refused_at_construction(monkeypatch, tmp_path, value):
    monkeypatch.setenv(ENV, value)
    with pytest.raises(ValueError, match=re.escape("memory, storage or shares")):
        _worker(tmp_path, 1, testing.InMemoryCoordinationService())


def test_the_restored_tensors_are_every_worker_s_save(shares, tmp_path):
    """Same values on both workers (as under MWMS): the merged checkpoint equals a
    checkpoint one worker would have written. Worker 1 writes its share before the
    chief has made the checkpoint folder (SaveV2 makes only the last folder of a path:
    this failed the full run once)."""
    ckpt_dir = tmp_path / "ckpt"
    chief, other = _worker(ckpt_dir, 0, shares), _worker(ckpt_dir, 1, shares)
    thread, errors = _save_in_thread(other, 3)
    key = f"{ck.SHARE_KEY}/{ckpt_dir}/1/ckpt-1/1"
    assert shares.get_config_key_value(key, int(JOIN_BOUND * 1000)).startswith("ok "), errors
    chief.save(3, (), {}, clock=lambda: 0.0)
    thread.join(JOIN_BOUND)
    assert errors == []
    reader = tf.train.load_checkpoint(str(ckpt_dir / "ckpt-1"))
    expected = _checkpoint()
    for name in ("big", "mid", "small"):
        np.testing.assert_array_equal(
            reader.get_tensor(f"{name}/.ATTRIBUTES/VARIABLE_VALUE"), getattr(expected, name).numpy()
        )
