"""Checkpoint managers, the ``checkpointed_runs`` counter, and the worker temp dirs.

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
storage, said in the log and in the ``save_end`` record. :data:`NON_CHIEF_SAVES_ENV`
``=storage`` gives back TensorFlow's layout; ``=shares`` has every worker write a share
of the one checkpoint (TensorFlow's sharded layout, ``_integrations/tf_shares.py``),
merged by the chief. A manager the user passes is used as it is.

Objects that are not TensorFlow's are accepted when they follow the small
protocol the fakes of :mod:`tf_failure_handling.testing` implement: a checkpoint
with ``make_manager(directory, max_to_keep)`` and ``make_counter()``, a manager with
``save``, ``restore_or_initialize``, ``directory`` and ``_checkpoint``.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import os
import secrets
import shutil
import time
from typing import Any, Optional

from .. import _errors
from .._integrations import tf_reads_only, tf_shares
from .._native import (
    SHARES_MIN_WAIT,  # the chief's shortest wait for the shares (s)
    SHARES_PROBE_WAIT,  # the construction's wait for the folder's probe (s)
    copy_place,
    shares_wait_bound_at,
)
from .._platforms import common
from . import host_memory

log = logging.getLogger("tf_failure_handling")

COUNTER_NAME = "checkpointed_runs"
#: Where a non-chief's copy goes when the handler makes its managers: ``memory`` (the
#: default: no copy, every tensor read; a copy that cannot be left out goes to
#: TensorFlow's ``ram://`` file system when it fits in the host's memory), ``storage``
#: (TensorFlow's ``workertemp_<task_id>`` beside the checkpoint) or ``shares`` (no copy:
#: each worker writes a share of the checkpoint itself).
NON_CHIEF_SAVES_ENV = "TF_FAILURE_HANDLING_NON_CHIEF_SAVES"
MEMORY, STORAGE, SHARES = "memory", "storage", "shares"
#: The coordination-service keys by which a non-chief tells the chief its share is written.
SHARE_KEY = "tf_failure_handling/share"
#: The probe file the chief writes into its checkpoint folder at construction (shares):
#: ``<folder>/<PROBE_FILE><token>``, holding the token; removed once every worker answered.
PROBE_FILE = "tf_failure_handling_probe_"
#: How long a non-chief looks for the probe file before it says it cannot see it: a
#: shared file system may show another host's new file a little later.
PROBE_LOOK = 10.0
#: The shares-mode handlers this process made, by worker: their probe keys, the same on
#: every worker (the workers of the unit tests share one process).
_probes: dict = collections.defaultdict(itertools.count)

#: The in-memory folders of this process's handlers, one each.
_MEMORY_ROOT = "ram://tf_failure_handling"
_memory_ids = itertools.count()
#: The clock a restore is timed on, and a chief's wait for the shares.
_clock = time.monotonic
#: ``(cgroups, mem_available)`` of the host when a non-chief's whole copy is about to be
#: written (a test passes its own numbers here).
_read_memory = host_memory.read
#: How a non-chief's copy of its last save was written (``save_end``'s ``copy``): none
#: (every tensor read, nothing written), whole in memory, or whole on the storage.
COPY_NONE, COPY_MEMORY, COPY_STORAGE = "none", "memory", "storage"


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


def make_dirs(path: str) -> None:
    try:
        from tensorflow.python.lib.io import file_io
    except ImportError:
        os.makedirs(path, exist_ok=True)
    else:
        file_io.recursive_create_dir_v2(path)


def delete_recursively(path: str) -> None:
    try:
        from tensorflow.python.platform import gfile
    except ImportError:
        shutil.rmtree(path, ignore_errors=True)
    else:
        if gfile.Exists(path):
            gfile.DeleteRecursively(path)


def delete_file(path: str) -> None:
    """Removes the file ``path`` if it is there (TF's file systems when TF is present)."""
    try:
        from tensorflow.python.platform import gfile
    except ImportError:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
    else:
        with contextlib.suppress(Exception):
            gfile.Remove(path)


def _read_or_none(path: str) -> Optional[str]:
    """The text of ``path``, or None when it cannot be read (not there, not yet)."""
    from tensorflow.python.lib.io import file_io

    try:
        return file_io.read_file_to_string(path)
    except Exception:  # noqa: BLE001 - any failure to read is "not seen"
        return None


def writable_dir(path: str) -> None:
    """Raises a TF error now if checkpoints could not be written under ``path`` later.

    TF's own handler fails at construction with ``FailedPreconditionError`` when
    the directory is a file; this also covers a path below a file and a local
    directory without write permission (``PermissionDeniedError``). Nothing is
    created: the manager creates the directory at its first save, as in TF.
    Remote paths (``gs://``...) are left to the first save.
    """
    path = os.fspath(path)
    if "://" in path:
        return
    existing = os.path.abspath(path)
    while not os.path.exists(existing):
        parent = os.path.dirname(existing)
        if parent == existing:
            break
        existing = parent
    if not os.path.isdir(existing):
        raise _errors.make(
            "FailedPreconditionError",
            f"{existing} is not a directory: checkpoints cannot be written to {path}",
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise _errors.make(
            "PermissionDeniedError", f"{existing}: no permission to write checkpoints to {path}"
        )


def non_chief_saves() -> str:
    """:data:`MEMORY`, :data:`STORAGE` or :data:`SHARES`, from :data:`NON_CHIEF_SAVES_ENV`.

    Raises:
      ValueError: any other value, naming the variable.
    """
    raw = common.env(NON_CHIEF_SAVES_ENV)
    if raw is None:
        return MEMORY
    if raw.lower() not in (MEMORY, STORAGE, SHARES):
        expected = "memory, storage or shares (or unset: memory)"
        raise common.bad(NON_CHIEF_SAVES_ENV, os.environ[NON_CHIEF_SAVES_ENV], expected)
    return raw.lower()


def memory_dir(checkpoint_dir: str, task_id: int) -> str:
    """Where a non-chief's copy goes in memory: ``ram://.../<pid>-<n>/workertemp_<task_id>/<base>``
    (``<n>`` counts this process's handlers, so two never share a folder)."""
    root = f"{_MEMORY_ROOT}/{os.getpid()}-{next(_memory_ids)}/workertemp_{task_id}"
    make_dirs(root)
    return f"{root}/{os.path.basename(os.path.normpath(checkpoint_dir))}"


def non_chief_dir(checkpoint_dir: str, task_id: int) -> str:
    """Where a non-chief worker writes: ``<parent>/workertemp_<task_id>/<base>``."""
    parent = os.path.join(os.path.dirname(checkpoint_dir), f"workertemp_{task_id}")
    make_dirs(parent)
    return os.path.join(parent, os.path.basename(checkpoint_dir))


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
        #: A non-chief that reads every tensor and writes no copy (``memory``).
        self.reads_only = False
        #: How this non-chief's copy of the last save was written, and why
        #: (:meth:`save_fields`); None: no such copy (a chief, ``storage``, ``shares``).
        self.copy: Optional[dict] = None
        #: The ``workertemp_<task_id>`` a copy that did not fit in memory went to.
        self._storage_copy: Optional[str] = None
        self._checkpoint_dir, self._task_id = checkpoint_dir, task_id or 0
        #: Workers that write each save together (1: each worker saves alone).
        self.shared_by = 1
        self._worker, self._coordination = worker, coordination
        self._saves = itertools.count(1)
        #: The chief's token of this handler (shares): in every save's keys and paths.
        self._token = ""
        #: The handler's ``ProtocolCore`` (None: no notice, no deadline): its
        #: ``shares_wait_bound`` bounds the shares' waits by the notice's deadline.
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
            self._token = self._probe(self.read.directory)
        self.counter = self._attach_counter()
        # Find out now, not at the preemption, that the saves cannot be written.
        writable_dir(self.write.directory)

    def _probe(self, directory: str) -> str:
        """The chief writes a probe file with a random token into ``directory`` and
        publishes the token; every other worker looks for the file in its own
        ``directory`` and answers; any worker that cannot see it raises
        ``FailedPreconditionError`` here, and so does the chief. Each wait is bounded
        (:data:`SHARES_PROBE_WAIT`). Returns the token."""
        from tensorflow.python.lib.io import file_io

        client, worker = self._coordination, self._worker
        key = f"{SHARE_KEY}/probe/{next(_probes[worker])}"
        bound = SHARES_PROBE_WAIT
        advice = (
            f"with {NON_CHIEF_SAVES_ENV}=shares every worker writes its part of each save "
            "into the chief's checkpoint folder, so it must be one every worker sees "
            f"(gs://, s3://, a shared file system); or set {NON_CHIEF_SAVES_ENV}=memory"
        )
        if worker == 0:
            token = secrets.token_hex(8)
            probe = f"{directory.rstrip('/')}/{PROBE_FILE}{token}"
            make_dirs(directory)
            file_io.write_string_to_file(probe, token)
            try:
                client.set(key, token)
                end = _clock() + bound
                for other in range(1, self.shared_by):
                    answer = client.get(f"{key}/{other}", max(0.001, end - _clock()))
                    if answer is None:
                        raise _errors.make(
                            "DeadlineExceededError",
                            f"Waited {bound:g}s at the handler's construction for worker "
                            f"{other} to say whether it sees the probe file {probe} "
                            f"({key}/{other}): is it building its handler?",
                        )
                    if answer != "ok":
                        raise _errors.make(
                            "FailedPreconditionError",
                            f"Worker {other} cannot see the probe file {probe} the chief "
                            f"wrote ({answer}): {advice}.",
                        )
            finally:
                delete_file(probe)
            return token
        token = client.get(key, bound)
        if token is None:
            raise _errors.make(
                "DeadlineExceededError",
                f"Waited {bound:g}s at the handler's construction for the chief's probe of "
                f"the checkpoint folder ({key}): is the chief building its handler?",
            )
        probe = f"{directory.rstrip('/')}/{PROBE_FILE}{token}"
        end = _clock() + PROBE_LOOK
        while True:
            seen = _read_or_none(probe)
            if seen == token or _clock() >= end:
                break
            time.sleep(0.2)
        if seen != token:
            client.set(f"{key}/{worker}", f"it looked for {probe} for {PROBE_LOOK:g}s")
            raise _errors.make(
                "FailedPreconditionError",
                f"Worker {worker} cannot see the probe file {probe} the chief wrote into its "
                f"checkpoint folder (looked for it {PROBE_LOOK:g}s): {advice}.",
            )
        client.set(f"{key}/{worker}", "ok")
        return token

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
        start = _clock()
        try:
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
            self.restore_seconds = _clock() - start
            self.restored_path = getattr(self.read, "latest_checkpoint", None)
            self.restore_deferred = _waits_for_variables(getattr(self.read, "_checkpoint", None))
        return int(self.counter.numpy())

    def save(self, run_count: int, args: tuple, kwargs: dict, clock: Any) -> None:
        """Records ``run_count`` in the counter and saves through ``save_fn`` or the
        write manager; the time it took (on ``clock``) is ``last_save_seconds``."""
        start = clock()
        self.counter.assign(run_count)
        with _preemption_save_context(), self._sharing(), self._reading_only():
            if self.save_fn is not None:
                self.save_fn(*args, **kwargs)
            else:
                self.write.save(*args, **kwargs)
        self.last_save_seconds = clock() - start
        log.info(
            "Checkpoint finished at path %s in %.3fs.",
            self.write.directory,
            self.last_save_seconds,
        )

    def _sharing(self) -> Any:
        """This save's :class:`tf_shares.Plan` in effect, when the workers write together."""
        if self.shared_by == 1:
            return contextlib.nullcontext()
        directory = self.read.directory
        number = next(self._saves)
        keys = self.share_keys(number)
        client = self._coordination

        def done(name: str, value: str) -> None:
            client.set(f"{keys}/{name}/{self._worker}", value)

        def wait(name: str, worker: int, digest: str, seconds: float) -> tuple:
            value = client.get(f"{keys}/{name}/{worker}", seconds)
            what = f"Worker {worker}'s share of checkpoint {name} in {directory}"
            fields = (value or "").split(" ")
            if value is None:
                kind = "DeadlineExceededError"
                why = f"was not written within {seconds:.0f}s ({keys}/{name}/{worker})"
            elif value.startswith("error "):
                kind, why = "AbortedError", f"could not be written: {value[len('error ') :]}"
            elif len(fields) != 4 or fields[0] != "ok":
                kind, why = "FailedPreconditionError", f"was reported as {value!r}"
            elif fields[1] != digest:
                kind = "FailedPreconditionError"
                why = (
                    f"holds other tensors than the chief's ({fields[1]}, not "
                    f"{digest}): every worker must build the same model, or set "
                    f"{NON_CHIEF_SAVES_ENV}=memory"
                )
            else:
                return int(fields[2]), fields[3]
            raise _errors.make(
                kind, f"{what} {why} -- the checkpoint is not used (parts: {name}_temp_{token})."
            )

        def merged(name: str, value: str) -> None:
            client.set(f"{keys}/{name}/merged", value)

        def wait_merged(name: str, seconds: float) -> None:
            value = client.get(f"{keys}/{name}/merged", seconds)
            if value == "ok":
                return
            what = f"The chief did not merge checkpoint {name} in {directory}"
            if value is None:
                raise _errors.make(
                    "DeadlineExceededError",
                    f"{what}: waited {seconds:.1f}s for its report ({keys}/{name}/merged) "
                    "after writing this worker's part.",
                )
            raise _errors.make("AbortedError", f"{what}: {value[len('error ') :]}")

        token = f"{self._token}-{number}"
        plan = tf_shares.Plan(
            directory,
            self._worker,
            self.shared_by,
            token,
            done,
            wait,
            merged,
            wait_merged,
            self._shares_bound,
            self._fallback,
            _clock,
        )
        return tf_shares.writing_shares(plan)

    def share_keys(self, number: int) -> str:
        """The coordination-service keys of save ``number`` (from 1) of this handler."""
        return f"{SHARE_KEY}/{self._token}/{number}"

    def _shares_bound(self, own: float, chief: bool) -> float:
        """Seconds a shares wait lasts from now: the core's decision, with the notice's
        deadline and the exit's reserve when a handler's core is attached."""
        now = _clock()
        if self.core is not None:
            return self.core.shares_wait_bound(own, now, SHARES_MIN_WAIT, chief)
        return shares_wait_bound_at(own, SHARES_MIN_WAIT, now, chief=chief)

    def _reading_only(self) -> Any:
        """This save's :class:`tf_reads_only.Plan` in effect, on a non-chief in ``memory``
        mode."""
        if not self.reads_only:
            return contextlib.nullcontext()
        self.copy = None

        def skipped(nbytes: int) -> None:
            self.copy = {"copy": COPY_NONE, "copy_bytes": nbytes}
            log.info(
                "The non-chief read every tensor of the save (%d bytes) and wrote no copy "
                "(only the chief's checkpoint is ever read).",
                nbytes,
            )

        def where(prefix: str, why: str) -> str:
            nbytes = tf_reads_only.variable_bytes(self.write._checkpoint)
            cgroups, available_now = _read_memory()
            place, needed, available = copy_place(nbytes, cgroups, available_now)
            self.copy = {
                "copy": place,
                "copy_bytes": nbytes,
                "copy_whole": why,
                "copy_needed": needed,
                "copy_available": available,
            }
            if place == COPY_MEMORY:
                return prefix
            folder = non_chief_dir(self._checkpoint_dir, self._task_id)
            if self._storage_copy is not None:
                # An earlier save's copy (a grace period's first round): never read, and
                # this manager's sweep looks in memory, so it goes here (TF keeps one too).
                delete_recursively(folder)
            make_dirs(folder)  # SaveV2 makes only the last folder, <prefix>_temp
            self._storage_copy = os.path.dirname(folder)
            log.warning(
                "This non-chief's save writes a whole copy (%d bytes, %s), and the host's "
                "memory cannot hold it: %d bytes needed, %d available (the cgroup's limit or "
                "MemAvailable). It goes to %s on the checkpoint's storage instead of memory, "
                "as TensorFlow's does.",
                nbytes,
                why,
                needed,
                available,
                folder,
            )
            return f"{folder}/{prefix.rstrip('/').rsplit('/', 1)[-1]}"

        return tf_reads_only.reading_only(tf_reads_only.Plan(skipped, where))

    def save_fields(self) -> dict:
        """What the ``save_end`` record says of this non-chief's copy (empty: no copy of
        the handler's own managers): ``copy`` (``none``, ``memory`` or ``storage``),
        ``copy_bytes``, and when it was written whole, why (``copy_whole``), ``copy_needed``
        and ``copy_available`` (bytes of host memory, the core's ``copy_place``)."""
        return dict(self.copy or {})

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
            if temp.startswith(_MEMORY_ROOT + "/"):
                temp = os.path.dirname(temp)
            delete_recursively(temp)
            if self._storage_copy is not None:
                delete_recursively(self._storage_copy)


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
