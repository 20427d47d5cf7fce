"""Bad checkpoint directories and damaged checkpoints, with real ``tf.train.Checkpoint``s.

Local mode (no cluster), in this process, for TF's handler and ours: a directory
that is a file or lies below one, and a checkpoint whose index or data is
damaged or missing. Each gives a clear error at construction (TF finds a bad
directory only at the preemption's save, when it is too late), of the type TF
raises or a subclass of it, and nothing already saved is changed or deleted.
"""

from __future__ import annotations

import hashlib
import os

import pytest

from .conftest import require_impl


@pytest.fixture(autouse=True)
def no_platform(monkeypatch):
    from tf_failure_handling._platforms import platform as _platform

    monkeypatch.setenv("GCE_METADATA_IP", "127.0.0.1:9")
    monkeypatch.setenv(_platform.CLOUD_ENV, "none")
    _platform.environment.cache_clear()
    _platform.detect.cache_clear()
    yield
    _platform.environment.cache_clear()
    _platform.detect.cache_clear()


def make_handler(impl: str, directory):
    import tensorflow as tf

    require_impl(impl)
    if impl == "ours":
        import tf_failure_handling as tfh

        cls = tfh.PreemptionCheckpointHandler
    else:
        cls = tf.distribute.experimental.PreemptionCheckpointHandler
    v = tf.Variable(1.0)
    checkpoint = tf.train.Checkpoint(v=v)
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(tf.train.ClusterSpec({}))
    handler = cls(resolver, checkpoint, str(directory))
    return handler, v


def close(handler) -> None:
    getattr(handler, "close", lambda: None)()


def digest(directory) -> dict:
    return {
        name: hashlib.sha256((directory / name).read_bytes()).hexdigest()
        for name in sorted(os.listdir(directory))
    }


@pytest.fixture
def saved(tmp_path):
    """A checkpoint directory holding one complete checkpoint of run 7 (v = 5.0)."""
    directory = tmp_path / "ckpt"
    handler, v = make_handler("ours", directory)
    v.assign(5.0)
    handler._run_counter = 7
    handler._save_checkpoint()
    close(handler)
    assert sorted(os.listdir(directory)) == [
        "checkpoint",
        "ckpt-1.data-00000-of-00001",
        "ckpt-1.index",
    ]
    return directory


@pytest.mark.parametrize("impl", ["tf", "ours"])
def test_an_intact_checkpoint_restores(impl, saved):
    handler, v = make_handler(impl, saved)
    try:
        assert int(handler._run_counter) == 7
        assert float(v.numpy()) == 5.0
    finally:
        close(handler)


@pytest.mark.parametrize("impl", ["tf", "ours"])
@pytest.mark.parametrize("below", [False, True], ids=["is_a_file", "below_a_file"])
def test_a_directory_that_is_a_file_fails_at_construction(impl, below, tmp_path):
    import tensorflow as tf

    path = tmp_path / "ckpt"
    path.write_text("not a directory")
    target = path / "sub" if below else path
    if impl == "tf":
        # TF finds out only when it saves: at the preemption, too late.
        handler, _ = make_handler(impl, target)
        with pytest.raises(tf.errors.FailedPreconditionError, match="not a directory"):
            handler._save_checkpoint()
    else:
        with pytest.raises(tf.errors.FailedPreconditionError, match="not a directory"):
            make_handler(impl, target)
    assert path.read_text() == "not a directory"


def test_a_directory_without_write_permission_fails_at_construction(tmp_path, monkeypatch):
    import tensorflow as tf

    # Tests run as root, for whom every directory is writable: ask os.access to say no.
    real_access = os.access
    denied = str(tmp_path / "readonly")
    os.mkdir(denied)
    monkeypatch.setattr(
        os, "access", lambda p, mode: False if str(p) == denied else real_access(p, mode)
    )
    with pytest.raises(tf.errors.PermissionDeniedError, match="no permission"):
        make_handler("ours", os.path.join(denied, "ckpt"))


def damage_index(directory) -> None:
    (directory / "ckpt-1.index").write_bytes(b"\x00garbage\xff" * 2)


def damage_data(directory) -> None:
    path = directory / "ckpt-1.data-00000-of-00001"
    data = bytearray(path.read_bytes())
    data[:8] = b"\xff" * 8
    path.write_bytes(bytes(data))


def remove_index(directory) -> None:
    (directory / "ckpt-1.index").unlink()


@pytest.mark.parametrize("impl", ["tf", "ours"])
@pytest.mark.parametrize(
    "damage,expected",
    [
        # TF raises a bare OpError for a damaged index, without the checkpoint's path
        # (README: "Differences"); ours, DataLossError (an OpError) naming it.
        (damage_index, {"tf": ("OpError", False), "ours": ("DataLossError", True)}),
        (damage_data, {"tf": ("DataLossError", True), "ours": ("DataLossError", True)}),
        (remove_index, {"tf": ("NotFoundError", True), "ours": ("NotFoundError", True)}),
    ],
    ids=["index", "data", "missing_index"],
)
def test_a_damaged_checkpoint_is_a_clear_error_and_nothing_is_deleted(
    impl, damage, expected, saved
):
    import tensorflow as tf

    damage(saved)
    before = digest(saved)
    with pytest.raises(tf.errors.OpError) as info:
        make_handler(impl, saved)
    assert digest(saved) == before, "the failed restore changed the checkpoint directory"
    error = info.value
    name, names_the_path = expected[impl]
    assert type(error).__name__ == name, repr(error)
    assert (str(saved / "ckpt-1") in str(error)) is names_the_path, str(error)
    if impl == "ours":
        assert "left as they are" in str(error)
