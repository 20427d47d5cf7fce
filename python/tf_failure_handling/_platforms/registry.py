"""The schedulers a job can run under, behind one interface.

Each scheduler is a module of this package with the same names (:class:`Scheduler`
lists them); :data:`SCHEDULERS` holds them in detection order, and the functions
below are the only way the rest of the package reaches them: the handler, the save
and the records know no scheduler by name. A new scheduler is a new module with these
names and one entry in :data:`SCHEDULERS`.

The clouds (GCE, AWS, Azure) are detected and given their defaults by ``platform``;
their notices come from the native metadata watch (``src/sources/``).
"""

from __future__ import annotations

import signal
from typing import Any, Optional, Protocol

from . import kubernetes, slurm


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
