"""The survivors' writers agree through the checkpoint folder (issue 62): with real
TensorFlow checkpoints in a local folder, each writer led by its own protocol object
(``Event.Claims``; ``src/protocol/lost.rs``), as ``survivor_folder.agree`` performs it.

Success, for each case: the state file (``tf.train.latest_checkpoint``) names one whole
checkpoint, the one of the most runs among the claims of this job; a writer that lost
left no file; a writer that a claim or a newer job says was paused writes nothing (its
``write`` is never called, or what it wrote is deleted); the checkpoints the state file
listed before are still listed.

Each case runs on a local folder and on ``ram://``, TensorFlow's in-memory file system
(a file system reached through ``tf.io.gfile`` only, as ``gs://`` is).
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid

import pytest
import tensorflow as tf
from tf_failure_handling import _native
from tf_failure_handling._protocol import survivor_folder
from tf_failure_handling._protocol.survivor_folder import SurvivorFolder

Action, Event = _native.Action, _native.Event
RESET = "Collective ops is aborted by: recvmsg:Connection reset by peer"
UNAVAILABLE = 14
#: Bound on a writer thread of the cut (a few small checkpoint writes).
WRITER_BOUND = 120.0


@pytest.fixture(params=["local", "ram"])
def folder(request, tmp_path) -> str:
    """The checkpoint folder: a local one, or one on ``ram://``."""
    if request.param == "local":
        return str(tmp_path)
    return f"ram://survivors-{uuid.uuid4().hex}/ckpt"


def _path(directory: str, name: str) -> str:
    return f"{directory}/{name}" if "://" in directory else os.path.join(directory, name)


def _writer(me: int, n: int, lost: list) -> _native.ProtocolCore:
    """Worker ``me``'s protocol object of ``n`` workers, named the writer after a probe
    found ``lost`` gone."""
    core = _native.HandlerCore()._protocol_core()
    core.configure(worker_id=me, num_workers=n, grace_period=0.0)
    assert isinstance(core.handle(Event.StepFailed(UNAVAILABLE, RESET)), Action.Probe)
    after = core.handle(Event.Probed(lost))
    assert isinstance(after, Action.PeerLost) and after.writes, after
    return core


def _writes(directory: str, name: str, value: float, calls: list, before=None):
    """A ``write`` for ``agree``: saves a checkpoint of ``value`` as ``name`` (calls
    ``before`` first); each call is counted in ``calls``."""

    def write():
        calls.append(name)
        if before is not None:
            before()
        return tf.train.Checkpoint(v=tf.Variable(value)).write(_path(directory, name))

    return write


def _value(path: str) -> float:
    v = tf.Variable(0.0)
    tf.train.Checkpoint(v=v).read(path).assert_consumed()
    return float(v.numpy())


def _earlier_save(directory: str) -> str:
    """A checkpoint the job saved before the loss, through a manager (its state file)."""
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=tf.Variable(1.0)), directory, 3)
    return manager.save(checkpoint_number=40)


def _marked(directory: str) -> tuple:
    """Worker 0 marks the folder for its job; worker 1 reads the mark."""
    chief, other = SurvivorFolder(directory), SurvivorFolder(directory)
    chief.mark()
    other.read_mark()
    assert chief.token is not None and chief.token == other.token
    return chief, other


def test_a_lone_writer_names_its_checkpoint_and_keeps_the_earlier_ones(folder):
    directory = folder
    earlier = _earlier_save(directory)
    folder, _ = _marked(directory)
    calls: list = []
    named_after = time.time()
    agreed = survivor_folder.agree(
        _writer(0, 2, [1]), folder, 0, 50, [1], _writes(directory, "ckpt-survivor0-50", 50.0, calls)
    )
    assert isinstance(agreed.end, Action.Settled) and not agreed.end.discard, agreed
    assert tf.train.latest_checkpoint(directory) == agreed.path == agreed.named["checkpoint"]
    assert _value(agreed.path) == 50.0
    state = tf.train.get_checkpoint_state(directory)
    assert list(state.all_model_checkpoint_paths) == [earlier, agreed.path]
    # The earlier save keeps its stamp; the survivors' is stamped as the core said.
    stamps = list(state.all_model_checkpoint_timestamps)
    assert len(stamps) == 2 and stamps[0] < stamps[1] and stamps[1] >= named_after, stamps
    # A manager opened on the folder afterwards (the restart's) reads it as its own.
    restart = tf.train.CheckpointManager(tf.train.Checkpoint(v=tf.Variable(0.0)), directory, 3)
    assert restart.latest_checkpoint == agreed.path
    assert restart.checkpoints == [earlier, agreed.path]
    [claim] = folder.claims().values()
    assert claim == {"writer": 0, "runs": 50, "lost": [1], "checkpoint": agreed.path}


def test_both_sides_of_a_cut_save_and_one_checkpoint_wins_whole(folder):
    """A network cut: worker 0 (lost 1) and worker 1 (lost 0) both read the folder before
    either claim is there, then save at once (a barrier in their writes). Whatever order
    their writes reach the folder in, the state file ends naming worker 0's run 50.
    Worker 1 deletes its own files when it read worker 0's claim before it settled; else
    the restart's mark deletes them. Either way the restart finds one checkpoint."""
    directory = folder
    earlier = _earlier_save(directory)
    chief, other = _marked(directory)
    both_checked = threading.Barrier(2, timeout=WRITER_BOUND)
    calls: list = []
    results: dict = {}

    def side(me, folder, runs, lost):
        write = _writes(
            directory, f"ckpt-survivor{me}-{runs}", float(runs), calls, both_checked.wait
        )
        results[me] = survivor_folder.agree(_writer(me, 2, lost), folder, me, runs, lost, write)

    threads = [
        threading.Thread(target=side, args=(0, chief, 50, [1])),
        threading.Thread(target=side, args=(1, other, 49, [0])),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WRITER_BOUND)
        assert not t.is_alive(), f"a writer did not end within {WRITER_BOUND:g} s"
    assert sorted(calls) == ["ckpt-survivor0-50", "ckpt-survivor1-49"], "both sides saved"
    won, lost = results[0], results[1]
    assert isinstance(won.end, Action.Settled) and not won.end.discard, won
    # Worker 1 settled on worker 0's claim (and deleted its own), or on its own before
    # worker 0's claim landed.
    assert isinstance(lost.end, Action.Settled), lost
    assert lost.end.discard == (lost.end.writer == 0), lost
    assert tf.train.latest_checkpoint(directory) == won.path
    assert _value(won.path) == 50.0
    assert list(tf.train.get_checkpoint_state(directory).all_model_checkpoint_paths) == [
        earlier,
        won.path,
    ]
    # The restart: the new job's mark deletes the losing checkpoint and every claim.
    SurvivorFolder(directory).mark()
    assert tf.io.gfile.glob(lost.path + "*") == [], "the losing checkpoint is deleted"
    assert _value(won.path) == 50.0 and tf.train.latest_checkpoint(directory) == won.path
    assert chief.claims() == {} and other.claims() == {}


def test_a_writer_a_claim_names_lost_writes_nothing(folder):
    """Worker 0 was paused (or on the far side of a cut) while worker 1 found it lost and
    saved: when it resumes, it reads worker 1's claim naming it, and writes nothing."""
    directory = folder
    chief, other = _marked(directory)
    calls: list = []
    first = survivor_folder.agree(
        _writer(1, 2, [0]), other, 1, 49, [0], _writes(directory, "ckpt-survivor1-49", 49.0, calls)
    )
    assert isinstance(first.end, Action.Settled)
    late = survivor_folder.agree(
        _writer(0, 2, [1]), chief, 0, 50, [1], _writes(directory, "ckpt-survivor0-50", 50.0, calls)
    )
    assert isinstance(late.end, Action.Refuse) and "worker 1 found this worker lost" in late.end.why
    assert calls == ["ckpt-survivor1-49"], "the paused worker never saved"
    assert tf.train.latest_checkpoint(directory) == first.path


def test_a_writer_paused_across_a_restart_writes_nothing(folder):
    """The job restarted while worker 1 was paused: the new job's chief marked the folder.
    Worker 1 does not write, and a mark made while it saves deletes what it wrote."""
    directory = folder
    earlier = _earlier_save(directory)
    _, paused = _marked(directory)
    SurvivorFolder(directory).mark()  # the new job's chief
    calls: list = []
    refused = survivor_folder.agree(
        _writer(1, 2, [0]), paused, 1, 49, [0], _writes(directory, "ckpt-survivor1-49", 49.0, calls)
    )
    assert isinstance(refused.end, Action.Refuse) and "a newer job" in refused.end.why
    assert calls == [] and tf.train.latest_checkpoint(directory) == earlier

    _, paused = _marked(directory)
    restarted = SurvivorFolder(directory).mark
    during = survivor_folder.agree(
        _writer(1, 2, [0]),
        paused,
        1,
        49,
        [0],
        _writes(directory, "ckpt-survivor1-49", 49.0, calls, before=restarted),
    )
    assert isinstance(during.end, Action.Refuse) and during.end.discard, during
    assert tf.io.gfile.glob(during.path + "*") == [] and paused.claims() == {}
    assert tf.train.latest_checkpoint(directory) == earlier


def test_a_claim_that_is_not_whole_is_ignored_with_a_warning(tmp_path, caplog):
    directory = str(tmp_path)
    folder, _ = _marked(directory)
    folder.claim(1, 60, [0], os.path.join(directory, "ckpt-survivor1-60"))
    path = os.path.join(directory, survivor_folder.FOLDER, folder.token, "claim-1")
    with open(path) as f:
        whole = f.read()
    with open(path, "w") as f:
        f.write(whole[: len(whole) // 2])
    assert folder.claims() == {}
    assert "not whole" in caplog.text
    json.loads(whole)  # what was cut was a whole claim


@pytest.mark.parametrize("me", [0, 1])
def test_a_worker_that_never_learned_its_token_is_not_fenced_but_still_agrees(tmp_path, me):
    directory = str(tmp_path)
    folder = SurvivorFolder(directory)  # no mark read: the chief's mark failed
    calls: list = []
    agreed = survivor_folder.agree(
        _writer(me, 2, [1 - me]),
        folder,
        me,
        7,
        [1 - me],
        _writes(directory, f"ckpt-survivor{me}-7", 7.0, calls),
    )
    assert isinstance(agreed.end, Action.Settled) and not agreed.end.discard
    assert tf.train.latest_checkpoint(directory) == agreed.path
    assert os.path.isdir(os.path.join(directory, survivor_folder.FOLDER, survivor_folder.UNMARKED))
