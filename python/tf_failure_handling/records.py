"""A record of every preemption, written by each process that handles a notice.

Every stage of a preemption is one JSON line (``notice``, ``agreement``, ``save_start``,
``save_end``, ``exit``, ``error``, after the restart ``resumed``, under SLURM
``requeue``), each task its own writer (:class:`Recorder`): one ``.jsonl`` file per task
in a local folder, one object per line on any other scheme TensorFlow writes.
:func:`load` folds them into :class:`Preemption` and :class:`Resume` objects, checking
each line against :data:`FIELDS`; ``python -m tf_failure_handling report PATH`` prints
them. The layouts, what a kill leaves, what they cost and each stage's fields:
docs/records.md.

This module writes them; ``_record_reading`` reads them (:func:`load`, :func:`last_exit`,
the schema) and ``_record_paths`` says where they go (:func:`folder_for`): their names
are re-exported here.
"""

from __future__ import annotations

import collections
import errno
import json
import logging
import os
import secrets
import socket
import threading
from typing import Any, Callable, Optional

from . import _record_paths as _paths
from ._native import RecordsCore
from ._record_paths import (  # re-exported: where the records go
    DEFAULT_SUBDIR,
    RECORDS_DIR_ENV,
    _join,
    _local,
    folder_for,
    is_local,
)
from ._record_reading import (  # re-exported: reading the records
    FIELDS,
    REQUIRED,
    Preemption,
    Records,
    Resume,
    last_exit,
    load,
    valid,
)

__all__ = [
    "DEFAULT_SUBDIR",
    "FIELDS",
    "RECORDS_DIR_ENV",
    "REQUIRED",
    "SCHEMA_VERSION",
    "STAGES",
    "Preemption",
    "Recorder",
    "Records",
    "Resume",
    "claim_resume",
    "folder_for",
    "is_local",
    "last_exit",
    "load",
    "valid",
]

log = logging.getLogger("tf_failure_handling")

SCHEMA_VERSION = 1
STAGES = ("notice", "agreement", "save_start", "save_end", "exit", "error", "resumed", "requeue")
# How long Recorder.close waits for an object store to take the lines still queued
# (the ``exit`` line among them) before the process exits without them is the core's:
# FLUSH_BOUND in src/records.rs (``RecordsCore.bound``). The wall-clock time a line
# carries (seconds since the Unix epoch: the clock a reader compares across hosts and
# restarts) is stamped by the binding as the line is built (``RecordsCore.stamp``).
_bound = RecordsCore.bound


# --------------------------------------------------------------------- writing


def _token() -> str:
    """The random part of a preemption's id: unique across processes and restarts."""
    return secrets.token_hex(6)


def task_preemption(job: str, task: Any) -> str:
    """The id of a PS or worker task's preemption its coordinator records."""
    return f"{job}-{task}-{_token()}"


class _File:
    """One task's ``.jsonl`` file on a local disk: each line appended, then fsynced."""

    def __init__(self, folder: str, name: str) -> None:
        self.folder = _local(folder)
        self.path = os.path.join(self.folder, f"{name}.jsonl")
        self._fd: Optional[int] = None
        self._lead = b""
        self._fsync = True

    def _open(self) -> None:
        os.makedirs(self.folder, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size:
                # A process killed in a write leaves a line without its newline:
                # this process's first line must not be joined to it.
                with open(self.path, "rb") as fh:
                    fh.seek(size - 1)
                    self._lead = b"" if fh.read(1) == b"\n" else b"\n"
            else:
                # The file's name is part of its folder: make it durable too.
                folder = os.open(self.folder, os.O_RDONLY | os.O_DIRECTORY)
                try:
                    os.fsync(folder)
                finally:
                    os.close(folder)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def append(self, line: bytes, stage: str, stamp: int) -> None:
        """Raises ``OSError`` when the line could not be written whole."""
        if self._fd is None:
            self._open()
        data = memoryview(self._lead + line)
        self._lead = b""
        while data:
            written = os.write(self._fd, data)
            if written <= 0:
                raise OSError(f"write returned {written}")
            data = data[written:]
        if self._fsync:
            try:
                os.fsync(self._fd)
            except OSError as e:
                # A file system without fsync (some FUSE mounts): the line is
                # written, only not forced to the disk.
                if e.errno not in (errno.EINVAL, errno.ENOTSUP):
                    raise
                self._fsync = False

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class _Objects:
    """One task's lines as objects in ``<folder>/<job>-<task>/``, one per line,
    through ``tf.io.gfile``: an object store has no append, and an object is
    complete or absent."""

    def __init__(self, folder: str, name: str, pid: int) -> None:
        self.path = _join(folder, name)
        self._pid = pid
        self._count = 0
        self._made = False

    def append(self, line: bytes, stage: str, stamp: int) -> None:
        """``stamp``: when the line was built, in microseconds since the Unix epoch (the
        objects' names sort in the order of their lines)."""
        gfile = _paths._gfile()
        if not self._made:
            gfile.makedirs(self.path)
            self._made = True
        self._count += 1
        name = f"{stamp:017d}-{self._pid:07d}-{self._count:05d}-{stage}.json"
        with gfile.GFile(_join(self.path, name), "wb") as f:
            f.write(line)

    def close(self) -> None:
        pass


class _Queue:
    """Runs jobs in order on one daemon thread (an object store's writes: no stage
    waits for them). A job that raises stops the queue and is reported once."""

    def __init__(self, on_error: Callable[[BaseException], None]) -> None:
        self._on_error = on_error
        self._jobs: collections.deque = collections.deque()
        self._cond = threading.Condition()
        self._busy = False
        self._stopped = False
        self._thread: Optional[threading.Thread] = None

    def put(self, job: Callable[[], None]) -> None:
        with self._cond:
            if self._stopped:
                return
            self._jobs.append(job)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="tf_failure_handling records", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._jobs:
                    if self._stopped:
                        return
                    self._cond.wait()
                job = self._jobs.popleft()
                self._busy = True
            try:
                job()
            except BaseException as e:  # noqa: BLE001 - reported, then the queue stops
                with self._cond:
                    self._stopped = True
                    self._jobs.clear()
                self._on_error(e)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def pending(self) -> int:
        with self._cond:
            return len(self._jobs) + self._busy

    def _empty(self) -> bool:
        return not self._jobs and not self._busy

    def wait_empty(self, timeout: Optional[float] = None) -> tuple:
        """Whether every job ran within ``timeout`` seconds (None: the core's bound
        before the exit), and that bound."""
        bound = _bound(timeout)
        with self._cond:
            return self._cond.wait_for(self._empty, bound), bound

    def stop(self) -> None:
        """The thread ends once the jobs queued before are done."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()


class Recorder:
    """Writes one task's lines. Thread-safe; never raises."""

    def __init__(
        self, folder: Optional[str], job: str, task: Any, platform: Optional[str] = None
    ) -> None:
        self.folder = None if folder is None else os.fspath(folder)
        self.job = job
        self.task = task
        self.platform = platform
        self.host = socket.gethostname()
        self.pid = os.getpid()
        #: Whether the lines go to an object store (written by a background thread).
        self.remote = self.folder is not None and not is_local(self.folder)
        self._lock = threading.Lock()
        self._failed = self.folder is None
        self._count = 0
        self.current: Optional[str] = None
        # Nothing is created beside the checkpoints until the first line (a
        # notice): the folder, the file or the writer thread.
        self._sink: Any = None
        self._queue: Optional[_Queue] = None

    @property
    def path(self) -> Optional[str]:
        """This task's file (local) or folder of objects (any other scheme)."""
        if self.folder is None:
            return None
        name = f"{self.job}-{self.task}"
        return _join(self.folder, name) if self.remote else _join(self.folder, f"{name}.jsonl")

    def _give_up(self, error: BaseException) -> None:
        with self._lock:
            if self._failed:
                return
            self._failed = True
        log.warning(
            "Cannot write preemption records to %s (%s); training goes on without them.",
            self.folder,
            error,
        )

    def new_preemption(self) -> str:
        with self._lock:
            self._count += 1
            self.current = f"{self.host}-{self.pid}-{_token()}-{self._count}"
            return self.current

    def write(self, stage: str, preemption: Optional[str] = None, **fields: Any) -> None:
        """Writes one line (and logs it at INFO, with the same fields): on a local
        folder it is on the disk when this returns; on an object store it is queued.
        Its ``time`` is now unless ``time`` is given; ``exited`` (a ``resumed`` line's
        exit) makes its ``downtime``."""
        # The coordinator of a PS cluster writes its PS and worker tasks' lines
        # (as_job / as_task) into its own file.
        job = fields.pop("as_job", None) or self.job
        task = fields.pop("as_task", None)
        record = {
            "schema": SCHEMA_VERSION,
            "stage": stage,
            "time": fields.pop("time", None),
            "job": job,
            "task": self.task if task is None else task,
            "host": self.host,
            "pid": self.pid,
            "preemption": preemption or self.current,
            **{k: v for k, v in fields.items() if v is not None},
        }
        if stage == "notice" and self.platform is not None and job == self.job:
            record.setdefault("platform", self.platform)
        stamp = RecordsCore.stamp(record)
        line = json.dumps(record, sort_keys=True, default=str)
        log.info("Preemption %s: %s", stage, line)
        data = (line + "\n").encode()
        if self.remote:
            self._later(lambda: self._sink_for_writing().append(data, stage, stamp))
            return
        with self._lock:
            if self._failed:
                return
            try:
                self._sink_for_writing().append(data, stage, stamp)
                return
            except OSError as e:
                error = e
        self._give_up(error)

    def _sink_for_writing(self) -> Any:
        if self._sink is None:
            name = f"{self.job}-{self.task}"
            self._sink = (
                _Objects(self.folder, name, self.pid) if self.remote else _File(self.folder, name)
            )
        return self._sink

    def _later(self, job: Callable[[], None]) -> None:
        with self._lock:
            if self._failed:
                return
            if self._queue is None:
                self._queue = _Queue(self._give_up)
            queue = self._queue
        queue.put(job)

    def defer(self, job: Callable[[], None]) -> None:
        """Runs ``job`` on the writer thread of an object store (after the lines
        queued before it), or now on a local folder. A job that raises is warned
        about, like a line that cannot be written."""
        if self.remote:
            self._later(job)
            return
        try:
            job()
        except Exception as e:  # noqa: BLE001 - records never stop training
            log.warning("Preemption records: %s failed: %r", getattr(job, "__name__", job), e)

    def flush(self, timeout: Optional[float] = None) -> bool:
        """Waits until every line written so far is complete (object stores; on a
        local folder they are already). False when ``timeout`` (None: the core's
        bound before the exit) passed first."""
        queue = self._queue
        return queue is None or queue.wait_empty(timeout)[0]

    def close(self, wait: bool = True) -> None:
        """Ends the writing (a later line opens again). With ``wait``, first lets an
        object store take the queued lines, within the core's bound."""
        with self._lock:
            queue, self._queue = self._queue, None
        if queue is not None:
            flushed, bound = queue.wait_empty() if wait else (True, None)
            if not flushed:
                log.warning(
                    "Preemption records: %d line(s) not written to %s within %.0f s "
                    "(the store did not answer); going on without them.",
                    queue.pending(),
                    self.folder,
                    bound,
                )
            queue.stop()
        with self._lock:
            if self._sink is not None and not self.remote:
                try:
                    self._sink.close()
                except OSError:
                    pass
                self._sink = None


def claim_resume(folder: str, job: str, task: Any, preemption: Optional[str]) -> bool:
    """True the first time this process asks for a ``(folder, job, task,
    preemption)``: a second handler of the same run (tf_keras makes several) must not
    write a second ``resumed`` line, even before the first one reached the store."""
    return RecordsCore.claim_resume(folder, job, str(task), preemption)
