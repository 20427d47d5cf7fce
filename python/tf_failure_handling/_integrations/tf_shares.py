"""Each worker writes a share of one TensorFlow checkpoint; the chief merges the shares.

Inside :func:`writing_shares` (on the thread that saves), TensorFlow's
``MultiDeviceSaver.save`` reads every tensor, as it always does (a ``SyncOnRead``
variable's read needs every worker), then writes only this worker's share as one part
of TensorFlow's own sharded layout, ``<prefix>_temp/part-0000i-of-0000n``, in the
chief's checkpoint folder. The chief waits for the other parts and merges them with
``MergeV2Checkpoints``, as TensorFlow's sharded save does: the checkpoint is
``<prefix>.index`` and ``<prefix>.data-0000i-of-0000n``, whole or absent. Which worker
writes which tensor is the core's answer (``assign_shares``), the same on every worker.

A saver this cannot split (registered savers, tensors of several tasks, graph mode)
saves as TensorFlow does, on every worker: the plan's ``fallback`` is told once.
"""

from __future__ import annotations

import hashlib
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

from .. import _errors
from .._native import assign_shares, shares_wait_bound

#: The object graph's key: in the chief's part, so the merged index describes it.
OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"


@dataclass(frozen=True)
class Plan:
    """One save's shares, as one worker sees them.

    ``directory``: the chief's checkpoint folder (the prefix's basename is the same on
    every worker). ``done(name, value)``: a non-chief tells the chief that its part of
    checkpoint ``name`` is written (``value``: ``"ok <digest>"``, or ``"error <message>"``).
    ``wait(name, worker, digest, seconds)``: the chief waits for ``worker``'s part, raising
    if it failed, did not come within ``seconds`` or holds other tensors (``digest``).
    ``fallback(why)``: this saver cannot be split and saves as TensorFlow does.
    """

    directory: str
    worker: int
    workers: int
    done: Callable[[str, str], None]
    wait: Callable[[str, int, str, float], None]
    fallback: Callable[[str], None]
    clock: Callable[[], float]
    #: The shortest wait of the chief for the other parts (the core's ``wait_bound``).
    min_wait: float


_local = threading.local()
_lock = threading.Lock()
_original: Optional[Callable[..., Any]] = None


@contextmanager
def writing_shares(plan: Plan) -> Iterator[None]:
    """Makes the saves of this thread write ``plan``'s share inside the block."""
    _install()
    previous = getattr(_local, "plan", None)
    _local.plan = plan
    try:
        yield
    finally:
        _local.plan = previous


def _install() -> None:
    global _original
    from tensorflow.python.checkpoint import functional_saver

    with _lock:
        if _original is None:
            _original = functional_saver.MultiDeviceSaver.save
            functional_saver.MultiDeviceSaver.save = _save


def _save(self: Any, file_prefix: Any, options: Any = None) -> Any:
    plan = getattr(_local, "plan", None)
    if plan is None:
        return _original(self, file_prefix, options)
    from tensorflow.python.eager import context

    why = None
    if not context.executing_eagerly():
        why = "the save is traced into a graph"
    elif getattr(self, "_registered_savers", None):
        why = "the checkpoint has registered savers"
    elif getattr(self, "_num_unique_tasks", 1) != 1:
        why = "the tensors are on more than one task"
    elif not hasattr(self, "_get_shards_by_task"):
        why = "this TensorFlow's saver has no _get_shards_by_task"
    if why is not None:
        plan.fallback(why)
        return _original(self, file_prefix, options)
    return _save_share(self, plan, _as_str(file_prefix), options)


def _as_str(prefix: Any) -> str:
    value = prefix.numpy() if hasattr(prefix, "numpy") else prefix
    return value.decode() if isinstance(value, bytes) else str(value)


def _size(shardable: Any) -> int:
    elements = shardable.shape.num_elements()
    size = getattr(shardable.dtype, "size", 0) or 0
    return (elements or 0) * size


class _Split:
    """TensorFlow's sharding callback: all the tensors of the task, as ``workers`` shares."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.digest = ""
        self.owner: list = []
        self.parts: list = []

    @property
    def description(self) -> str:
        return f"tf_failure_handling: one share per worker ({self.workers} workers)"

    def __call__(self, shardables: Any) -> list:
        listed = sorted(shardables, key=lambda s: (s.checkpoint_key, str(s.slice_spec)))
        self.digest = hashlib.sha256(
            "\n".join(
                f"{s.checkpoint_key}|{s.slice_spec}|{s.dtype.name}|{s.shape}" for s in listed
            ).encode()
        ).hexdigest()[:16]
        self.owner, self.parts = assign_shares(
            [_size(s) for s in listed],
            [s.checkpoint_key == OBJECT_GRAPH_KEY for s in listed],
            self.workers,
        )
        shares: list = [{} for _ in range(self.workers)]
        for s, worker in zip(listed, self.owner):
            shares[worker].setdefault(s.checkpoint_key, {})[s.slice_spec] = s.tensor
        return shares


def _save_share(saver: Any, plan: Plan, file_prefix: str, options: Any) -> Any:
    from tensorflow.python.checkpoint import checkpoint_options, functional_saver
    from tensorflow.python.eager import context
    from tensorflow.python.framework import constant_op
    from tensorflow.python.lib.io import file_io
    from tensorflow.python.ops import gen_io_ops

    options = options or checkpoint_options.CheckpointOptions()
    name = file_prefix.rstrip("/").rsplit("/", 1)[-1]
    prefix = f"{plan.directory.rstrip('/')}/{name}"
    split = _Split(plan.workers)
    # Every tensor is read here, on every worker, in the same order.
    by_task = saver._get_shards_by_task(split)
    if len(by_task) != 1:
        plan.fallback(f"the tensors are on {len(by_task)} tasks")
        return _original(saver, file_prefix, options)
    [(task, shares)] = by_task
    # TensorFlow's own temporary layout (S3 has no folder to rename from).
    temp = prefix + (".part" if prefix.startswith("s3://") else "_temp/part")
    count = len(split.parts)
    parts = [f"{temp}-{i:05d}-of-{count:05d}" for i in range(count)]
    mine = split.parts.index(plan.worker) if plan.worker in split.parts else None
    start = plan.clock()
    try:
        if mine is not None:
            # SaveV2 makes only the last folder: the chief's may not exist yet here.
            file_io.recursive_create_dir_v2(parts[mine].rsplit("/", 1)[0])
            functional_saver._single_shard_save(
                constant_op.constant(parts[mine]), shares[plan.worker], task, options
            )
        context.async_wait()
    except Exception as e:
        if plan.worker != 0:
            plan.done(name, f"error {type(e).__name__}: {e}")
        raise
    if plan.worker != 0:
        plan.done(name, f"ok {split.digest}")
        return None
    deadline = plan.clock() + shares_wait_bound(plan.clock() - start, plan.min_wait)
    for worker in range(1, plan.workers):
        plan.wait(name, worker, split.digest, max(0.001, deadline - plan.clock()))
    if not parts:
        return None
    errors = _errors.module()
    try:
        gen_io_ops.merge_v2_checkpoints(
            checkpoint_prefixes=constant_op.constant(parts),
            destination_prefix=constant_op.constant(prefix),
            delete_old_dirs=True,
        )
    except errors.NotFoundError as e:
        raise errors.NotFoundError(
            None,
            None,
            f"{e.message} -- the chief merges the parts every worker wrote into {prefix}: "
            "for the workers to write one checkpoint together, its folder must be one "
            "every worker sees (gs://, s3://, a shared file system).",
        ) from e
    return None
