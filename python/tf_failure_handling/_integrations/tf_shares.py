"""Each worker writes a share of one TensorFlow checkpoint; the chief merges the shares.

Inside :func:`writing_shares` (on the thread that saves), TensorFlow's
``MultiDeviceSaver.save`` reads every tensor, as it always does (a ``SyncOnRead``
variable's read needs every worker), then writes only this worker's share as one part
of TensorFlow's own sharded layout, ``<prefix>_temp_<token>/part-0000i-of-0000n`` (the
save's token: a part an earlier attempt left is never one of these), in the chief's
checkpoint folder. The chief waits for the other parts, checks that each is the one its
worker wrote (the data's size and the index's digest, from the worker's "ok"), merges
them with ``MergeV2Checkpoints``, as TensorFlow's sharded save does, and publishes the
result, which each non-chief waits for: the checkpoint is ``<prefix>.index`` and
``<prefix>.data-0000i-of-0000n``, whole or absent. Which worker writes which tensor is
the core's answer (``assign_shares``), the same on every worker; how long each wait
lasts is the core's too (``ProtocolCore.shares_wait_bound``).

A saver this cannot split (registered savers, tensors of several tasks, graph mode)
saves as TensorFlow does, on every worker: the plan's ``fallback`` is told once, and
a non-chief's whole copy goes where the plan's ``where`` says (memory, or the storage
when the host's memory cannot hold it).
"""

from __future__ import annotations

import hashlib
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Tuple

from .. import _errors
from .._native import assign_shares
from . import saver_hook, tf_reads_only

#: The object graph's key: in the chief's part, so the merged index describes it.
OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"


@dataclass(frozen=True)
class Plan:
    """One save's shares, as one worker sees them.

    ``directory``: the chief's checkpoint folder (the prefix's basename is the same on
    every worker). ``token``: this save's, the same on every worker (the chief's token
    from the handler's construction and the save's number): the parts go to
    ``<prefix>_temp_<token>/``, so a part an earlier attempt left is never merged.
    ``done(name, value)``: a non-chief tells the chief that its part of checkpoint
    ``name`` is written (``value``: ``"ok <tensors> <data bytes> <index digest>"``, or
    ``"error <message>"``). ``wait(name, worker, digest, seconds)``: the chief waits for
    ``worker``'s part and returns its ``(data bytes, index digest)``, raising if it
    failed, did not come within ``seconds`` or holds other tensors (``digest``).
    ``merged(name, value)``: the chief tells the others the merge's result (``"ok"`` or
    ``"error <message>"``); ``wait_merged(name, seconds)``: a non-chief waits for it,
    raising unless it is ``"ok"``. ``bound(own, chief)``: the seconds a wait lasts from
    now, after this worker's own part took ``own`` (the core's
    ``shares_wait_bound``: the deadline less the exit's reserve binds it).
    ``fallback(why)``: this saver cannot be split and saves as TensorFlow does.
    ``where(prefix, why)``: on a non-chief, where that whole copy goes (``prefix`` itself,
    or a folder on the storage when the host's memory cannot hold it); None: ``prefix``.
    """

    directory: str
    worker: int
    workers: int
    token: str
    done: Callable[[str, str], None]
    wait: Callable[[str, int, str, float], Tuple[int, str]]
    merged: Callable[[str, str], None]
    wait_merged: Callable[[str, float], None]
    bound: Callable[[float, bool], float]
    fallback: Callable[[str], None]
    clock: Callable[[], float]
    where: Optional[Callable[[str, str], str]] = None


@contextmanager
def writing_shares(plan: Plan) -> Iterator[None]:
    """Makes the saves of this thread write ``plan``'s share inside the block."""
    with saver_hook.saving_with(lambda saver, prefix, options: _save(saver, prefix, options, plan)):
        yield


def _save(self: Any, file_prefix: Any, options: Any, plan: Plan) -> Any:
    # The savers a share cannot be cut from are those whose copy cannot be left out.
    why = tf_reads_only.cannot_skip(self)
    if why is not None:
        plan.fallback(why)
        return saver_hook.original(self, _placed(plan, file_prefix, why), options)
    return _save_share(self, plan, saver_hook.as_str(file_prefix), options)


def _placed(plan: Plan, file_prefix: Any, why: str) -> Any:
    """The prefix a save this cannot split writes its whole copy to: the plan's
    ``where`` decides on a non-chief (memory, or the storage when the host's memory
    cannot hold it); the chief's is the checkpoint itself."""
    if plan.where is None:
        return file_prefix
    prefix = saver_hook.as_str(file_prefix)
    target = plan.where(prefix, why)
    return file_prefix if target == prefix else target


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


def part_files(part: str) -> Tuple[str, str]:
    """The index and the data file SaveV2 writes for the one-shard prefix ``part``."""
    return f"{part}.index", f"{part}.data-00000-of-00001"


def part_fingerprint(part: str) -> Tuple[int, str]:
    """``(data bytes, index digest)`` of the part at ``part``, as this worker sees it:
    the index holds each tensor's offset, size and checksum, so two parts with the same
    fingerprint hold the same bytes. Raises TF's ``NotFoundError`` when it is missing."""
    from tensorflow.python.lib.io import file_io

    index, data = part_files(part)
    with file_io.FileIO(index, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:16]
    return int(file_io.stat(data).length), digest


def _save_share(saver: Any, plan: Plan, file_prefix: str, options: Any) -> Any:
    from tensorflow.python.checkpoint import checkpoint_options, functional_saver
    from tensorflow.python.eager import context
    from tensorflow.python.framework import constant_op

    options = options or checkpoint_options.CheckpointOptions()
    name = file_prefix.rstrip("/").rsplit("/", 1)[-1]
    prefix = f"{plan.directory.rstrip('/')}/{name}"
    split = _Split(plan.workers)
    # Every tensor is read here, on every worker, in the same order.
    by_task = saver._get_shards_by_task(split)
    if len(by_task) != 1:
        why = f"the tensors are on {len(by_task)} tasks"
        plan.fallback(why)
        return saver_hook.original(saver, _placed(plan, file_prefix, why), options)
    [(task, shares)] = by_task
    # TensorFlow's own temporary layout (S3 has no folder to rename from), with this
    # save's token: a part an interrupted attempt left is never one of these.
    temp = prefix + (
        f".part_{plan.token}" if prefix.startswith("s3://") else f"_temp_{plan.token}/part"
    )
    count = len(split.parts)
    parts = [f"{temp}-{i:05d}-of-{count:05d}" for i in range(count)]
    mine = split.parts.index(plan.worker) if plan.worker in split.parts else None
    start = plan.clock()
    try:
        if mine is not None:
            # SaveV2 makes only the last folder: the chief's may not exist yet here.
            from tensorflow.python.lib.io import file_io

            file_io.recursive_create_dir_v2(parts[mine].rsplit("/", 1)[0])
            functional_saver._single_shard_save(
                constant_op.constant(parts[mine]), shares[plan.worker], task, options
            )
        context.async_wait()
        size, digest = part_fingerprint(parts[mine]) if mine is not None else (0, "-")
    except Exception as e:
        if plan.worker != 0:
            plan.done(name, f"error {type(e).__name__}: {e}")
        else:
            plan.merged(name, f"error {type(e).__name__}: {e}")
        raise
    own = plan.clock() - start
    if plan.worker != 0:
        plan.done(name, f"ok {split.digest} {size} {digest}")
        # The restart code only once the chief says the checkpoint is whole.
        plan.wait_merged(name, max(0.001, plan.bound(own, False)))
        return None
    try:
        _check_and_merge(plan, split, name, prefix, parts, own)
    except Exception as e:
        plan.merged(name, f"error {type(e).__name__}: {e}")
        raise
    plan.merged(name, "ok")
    return None


def _check_and_merge(
    plan: Plan, split: _Split, name: str, prefix: str, parts: list, own: float
) -> None:
    """The chief: every part written (each worker's word), each the one its worker wrote
    (its fingerprint, as the chief sees the file), then ``MergeV2Checkpoints``."""
    from tensorflow.python.framework import constant_op
    from tensorflow.python.ops import gen_io_ops

    errors = _errors.module()
    deadline = plan.clock() + plan.bound(own, True)
    wrote = {}
    for worker in range(1, plan.workers):
        wrote[worker] = plan.wait(name, worker, split.digest, max(0.001, deadline - plan.clock()))
    if not parts:
        return
    for worker, (size, digest) in wrote.items():
        if worker not in split.parts:
            continue
        part = parts[split.parts.index(worker)]
        try:
            seen = part_fingerprint(part)
        except errors.NotFoundError as e:
            raise errors.NotFoundError(
                None, None, f"Worker {worker}'s part {part} is not there: {e.message}{_SHARED}"
            ) from e
        if seen != (size, digest):
            raise errors.FailedPreconditionError(
                None,
                None,
                f"Worker {worker}'s part {part} is not the one it wrote (it wrote {size} bytes, "
                f"index {digest}; the chief sees {seen[0]} bytes, index {seen[1]}): nothing "
                f"is merged{_SHARED}",
            )
    try:
        gen_io_ops.merge_v2_checkpoints(
            checkpoint_prefixes=constant_op.constant(parts),
            destination_prefix=constant_op.constant(prefix),
            delete_old_dirs=True,
        )
    except (errors.NotFoundError, errors.InvalidArgumentError) as e:
        # A missing part: NotFoundError before TF 2.21, InvalidArgumentError
        # ("allow_missing_files") since.
        raise type(e)(
            None, None, f"{e.message} -- the chief merges the parts into {prefix}{_SHARED}"
        ) from e


_SHARED = (
    " -- for the workers to write one checkpoint together, the checkpoint folder must be "
    "one every worker sees (gs://, s3://, a shared file system)."
)
