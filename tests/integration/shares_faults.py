"""Faults a ``shares`` save can meet, injected into TensorFlow from user-level code (the
package is left untouched): ``mwms_worker.py --fault NAME`` installs one in a worker.

* ``exit-at-record-state``: the first ``CheckpointManager._record_state`` (TensorFlow
  writes the ``checkpoint`` state file there, in the save's write callback, after the
  checkpoint's files) prints a ``fault`` event and ends the process with
  ``os._exit(EXIT_AT_RECORD_STATE)``: the chief killed after the merge, before the state
  file names the checkpoint.
* ``truncate-part-at-merge``: the first ``MergeV2Checkpoints`` finds its last part's
  index cut to half its bytes (done just before the merge, after the chief checked the
  parts' fingerprints), prints a ``fault`` event and runs: the merge fails with TF's
  ``DataLossError``.
"""

from __future__ import annotations

import os

#: The exit code of a process ended at ``_record_state`` (``exit-at-record-state``).
EXIT_AT_RECORD_STATE = 9
FAULTS = ("exit-at-record-state", "truncate-part-at-merge")


def install(name: str, emit) -> None:
    """Installs fault ``name`` in this process; ``emit(event, **fields)`` prints events."""
    if name == "exit-at-record-state":
        _exit_at_record_state(emit)
    elif name == "truncate-part-at-merge":
        _truncate_part_at_merge(emit)
    else:
        raise ValueError(f"unknown fault {name!r}: one of {FAULTS}")


def _exit_at_record_state(emit) -> None:
    from tensorflow.python.checkpoint import checkpoint_management

    cls = checkpoint_management.CheckpointManager

    def record_state(self, *args, **kwargs):
        emit("fault", fault="exit-at-record-state", latest=self._latest_checkpoint)
        os._exit(EXIT_AT_RECORD_STATE)

    cls._record_state = record_state


def _truncate_part_at_merge(emit) -> None:
    from tensorflow.python.ops import gen_io_ops

    original = gen_io_ops.merge_v2_checkpoints
    done: list = []

    def merge_v2_checkpoints(checkpoint_prefixes, destination_prefix, *args, **kwargs):
        if not done:
            done.append(True)
            prefixes = [p.decode() for p in checkpoint_prefixes.numpy()]
            index = prefixes[-1] + ".index"
            size = os.path.getsize(index)
            with open(index, "r+b") as f:
                f.truncate(size // 2)
            emit("fault", fault="truncate-part-at-merge", index=index, size=size)
        return original(checkpoint_prefixes, destination_prefix, *args, **kwargs)

    gen_io_ops.merge_v2_checkpoints = merge_v2_checkpoints
