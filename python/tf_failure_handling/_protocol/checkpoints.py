"""Checkpoint managers, the ``checkpointed_runs`` counter, the restore and the saves.

Layout as TensorFlow's handler writes it, so checkpoints move freely between
the two: a ``tf.train.Checkpoint`` gets a ``CheckpointManager(max_to_keep=1)`` in
``checkpoint_dir``; a non-chief writes to
``dirname(checkpoint_dir)/workertemp_<task_id>/basename(checkpoint_dir)`` and removes
``workertemp_<task_id>`` before a preemption exit; the run count is the int64
variable ``checkpointed_runs`` attached to the user's checkpoint.

One difference: by default a non-chief writes no copy. It still saves (the save's
collective reads need every worker: ``_integrations/tf_reads_only.py`` reads every
tensor in the chief's order and leaves the write out), through a manager whose folder
is in TensorFlow's in-memory file system (``ram://``), where only its small
``checkpoint`` file goes: the checkpoint's storage gets one copy of the model per save,
not one per worker, and the host's memory none. A saver that cannot leave its copy out
writes it there whole when the host's memory can hold it (the core's ``copy_place``,
from ``host_memory``'s readings), else to TensorFlow's ``workertemp_<task_id>`` on the
storage, said in the log and in the ``save_end`` record (``non_chief_saves``).
:data:`~.non_chief_saves.NON_CHIEF_SAVES_ENV` ``=storage`` gives back TensorFlow's
layout; ``=shares`` has every worker write a share of the one checkpoint (TensorFlow's
sharded layout, ``_integrations/tf_shares.py``), merged by the chief
(``checkpoint_shares``). A manager the user passes is used as it is.

Objects that are not TensorFlow's are accepted when they follow the small
protocol the fakes of :mod:`tf_failure_handling.testing` implement: a checkpoint
with ``make_manager(directory, max_to_keep)`` and ``make_counter()``, a manager with
``save``, ``restore_or_initialize``, ``directory`` and ``_checkpoint``.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
from typing import Any, Optional

from .. import _errors
from .._integrations import tf_keras_fit
from .._native import Event
from . import checkpoint_shares
from .checkpoint_files import delete_recursively, writable_dir
from .non_chief_saves import (
    MEMORY,
    MEMORY_ROOT,
    SHARES,
    STORAGE,
    CopyPlacement,
    installable,
    memory_dir,
    non_chief_dir,
    non_chief_saves,
)

log = logging.getLogger("tf_failure_handling")

COUNTER_NAME = "checkpointed_runs"


def _tf_classes():
    try:
        from tensorflow.python.checkpoint import checkpoint as checkpoint_lib
        from tensorflow.python.checkpoint import checkpoint_management
    except ImportError:
        return None, None
    return checkpoint_lib.Checkpoint, checkpoint_management.CheckpointManager


def _is_manager(obj: Any) -> bool:
    _, manager_cls = _tf_classes()
    if manager_cls is not None and isinstance(obj, manager_cls):
        return True
    return all(
        hasattr(obj, a) for a in ("save", "restore_or_initialize", "directory", "_checkpoint")
    )


def _is_tf_checkpoint(obj: Any) -> bool:
    checkpoint_cls, _ = _tf_classes()
    return checkpoint_cls is not None and isinstance(obj, checkpoint_cls)


def _is_checkpoint(obj: Any) -> bool:
    return _is_tf_checkpoint(obj) or callable(getattr(obj, "make_manager", None))


def _make_manager(checkpoint: Any, directory: str) -> Any:
    checkpoint_cls, manager_cls = _tf_classes()
    if checkpoint_cls is not None and isinstance(checkpoint, checkpoint_cls):
        return manager_cls(checkpoint, directory=directory, max_to_keep=1)
    return checkpoint.make_manager(directory, max_to_keep=1)


class Checkpoints:
    """The read and write managers of one handler and its run counter."""

    def __init__(
        self,
        checkpoint_or_manager: Any,
        checkpoint_dir: Optional[str],
        is_chief: bool,
        task_id: Optional[int],
        save_fn: Any = None,
        worker: Optional[int] = None,
        workers: int = 1,
        coordination: Any = None,
    ) -> None:
        """``worker`` of ``workers`` (the MWMS workers, chief included) and the
        coordination ``Client`` are what the workers need to write shares."""
        self.save_fn = save_fn
        where = non_chief_saves()  # a bad value is an error on every worker, at once
        if (
            _is_tf_checkpoint(checkpoint_or_manager)
            and save_fn is None
            and (
                (where == MEMORY and not is_chief)
                or (
                    where == SHARES
                    and workers > 1
                    and worker is not None
                    and coordination is not None
                )
            )
        ):
            # Once, as the mode is installed: TensorFlow's own save when this
            # TensorFlow's saver lacks a private name the mode uses.
            where = installable(where)
        #: A non-chief that reads every tensor and writes no copy (``memory``).
        self.reads_only = False
        #: How this non-chief's copies were written (:meth:`save_fields`; none: a
        #: chief, ``storage``, ``shares``).
        self._copies = CopyPlacement(checkpoint_dir, task_id or 0)
        #: Workers that write each save together (1: each worker saves alone).
        self.shared_by = 1
        self._worker, self._coordination = worker, coordination
        self._saves = itertools.count(1)
        #: The chief's token of this handler (shares): in every save's keys and paths.
        self._token = ""
        #: The handler's ``ProtocolCore`` (None: no notice, no deadline, nothing timed):
        #: it times the restore and each save (``Event.Timing``/``Timed``, on its clock),
        #: its ``shares_wait_bound`` bounds the shares' waits by the notice's deadline,
        #: its ``shares_merge_start`` decides whether the chief starts a merge.
        self.core: Any = None
        self._fell_back = False
        #: Seconds the last save took (TF's ``_checkpoint_time``).
        self.last_save_seconds: Optional[float] = None
        #: Seconds the restore of a checkpoint at start took (None: nothing restored).
        self.restore_seconds: Optional[float] = None
        #: The prefix of the checkpoint restored at start (None: nothing restored).
        self.restored_path: Optional[str] = None
        #: The restore at start left values waiting for variables not made yet (a
        #: Keras model built at its first call, optimizer slots): its time is not a
        #: save's, and no estimate is taken from it.
        self.restore_deferred = False
        if checkpoint_dir is not None:
            if not isinstance(checkpoint_dir, (str, os.PathLike)):
                raise TypeError(
                    f"checkpoint_dir must be a path string, got {type(checkpoint_dir).__name__}"
                )
            checkpoint_dir = os.fspath(checkpoint_dir)
        if _is_manager(checkpoint_or_manager):
            self.read = self.write = checkpoint_or_manager
            self.api_made = False
        elif _is_checkpoint(checkpoint_or_manager):
            if not checkpoint_dir:
                # TF means to raise this but builds it with the wrong arguments,
                # so its users get a TypeError instead.
                raise _errors.make(
                    "InvalidArgumentError",
                    "When a checkpoint is passed, a checkpoint_dir must be passed as well.",
                )
            self.api_made = True
            self.read = _make_manager(checkpoint_or_manager, checkpoint_dir)
            if is_chief:
                self.write = self.read
            else:
                # A fake checkpoint (tf_failure_handling.testing) writes with os: storage.
                in_memory = where != STORAGE and _is_tf_checkpoint(checkpoint_or_manager)
                make_dir = memory_dir if in_memory else non_chief_dir
                self.write = _make_manager(
                    checkpoint_or_manager, make_dir(checkpoint_dir, task_id or 0)
                )
                self.reads_only = in_memory and where == MEMORY and save_fn is None
        else:
            raise TypeError(
                "checkpoint_or_checkpoint_manager must be a tf.train.Checkpoint or a "
                f"tf.train.CheckpointManager, got {type(checkpoint_or_manager).__name__}"
            )
        if (
            where == SHARES
            and self.api_made
            and save_fn is None
            and _is_tf_checkpoint(checkpoint_or_manager)
            and worker is not None
            and workers > 1
            and coordination is not None
        ):
            self.shared_by = workers
            # A non-chief writes its share into the chief's folder.
            writable_dir(self.read.directory)
            # Every worker sees the folder, or an error now, before any notice.
            self._token = checkpoint_shares.probe(
                coordination, worker, workers, self.read.directory
            )
        self.counter = self._attach_counter()
        # Find out now, not at the preemption, that the saves cannot be written.
        writable_dir(self.write.directory)

    def _attach_counter(self) -> Any:
        """The ``checkpointed_runs`` variable, attached to both managers' checkpoints.

        A checkpoint that already carries one (a second handler on the same
        checkpoint) keeps it, so the count it restores is the one it saved.
        """
        checkpoints = [self.read._checkpoint, self.write._checkpoint]
        for ckpt in checkpoints:
            existing = getattr(ckpt, COUNTER_NAME, None)
            if existing is not None:
                counter = existing
                break
        else:
            counter = self._new_counter(checkpoints[0])
        for ckpt in checkpoints:
            if getattr(ckpt, COUNTER_NAME, None) is None:
                setattr(ckpt, COUNTER_NAME, counter)
        return counter

    def attach_state(self, name: str, make: Any) -> Any:
        """The object saved as ``name`` in both managers' checkpoints: the one already
        there, or ``make()`` attached to both (a ``tf.train.Checkpoint`` only)."""
        checkpoints = [self.read._checkpoint, self.write._checkpoint]
        found = next((getattr(c, name) for c in checkpoints if getattr(c, name, None)), None)
        state = found if found is not None else make()
        for ckpt in checkpoints:
            if getattr(ckpt, name, None) is None:
                setattr(ckpt, name, state)
        return state

    @staticmethod
    def _new_counter(checkpoint: Any) -> Any:
        make_counter = getattr(checkpoint, "make_counter", None)
        if callable(make_counter):
            return make_counter()
        from tensorflow.python.framework import constant_op, dtypes
        from tensorflow.python.ops import variables

        return variables.Variable(
            initial_value=constant_op.constant(0, dtype=dtypes.int64),
            trainable=False,
            name=COUNTER_NAME,
        )

    def restore(self) -> int:
        """Restores the latest checkpoint (if any); returns the restored run count.

        A checkpoint that cannot be read raises TF's error type again (a bare
        ``OpError`` becomes ``DataLossError``, its subclass) with the checkpoint's
        path in the message; nothing in the directory is changed or deleted.
        """
        errors = _errors.module()
        self._timing()
        # A tf_keras non-chief restores its own folder, unless the survivors of a lost
        # worker saved into the one every worker reads.
        survivors = tf_keras_fit.backup_survivors_save()
        try:
            if survivors is not None:
                log.info("Restoring the survivors' save %s (tf_keras BackupAndRestore).", survivors)
                self.read._checkpoint.restore(survivors)
                restored = survivors
            else:
                restored = self.read.restore_or_initialize()
        except errors.OpError as e:
            path = getattr(self.read, "latest_checkpoint", None) or self.read.directory
            cls = errors.DataLossError if type(e) is errors.OpError else type(e)
            message = (
                f"Cannot restore the checkpoint {path}: {e.message} -- the files were left "
                "as they are; move them away to start from scratch, or put back an intact copy."
            )
            try:
                clearer = cls(None, None, message)
            except TypeError:  # an OpError subclass with another constructor: keep it
                raise e from None
            raise clearer from e
        if restored:
            self.restore_seconds = self._timed()
            self.restored_path = survivors or getattr(self.read, "latest_checkpoint", None)
            self.restore_deferred = _waits_for_variables(getattr(self.read, "_checkpoint", None))
        return int(self.counter.numpy())

    def _timing(self) -> None:
        """A save or the restore starts: the core times it on its clock."""
        if self.core is not None:
            self.core.handle(Event.Timing())

    def _timed(self) -> Optional[float]:
        """The seconds the save or restore took, as the core timed it (None: no core)."""
        return None if self.core is None else self.core.handle(Event.Timed())

    def save(self, run_count: int, args: tuple, kwargs: dict) -> None:
        """Records ``run_count`` in the counter and saves through ``save_fn`` or the
        write manager; the time it took (the core's timing, which a round's
        ``Event.Saved`` records) is ``last_save_seconds``."""
        self._timing()
        self.counter.assign(run_count)
        with _preemption_save_context(), self._sharing(), self._reading_only():
            if self.save_fn is not None:
                self.save_fn(*args, **kwargs)
            else:
                self.write.save(*args, **kwargs)
        self.last_save_seconds = self._timed()
        log.info(
            "Checkpoint finished at path %s in %.3fs.",
            self.write.directory,
            self.last_save_seconds or 0.0,
        )

    def _sharing(self) -> Any:
        """This save's :class:`tf_shares.Plan` in effect, when the workers write together."""
        if self.shared_by == 1:
            return contextlib.nullcontext()
        number = next(self._saves)
        where = None
        if self._worker != 0:
            # A saver this cannot split writes a whole copy: in memory only when the
            # host can hold it, as in the memory mode.
            self._copies.start_save()
            checkpoint = self.write._checkpoint

            def where(prefix: str, why: str) -> str:
                return self._copies.whole_copy(checkpoint, prefix, why)

        return checkpoint_shares.writing_shares(
            self.read.directory,
            self._worker,
            self.shared_by,
            self._coordination,
            self.share_keys(number),
            f"{self._token}-{number}",
            lambda: self.core,
            self._fallback,
            where,
        )

    def share_keys(self, number: int) -> str:
        """The coordination-service keys of save ``number`` (from 1) of this handler."""
        return checkpoint_shares.share_keys(self._token, number)

    def _reading_only(self) -> Any:
        """This save's :class:`tf_reads_only.Plan` in effect, on a non-chief in ``memory``
        mode."""
        if not self.reads_only:
            return contextlib.nullcontext()
        return self._copies.reading_only(self.write._checkpoint)

    def save_fields(self) -> dict:
        """What the ``save_end`` record says of this non-chief's copy (empty: no copy of
        the handler's own managers): ``copy`` (``none``, ``memory`` or ``storage``),
        ``copy_bytes``, and when it was written whole, why (``copy_whole``), ``copy_needed``
        and ``copy_available`` (bytes of host memory, the core's ``copy_place``)."""
        return self._copies.fields()

    def _fallback(self, why: str) -> None:
        if not self._fell_back:
            self._fell_back = True
            log.warning(
                "The workers cannot write this checkpoint together (%s): each saves it "
                "whole, the non-chiefs to memory.",
                why,
            )

    def remove_worker_temp(self, is_chief: bool) -> None:
        """Deletes ``workertemp_<task_id>`` of a non-chief whose manager the handler made
        (in memory: the handler's whole folder there)."""
        if self.api_made and not is_chief:
            temp = os.path.dirname(self.write.directory)
            if temp.startswith(MEMORY_ROOT + "/"):
                temp = os.path.dirname(temp)
            delete_recursively(temp)
            self._copies.remove_storage_copy()


def _waits_for_variables(checkpoint: Any) -> bool:
    """Whether a restore of ``checkpoint`` left values for objects not made yet (TF's
    deferred restoration: ``_deferred_dependencies`` of an object in its graph)."""
    if checkpoint is None or not _is_tf_checkpoint(checkpoint):
        return False
    try:
        import tensorflow as tf

        for trackable in tf.train.TrackableView(checkpoint).descendants():
            if getattr(trackable, "_deferred_dependencies", None):
                return True
    except Exception:  # noqa: BLE001 - an object graph TF cannot walk: not known to wait
        return False
    return False


def _preemption_save_context():
    """TF's ``checkpoint_context.preemption_save_context()`` when TF is present."""
    try:
        from tensorflow.python.checkpoint import checkpoint_context
    except ImportError:
        return contextlib.nullcontext()
    return checkpoint_context.preemption_save_context()
