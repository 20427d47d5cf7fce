"""Where a non-chief worker's copy of the checkpoint goes (issue 36, part 2): TF's
in-memory file system by default, TF's ``workertemp_<task_id>`` beside the checkpoint
with ``TF_FAILURE_HANDLING_NON_CHIEF_SAVES=storage``. Real MWMS workers:
tests/integration/test_mwms_handler.py."""

from __future__ import annotations

import re

import pytest
from tf_failure_handling import PreemptionCheckpointHandler, testing
from tf_failure_handling._protocol import checkpoints as ck

tf = pytest.importorskip("tensorflow", reason="the in-memory copy is TensorFlow's ram://")

ENV = ck.NON_CHIEF_SAVES_ENV


def _checkpoint():
    return tf.train.Checkpoint(v=tf.Variable(tf.range(1000, dtype=tf.float32)))


def _files_under(path: str) -> list:
    return [f for f in tf.io.gfile.glob(f"{path}/*") if not tf.io.gfile.isdir(f)]


def test_a_non_chief_saves_in_memory_and_its_folder_goes_at_the_exit(monkeypatch, tmp_path):
    monkeypatch.delenv(ENV, raising=False)
    ckpt_dir = tmp_path / "ckpt"
    saves = ck.Checkpoints(_checkpoint(), str(ckpt_dir), is_chief=False, task_id=1)
    directory = saves.write.directory
    assert re.fullmatch(r"ram://tf_failure_handling/\d+-\d+/workertemp_1/ckpt", directory)
    saves.save(7, (), {}, clock=lambda: 0.0)
    assert sorted(f.rsplit("/", 1)[-1] for f in _files_under(directory)) == [
        "checkpoint",
        "ckpt-1.data-00000-of-00001",
        "ckpt-1.index",
    ]
    assert list(tmp_path.iterdir()) == [], "nothing reaches the checkpoint's storage"
    assert saves.read.directory == str(ckpt_dir)  # restores read the chief's checkpoint
    saves.remove_worker_temp(is_chief=False)
    assert not tf.io.gfile.exists(directory.rsplit("/", 2)[0])


def test_two_handlers_of_one_process_get_two_folders(monkeypatch, tmp_path):
    monkeypatch.delenv(ENV, raising=False)
    a = ck.Checkpoints(_checkpoint(), str(tmp_path / "ckpt"), is_chief=False, task_id=1)
    b = ck.Checkpoints(_checkpoint(), str(tmp_path / "ckpt"), is_chief=False, task_id=1)
    assert a.write.directory != b.write.directory


@pytest.mark.parametrize("value", ["storage", "STORAGE", " storage "])
def test_storage_gives_tfs_layout(monkeypatch, tmp_path, value):
    monkeypatch.setenv(ENV, value)
    saves = ck.Checkpoints(_checkpoint(), str(tmp_path / "ckpt"), is_chief=False, task_id=1)
    assert saves.write.directory == str(tmp_path / "workertemp_1" / "ckpt")
    saves.save(7, (), {}, clock=lambda: 0.0)
    assert (tmp_path / "workertemp_1" / "ckpt" / "ckpt-1.index").is_file()
    saves.remove_worker_temp(is_chief=False)
    assert not (tmp_path / "workertemp_1").exists()


def test_the_chief_and_a_fake_checkpoint_write_to_storage(monkeypatch, tmp_path):
    monkeypatch.delenv(ENV, raising=False)
    chief = ck.Checkpoints(_checkpoint(), str(tmp_path / "ckpt"), is_chief=True, task_id=0)
    assert chief.write is chief.read and chief.write.directory == str(tmp_path / "ckpt")
    fake = testing.FakeCheckpoint(w=testing.FakeVariable(0))
    saves = ck.Checkpoints(fake, str(tmp_path / "ckpt"), is_chief=False, task_id=1)
    assert saves.write.directory == str(tmp_path / "workertemp_1" / "ckpt")


@pytest.mark.parametrize("value", ["disk", "ram", "1"])
def test_a_bad_value_stops_the_handler_at_construction(monkeypatch, tmp_path, value):
    monkeypatch.setenv(ENV, value)
    with pytest.raises(ValueError, match=re.escape(f"{ENV}={value!r}")):
        PreemptionCheckpointHandler(None, testing.FakeCheckpoint(), str(tmp_path))
