"""A non-chief's part of a MultiWorkerMirroredStrategy save: every read, no copy.

Under MWMS every worker must take part in a save: a ``SyncOnRead`` variable's value is
an all-reduce across the workers, made while the checkpoint's tensors are read. The copy
a non-chief then writes is never read (a restore reads the chief's checkpoint) and
TensorFlow deletes it before the exit. Inside :func:`reading_only` (on the thread that
saves), TensorFlow's ``MultiDeviceSaver.save`` reads every tensor as it always does, in
the same order as on the chief (``_get_shards_by_task``: the collectives match), waits
for the reads, and writes nothing: no host memory for a copy (``ram://`` held one) and
no bytes on the storage (TensorFlow's ``workertemp_<task_id>`` held one). The manager's
own small ``checkpoint`` file is still written, in its folder, so its next save (a grace
period's final round) goes on as in TensorFlow.

A saver whose save does more than read and write (registered savers, tensors of several
tasks, graph mode) saves as TensorFlow does: before that copy is written, the plan's
``where(prefix, why)`` says where it goes (the prefix given, or one on the storage when
the host's memory cannot hold it: the core's ``copy_fits``).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

from . import saver_hook


@dataclass(frozen=True)
class Plan:
    """One non-chief's saves. ``skipped(bytes)``: the copy of ``bytes`` was not written
    (every tensor was read). ``where(prefix, why)``: this saver cannot leave its copy
    out (``why``); the prefix to write it to (``prefix`` itself, or another)."""

    skipped: Callable[[int], None]
    where: Callable[[str, str], str]


@contextmanager
def reading_only(plan: Plan) -> Iterator[None]:
    """Makes the saves of this thread read without writing, inside the block."""
    with saver_hook.saving_with(lambda saver, prefix, options: _save(saver, prefix, options, plan)):
        yield


def cannot_skip(saver: Any) -> Optional[str]:
    """Why ``saver``'s save does more than read its tensors and write them (None: it
    does not, and the write can be left out)."""
    from tensorflow.python.eager import context

    if not context.executing_eagerly():
        return "the save is traced into a graph"
    # Read as they are: the mode was installed only on a TensorFlow whose savers have
    # them (saver_hook.missing), and a default here would turn a rename into a save
    # that leaves out the reads the other workers' collectives wait for.
    if saver._registered_savers:
        return "the checkpoint has registered savers"
    if saver._num_unique_tasks != 1:
        return "the tensors are on more than one task"
    return None


def _save(self: Any, file_prefix: Any, options: Any, plan: Plan) -> Any:
    why = cannot_skip(self)
    if why is not None:
        prefix = saver_hook.as_str(file_prefix)
        where = plan.where(prefix, why)
        return saver_hook.original(self, file_prefix if where == prefix else where, options)
    return _read_all(self, plan)


def _size(shardable: Any) -> int:
    """Bytes of one tensor of a save, once read (``_get_shards_by_task``)."""
    shape = shardable.shape
    if shape is None:
        return 0
    elements = shape.num_elements()
    size = getattr(shardable.dtype, "size", 0) or 0
    return (elements or 0) * size


def variable_bytes(checkpoint: Any) -> int:
    """The bytes of the variables in ``checkpoint``'s object graph, from their shapes and
    types (nothing is read: a save's read of a ``SyncOnRead`` variable is a collective,
    made once per save on every worker): about what a copy's data files hold."""
    import tensorflow as tf

    total, seen = 0, set()
    for trackable in tf.train.TrackableView(checkpoint).descendants():
        if isinstance(trackable, tf.Variable) and id(trackable) not in seen:
            seen.add(id(trackable))
            elements = trackable.shape.num_elements() or 0
            total += elements * (getattr(trackable.dtype, "size", 0) or 0)
    return total


class _Count:
    """TensorFlow's sharding callback, which keeps nothing: the bytes it was given."""

    description = "tf_failure_handling: read only (a non-chief's save)"

    def __init__(self) -> None:
        self.bytes = 0

    def __call__(self, shardables: Any) -> list:
        self.bytes += sum(_size(s) for s in shardables)
        return []


def _read_all(saver: Any, plan: Plan) -> None:
    from tensorflow.python.eager import context

    count = _Count()
    # Every tensor is read here (the save specs' reads, collectives among them), in the
    # order TensorFlow's own save reads them on the chief.
    saver._get_shards_by_task(count)
    context.async_wait()
    plan.skipped(count.bytes)
    return None
