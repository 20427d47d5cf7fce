"""Reading the preemption records: :func:`load` (every task's lines of a folder, for
``python -m tf_failure_handling report``) and :func:`last_exit` (a restarting task's own
last exit); both pass the bytes to the Rust core, which checks each line against the
schema and folds them into :class:`Preemption` and :class:`Resume` objects.
``records`` re-exports every name; docs/records.md describes the layouts.
"""

from __future__ import annotations

import functools
import json
import os
import stat
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from . import _record_paths as _paths
from ._native import RecordsCore
from ._record_paths import DEFAULT_SUBDIR, _join, _local, is_local


@dataclass
class Preemption:
    """One task's view of one preemption (the lines of one ``preemption`` id)."""

    job: str
    task: Any
    host: Optional[str] = None
    pid: Optional[int] = None
    id: Optional[str] = None
    platform: Optional[str] = None
    source: Optional[str] = None
    notice_time: Optional[float] = None
    deadline: Optional[float] = None
    grace_period: Optional[float] = None
    agreed_step: Optional[int] = None
    proposer: Optional[str] = None
    agreement_time: Optional[float] = None
    save_start: Optional[float] = None
    save_end: Optional[float] = None
    checkpoint_path: Optional[str] = None
    exit_code: Optional[Any] = None
    exit_time: Optional[float] = None
    error: Optional[str] = None
    extra: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.job} {self.task}"

    @property
    def save_duration(self) -> Optional[float]:
        if self.save_start is None or self.save_end is None:
            return None
        return self.save_end - self.save_start

    @property
    def margin(self) -> Optional[float]:
        """Seconds left to the deadline when the save ended (negative: too late)."""
        if self.deadline is None or self.save_end is None:
            return None
        return self.deadline - self.save_end


@dataclass
class Resume:
    """A ``resumed`` line: a task restarted from a checkpoint."""

    job: str
    task: Any
    time: float
    step: Optional[int] = None
    lost: Optional[int] = None
    downtime: Optional[float] = None
    host: Optional[str] = None
    extra: dict = field(default_factory=dict)


@dataclass
class Records:
    preemptions: list
    resumes: list
    #: Lines that were skipped, per file (or object): cut off, not JSON, or not of
    #: the schema's shape. Line 0: the file itself could not be read.
    skipped: dict
    #: The preemptions grouped into cluster-wide ones (their indices, in time order):
    #: the core's rule, ``records::groups`` in src/records.rs.
    groups: list = field(default_factory=list)


#: The schema: each known field, and a check of a value for it (``FIELDS[name](value)``;
#: ``null`` is the same as absent). A line must have :data:`REQUIRED`; any other field is
#: kept in ``extra`` whatever its value. The rules (docs/records.md) are in the Rust core.
FIELDS: dict = {n: functools.partial(RecordsCore.valid, field=n) for n in RecordsCore.FIELDS}
REQUIRED = tuple(n for n, required in RecordsCore.FIELDS.items() if required)


def valid(obj: Any) -> bool:
    """Whether ``obj`` (a parsed line) is of the schema's shape."""
    return RecordsCore.valid(obj)


class _Reader:
    """The read side of both layouts: local paths through ``os``, any other scheme
    through ``tf.io.gfile`` (its errors become ``OSError``)."""

    def __init__(self, path: str) -> None:
        self.local = is_local(path)

    def _gfile(self, what: str, path: str) -> Any:
        gfile = _paths._gfile()
        try:
            if what == "read":
                with gfile.GFile(path, "rb") as f:
                    return f.read()
            return getattr(gfile, what)(path)
        except Exception as e:
            if type(e).__name__ == "NotFoundError":
                raise FileNotFoundError(str(e)) from e
            raise OSError(f"{path}: {e}") from e

    def exists(self, path: str) -> bool:
        return os.path.exists(_local(path)) if self.local else self._gfile("exists", path)

    def isdir(self, path: str) -> bool:
        return os.path.isdir(_local(path)) if self.local else self._gfile("isdir", path)

    def names(self, folder: str, suffix: str) -> list:
        """The paths in ``folder`` whose names end with ``suffix``, sorted."""
        found = os.listdir(_local(folder)) if self.local else self._gfile("listdir", folder)
        return sorted(_join(folder, n) for n in found if n.endswith(suffix))

    def folders(self, folder: str) -> list:
        found = os.listdir(_local(folder)) if self.local else self._gfile("listdir", folder)
        paths = (_join(folder, n.rstrip("/")) for n in found if not n.endswith((".jsonl", ".json")))
        return sorted(p for p in paths if self.isdir(p))

    def read(self, path: str) -> bytes:
        if self.local:
            # Not a FIFO, a device or a folder that happens to be named *.jsonl: reading
            # one would block, never end, or fail.
            with open(_local(path), "rb", opener=_open_regular) as f:
                return f.read()
        return self._gfile("read", path)


def _open_regular(path: str, flags: int) -> int:
    fd = os.open(path, flags | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{path}: not a regular file")
    return fd


def _read(reader: _Reader, sources: list) -> list:
    """``(name, bytes)`` of each file or object; None for one that cannot be read."""
    found = []
    for source in sources:
        try:
            found.append((str(source), reader.read(source)))
        except OSError:
            found.append((str(source), None))
    return found


def _sources(reader: _Reader, path: str) -> list:
    """The files and objects of a records folder, one file, or a checkpoint folder
    with a records folder inside."""
    if not reader.exists(path):
        raise FileNotFoundError(f"no such file or folder: {path}")
    if not reader.isdir(path):
        return [path]
    inner = _join(path, DEFAULT_SUBDIR)
    if reader.isdir(inner):
        path = inner
    objects = [o for f in reader.folders(path) for o in reader.names(f, ".json")]
    return reader.names(path, ".jsonl") + objects


def load(path: Union[str, os.PathLike]) -> Records:
    """Reads a records folder (every ``*.jsonl`` file and ``*/*.json`` object in it),
    one file, or a checkpoint folder with a ``preemption_records`` folder inside; a
    path with a scheme through ``tf.io.gfile``.

    Skips, and counts in ``skipped``, every line that is cut off, not JSON or not of
    the schema's shape (:func:`valid`); fields the schema does not name go to ``extra``.

    Raises:
      FileNotFoundError: ``path`` does not exist.
      OSError: ``path`` could not be listed.
    """
    path = os.fspath(path)
    reader = _Reader(path)
    found = json.loads(RecordsCore.read(_read(reader, _sources(reader, path))))
    return Records(
        [Preemption(**p) for p in found["preemptions"]],
        [Resume(**r) for r in found["resumes"]],
        dict(found["skipped"]),
        found["groups"],
    )


def _task_sources(reader: _Reader, folder: str, job: str, task: Any) -> list:
    name = f"{job}-{task}"
    found = []
    file = _join(folder, f"{name}.jsonl")
    if reader.exists(file):
        found.append(file)
    inner = _join(folder, name)
    objects = reader.names(inner, ".json") if reader.isdir(inner) else []
    # Only the objects after the task's last `resumed` one can hold an exit that
    # has not been resumed from: the others are not read.
    last = max((i for i, o in enumerate(objects) if o.endswith("-resumed.json")), default=-1)
    return found + objects[max(last, 0) :]


def last_exit(folder: Optional[str], job: str, task: Any) -> Optional[Preemption]:
    """The latest preemption of ``job``/``task`` in ``folder`` that reached its exit
    and has no ``resumed`` line after it; None when there is none or the folder cannot
    be read (a record file never stops a handler)."""
    if folder is None:
        return None
    try:
        reader = _Reader(folder)
        if not reader.isdir(folder):
            return None
        sources = _read(reader, _task_sources(reader, folder, job, task))
    except OSError:
        return None
    found = json.loads(RecordsCore.read(sources, (job, str(task))))
    return None if found is None else Preemption(**found)
