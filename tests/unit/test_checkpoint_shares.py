"""The workers write one checkpoint together (``TF_FAILURE_HANDLING_NON_CHIEF_SAVES=shares``,
issue 36 part 2): two workers of one process, each its own ``tf.train.Checkpoint`` with the
same variables, over one in-memory coordination service. Real MWMS workers:
tests/integration/test_mwms_handler.py."""

from __future__ import annotations

import re
import threading
import time

import numpy as np
import pytest
from tf_failure_handling import testing
from tf_failure_handling._cluster import coordination
from tf_failure_handling._protocol import checkpoint_shares as shares_mod
from tf_failure_handling._protocol import checkpoints as ck
from tf_failure_handling._protocol import non_chief_saves

tf = pytest.importorskip("tensorflow", reason="the shares are TensorFlow's sharded layout")

ENV = non_chief_saves.NON_CHIEF_SAVES_ENV
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


def _workers(ckpt_dir, service, *checkpoints, dirs=None) -> list:
    """One worker per checkpoint, built at once (each waits for the others' answers to
    the folder's probe at its construction); ``dirs``: each worker's own folder."""
    built: list = [None] * len(checkpoints)

    def build(i: int) -> None:
        try:
            built[i] = _worker(
                (dirs or {}).get(i, ckpt_dir), i, service, checkpoints[i], workers=len(checkpoints)
            )
        except BaseException as e:  # noqa: BLE001 - handed to the test
            built[i] = e

    threads = [threading.Thread(target=build, args=(i,)) for i in range(len(checkpoints))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_BOUND)
    return built


def _save_in_thread(saves: ck.Checkpoints, run_count: int) -> tuple:
    errors: list = []

    def save():
        try:
            saves.save(run_count, (), {})
        except BaseException as e:  # noqa: BLE001 - handed to the test
            errors.append(e)

    thread = threading.Thread(target=save, name=f"worker-{saves._worker}")
    thread.start()
    return thread, errors


@pytest.fixture
def shares(monkeypatch):
    monkeypatch.setenv(ENV, "shares")
    return testing.InMemoryCoordinationService()


def _core_with_deadline(worker: int, left: float):
    """A handler's ``ProtocolCore`` whose notice leaves ``left`` seconds before its
    deadline less the exit's reserve (5 s): the core bounds the shares' waits by that."""
    from tf_failure_handling import _native

    core = _native.HandlerCore()._protocol_core()
    core.configure(worker_id=None, num_workers=worker, grace_period=0.0, exit_reserve=5.0)
    if left is not None:
        end = time.time() + 5.0 + left  # a platform's deadline: Unix time
        core.handle(_native.Event.Notice("test", "m", end, end))
    return core


class _CutWaits(testing.InMemoryCoordinationService):
    """A service whose waits for a key end at once (as when their bound passed)."""

    def get_config_key_value(self, key, timeout_in_ms=0):
        return super().get_config_key_value(key, 1)


def test_each_worker_writes_a_share_and_the_chief_merges_them(shares, tmp_path):
    ckpt_dir = tmp_path / "ckpt"
    chief, other = _workers(ckpt_dir, shares, _checkpoint(), _checkpoint(0.5))
    assert chief.shared_by == other.shared_by == 2
    thread, errors = _save_in_thread(other, 7)
    chief.save(7, (), {})
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
    chief.save(9, (), {})
    thread.join(JOIN_BOUND)
    assert errors == []
    assert sorted(p.name for p in ckpt_dir.glob("ckpt-*")) == [
        "ckpt-2.data-00000-of-00002",
        "ckpt-2.data-00001-of-00002",
        "ckpt-2.index",
    ]
    assert tf.train.latest_checkpoint(str(ckpt_dir)).endswith("ckpt-2")


def test_a_share_that_never_comes_leaves_the_last_checkpoint_as_it_was(shares, tmp_path):
    ckpt_dir = tmp_path / "ckpt"
    chief, _ = _workers(ckpt_dir, shares, _checkpoint(), _checkpoint())
    chief.core = _core_with_deadline(0, 0.2)  # the core bounds the chief's wait: 0.2 s
    with pytest.raises(
        tf.errors.DeadlineExceededError,
        match=r"Worker 1's share of checkpoint ckpt-1 .* was not written",
    ):
        chief.save(7, (), {})
    assert not list(ckpt_dir.glob("ckpt-*.index")), "no checkpoint without every share"
    assert tf.train.latest_checkpoint(str(ckpt_dir)) is None


def test_a_worker_whose_share_failed_fails_the_chief_at_once(shares, tmp_path):
    ckpt_dir = tmp_path / "ckpt"
    chief, _ = _workers(ckpt_dir, shares, _checkpoint(), _checkpoint())
    shares.set_config_key_value(
        f"{chief.share_keys(1)}/ckpt-1/1", "error PermissionDeniedError: no room"
    )
    with pytest.raises(
        tf.errors.AbortedError, match=r"Worker 1's share .* could not be written: .*no room"
    ):
        chief.save(7, (), {})
    assert not list(ckpt_dir.glob("ckpt-*.index"))


def test_workers_with_other_variables_cannot_write_together(shares, tmp_path):
    ckpt_dir = tmp_path / "ckpt"
    chief, other = _workers(
        ckpt_dir, shares, _checkpoint(), tf.train.Checkpoint(only=tf.Variable([1.0]))
    )
    thread, _ = _save_in_thread(other, 7)
    with pytest.raises(
        tf.errors.FailedPreconditionError, match="holds other tensors than the chief's"
    ):
        chief.save(7, (), {})
    thread.join(JOIN_BOUND)
    assert not list(ckpt_dir.glob("ckpt-*.index"))


def test_one_worker_or_a_fake_checkpoint_saves_alone(shares, tmp_path):
    alone = _worker(tmp_path / "a", 0, shares, workers=1)
    assert alone.shared_by == 1
    fake = _worker(tmp_path / "b", 1, shares, testing.FakeCheckpoint(w=testing.FakeVariable(0)))
    assert fake.shared_by == 1
    # A non-chief that writes shares keeps its manager's bookkeeping in memory.
    _, other = _workers(tmp_path / "c", shares, _checkpoint(), _checkpoint())
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
    chief, other = _workers(ckpt_dir, shares, _checkpoint(), _checkpoint())
    thread, errors = _save_in_thread(other, 3)
    key = f"{chief.share_keys(1)}/ckpt-1/1"
    assert shares.get_config_key_value(key, int(JOIN_BOUND * 1000)).startswith("ok "), errors
    chief.save(3, (), {})
    thread.join(JOIN_BOUND)
    assert errors == []
    reader = tf.train.load_checkpoint(str(ckpt_dir / "ckpt-1"))
    expected = _checkpoint()
    for name in ("big", "mid", "small"):
        np.testing.assert_array_equal(
            reader.get_tensor(f"{name}/.ATTRIBUTES/VARIABLE_VALUE"), getattr(expected, name).numpy()
        )


# ---------------------------------------------------- issue 50: whole or absent, bounded


def _ok_key(saves: ck.Checkpoints, number: int, name: str, worker: int = 1) -> str:
    if not hasattr(saves, "share_keys"):  # main before issue 50, to see the test fail there
        return f"{shares_mod.SHARE_KEY}/{saves.read.directory}/{number}/{name}/{worker}"
    return f"{saves.share_keys(number)}/{name}/{worker}"


def _wait_for(service, key: str) -> str:
    return service.get_config_key_value(key, int(JOIN_BOUND * 1000))


def _restale(part: str) -> None:
    """Writes a part of the same tensors, other values, over the one at ``part``: what an
    earlier attempt leaves where a worker's part should be."""
    reader = tf.train.load_checkpoint(part)
    names = sorted(reader.get_variable_to_shape_map())
    tensors = [tf.constant(reader.get_tensor(n)) + 1000 for n in names]
    tf.raw_ops.SaveV2(
        prefix=part, tensor_names=names, shape_and_slices=[""] * len(names), tensors=tensors
    )


def test_a_part_that_is_not_the_one_its_worker_wrote_is_not_merged(shares, tmp_path):
    """Worker 1's part is replaced, after its "ok", by a stale part of the same tensors
    (a folder the chief does not share with it, holding an earlier attempt's part): the
    chief sees that the part is not the one worker 1 wrote (its "ok" names the part's
    size and index digest), merges nothing, and tells worker 1, which does not take the
    save as done. `checkpoint` still names the last good save. On main (2f3c22f) the
    stale part was merged: ckpt-2 with worker 1's tensors 1000 off, no error."""
    ckpt_dir = tmp_path / "ckpt"
    chief, other = _workers(ckpt_dir, shares, _checkpoint(), _checkpoint())
    thread, errors = _save_in_thread(other, 3)
    chief.save(3, (), {})
    thread.join(JOIN_BOUND)
    assert errors == [] and tf.train.latest_checkpoint(str(ckpt_dir)).endswith("ckpt-1")

    thread, errors = _save_in_thread(other, 5)
    assert _wait_for(shares, _ok_key(other, 2, "ckpt-2")).startswith("ok ")
    (index,) = ckpt_dir.glob("ckpt-2_temp*/part-00001-of-00002.index")
    _restale(str(index)[: -len(".index")])
    with pytest.raises(tf.errors.FailedPreconditionError, match="is not the one it wrote"):
        chief.save(5, (), {})
    thread.join(JOIN_BOUND)
    assert not thread.is_alive()
    assert [type(e).__name__ for e in errors] == ["AbortedError"], errors
    assert "did not merge checkpoint ckpt-2" in str(errors[0])
    assert not list(ckpt_dir.glob("ckpt-2.*")), "nothing merged"
    assert tf.train.latest_checkpoint(str(ckpt_dir)).endswith("ckpt-1")


def test_a_leftover_part_of_an_earlier_attempt_is_never_one_of_this_save_s(shares, tmp_path):
    """A `ckpt-1_temp/part-…` an interrupted attempt left (TensorFlow's own temporary
    path) is not where this save's parts go: the merged checkpoint holds what the
    workers wrote now, and the leftover stays as it was."""
    ckpt_dir = tmp_path / "ckpt"
    old = tf.train.Checkpoint(big=tf.Variable(tf.zeros(4000)))
    leftover = ckpt_dir / "ckpt-1_temp" / "part-00001-of-00002"
    leftover.parent.mkdir(parents=True)
    old.write(str(leftover))
    chief, other = _workers(ckpt_dir, shares, _checkpoint(), _checkpoint(0.5))
    thread, errors = _save_in_thread(other, 3)
    chief.save(3, (), {})
    thread.join(JOIN_BOUND)
    assert errors == []
    reader = tf.train.load_checkpoint(str(ckpt_dir / "ckpt-1"))
    assert reader.get_tensor("mid/.ATTRIBUTES/VARIABLE_VALUE")[0] == 0.5
    assert sorted(p.name for p in leftover.parent.iterdir())[0].startswith("part-00001")
    assert not list(ckpt_dir.glob("ckpt-1_temp_*")), "this save's parts folder is gone"


def test_a_folder_a_worker_cannot_see_is_an_error_at_construction(shares, tmp_path):
    """The non-chief's checkpoint_dir is another folder (as on a host that does not
    share the chief's): both workers raise FailedPreconditionError at construction,
    before any notice; the probe file does not stay. On main both were built."""
    chief, other = _workers(
        tmp_path / "a", shares, _checkpoint(), _checkpoint(), dirs={1: tmp_path / "b"}
    )
    for built in (chief, other):
        assert isinstance(built, tf.errors.FailedPreconditionError), built
        assert "cannot see the probe file" in str(built) and "every worker sees" in str(built)
    assert not list((tmp_path / "a").glob(shares_mod.PROBE_FILE + "*"))


def test_the_probe_s_wait_is_bounded_and_says_what_it_waited_for(shares, tmp_path):
    """A wait that ends without an answer (the service cuts it short, as the core's
    bound, ``shares::Probe``, does after 60 s: its Rust tests) is an error naming what
    it waited for."""
    with pytest.raises(
        tf.errors.DeadlineExceededError, match=r"Waited 60s .* say whether it sees the probe"
    ):
        _worker(tmp_path, 0, _CutWaits())
    with pytest.raises(tf.errors.DeadlineExceededError, match=r"Waited 60s .* the chief's probe"):
        _worker(tmp_path, 1, _CutWaits())


def test_a_part_missing_at_the_merge_gets_the_shared_folder_message(shares, tmp_path, monkeypatch):
    """TF 2.21's MergeV2Checkpoints raises InvalidArgumentError ("allow_missing_files"),
    older ones NotFoundError, for a missing part: either way the message says that the
    folder must be one every worker sees. On main the InvalidArgumentError went out
    without it."""
    from tensorflow.python.ops import gen_io_ops

    ckpt_dir = tmp_path / "ckpt"
    chief, other = _workers(ckpt_dir, shares, _checkpoint(), _checkpoint())
    merge = gen_io_ops.merge_v2_checkpoints

    def merge_without_worker_1_s_part(**kwargs):
        for f in ckpt_dir.glob("ckpt-1_temp*/part-00001-of-00002*"):
            f.unlink()
        return merge(**kwargs)

    monkeypatch.setattr(gen_io_ops, "merge_v2_checkpoints", merge_without_worker_1_s_part)
    thread, errors = _save_in_thread(other, 3)
    with pytest.raises((tf.errors.InvalidArgumentError, tf.errors.NotFoundError)) as raised:
        chief.save(3, (), {})
    thread.join(JOIN_BOUND)
    assert "every worker sees" in str(raised.value), raised.value
    assert [type(e).__name__ for e in errors] == ["AbortedError"], errors
    assert tf.train.latest_checkpoint(str(ckpt_dir)) is None


def test_the_wait_for_the_merge_is_bounded_by_the_notice_s_deadline(shares, tmp_path):
    """A non-chief whose handler's notice leaves 0.5 s before its deadline less the exit's
    reserve waits that long for the chief's merge, not 2 x 60 s, then raises, naming
    what it waited for."""
    ckpt_dir = tmp_path / "ckpt"
    _, other = _workers(ckpt_dir, shares, _checkpoint(), _checkpoint())
    other.core = _core_with_deadline(1, 0.5)
    thread, errors = _save_in_thread(other, 3)
    thread.join(JOIN_BOUND)
    assert not thread.is_alive()
    assert [type(e).__name__ for e in errors] == ["DeadlineExceededError"], errors
    assert "waited" in str(errors[0]) and "for its report" in str(errors[0])


@pytest.mark.parametrize(
    ("memory", "place"),
    [(([], 8 << 30), "memory"), (([], 1 << 20), "storage")],
    ids=["fits", "does-not-fit"],
)
def test_a_saver_that_cannot_be_split_puts_the_non_chief_s_copy_where_the_host_can_hold_it(
    shares, tmp_path, monkeypatch, memory, place
):
    """Issue 50, item 2, in the shares mode: a saver no share can be cut from (registered
    savers, tensors of several tasks) saves as TensorFlow does, a whole copy on every
    worker; the non-chief's goes to memory only when the host can hold it, else to
    TensorFlow's workertemp_<task_id> on the storage, as in the memory mode, and its
    save_end fields say which."""
    from tf_failure_handling._integrations import tf_reads_only

    monkeypatch.setattr(tf_reads_only, "cannot_skip", lambda saver: "a test's saver")
    monkeypatch.setattr(non_chief_saves, "_read_memory", lambda: memory)
    ckpt_dir = tmp_path / "ckpt"
    chief, other = _workers(ckpt_dir, shares, _checkpoint(), _checkpoint())
    thread, errors = _save_in_thread(other, 7)
    chief.save(7, (), {})
    thread.join(JOIN_BOUND)
    assert not thread.is_alive() and errors == []
    # The chief's checkpoint is TensorFlow's whole one.
    assert tf.train.latest_checkpoint(str(ckpt_dir)).endswith("ckpt-1")
    fields = other.save_fields()
    assert fields["copy"] == place and fields["copy_whole"] == "a test's saver", fields
    copy = tmp_path / "workertemp_1" / "ckpt"
    if place == "storage":
        assert sorted(p.name for p in copy.iterdir()) == [
            "ckpt-1.data-00000-of-00001",
            "ckpt-1.index",
        ]
    else:
        assert not copy.exists()
        assert any(f.endswith("ckpt-1.index") for f in tf.io.gfile.listdir(other.write.directory))
    assert chief.save_fields() == {}, "the chief writes the checkpoint, not a copy"
    other.remove_worker_temp(is_chief=False)
    assert not (tmp_path / "workertemp_1").exists()


# ------------------------------------------ issue 60 part 2: "saved" means the state file


def _merged_key(saves: ck.Checkpoints, number: int, name: str) -> str:
    return f"{saves.share_keys(number)}/{name}/merged"


def _reported(service, key: str):
    """The value of ``key`` now, or None when it is not set."""
    try:
        return service.get_config_key_value(key, 1)
    except tf.errors.DeadlineExceededError:
        return None


def test_the_others_hear_merged_only_once_the_state_file_names_the_checkpoint(
    shares, tmp_path, monkeypatch
):
    """When TensorFlow writes the state file (``_record_state``, in the save's write
    callback, after the merge), nothing is reported yet; after the chief's save, "ok".
    On main (97acf12) "ok" was already set there: a chief that ended at that moment left
    the non-chief with the restart code for a checkpoint no restart reads."""
    from tensorflow.python.checkpoint import checkpoint_management

    ckpt_dir = tmp_path / "ckpt"
    chief, other = _workers(ckpt_dir, shares, _checkpoint(), _checkpoint())
    seen: list = []
    record_state = checkpoint_management.CheckpointManager._record_state

    def watched(manager, *args, **kwargs):
        if manager is chief.write:
            seen.append(_reported(shares, _merged_key(chief, 1, "ckpt-1")))
        return record_state(manager, *args, **kwargs)

    monkeypatch.setattr(checkpoint_management.CheckpointManager, "_record_state", watched)
    thread, errors = _save_in_thread(other, 3)
    chief.save(3, (), {})
    thread.join(JOIN_BOUND)
    assert errors == [] and not thread.is_alive()
    assert seen and seen[0] is None, seen
    assert _reported(shares, _merged_key(chief, 1, "ckpt-1")) == "ok"


def test_a_merge_that_would_not_end_before_the_deadline_is_not_started(
    shares, tmp_path, monkeypatch
):
    """The chief measured a merge of over 3 s (its core heard it); its notice leaves 2 s
    before the deadline less the exit's reserve: the merge is not started, the chief's
    error says so, the non-chief hears it, this save's parts are removed and the state
    file still names ckpt-1. On main the merge started whatever the time left."""
    import time

    from tensorflow.python.ops import gen_io_ops
    from tf_failure_handling import _native

    ckpt_dir = tmp_path / "ckpt"
    chief, other = _workers(ckpt_dir, shares, _checkpoint(), _checkpoint())
    core = _core_with_deadline(0, None)
    chief.core = core
    merge = gen_io_ops.merge_v2_checkpoints

    def slow_merge(**kwargs):
        time.sleep(3.0)
        return merge(**kwargs)

    monkeypatch.setattr(gen_io_ops, "merge_v2_checkpoints", slow_merge)
    thread, errors = _save_in_thread(other, 3)
    chief.save(3, (), {})
    thread.join(JOIN_BOUND)
    assert errors == []

    end = time.time() + 7.0
    core.handle(_native.Event.Notice("test", "m", end, end))
    thread, errors = _save_in_thread(other, 5)
    with pytest.raises(tf.errors.DeadlineExceededError, match="was not started") as raised:
        chief.save(5, (), {})
    thread.join(JOIN_BOUND)
    needed = float(re.search(r"expected to take ([0-9.]+)s", str(raised.value)).group(1))
    assert needed >= 3.0 and "stays" in str(raised.value), raised.value
    assert [type(e).__name__ for e in errors] == ["AbortedError"], errors
    assert "was not started" in str(errors[0])
    assert not list(ckpt_dir.glob("ckpt-2*")), sorted(p.name for p in ckpt_dir.iterdir())
    assert tf.train.latest_checkpoint(str(ckpt_dir)).endswith("ckpt-1")


def test_a_failed_merge_removes_its_parts(shares, tmp_path, monkeypatch):
    """The merge fails (worker 1's part index cut short): nothing of the save is left,
    neither the parts folder nor a merged file. On main the parts folder stayed."""
    from tensorflow.python.ops import gen_io_ops

    ckpt_dir = tmp_path / "ckpt"
    chief, other = _workers(ckpt_dir, shares, _checkpoint(), _checkpoint())
    merge = gen_io_ops.merge_v2_checkpoints

    def merge_a_cut_part(**kwargs):
        (index,) = ckpt_dir.glob("ckpt-1_temp*/part-00001-of-00002.index")
        index.write_bytes(index.read_bytes()[:10])
        return merge(**kwargs)

    monkeypatch.setattr(gen_io_ops, "merge_v2_checkpoints", merge_a_cut_part)
    thread, errors = _save_in_thread(other, 3)
    with pytest.raises(tf.errors.DataLossError):
        chief.save(3, (), {})
    thread.join(JOIN_BOUND)
    assert [type(e).__name__ for e in errors] == ["AbortedError"], errors
    assert sorted(p.name for p in ckpt_dir.iterdir()) == [], "the save left its parts"


@pytest.mark.parametrize("blocked", ["fingerprint", "merge"])
def test_the_chief_s_reads_of_the_parts_and_its_merge_are_bounded(
    shares, tmp_path, monkeypatch, blocked
):
    """A read of worker 1's part, or the merge, that does not return (a storage that
    hangs): the chief gives up after its bound (the notice's deadline less the exit's
    reserve, here 2 s) with ``DeadlineExceededError`` naming what it waited for, and
    tells worker 1. On main both waited as long as the call took."""
    from tensorflow.python.ops import gen_io_ops
    from tf_failure_handling._integrations import tf_shares

    release = threading.Event()
    ckpt_dir = tmp_path / "ckpt"
    chief, other = _workers(ckpt_dir, shares, _checkpoint(), _checkpoint())
    chief.core = _core_with_deadline(0, 2.0)
    if blocked == "fingerprint":
        own = tf_shares.part_fingerprint

        # Worker 1 saves in the thread `_save_in_thread` names after it, which may read
        # its part before the test holds the thread object: it is told by its name.
        saver = f"worker-{other._worker}"

        def fingerprint(part: str):
            # The chief's read of worker 1's part hangs; each worker's own read does not.
            if part.endswith("part-00001-of-00002") and threading.current_thread().name != saver:
                release.wait(JOIN_BOUND)
            return own(part)

        monkeypatch.setattr(tf_shares, "part_fingerprint", fingerprint)
        said = "for the read of worker 1's part"
    else:
        monkeypatch.setattr(
            gen_io_ops, "merge_v2_checkpoints", lambda **k: release.wait(JOIN_BOUND)
        )
        said = "for MergeV2Checkpoints of 2 parts"
    thread, errors = _save_in_thread(other, 3)
    try:
        with pytest.raises(tf.errors.DeadlineExceededError, match=said):
            chief.save(3, (), {})
        thread.join(JOIN_BOUND)
        assert [type(e).__name__ for e in errors] == ["AbortedError"], errors
        assert tf.train.latest_checkpoint(str(ckpt_dir)) is None
    finally:
        release.set()
