"""Where a non-chief's copy of a save goes: the mode (:data:`NON_CHIEF_SAVES_ENV`), its
folders, and in ``memory`` mode the reads without a copy and the placement of a copy
that cannot be left out.

By default a non-chief writes no copy. It still saves (the save's collective reads need
every worker: ``_integrations/tf_reads_only.py`` reads every tensor in the chief's order
and leaves the write out), through a manager whose folder is in TensorFlow's in-memory
file system (``ram://``, :func:`memory_dir`), where only its small ``checkpoint`` file
goes. A saver that cannot leave its copy out writes it there whole when the host's
memory can hold it (the core's ``copy_place``, from ``host_memory``'s readings), else to
TensorFlow's ``workertemp_<task_id>`` on the storage (:func:`non_chief_dir`), said in the
log and in the ``save_end`` record (:class:`CopyPlacement`). ``=storage`` gives back
TensorFlow's layout; ``=shares`` is ``checkpoint_shares``.

``memory`` and ``shares`` call private names of TensorFlow's saver. Whether this
TensorFlow has them is decided once, when a handler installs the mode
(:func:`installable`): one that lacks any gets TensorFlow's own save (``storage``),
with a warning naming TensorFlow's version and the name.
"""

from __future__ import annotations

import itertools
import logging
import os
from typing import Any, Optional

from .._integrations import saver_hook, tf_reads_only, tf_versions
from .._native import copy_place
from .._platforms import common
from . import host_memory
from .checkpoint_files import delete_recursively, make_dirs

log = logging.getLogger("tf_failure_handling")

#: Where a non-chief's copy goes when the handler makes its managers: ``memory`` (the
#: default: no copy, every tensor read; a copy that cannot be left out goes to
#: TensorFlow's ``ram://`` file system when it fits in the host's memory), ``storage``
#: (TensorFlow's ``workertemp_<task_id>`` beside the checkpoint) or ``shares`` (no copy:
#: each worker writes a share of the checkpoint itself).
NON_CHIEF_SAVES_ENV = "TF_FAILURE_HANDLING_NON_CHIEF_SAVES"
MEMORY, STORAGE, SHARES = "memory", "storage", "shares"

#: The in-memory folders of this process's handlers, one each.
MEMORY_ROOT = "ram://tf_failure_handling"
_memory_ids = itertools.count()
#: ``(cgroups, mem_available)`` of the host when a non-chief's whole copy is about to be
#: written (a test passes its own numbers here).
_read_memory = host_memory.read
#: How a non-chief's copy of its last save was written (``save_end``'s ``copy``): none
#: (every tensor read, nothing written), whole in memory, or whole on the storage.
COPY_NONE, COPY_MEMORY, COPY_STORAGE = "none", "memory", "storage"


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


def installable(mode: str) -> str:
    """``mode`` (:data:`MEMORY` or :data:`SHARES`) when this TensorFlow's saver has every
    private name the mode uses (``saver_hook.missing``), else :data:`STORAGE`:
    TensorFlow's own save, its whole copy in ``workertemp_<task_id>``, with a warning
    that names TensorFlow's version and the missing name."""
    absent = saver_hook.missing(mode)
    if absent is None:
        return mode
    import tensorflow as tf

    log.warning(
        "TensorFlow %s's saver has no %s, a private name %s=%s uses "
        "(tf_failure_handling is tested with TensorFlow %s to %s): this worker saves as "
        "TensorFlow does instead, a non-chief's whole copy in workertemp_<task_id> beside "
        "the checkpoint (=%s).",
        getattr(tf, "__version__", "(unknown version)"),
        absent,
        NON_CHIEF_SAVES_ENV,
        mode,
        *tf_versions.TESTED,
        STORAGE,
    )
    return STORAGE


def memory_dir(checkpoint_dir: str, task_id: int) -> str:
    """Where a non-chief's copy goes in memory: ``ram://.../<pid>-<n>/workertemp_<task_id>/<base>``
    (``<n>`` counts this process's handlers, so two never share a folder)."""
    root = f"{MEMORY_ROOT}/{os.getpid()}-{next(_memory_ids)}/workertemp_{task_id}"
    make_dirs(root)
    return f"{root}/{os.path.basename(os.path.normpath(checkpoint_dir))}"


def non_chief_dir(checkpoint_dir: str, task_id: int) -> str:
    """Where a non-chief worker writes: ``<parent>/workertemp_<task_id>/<base>``."""
    parent = os.path.join(os.path.dirname(checkpoint_dir), f"workertemp_{task_id}")
    make_dirs(parent)
    return os.path.join(parent, os.path.basename(checkpoint_dir))


class CopyPlacement:
    """A non-chief's copies: in ``memory`` mode each save's :class:`tf_reads_only.Plan`
    (no copy, or a whole one in memory or on the storage), in ``shares`` mode where a
    saver that cannot be split writes its whole copy (:meth:`whole_copy`), and what the
    ``save_end`` record says of the last one."""

    def __init__(self, checkpoint_dir: Optional[str], task_id: int) -> None:
        #: How this non-chief's copy of the last save was written, and why
        #: (:meth:`fields`); None: no such copy.
        self.copy: Optional[dict] = None
        #: The ``workertemp_<task_id>`` a copy that did not fit in memory went to.
        self._storage_copy: Optional[str] = None
        self._checkpoint_dir, self._task_id = checkpoint_dir, task_id

    def reading_only(self, checkpoint: Any) -> Any:
        """The save of ``checkpoint`` (the write manager's) with its plan in effect."""
        self.copy = None

        def skipped(nbytes: int) -> None:
            self.copy = {"copy": COPY_NONE, "copy_bytes": nbytes}
            log.info(
                "The non-chief read every tensor of the save (%d bytes) and wrote no copy "
                "(only the chief's checkpoint is ever read).",
                nbytes,
            )

        def where(prefix: str, why: str) -> str:
            return self.whole_copy(checkpoint, prefix, why)

        return tf_reads_only.reading_only(tf_reads_only.Plan(skipped, where))

    def whole_copy(self, checkpoint: Any, prefix: str, why: str) -> str:
        """Where a whole copy of ``checkpoint``'s save to ``prefix`` goes, when the saver
        cannot leave it out (``why``): ``prefix`` itself (in memory) when the host's
        memory can hold it (the core's ``copy_place``), else a folder on the storage."""
        nbytes = tf_reads_only.variable_bytes(checkpoint)
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

    def start_save(self) -> None:
        """A new save: the last one's fields are cleared."""
        self.copy = None

    def fields(self) -> dict:
        """``save_end``'s fields of the last save's copy (empty: none)."""
        return dict(self.copy or {})

    def remove_storage_copy(self) -> None:
        """Deletes the ``workertemp_<task_id>`` a whole copy went to, if one did."""
        if self._storage_copy is not None:
            delete_recursively(self._storage_copy)
