"""The tf_keras ``Model.fit`` internals the input position relies on, and nothing else.

tf_keras' ``BackupAndRestore(save_before_preemption=True)`` makes the handler inside
``fit`` (``on_train_begin``), with a checkpoint of its own (``WorkerTrainingState``).
Relies on (tf_keras 2.16-2.21, ``tf_keras/src/engine/training.py`` and
``data_adapter.py``): ``Model.fit``'s local ``data_handler`` (a ``DataHandler``) whose
``_dataset`` is the input ``enumerate_epochs`` makes its iterators of: one before the
first epoch, then one per epoch when ``_adapter.should_recreate_iterator()``; fit sets
``_initial_epoch`` and ``_initial_step`` (the restored batch) after ``on_train_begin``.
"""

from __future__ import annotations

import inspect
import os
import sys
from dataclasses import dataclass
from typing import Any, Optional

from . import tf_last_step

#: How far up the stack the handler's constructor may be from ``fit``.
_MAX_FRAMES = 64
_TRAINING = "tf_keras.src.engine.training"


@dataclass
class Fit:
    """The objects of the tf_keras ``fit`` call that is making a handler."""

    model: Any
    data_handler: Any

    @property
    def dataset(self) -> Any:
        return self.data_handler._dataset

    def recreates_iterator(self) -> bool:
        """Whether each epoch makes a new iterator (else one spans the epochs)."""
        return bool(self.data_handler._adapter.should_recreate_iterator())

    def initial_step(self) -> int:
        return int(self.data_handler._initial_step or 0)

    def steps_per_execution(self) -> int:
        value = getattr(self.data_handler, "_steps_per_execution", None)
        try:
            return max(1, int(value.numpy()))
        except AttributeError:
            return max(1, int(value or 1))


def fit_on_stack(checkpoint: Any) -> Optional[Fit]:
    """The tf_keras fit whose ``BackupAndRestore`` made ``checkpoint``, when the caller
    runs inside it (None otherwise: a custom loop, Keras 3, or no tf_keras)."""
    training = sys.modules.get(_TRAINING)
    if training is None or not hasattr(checkpoint, "ckpt_saved_epoch"):
        return None
    fit = getattr(getattr(training, "Model", None), "fit", None)
    code = getattr(inspect.unwrap(fit), "__code__", None) if fit is not None else None
    if code is None:
        return None
    frame = sys._getframe(1)
    for _ in range(_MAX_FRAMES):
        if frame is None:
            return None
        if frame.f_code is code:
            found = frame.f_locals
            data_handler = found.get("data_handler")
            if data_handler is None or not hasattr(data_handler, "_dataset"):
                return None
            return Fit(found.get("self"), data_handler)
        frame = frame.f_back
    return None


def backup_survivors_save() -> Optional[str]:
    """A survivors' save for a tf_keras non-chief to restore, or None.

    ``BackupAndRestore(save_before_preemption=True)`` makes the handler in
    ``WorkerTrainingState.__init__``, with its *write* manager: a non-chief's is its own
    ``workertemp_<task>`` folder, which it restores from, as with TensorFlow's handler
    (its preemption saves go there). The survivors of a lost worker save once, into the
    folder every worker reads (``<backup_dir>/chief``, the read manager's): when the
    state file there names a survivors' save, that is the checkpoint to restore.
    """
    frame = sys._getframe(1)
    for _ in range(_MAX_FRAMES):
        if frame is None:
            return None
        state = frame.f_locals.get("self")
        if type(state).__name__ == "WorkerTrainingState" and type(state).__module__.startswith(
            "tf_keras"
        ):
            read = getattr(state, "read_checkpoint_manager", None)
            write = getattr(state, "write_checkpoint_manager", None)
            if read is None or read is write:
                return None
            latest = read.latest_checkpoint
            if latest and os.path.basename(latest).startswith(tf_last_step.SURVIVORS_PREFIX):
                return latest
            return None
        frame = frame.f_back
    return None
