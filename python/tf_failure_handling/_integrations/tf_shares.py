"""Each worker writes a share of one TensorFlow checkpoint; the chief merges the shares.

Inside :func:`writing_shares` (on the thread that saves), TensorFlow's
``MultiDeviceSaver.save`` reads every tensor, as it always does (a ``SyncOnRead``
variable's read needs every worker), then writes only this worker's share as one part
of TensorFlow's own sharded layout, ``<prefix>_temp_<token>/part-0000i-of-0000n`` (the
save's token: a part an earlier attempt left is never one of these), in the chief's
checkpoint folder. The chief waits for the other parts, checks that each is the one its
worker wrote (the data's size and the index's digest, from the worker's "ok"), merges
them with ``MergeV2Checkpoints``, as TensorFlow's sharded save does: the checkpoint is
``<prefix>.index`` and ``<prefix>.data-0000i-of-0000n``, whole or absent. It reports
"merged" (which each non-chief waits for) only once ``CheckpointManager.save`` has
returned and its state file, ``checkpoint``, names the checkpoint: a chief that ends
before that leaves the non-chiefs without the restart code. A merge cannot be
cancelled once started, so the chief starts it only when the core says it fits before
the deadline (the ``Merge`` or ``Keep`` of the save's ``SharesWaits``); a save that
fails removes its parts (and a merge's files the state file does not name). Which worker
writes which tensor is the core's answer (``assign_shares``), the same on every worker;
how long each wait lasts is the core's too (the plan's ``waits``, a ``SharesWaits``),
and every wait, file read and merge of the chief is bounded by it.

A saver this cannot split (registered savers, tensors of several tasks, graph mode)
saves as TensorFlow does, on every worker: the plan's ``fallback`` is told once, and
a non-chief's whole copy goes where the plan's ``where`` says (memory, or the storage
when the host's memory cannot hold it).
"""

from __future__ import annotations

import hashlib
import logging
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Tuple

from .. import _errors
from .._bounded_call import BoundedCall
from .._native import SharesWaits, assign_shares
from . import saver_hook, tf_reads_only

log = logging.getLogger("tf_failure_handling")

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
    ``merged(name, value)``: the chief tells the others the save's result (``"ok"``, once
    the state file names the checkpoint, or ``"error <message>"``);
    ``wait_merged(name, seconds)``: a non-chief waits for it, raising unless it is
    ``"ok"``. ``waits()``: the core's ``SharesWaits``, made when this worker's part
    starts and told when it is written (``handle("part_written")``), which says how
    long each wait lasts from now (``poll_timeout()``: the deadline less the exit's
    reserve binds it), whether the chief starts the merge once it has the parts
    (``handle("parts_checked")``, then ``poll()``: ``Merge`` or ``Keep``), hears that
    it ended (``handle("merged")``) and bounds the removal of a failed save's parts
    (``handle("failed")``).
    ``fallback(why)``: this saver cannot be split
    and saves as TensorFlow does. ``where(prefix, why)``: on a non-chief, where that
    whole copy goes (``prefix`` itself, or a folder on the storage when the host's
    memory cannot hold it); None: ``prefix``.
    """

    directory: str
    worker: int
    workers: int
    token: str
    done: Callable[[str, str], None]
    wait: Callable[[str, int, str, float], Tuple[int, str]]
    merged: Callable[[str, str], None]
    wait_merged: Callable[[str, float], None]
    waits: Callable[[], Any]
    fallback: Callable[[str], None]
    where: Optional[Callable[[str, str], str]] = None


@dataclass
class _Save:
    """What one save in shares has done so far, as this worker knows it."""

    #: The checkpoint's name (``ckpt-N``) and prefix in the chief's folder, once known.
    name: Optional[str] = None
    prefix: Optional[str] = None
    #: This save's parts: ``<prefix>_temp_<token>`` (a folder), or on S3 the parts'
    #: common prefix ``<prefix>.part_<token>``.
    temp: Optional[str] = None
    #: The core's ``SharesWaits`` of this worker's part, once it started.
    waits: Any = None
    #: The chief's merge, once started: its bound (s).
    merge_bound: Optional[float] = None
    #: A merge given up on while it still runs: its files are left to it.
    merge_running: bool = False
    #: The chief told the others the result.
    reported: bool = False


@contextmanager
def writing_shares(plan: Plan) -> Iterator[None]:
    """Makes the saves of this thread write ``plan``'s share inside the block. On the
    chief, once the block (``CheckpointManager.save``) returned, the state file must
    name the merged checkpoint before the others hear "ok"; a block that raises reports
    the error to them and removes the save's parts."""
    save = _Save()

    def hooked(saver: Any, prefix: Any, options: Any) -> Any:
        return _save(saver, prefix, options, plan, save)

    with saver_hook.saving_with(hooked):
        try:
            yield
            if plan.worker == 0 and save.merge_bound is not None:
                _report_visible(plan, save)
        except BaseException as e:
            if plan.worker == 0 and save.name is not None:
                _failed(plan, save, e)
            raise


def _save(self: Any, file_prefix: Any, options: Any, plan: Plan, save: _Save) -> Any:
    # The savers a share cannot be cut from are those whose copy cannot be left out.
    why = tf_reads_only.cannot_skip(self)
    if why is not None:
        plan.fallback(why)
        return saver_hook.original(self, _placed(plan, file_prefix, why), options)
    return _save_share(self, plan, saver_hook.as_str(file_prefix), options, save)


def _bounded(fn: Callable[[], Any], seconds: float, what: str) -> Any:
    """``fn()``, waited for at most ``seconds``; ``DeadlineExceededError`` naming
    ``what`` after that (the call is left to end on its own thread)."""
    call = BoundedCall(fn, "tfh-shares")
    if not call.wait(seconds):
        raise _errors.make(
            "DeadlineExceededError",
            f"The chief waited {seconds:.1f}s for {what}, which did not end: the checkpoint "
            f"is not used{_SHARED}",
        )
    return call.result()


def _named(directory: str) -> Optional[str]:
    """The checkpoint ``directory``'s state file names (its basename), or None."""
    from tensorflow.python.checkpoint import checkpoint_management

    state = checkpoint_management.get_checkpoint_state(directory)
    path = getattr(state, "model_checkpoint_path", None) if state is not None else None
    return path.rstrip("/").rsplit("/", 1)[-1] if path else None


def _report_visible(plan: Plan, save: _Save) -> None:
    """The chief, after ``CheckpointManager.save`` returned: "ok" to the others only
    when the state file names this save's checkpoint (the merge's time to the core)."""
    what = f"the state file of {plan.directory} (after merging {save.name})"
    named = _bounded(lambda: _named(plan.directory), save.waits.poll_timeout(), what)
    if named != save.name:
        raise _errors.make(
            "FailedPreconditionError",
            f"The checkpoint {save.name} was merged, but the state file "
            f"{plan.directory}/checkpoint names {named}: it is not the checkpoint a restart "
            f"reads, so it is not used{_SHARED}",
        )
    save.waits.handle("merged")
    save.reported = True
    plan.merged(save.name, "ok")


def _failed(plan: Plan, save: _Save, error: BaseException) -> None:
    """The chief's save failed: the others hear why (unless they did already), and the
    save's parts are removed, with a merge's files the state file does not name."""
    if not save.reported:
        save.reported = True
        try:
            plan.merged(save.name, f"error {type(error).__name__}: {error}")
        except Exception as e:  # noqa: BLE001 - the save's own error goes on
            log.error("Could not tell the other workers that %s failed: %s", save.name, e)
    if save.merge_running:
        log.warning(
            "The merge of %s was given up on while it ran: its files are left to it (%s).",
            save.name,
            save.temp,
        )
        return
    waits = save.waits or plan.waits()
    waits.handle("failed")
    try:
        _bounded(
            lambda: _remove(plan, save),
            waits.poll_timeout(),
            f"the removal of {save.name}'s parts ({save.temp})",
        )
    except Exception as e:  # noqa: BLE001 - the save's own error goes on
        log.error("Could not remove the parts of the failed save %s: %s", save.name, e)


def _remove(plan: Plan, save: _Save) -> None:
    from tensorflow.python.lib.io import file_io

    removed = []
    if save.temp is not None:
        if save.temp.startswith("s3://"):
            for path in file_io.get_matching_files_v2(f"{save.temp}-*"):
                file_io.delete_file_v2(path)
        elif file_io.file_exists_v2(save.temp):
            file_io.delete_recursively_v2(save.temp)
            removed.append(save.temp)
    if save.prefix is not None and _named(plan.directory) != save.name:
        for pattern in (f"{save.prefix}.index", f"{save.prefix}.data-*"):
            for path in file_io.get_matching_files_v2(pattern):
                file_io.delete_file_v2(path)
                removed.append(path)
    log.info("The failed save %s left nothing: removed %s.", save.name, removed or "nothing")


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


def _save_share(saver: Any, plan: Plan, file_prefix: str, options: Any, save: _Save) -> Any:
    from tensorflow.python.checkpoint import checkpoint_options, functional_saver
    from tensorflow.python.eager import context
    from tensorflow.python.framework import constant_op

    options = options or checkpoint_options.CheckpointOptions()
    name = file_prefix.rstrip("/").rsplit("/", 1)[-1]
    prefix = f"{plan.directory.rstrip('/')}/{name}"
    save.name, save.prefix = name, prefix
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
    s3 = prefix.startswith("s3://")
    temp = prefix + (f".part_{plan.token}" if s3 else f"_temp_{plan.token}/part")
    save.temp = temp if s3 else temp.rsplit("/", 1)[0]
    count = len(split.parts)
    parts = [f"{temp}-{i:05d}-of-{count:05d}" for i in range(count)]
    mine = split.parts.index(plan.worker) if plan.worker in split.parts else None
    save.waits = plan.waits()
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
        raise  # the chief's: writing_shares reports it
    save.waits.handle("part_written")
    if plan.worker != 0:
        plan.done(name, f"ok {split.digest} {size} {digest}")
        # The restart code only once the chief says the state file names the checkpoint.
        plan.wait_merged(name, save.waits.poll_timeout())
        return None
    _check_and_merge(plan, split, save, parts)
    return None


def _check_and_merge(plan: Plan, split: _Split, save: _Save, parts: list) -> None:
    """The chief: every part written (each worker's word), each the one its worker wrote
    (its fingerprint, as the chief sees the file), then ``MergeV2Checkpoints``, when the
    core says it fits before the deadline."""
    errors = _errors.module()
    name = save.name
    wrote = {}
    for worker in range(1, plan.workers):
        wrote[worker] = plan.wait(name, worker, split.digest, save.waits.poll_timeout())
    for worker, (size, digest) in wrote.items():
        if worker not in split.parts:
            continue
        part = parts[split.parts.index(worker)]
        try:
            seen = _bounded(
                lambda part=part: part_fingerprint(part),
                save.waits.poll_timeout(),
                f"the read of worker {worker}'s part {part}",
            )
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
    save.waits.handle("parts_checked")
    start = save.waits.poll()
    if isinstance(start, SharesWaits.Action.Keep):
        raise _errors.make(
            "DeadlineExceededError",
            f"The merge of checkpoint {name} was not started: it is expected to take "
            f"{start.needed:.2f}s and {start.left:.2f}s are left before the notice's deadline "
            "less the exit's reserve (a merge cannot be cancelled once started). The "
            "checkpoint before it stays.",
        )
    save.merge_bound = start.bound
    if parts:
        _merge(parts, save)


def _merge(parts: list, save: _Save) -> None:
    """``MergeV2Checkpoints`` of ``parts`` into the save's prefix, bounded by the save's
    merge bound: one given up on runs on, and its files are left to it."""
    from tensorflow.python.framework import constant_op
    from tensorflow.python.ops import gen_io_ops

    errors = _errors.module()
    prefix = save.prefix

    def merge() -> None:
        gen_io_ops.merge_v2_checkpoints(
            checkpoint_prefixes=constant_op.constant(parts),
            destination_prefix=constant_op.constant(prefix),
            delete_old_dirs=True,
        )

    call = BoundedCall(merge, "tfh-shares-merge")
    if not call.wait(save.merge_bound):
        save.merge_running = True
        raise _errors.make(
            "DeadlineExceededError",
            f"The chief waited {save.merge_bound:.1f}s for MergeV2Checkpoints of "
            f"{len(parts)} parts into {prefix}, which did not end: the checkpoint is not "
            f"used{_SHARED}",
        )
    try:
        call.result()
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
