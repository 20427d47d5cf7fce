"""The clouds and the schedulers a job can run under, each kind behind one interface.

Each cloud and each scheduler is a module of this package with the same names as the
others of its kind (:class:`Cloud`, :class:`Scheduler` list them); :data:`CLOUDS` and
:data:`SCHEDULERS` hold them in detection order, and this module is the only way the
rest of the package reaches them: the handler, the save and the records know no
platform by name. A new platform is a new module with these names and one entry here
(a cloud's notices also need its Rust poller: ``src/sources/clouds.rs``).
"""

from __future__ import annotations

import signal
from typing import Any, Optional, Protocol

from . import cloud_aws, cloud_azure, cloud_gce, kubernetes, slurm


class Cloud(Protocol):
    """What each cloud module defines."""

    #: ``Environment.cloud`` when this cloud is detected (and ``_native``'s name).
    NAME: str
    #: Its metadata service when its variable is unset.
    DEFAULT_BASE: str
    #: The code its default ``exit_fn`` exits with.
    EXIT_CODE: int

    def configured_base(self) -> Optional[str]:
        """Its metadata service as its variable says, or None (unset). Raises
        ValueError naming the variable when it cannot mean a base URL."""

    def detected(self, configured: Optional[str]) -> bool:
        """Whether this process runs on it (bounded probes; any failure is no)."""

    def grace_period(self, gpu: bool) -> float:
        """Its default grace period in seconds."""

    def exit_fn(self) -> None:
        """Its default ``exit_fn``."""


#: Every cloud, in detection order (the first detected wins).
CLOUDS: tuple = (cloud_gce, cloud_aws, cloud_azure)


def cloud(name: Optional[str]) -> Optional[Cloud]:
    """The cloud module named ``name``, or None."""
    for c in CLOUDS:
        if c.NAME == name:
            return c
    return None


class Scheduler(Protocol):
    """What each scheduler module defines."""

    #: ``Environment.scheduler`` when this scheduler is detected.
    NAME: str

    def detected(self) -> bool:
        """Whether this process runs under it (environment variables only)."""

    def extra_signals(self) -> tuple:
        """Signals besides SIGTERM that count as a notice when the user named none."""

    def start(self, env: Any) -> None:
        """Once, when detected: start whatever reads the job's limits off the training
        thread."""

    def signal_deadline(self, env: Any, unix_now: float) -> Optional[float]:
        """When a signalled machine goes away (Unix time), or None. Never raises."""

    def attach(self, handler: Any, config: Any) -> None:
        """Handler construction, detected or not: check this scheduler's options and
        variables (an error at construction), keep what ``after_save`` needs."""

    def after_save(self, handler: Any) -> None:
        """After the final checkpoint, before ``exit_fn``. Never raises."""

    def resume_fields(self) -> dict:
        """What a ``resumed`` preemption record says about the job."""


#: Every scheduler, in detection order (the first detected wins).
SCHEDULERS: tuple = (slurm, kubernetes)


def detect() -> Optional[str]:
    """The name of the scheduler this process runs under, or None."""
    for scheduler in SCHEDULERS:
        if scheduler.detected():
            return scheduler.NAME
    return None


def _active(env: Any) -> Optional[Scheduler]:
    for scheduler in SCHEDULERS:
        if scheduler.NAME == env.scheduler:
            return scheduler
    return None


def start(env: Any) -> None:
    scheduler = _active(env)
    if scheduler is not None:
        scheduler.start(env)


def notice_signals(env: Any) -> tuple:
    """The signals that count as a notice when the user named none."""
    scheduler = _active(env)
    return (signal.SIGTERM, *(() if scheduler is None else scheduler.extra_signals()))


def signal_deadline(env: Any, unix_now: float) -> Optional[float]:
    scheduler = _active(env)
    return None if scheduler is None else scheduler.signal_deadline(env, unix_now)


def attach(handler: Any, config: Any) -> None:
    for scheduler in SCHEDULERS:
        scheduler.attach(handler, config)


def after_save(handler: Any) -> None:
    scheduler = _active(handler._environment)
    if scheduler is not None:
        scheduler.after_save(handler)


def resume_fields(env: Any) -> dict:
    scheduler = _active(env)
    return {} if scheduler is None else scheduler.resume_fields()
