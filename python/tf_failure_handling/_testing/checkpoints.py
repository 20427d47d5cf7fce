"""A checkpoint without TensorFlow: :class:`FakeVariable`, :class:`FakeCheckpoint` and
:class:`FakeCheckpointManager` (JSON files written atomically, with
``CheckpointManager``'s contract). Public through ``tf_failure_handling.testing``.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from typing import Any, Optional


class FakeVariable:
    """A checkpointable number: ``assign``, ``assign_add``, ``numpy``."""

    def __init__(self, value: Any = 0) -> None:
        self._value = value

    def assign(self, value: Any) -> FakeVariable:
        self._value = value
        return self

    def assign_add(self, delta: Any) -> FakeVariable:
        self._value = self._value + delta
        return self

    def numpy(self) -> Any:
        return self._value

    def __repr__(self) -> str:
        return f"FakeVariable({self._value!r})"


class FakeCheckpoint:
    """A checkpoint of :class:`FakeVariable` attributes, saved as JSON.

    Any ``FakeVariable`` attribute is saved, including the ``checkpointed_runs``
    counter the handler attaches.
    """

    def __init__(self, **variables: FakeVariable) -> None:
        for name, var in variables.items():
            if not isinstance(var, FakeVariable):
                raise TypeError(f"{name} must be a FakeVariable, got {type(var).__name__}")
            setattr(self, name, var)

    def variables(self) -> dict:
        return {k: v for k, v in vars(self).items() if isinstance(v, FakeVariable)}

    def make_manager(self, directory: str, max_to_keep: int = 1) -> FakeCheckpointManager:
        return FakeCheckpointManager(self, directory, max_to_keep)

    def make_counter(self) -> FakeVariable:
        return FakeVariable(0)


class FakeCheckpointManager:
    """``tf.train.CheckpointManager``'s contract for a :class:`FakeCheckpoint`.

    A save writes ``ckpt-<n>.json`` through a temporary file and a rename, then
    the ``checkpoint`` index: a crash leaves either the previous checkpoint or
    the new one, never a partial file in use.
    """

    INDEX = "checkpoint"

    def __init__(self, checkpoint: FakeCheckpoint, directory: str, max_to_keep: int = 1) -> None:
        self._checkpoint = checkpoint
        self.directory = os.fspath(directory)
        self._max_to_keep = max_to_keep
        self.saves = 0
        # Checkpoints this manager keeps, oldest first: like TF's manager it
        # counts recency of saves, not checkpoint numbers. Files found on disk
        # at start count as older than any save of this manager.
        self._kept = self._existing()
        self._next = (self._kept[-1] + 1) if self._kept else 1

    @property
    def latest_checkpoint(self) -> Optional[str]:
        try:
            with open(os.path.join(self.directory, self.INDEX)) as f:
                name = f.read().strip()
        except FileNotFoundError:
            return None
        path = os.path.join(self.directory, name)
        return path if os.path.exists(path) else None

    def _existing(self) -> list:
        if not os.path.isdir(self.directory):
            return []
        found = []
        for n in os.listdir(self.directory):
            if n.startswith("ckpt-") and n.endswith(".json"):
                found.append(int(n[5:-5]))
        return sorted(found)

    def save(self, checkpoint_number: Optional[int] = None) -> str:
        os.makedirs(self.directory, exist_ok=True)
        number = self._next if checkpoint_number is None else int(checkpoint_number)
        self._next = max(self._next, number + 1)
        name = f"ckpt-{number}.json"
        path = os.path.join(self.directory, name)
        data = {k: v.numpy() for k, v in self._checkpoint.variables().items()}
        _atomic_write(path, json.dumps(data))
        _atomic_write(os.path.join(self.directory, self.INDEX), name)
        if number in self._kept:
            self._kept.remove(number)
        self._kept.append(number)
        while self._max_to_keep and len(self._kept) > self._max_to_keep:
            old = self._kept.pop(0)
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(self.directory, f"ckpt-{old}.json"))
        self.saves += 1
        return path

    def restore_or_initialize(self) -> Optional[str]:
        path = self.latest_checkpoint
        if path is None:
            return None
        with open(path) as f:
            data = json.load(f)
        for name, var in self._checkpoint.variables().items():
            if name in data:
                var.assign(data[name])
        return path


def _atomic_write(path: str, text: str) -> None:
    tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
