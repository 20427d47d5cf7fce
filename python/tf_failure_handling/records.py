"""A record of every preemption, written by each process that handles a notice.

Every stage of a preemption is one JSON line (``notice``, ``agreement``, ``save_start``,
``save_end``, ``exit``, ``error``, after the restart ``resumed``, under SLURM
``requeue``), each task its own writer (:class:`Recorder`): one ``.jsonl`` file per task
in a local folder, one object per line on any other scheme TensorFlow writes.
:func:`load` folds them into :class:`Preemption` and :class:`Resume` objects, checking
each line against :data:`FIELDS`; ``python -m tf_failure_handling report PATH`` prints
them. The layouts, what a kill leaves, what they cost and each stage's fields:
docs/records.md.
"""

from __future__ import annotations

import collections
import errno
import functools
import json
import logging
import os
import socket
import stat
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

from ._native import (
    RECORD_FIELDS,
    RECORD_REQUIRED,
    last_exit_record,
    read_records,
    record_field_ok,
    valid_record,
)
from ._native import (
    claim_resume as _claim_resume,
)

log = logging.getLogger("tf_failure_handling")

SCHEMA_VERSION = 1
#: Where records go when the handler's ``TerminationConfig`` does not say:
#: this variable, or ``<checkpoint_dir>/preemption_records`` (created at the first
#: notice; none by default when a ``save_fn`` replaces the save). ``off`` disables.
RECORDS_DIR_ENV = "TF_FAILURE_HANDLING_RECORDS_DIR"
DEFAULT_SUBDIR = "preemption_records"
STAGES = ("notice", "agreement", "save_start", "save_end", "exit", "error", "resumed", "requeue")
#: Seconds :meth:`Recorder.close` waits for an object store to take the lines still
#: queued (the ``exit`` line among them) before the process exits without them.
FLUSH_BOUND = 10.0


def is_local(path: str) -> bool:
    """Whether ``path`` is on this machine's file system: no scheme, or ``file://``."""
    return "://" not in path or path.startswith("file://")


def _local(path: str) -> str:
    return path[len("file://") :] if path.startswith("file://") else path


def _join(folder: str, *names: str) -> str:
    if is_local(folder):
        return os.path.join(folder, *names)
    return "/".join([folder.rstrip("/"), *names])


def folder_for(checkpoint_dir: Optional[str], configured: Any = None) -> Optional[str]:
    """The records folder: ``configured`` (``False``: none), else the environment
    variable, else beside the checkpoints; None when there is nowhere to write."""
    if configured is False:
        return None
    if configured:
        return os.fspath(configured)
    env = os.environ.get(RECORDS_DIR_ENV)
    if env is not None:
        return None if env.strip().lower() in ("", "off", "0", "false", "none") else env
    if checkpoint_dir:
        return _join(os.fspath(checkpoint_dir), DEFAULT_SUBDIR)
    return None


def _gfile() -> Any:
    """TensorFlow's file system layer, for every path that is not local."""
    try:
        import tensorflow as tf
    except ImportError as e:
        raise OSError(f"a path with a scheme needs TensorFlow's file systems: {e}") from e
    return tf.io.gfile


# --------------------------------------------------------------------- writing


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

    def append(self, line: bytes, stage: str) -> None:
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

    def append(self, line: bytes, stage: str) -> None:
        gfile = _gfile()
        if not self._made:
            gfile.makedirs(self.path)
            self._made = True
        self._count += 1
        name = f"{time.time_ns() // 1000:017d}-{self._pid:07d}-{self._count:05d}-{stage}.json"
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

    def wait_empty(self, timeout: float) -> bool:
        """Whether every job ran within ``timeout`` seconds."""
        end = time.monotonic() + timeout
        with self._cond:
            while self._jobs or self._busy:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

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
            self.current = f"{self.host}-{self.pid}-{int(time.time() * 1000)}-{self._count}"
            return self.current

    def write(self, stage: str, preemption: Optional[str] = None, **fields: Any) -> None:
        """Writes one line (and logs it at INFO, with the same fields): on a local
        folder it is on the disk when this returns; on an object store it is queued."""
        # The coordinator of a PS cluster writes its PS and worker tasks' lines
        # (as_job / as_task) into its own file.
        job = fields.pop("as_job", None) or self.job
        task = fields.pop("as_task", None)
        record = {
            "schema": SCHEMA_VERSION,
            "stage": stage,
            "time": fields.pop("time", None) or time.time(),
            "job": job,
            "task": self.task if task is None else task,
            "host": self.host,
            "pid": self.pid,
            "preemption": preemption or self.current,
            **{k: v for k, v in fields.items() if v is not None},
        }
        if stage == "notice" and self.platform is not None and job == self.job:
            record.setdefault("platform", self.platform)
        line = json.dumps(record, sort_keys=True, default=str)
        log.info("Preemption %s: %s", stage, line)
        data = (line + "\n").encode()
        if self.remote:
            self._later(lambda: self._sink_for_writing().append(data, stage))
            return
        with self._lock:
            if self._failed:
                return
            try:
                self._sink_for_writing().append(data, stage)
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

    def flush(self, timeout: float = FLUSH_BOUND) -> bool:
        """Waits until every line written so far is complete (object stores; on a
        local folder they are already). False when ``timeout`` passed first."""
        queue = self._queue
        return queue is None or queue.wait_empty(timeout)

    def close(self, wait: bool = True) -> None:
        """Ends the writing (a later line opens again). With ``wait``, first lets an
        object store take the queued lines, within :data:`FLUSH_BOUND`."""
        with self._lock:
            queue, self._queue = self._queue, None
        if queue is not None:
            if wait and not queue.wait_empty(FLUSH_BOUND):
                log.warning(
                    "Preemption records: %d line(s) not written to %s within %.0f s "
                    "(the store did not answer); going on without them.",
                    queue.pending(),
                    self.folder,
                    FLUSH_BOUND,
                )
            queue.stop()
        with self._lock:
            if self._sink is not None and not self.remote:
                try:
                    self._sink.close()
                except OSError:
                    pass
                self._sink = None


# --------------------------------------------------------------------- reading


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


#: The schema: each known field, and a check of a value for it (``FIELDS[name](value)``;
#: ``null`` is the same as absent). A line must have :data:`REQUIRED`; any other field is
#: kept in ``extra`` whatever its value. The rules (docs/records.md) are in the Rust core.
FIELDS: dict = {n: functools.partial(record_field_ok, n) for n in RECORD_FIELDS}
REQUIRED = RECORD_REQUIRED


def valid(obj: Any) -> bool:
    """Whether ``obj`` (a parsed line) is of the schema's shape."""
    return valid_record(obj)


class _Reader:
    """The read side of both layouts: local paths through ``os``, any other scheme
    through ``tf.io.gfile`` (its errors become ``OSError``)."""

    def __init__(self, path: str) -> None:
        self.local = is_local(path)

    def _gfile(self, what: str, path: str) -> Any:
        gfile = _gfile()
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
    preemptions, resumes, skipped = read_records(_read(reader, _sources(reader, path)))
    return Records([Preemption(**p) for p in preemptions], [Resume(**r) for r in resumes], skipped)


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
    found = last_exit_record(sources, job, str(task))
    return None if found is None else Preemption(**found)


def claim_resume(folder: str, job: str, task: Any, preemption: Optional[str]) -> bool:
    """True the first time this process asks for a ``(folder, job, task,
    preemption)``: a second handler of the same run (tf_keras makes several) must not
    write a second ``resumed`` line, even before the first one reached the store."""
    return _claim_resume(folder, job, str(task), preemption)
