"""The last whole step a survivor saves (issue 62): held after a step, written back
before the save, refused when the checkpoint has variables nothing was held for; the
checkpoint's own count of its saves, made by a preemption's round after the last hold, is
not one of them (the survivors' save counts itself)."""

from __future__ import annotations

import pytest

tf = pytest.importorskip("tensorflow")

from tf_failure_handling._integrations.tf_last_step import LastStep  # noqa: E402


def test_the_held_step_is_written_back_whatever_came_after():
    v = tf.Variable([1.0, 2.0])
    ckpt = tf.train.Checkpoint(v=v)
    held = LastStep(ckpt)
    held.hold(7)
    v.assign([5.0, 5.0])  # a torn step, say
    assert held.restore() == []
    assert held.run_count == 7
    assert v.numpy().tolist() == [1.0, 2.0]


def test_a_variable_made_after_the_hold_refuses_the_restore():
    v = tf.Variable(1.0)
    ckpt = tf.train.Checkpoint(v=v)
    held = LastStep(ckpt)
    held.hold(3)
    ckpt.w = tf.Variable(2.0, name="made_later")
    v.assign(9.0)
    assert held.restore() == ["made_later:0"]
    assert v.numpy() == 9.0, "nothing written back"


def test_the_save_counter_made_by_a_rounds_save_after_the_hold_is_not_missing():
    v = tf.Variable(1.0)
    ckpt = tf.train.Checkpoint(v=v)
    held = LastStep(ckpt)
    held.hold(4)
    assert ckpt.save_counter.numpy() == 0  # the property makes the variable now
    v.assign(3.0)
    assert held.restore() == []
    assert v.numpy() == 1.0
