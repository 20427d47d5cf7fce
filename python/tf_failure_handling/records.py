"""A record of every preemption, written by each process that handles a notice.

Every stage of a preemption is one JSON line in the task's own file
(``<folder>/<job>-<task>.jsonl``, one writer per file): ``notice``, ``agreement``,
``save_start``, ``save_end``, ``exit``, ``error``, and, after the restart,
``resumed``. Each line is written with one ``write`` on a file opened for
appending, after or beside the work it describes (never before the save starts,
and a save never waits for it), so a kill at any moment leaves whole lines and at
most one cut-off last line, which :func:`load` skips. A folder that cannot be
written is warned about once and training goes on.

:func:`load` folds the lines of one folder (or file) into :class:`Preemption`
objects, one per task and preemption, with :class:`Resume` objects for the
restarts; ``python -m tf_failure_handling report PATH`` prints them.

Fields of a line (``schema`` 1): ``schema``, ``stage``, ``time`` (Unix seconds),
``job``, ``task``, ``host``, ``pid``, ``preemption`` (the id shared by a task's
lines of one preemption), and per stage: ``platform``, ``source`` (``SIGTERM``,
``SIGUSR1``, ``gce``, ``aws``, ``azure``, ``kubernetes``, ``watcher fn``,
``peer``, ``ps 0: SIGTERM`` ...), ``deadline``, ``grace_period`` (notice);
``step``, ``proposer`` (agreement); ``path`` (save_end); ``code`` (exit);
``error`` (error); ``step``, ``lost``, ``downtime`` (resumed). A newer schema's
extra fields are kept in ``extra``.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional, Union

log = logging.getLogger("tf_failure_handling")

SCHEMA_VERSION = 1
#: Where records go when the handler's ``TerminationConfig`` does not say:
#: this variable, or ``<checkpoint_dir>/preemption_records`` (created at the first
#: notice; none by default when a ``save_fn`` replaces the save). ``off`` disables.
RECORDS_DIR_ENV = "TF_FAILURE_HANDLING_RECORDS_DIR"
DEFAULT_SUBDIR = "preemption_records"
STAGES = ("notice", "agreement", "save_start", "save_end", "exit", "error", "resumed")


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
        return os.path.join(os.fspath(checkpoint_dir), DEFAULT_SUBDIR)
    return None


class Recorder:
    """Writes one task's lines. Thread-safe; never raises."""

    def __init__(
        self, folder: Optional[str], job: str, task: Any, platform: Optional[str] = None
    ) -> None:
        self.folder = folder
        self.job = job
        self.task = task
        self.platform = platform
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self._lock = threading.Lock()
        self._fd: Optional[int] = None
        self._failed = folder is None
        self._count = 0
        self.current: Optional[str] = None
        # Opened at the first line (a notice, on the driver thread): nothing is
        # created beside the checkpoints unless a preemption happens.

    def _open_locked(self) -> bool:
        if self._failed:
            return False
        if self._fd is None:
            try:
                os.makedirs(self.folder, exist_ok=True)
                self._fd = os.open(
                    self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644
                )
            except OSError as e:
                self._give_up(e)
                return False
        return True

    def _give_up(self, error: OSError) -> None:
        self._failed = True
        log.warning(
            "Cannot write preemption records to %s (%s); training goes on without them.",
            self.folder,
            error,
        )

    @property
    def path(self) -> Optional[str]:
        if self.folder is None:
            return None
        return os.path.join(self.folder, f"{self.job}-{self.task}.jsonl")

    def new_preemption(self) -> str:
        with self._lock:
            self._count += 1
            self.current = f"{self.host}-{self.pid}-{int(time.time() * 1000)}-{self._count}"
            return self.current

    def write(self, stage: str, preemption: Optional[str] = None, **fields: Any) -> None:
        """Appends one line (and logs it at INFO, with the same fields)."""
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
        with self._lock:
            if not self._open_locked():
                return
            try:
                data = (line + "\n").encode()
                written = os.write(self._fd, data)
                if written != len(data):
                    raise OSError(f"short write ({written} of {len(data)} bytes)")
            except OSError as e:
                self._give_up(e)

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


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
    #: Lines that could not be read (a cut-off last line, garbage), per file.
    skipped: dict


_KNOWN = {
    "schema",
    "stage",
    "time",
    "job",
    "task",
    "host",
    "pid",
    "preemption",
    "platform",
    "source",
    "deadline",
    "grace_period",
    "step",
    "proposer",
    "path",
    "code",
    "error",
    "lost",
    "downtime",
}


def _files(path: Union[str, Path]) -> list:
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"no such file or folder: {p}")
    if p.is_dir():
        return sorted(p.glob("*.jsonl"))
    return [p]


def _lines(files: Iterable[Path], skipped: dict) -> Iterable[dict]:
    for f in files:
        with open(f, "rb") as fh:
            for number, raw in enumerate(fh, 1):
                try:
                    if not raw.endswith(b"\n"):
                        raise ValueError("cut off")
                    obj = json.loads(raw)
                    if not isinstance(obj, dict) or "stage" not in obj or "job" not in obj:
                        raise ValueError("not a record")
                except ValueError:
                    skipped.setdefault(str(f), []).append(number)
                    continue
                yield obj


def load(path: Union[str, Path]) -> Records:
    """Reads a records folder (every ``*.jsonl`` in it) or one file.

    Tolerates a cut-off last line and lines it cannot parse (counted in
    ``skipped``); fields of newer schemas go to ``extra``.

    Raises:
      FileNotFoundError: ``path`` does not exist.
    """
    skipped: dict = {}
    preemptions: dict = {}
    resumes = []
    for obj in _lines(_files(path), skipped):
        extra = {k: v for k, v in obj.items() if k not in _KNOWN}
        stage = obj["stage"]
        if stage == "resumed":
            resumes.append(
                Resume(
                    obj["job"],
                    obj.get("task"),
                    obj.get("time", 0.0),
                    obj.get("step"),
                    obj.get("lost"),
                    obj.get("downtime"),
                    obj.get("host"),
                    extra,
                )
            )
            continue
        key = (obj["job"], obj.get("task"), obj.get("preemption"))
        p = preemptions.get(key)
        if p is None:
            p = preemptions[key] = Preemption(
                obj["job"], obj.get("task"), obj.get("host"), obj.get("pid"), obj.get("preemption")
            )
        p.extra.update(extra)
        t = obj.get("time")
        if stage == "notice":
            if p.notice_time is None:
                p.notice_time = t
                p.source = obj.get("source")
                p.platform = obj.get("platform")
                p.deadline = obj.get("deadline")
                p.grace_period = obj.get("grace_period")
        elif stage == "agreement":
            p.agreed_step = obj.get("step")
            p.proposer = obj.get("proposer")
            p.agreement_time = t
        elif stage == "save_start":
            p.save_start = t
            if obj.get("step") is not None:
                p.agreed_step = obj.get("step")
        elif stage == "save_end":
            p.save_end = t
            p.checkpoint_path = obj.get("path")
        elif stage == "exit":
            p.exit_time = t
            p.exit_code = obj.get("code")
        elif stage == "error":
            p.error = obj.get("error")
    ordered = sorted(preemptions.values(), key=lambda p: (p.notice_time or 0.0, p.label))
    resumes.sort(key=lambda r: r.time)
    return Records(ordered, resumes, skipped)


def last_exit(folder: Optional[str], job: str, task: Any) -> Optional[Preemption]:
    """The latest preemption of ``job``/``task`` in ``folder`` that reached its exit."""
    if folder is None:
        return None
    path = Path(folder) / f"{job}-{task}.jsonl"
    if not path.exists():
        return None
    try:
        found = [
            p for p in load(path).preemptions if p.exit_time is not None and _own(p, job, task)
        ]
    except OSError:
        return None
    return found[-1] if found else None


def _own(preemption: Preemption, job: str, task: Any) -> bool:
    """Whether ``preemption`` is ``job``/``task``'s own: a coordinator's file also holds
    the lines it wrote for its PS and worker tasks (their job and task, ``observer``)."""
    return preemption.job == job and str(preemption.task) == str(task)
