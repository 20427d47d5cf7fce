"""A non-chief's look for the chief's checkpoint of a round (issue 62): the state file
the chief's ``tf.train.CheckpointManager`` writes after the checkpoint's files, naming
the checkpoint the non-chief's own save named (the two count their saves together)."""

from __future__ import annotations

import pytest

tf = pytest.importorskip("tensorflow")

from tf_failure_handling._protocol.chief_checkpoint import ChiefCheckpoint  # noqa: E402


def test_the_look_finds_the_checkpoint_the_state_file_names(tmp_path):
    chief = tf.train.CheckpointManager(
        tf.train.Checkpoint(v=tf.Variable(1.0)), str(tmp_path / "chief"), max_to_keep=1
    )
    assert not ChiefCheckpoint._named(str(tmp_path / "chief"), "ckpt-1"), "no state file yet"
    chief.save()
    assert ChiefCheckpoint._named(str(tmp_path / "chief"), "ckpt-1")
    assert not ChiefCheckpoint._named(str(tmp_path / "chief"), "ckpt-2"), "an older round"
    assert not ChiefCheckpoint._named(str(tmp_path / "nowhere"), "ckpt-1")


def test_an_unreadable_state_file_is_not_seen(tmp_path):
    (tmp_path / "checkpoint").write_text("not a state file {")
    assert not ChiefCheckpoint._named(str(tmp_path), "ckpt-1")
