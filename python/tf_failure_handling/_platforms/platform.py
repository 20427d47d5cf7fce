"""Where this process runs, and the defaults each platform gets.

:func:`environment` answers, once per process (cached):

* **cloud** — ``"gce"``, ``"aws"``, ``"azure"`` or None: ``TF_FAILURE_HANDLING_CLOUD`` =
  ``gce`` | ``aws`` | ``azure`` | ``none`` forces the answer without any probe (anything
  else is a ValueError); otherwise each cloud of ``registry.CLOUDS`` is asked in turn
  whether it is detected (one module each: ``gce``, ``aws``, ``azure`` say how), first
  hit wins. A probe that fails in any way means "not that cloud"; every probe is
  bounded by ``common.METADATA_TIMEOUT``, and off-cloud, with no variables set,
  detection reads a few small sysfs files and costs milliseconds (the GCE name lookup
  aside).
* **metadata_base** — the ``http://host[:port]`` of that cloud's metadata service,
  which ``_native.MetadataWatch`` watches for termination notices.
* **scheduler** — ``"slurm"`` (``SLURM_JOB_ID`` set), else ``"kubernetes"``
  (``KUBERNETES_SERVICE_HOST`` set), else None.
* **device** — TF's ``PlatformDevice``: ``GCE_*`` on GCE, else ``INTERNAL_*``; GPU
  or TPU from TF's logical devices, asked only if TensorFlow is already imported.

:func:`complete` fills what a user left unset with the platform's defaults
(exit code and grace period per cloud, SIGUSR1 too under SLURM), and
:func:`signal_deadline` says when a signalled machine goes away, where the
scheduler tells (SLURM: ``SLURM_JOB_END_TIME``, else the job's ``EndTime``, and
``KillWait`` after a SIGTERM, see ``slurm.py``; Kubernetes' grace period,
``TF_FAILURE_HANDLING_KUBERNETES_GRACE_PERIOD``, default 30 s).

Every variable this module reads is read and checked by :func:`settings`, which
:func:`environment` calls first, so at handler or watcher construction:

===============================================  ================================================
variable                                         accepted (blank or unset: the default)
===============================================  ================================================
``TF_FAILURE_HANDLING_CLOUD``                    ``gce``, ``aws``, ``azure``, ``none`` (any case)
``GCE_METADATA_IP``                              ``host[:port][/]``
``TF_FAILURE_HANDLING_AWS_METADATA_URL``         ``[http://]host[:port][/]``
``TF_FAILURE_HANDLING_AZURE_METADATA_URL``       ``[http://]host[:port][/]``
``TF_FAILURE_HANDLING_KUBERNETES_GRACE_PERIOD``  seconds, a finite number >= 0
``SLURM_JOB_END_TIME``                           Unix seconds, a finite number
``SLURM_JOB_ID``, ``KUBERNETES_SERVICE_HOST``    anything (only whether it is set counts)
===============================================  ================================================

Anything else is a ``ValueError`` naming the variable and its value. The parsed
values travel in :class:`Environment`; nothing here reads the environment again
when a notice arrives (a bad value used to surface only then, in the notice thread,
which died with it). Unlike TensorFlow, the answer is computed once per process.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import logging
import os
import sys
import time
from typing import Any, Callable, Optional, Sequence

from . import common, registry

log = logging.getLogger("tf_failure_handling")

#: Forces the cloud: ``gce``, ``aws``, ``azure`` or ``none`` (no probe at all).
CLOUD_ENV = "TF_FAILURE_HANDLING_CLOUD"
#: Seconds Kubernetes leaves between SIGTERM and SIGKILL for this pod.
KUBERNETES_GRACE_ENV = "TF_FAILURE_HANDLING_KUBERNETES_GRACE_PERIOD"
#: Kubernetes' default ``terminationGracePeriodSeconds``.
KUBERNETES_DEFAULT_GRACE_PERIOD = 30.0
#: Set by SLURM >= 23.02: the job's end time, in Unix seconds.
SLURM_END_TIME_ENV = "SLURM_JOB_END_TIME"
#: The code a released PS or worker task exits with (TF's restart code).
DEFAULT_EXIT_CODE = common.DEFAULT_EXIT_CODE
#: Every cloud's name, in detection order.
CLOUDS = tuple(cloud.NAME for cloud in registry.CLOUDS)


class PlatformDevice(enum.Enum):
    """Same members and values as TF's ``failure_handling_util.PlatformDevice``."""

    INTERNAL_CPU = "internal_CPU"
    INTERNAL_GPU = "internal_GPU"
    INTERNAL_TPU = "internal_TPU"
    GCE_GPU = "GCE_GPU"
    GCE_TPU = "GCE_TPU"
    GCE_CPU = "GCE_CPU"
    UNSUPPORTED = "unsupported"


@dataclasses.dataclass(frozen=True)
class Environment:
    """Where this process runs (see the module docstring for how each field is found)."""

    #: TF's platform device: ``GCE_*`` when ``cloud == "gce"``, else ``INTERNAL_*``.
    device: PlatformDevice
    #: ``"gce"``, ``"aws"``, ``"azure"``, or None off-cloud.
    cloud: Optional[str]
    #: ``"http://host[:port]"`` of the cloud's metadata service; None off-cloud.
    metadata_base: Optional[str]
    #: ``"slurm"``, ``"kubernetes"`` or None.
    scheduler: Optional[str]
    #: ``SLURM_JOB_END_TIME`` (Unix seconds), if set.
    slurm_end_time: Optional[float] = None
    #: ``TF_FAILURE_HANDLING_KUBERNETES_GRACE_PERIOD`` in seconds, else Kubernetes' default.
    kubernetes_grace_period: float = KUBERNETES_DEFAULT_GRACE_PERIOD


@dataclasses.dataclass(frozen=True)
class Settings:
    """Every environment variable this module reads, parsed and checked (:func:`settings`)."""

    #: ``TF_FAILURE_HANDLING_CLOUD``: ``"gce"``, ``"aws"``, ``"azure"``, ``"none"``, or
    #: None (unset: detect).
    forced_cloud: Optional[str]
    #: Each cloud's name -> its metadata service's base URL as its variable says
    #: (``http://host[:port]``), or None when the variable is unset.
    cloud_bases: dict
    #: ``"slurm"`` (``SLURM_JOB_ID`` set), ``"kubernetes"`` (``KUBERNETES_SERVICE_HOST``
    #: set), or None.
    scheduler: Optional[str]
    #: ``SLURM_JOB_END_TIME``, or None.
    slurm_end_time: Optional[float]
    #: ``TF_FAILURE_HANDLING_KUBERNETES_GRACE_PERIOD``, else 30 s.
    kubernetes_grace_period: float


@dataclasses.dataclass(frozen=True)
class Defaults:
    """A termination config with every unset field filled in (:func:`complete`)."""

    #: The user's ``termination_watcher_fn`` (metadata services are watched natively).
    watcher_fn: Optional[Callable[[], bool]]
    exit_fn: Callable[[], Any]
    grace_period: float
    #: Signals that count as a termination notice.
    signals: tuple[int, ...]


# ------------------------------------------------------------------ settings


def settings() -> Settings:
    """Reads and checks every environment variable this module uses (not cached).

    Raises:
      ValueError: a variable holds something it cannot mean; the message names the
        variable and its value (see the module docstring for what each accepts).
    """
    forced = common.env(CLOUD_ENV)
    if forced is not None:
        forced = forced.lower()
        if forced not in (*CLOUDS, "none"):
            raise common.bad(CLOUD_ENV, os.environ[CLOUD_ENV], "one of gce, aws, azure, none")
    scheduler = registry.detect()
    grace = common.seconds(KUBERNETES_GRACE_ENV, minimum=0.0)
    return Settings(
        forced_cloud=forced,
        cloud_bases={cloud.NAME: cloud.configured_base() for cloud in registry.CLOUDS},
        scheduler=scheduler,
        slurm_end_time=common.seconds(SLURM_END_TIME_ENV),
        kubernetes_grace_period=KUBERNETES_DEFAULT_GRACE_PERIOD if grace is None else grace,
    )


def exit_code(exit_fn: Any) -> Optional[int]:
    """The code ``exit_fn`` exits with, when it is one of the defaults; else None."""
    for cloud in registry.CLOUDS:
        if exit_fn is cloud.exit_fn:
            return cloud.EXIT_CODE
    return common.DEFAULT_EXIT_CODE if exit_fn is common.default_exit_fn else None


# ------------------------------------------------------------------ detection


def _devices(kind: str) -> bool:
    # A process that has not imported TensorFlow has no TF devices in use; do
    # not pay TF's import (seconds) to learn that.
    if "tensorflow" not in sys.modules:
        return False
    from tensorflow.python.eager import context

    return bool(context.context().list_logical_devices(kind))


def _device(gce: bool) -> PlatformDevice:
    if _devices("GPU"):
        return PlatformDevice.GCE_GPU if gce else PlatformDevice.INTERNAL_GPU
    if _devices("TPU"):
        return PlatformDevice.GCE_TPU if gce else PlatformDevice.INTERNAL_TPU
    return PlatformDevice.GCE_CPU if gce else PlatformDevice.INTERNAL_CPU


def _cloud(s: Settings) -> tuple[Optional[str], Optional[str]]:
    """``(cloud, metadata_base)`` by the rules of the module docstring."""
    for cloud in registry.CLOUDS:
        configured = s.cloud_bases[cloud.NAME]
        if s.forced_cloud == cloud.NAME or (s.forced_cloud is None and cloud.detected(configured)):
            return cloud.NAME, configured or cloud.DEFAULT_BASE
    return None, None


@functools.lru_cache(maxsize=1)
def environment() -> Environment:
    """Where this process runs (computed once; ``environment.cache_clear()`` to redo).

    Every environment variable is read and checked first (:func:`settings`), before
    any probe.

    Raises:
      ValueError: a variable holds something it cannot mean, named with its value.
    """
    start = time.monotonic()
    s = settings()
    cloud, base = _cloud(s)
    env = Environment(
        device=_device(cloud == "gce"),
        cloud=cloud,
        metadata_base=base,
        scheduler=s.scheduler,
        slurm_end_time=s.slurm_end_time,
        kubernetes_grace_period=s.kubernetes_grace_period,
    )
    registry.start(env)  # SLURM: the job's limits, read once off this thread
    log.debug("environment %s (detected in %.3f s)", env, time.monotonic() - start)
    return env


@functools.lru_cache(maxsize=1)
def detect() -> PlatformDevice:
    """TF's platform device of this process: ``environment().device`` (cached too)."""
    return environment().device


# ------------------------------------------------------------------ defaults


def complete(
    env: Environment,
    watcher_fn: Optional[Callable[[], bool]],
    exit_fn: Optional[Callable[[], Any]],
    grace_period: Optional[float],
    signals: Optional[Sequence[int]],
) -> Defaults:
    """Fills what the user left unset (None) with the platform's defaults.

    A user's value always wins, a grace period of 0 included. As TF's
    ``_complete_config_for_environment`` for Borg and GCE GPU, except that GCE CPU
    and TPU get GCE's exit code instead of being rejected, AWS and Azure get their
    notices' lead times as grace period, and under SLURM SIGUSR1 (what
    ``--signal`` usually sends) counts as a notice besides SIGTERM.
    """
    cloud = registry.cloud(env.cloud)
    if exit_fn is None:
        exit_fn = common.default_exit_fn if cloud is None else cloud.exit_fn
    if grace_period is None:
        gpu = env.device in (PlatformDevice.GCE_GPU, PlatformDevice.INTERNAL_GPU)
        grace_period = 0 if cloud is None else cloud.grace_period(gpu)
    chosen: Sequence[int] = registry.notice_signals(env) if signals is None else signals
    return Defaults(
        watcher_fn=watcher_fn,
        exit_fn=exit_fn,
        grace_period=grace_period,
        signals=tuple(dict.fromkeys(int(s) for s in chosen)),
    )


def signal_deadline(env: Environment, unix_now: float) -> Optional[float]:
    """When a signalled machine goes away (Unix time), where the scheduler says.

    SLURM (``_slurm.notice_deadline``, which has the table per launch form): a
    SIGUSR1, the job's end (``env.slurm_end_time``, ``SLURM_JOB_END_TIME``, else
    ``EndTime`` as ``scontrol show job`` said, read off this thread); a SIGTERM,
    ``unix_now`` plus ``KillWait``, or for an ``srun`` task being preempted the
    grace time's end (``PreemptTime`` + ``GraceTime``); each only if after
    ``unix_now``. Kubernetes: ``unix_now`` plus ``env.kubernetes_grace_period``
    (``TF_FAILURE_HANDLING_KUBERNETES_GRACE_PERIOD``, default 30 s, Kubernetes'
    default ``terminationGracePeriodSeconds``). Otherwise None.

    Called in the driver thread when a signal arrives, never raises; apart from
    the one bounded SLURM read above it reads only ``env``, whose values
    :func:`environment` checked. The scheduler answers (``registry``).
    """
    return registry.signal_deadline(env, unix_now)


def attach(handler: Any, config: Any) -> None:
    """Handler construction: every scheduler checks its options (``registry``)."""
    registry.attach(handler, config)


def after_save(handler: Any) -> None:
    """After the final checkpoint, before ``exit_fn``: the scheduler's step (SLURM:
    the job back in the queue)."""
    registry.after_save(handler)


def resume_fields(env: Environment) -> dict:
    """What a ``resumed`` preemption record says about the scheduler's job."""
    return registry.resume_fields(env)
