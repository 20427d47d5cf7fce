"""Where a non-chief worker's copy of the checkpoint goes (issue 36, part 2; issue 50):
none by default (every tensor read, no write; a copy that cannot be left out goes to
TF's in-memory file system when the host can hold it, else to the storage), TF's
``workertemp_<task_id>`` beside the checkpoint with
``TF_FAILURE_HANDLING_NON_CHIEF_SAVES=storage``. Real MWMS workers:
tests/integration/test_mwms_handler.py."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
from tf_failure_handling import PreemptionCheckpointHandler, testing
from tf_failure_handling._integrations import tf_reads_only
from tf_failure_handling._protocol import checkpoints as ck
from tf_failure_handling._protocol import non_chief_saves
from tf_failure_handling._protocol.records_hooks import StageRecords

tf = pytest.importorskip("tensorflow", reason="the in-memory copy is TensorFlow's ram://")

ENV = non_chief_saves.NON_CHIEF_SAVES_ENV


def _checkpoint():
    return tf.train.Checkpoint(v=tf.Variable(tf.range(1000, dtype=tf.float32)))


def _files_under(path: str) -> list:
    return [f for f in tf.io.gfile.glob(f"{path}/*") if not tf.io.gfile.isdir(f)]


def test_a_non_chief_reads_every_tensor_writes_no_copy_and_its_folder_goes_at_the_exit(
    monkeypatch, tmp_path
):
    """Issue 50: the default ``memory`` mode writes no copy at all (the reads are made,
    the write left out): its manager's folder in ``ram://`` holds only the ``checkpoint``
    file, at every save (a grace period's two rounds)."""
    monkeypatch.delenv(ENV, raising=False)
    ckpt_dir = tmp_path / "ckpt"
    saves = ck.Checkpoints(_checkpoint(), str(ckpt_dir), is_chief=False, task_id=1)
    directory = saves.write.directory
    assert re.fullmatch(r"ram://tf_failure_handling/\d+-\d+/workertemp_1/ckpt", directory)
    for n in (1, 2):
        saves.save(7, (), {})
        assert [f.rsplit("/", 1)[-1] for f in _files_under(directory)] == ["checkpoint"]
        assert saves.write.latest_checkpoint.endswith(f"/ckpt-{n}")
        fields = saves.save_fields()
        assert fields["copy"] == "none" and fields["copy_bytes"] >= 4000, fields
    assert list(tmp_path.iterdir()) == [], "nothing reaches the checkpoint's storage"
    assert saves.read.directory == str(ckpt_dir)  # restores read the chief's checkpoint
    saves.remove_worker_temp(is_chief=False)
    assert not tf.io.gfile.exists(directory.rsplit("/", 2)[0])


def _whole_copies(monkeypatch, memory):
    """Every save writes a whole copy (as a saver with registered savers does), and the
    host's memory reads ``memory``: ``(cgroups, MemAvailable)``."""
    monkeypatch.setattr(tf_reads_only, "cannot_skip", lambda saver: "a test's saver")
    monkeypatch.setattr(non_chief_saves, "_read_memory", lambda: memory)


def test_a_whole_copy_that_fits_goes_to_memory(monkeypatch, tmp_path):
    monkeypatch.delenv(ENV, raising=False)
    _whole_copies(monkeypatch, ([(None, None, None)], 8 << 30))
    saves = ck.Checkpoints(_checkpoint(), str(tmp_path / "ckpt"), is_chief=False, task_id=1)
    saves.save(7, (), {})
    assert sorted(f.rsplit("/", 1)[-1] for f in _files_under(saves.write.directory)) == [
        "checkpoint",
        "ckpt-1.data-00000-of-00001",
        "ckpt-1.index",
    ]
    fields = saves.save_fields()
    assert fields["copy"] == "memory" and fields["copy_whole"] == "a test's saver"
    assert fields["copy_available"] == 8 << 30
    assert fields["copy_needed"] > fields["copy_bytes"] >= 4000
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "memory",
    [
        ([], 1 << 20),  # the machine's MemAvailable
        ([(2 << 30, (2 << 30) - (1 << 20), 0), (None, None, None)], 8 << 30),  # a cgroup v2's
        ([(9223372036854771712, 1 << 30, 0), (1 << 30, 1 << 30, None)], None),  # v1, a parent's
    ],
    ids=["meminfo", "cgroup", "parent-cgroup"],
)
def test_a_whole_copy_that_does_not_fit_goes_to_the_storage_and_says_so(
    monkeypatch, tmp_path, caplog, memory
):
    """Issue 50: a copy the host cannot hold goes to TF's workertemp_<task_id> on the
    storage (an OOM kill would lose the save), in the log and in the record's fields;
    the exit removes it."""
    monkeypatch.delenv(ENV, raising=False)
    _whole_copies(monkeypatch, memory)
    saves = ck.Checkpoints(_checkpoint(), str(tmp_path / "ckpt"), is_chief=False, task_id=1)
    with caplog.at_level("WARNING", logger="tf_failure_handling"):
        saves.save(7, (), {})
    copy = tmp_path / "workertemp_1" / "ckpt"
    assert sorted(p.name for p in copy.iterdir()) == [
        "ckpt-1.data-00000-of-00001",
        "ckpt-1.index",
    ]
    assert [f.rsplit("/", 1)[-1] for f in _files_under(saves.write.directory)] == ["checkpoint"]
    fields = saves.save_fields()
    assert fields["copy"] == "storage", fields
    assert fields["copy_needed"] > fields["copy_available"], fields
    assert "cannot hold it" in caplog.text and str(copy) in caplog.text
    # The save's record says so: save.py passes these fields to the save_end line.
    lines = []
    recorder = SimpleNamespace(current="p0", write=lambda stage, **f: lines.append((stage, f)))
    StageRecords(recorder, SimpleNamespace(), "worker 1").save_end(
        saves.write, **saves.save_fields()
    )
    [(stage, line)] = lines
    assert stage == "save_end" and line["copy"] == "storage", line
    assert line["copy_needed"] == fields["copy_needed"] and line["path"].endswith("ckpt-1")
    # A second save (a grace period's final round) leaves one copy there, as TF's does.
    saves.save(8, (), {})
    assert sorted(p.name for p in copy.iterdir()) == [
        "ckpt-2.data-00000-of-00001",
        "ckpt-2.index",
    ]
    saves.remove_worker_temp(is_chief=False)
    assert not (tmp_path / "workertemp_1").exists()


def test_storage_and_the_chief_write_no_copy_fields(monkeypatch, tmp_path):
    monkeypatch.setenv(ENV, "storage")
    saves = ck.Checkpoints(_checkpoint(), str(tmp_path / "ckpt"), is_chief=False, task_id=1)
    saves.save(7, (), {})
    assert saves.save_fields() == {} and not saves.reads_only
    monkeypatch.delenv(ENV)
    chief = ck.Checkpoints(_checkpoint(), str(tmp_path / "ckpt"), is_chief=True, task_id=0)
    chief.save(7, (), {})
    assert chief.save_fields() == {} and not chief.reads_only


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
    saves.save(7, (), {})
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
