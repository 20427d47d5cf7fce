"""Where this process runs, and the defaults each platform gets: one dispatch over
:data:`PLATFORMS`, each behind ``common.Platform`` (the clouds one class, from the
core's table: ``clouds``).

:func:`environment` answers once per process: the cloud and its metadata service, the
scheduler, and TF's platform device (``GCE_*`` on GCE, else ``INTERNAL_*``; GPU or TPU
from TF's logical devices, asked only if TensorFlow is already imported). Every
variable is read and checked first (:func:`settings`): a bad value is a ValueError
naming the variable and its value, at handler or watcher construction, never in the
notice thread. The variables, the detection order and the defaults per platform are
in docs/how-it-works.md ("Where notices come from").
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import logging
import os
import signal
import sys
from typing import Any, Callable, Mapping, Optional, Sequence

from . import clouds, common, kubernetes, slurm, tf_hooks

log = logging.getLogger("tf_failure_handling")

#: Every platform; of each kind, the first detected wins (GCE first, as TF).
PLATFORMS: tuple = (*clouds.CLOUDS, slurm.PLATFORM, kubernetes.PLATFORM)
#: Forces the cloud: ``gce``, ``aws``, ``azure`` or ``none`` (no probe at all).
CLOUD_ENV = "TF_FAILURE_HANDLING_CLOUD"
#: The code a released PS or worker task exits with (TF's restart code).
DEFAULT_EXIT_CODE = common.DEFAULT_EXIT_CODE
#: Every cloud's name, in detection order.
CLOUDS = tuple(c.NAME for c in clouds.CLOUDS)


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
    """Where this process runs (:func:`environment`)."""

    #: TF's platform device: ``GCE_*`` when ``cloud == "gce"``, else ``INTERNAL_*``.
    device: PlatformDevice
    #: ``"gce"``, ``"aws"``, ``"azure"``, or None off-cloud.
    cloud: Optional[str]
    #: ``"http://host[:port]"`` of the cloud's metadata service; None off-cloud.
    metadata_base: Optional[str]
    #: ``"slurm"``, ``"kubernetes"`` or None.
    scheduler: Optional[str]
    #: Each platform's name -> its variables as its ``check()`` read them.
    settings: Mapping[str, Any] = dataclasses.field(default_factory=dict, hash=False)


@dataclasses.dataclass(frozen=True)
class Settings:
    """Every environment variable this module reads, parsed and checked (:func:`settings`)."""

    #: ``TF_FAILURE_HANDLING_CLOUD``: a cloud's name, ``"none"``, or None (unset: detect).
    forced_cloud: Optional[str]
    #: Each platform's name -> its ``check()``.
    checked: Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class Defaults:
    """A termination config with every unset field filled in (:func:`complete`)."""

    #: The user's ``termination_watcher_fn`` (metadata services are watched natively),
    #: or TensorFlow's GCE one when a replaced ``detect_platform`` says GCE (``tf_hooks``).
    watcher_fn: Optional[Callable[[], bool]]
    exit_fn: Callable[[], Any]
    grace_period: float
    #: Signals that count as a termination notice.
    signals: tuple[int, ...]
    #: The device a replaced ``detect_platform`` of TensorFlow's named; None otherwise.
    device: Optional[PlatformDevice] = None


def settings() -> Settings:
    """Reads and checks every environment variable the platforms use (not cached).

    Raises:
      ValueError: a variable holds something it cannot mean; the message names the
        variable and its value.
    """
    forced = common.env(CLOUD_ENV)
    if forced is not None:
        forced = forced.lower()
        if forced not in (*CLOUDS, "none"):
            raise common.bad(CLOUD_ENV, os.environ[CLOUD_ENV], f"one of {', '.join(CLOUDS)}, none")
    return Settings(forced, {p.NAME: p.check() for p in PLATFORMS})


#: The code an ``exit_fn`` exits with, when it is one of the defaults; else None.
exit_code = common.exit_code


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


def _detected(kind: str, s: Settings) -> Optional[common.Platform]:
    """The first platform of ``kind`` detected; ``TF_FAILURE_HANDLING_CLOUD`` names the
    cloud without any probe."""
    for p in PLATFORMS:
        if p.KIND != kind:
            continue
        if kind == "cloud" and s.forced_cloud is not None:
            if s.forced_cloud == p.NAME:
                return p
        elif p.detect(s.checked[p.NAME]):
            return p
    return None


@functools.lru_cache(maxsize=1)
def environment() -> Environment:
    """Where this process runs (computed once; ``environment.cache_clear()`` to redo).

    Raises:
      ValueError: a variable holds something it cannot mean, named with its value.
    """
    s = settings()
    cloud, scheduler = _detected("cloud", s), _detected("scheduler", s)
    env = Environment(
        device=_device(cloud is not None and cloud.NAME == "gce"),
        cloud=None if cloud is None else cloud.NAME,
        metadata_base=None if cloud is None else cloud.metadata_base(s.checked[cloud.NAME]),
        scheduler=None if scheduler is None else scheduler.NAME,
        settings=s.checked,
    )
    for p in _active(env):
        p.start(env)  # SLURM: the job's limits, read once off this thread
    log.debug("environment %s", env)
    return env


@functools.lru_cache(maxsize=1)
def detect() -> PlatformDevice:
    """TF's platform device of this process: ``environment().device`` (cached too)."""
    return environment().device


def _active(env: Environment) -> list:
    """The platforms ``env`` names: its cloud, then its scheduler."""
    return [p for p in PLATFORMS if p.NAME in (env.cloud, env.scheduler)]


def complete(
    env: Environment,
    watcher_fn: Optional[Callable[[], bool]],
    exit_fn: Optional[Callable[[], Any]],
    grace_period: Optional[float],
    signals: Optional[Sequence[int]],
) -> Defaults:
    """Fills what the user left unset (None) with the platforms' defaults.

    A user's value always wins, a grace period of 0 included. As TF's
    ``_complete_config_for_environment`` for Borg and GCE GPU, except that GCE CPU
    and TPU get GCE's exit code instead of being rejected, AWS and Azure get their
    notices' lead times as grace period, and under SLURM SIGUSR1 (what
    ``--signal`` usually sends) counts as a notice besides SIGTERM. A replaced
    ``detect_platform`` of TensorFlow's that says GCE brings TensorFlow's GCE watcher fn
    and GCE's defaults (``tf_hooks``).
    """
    found: dict = {"exit_fn": common.default_exit_fn, "grace_period": 0, "signals": ()}
    for p in _active(env):
        found.update(p.defaults(env))
    device = None
    hooked = tf_hooks.gce_watcher()
    if hooked is not None:
        # A test acting out GCE through TensorFlow's hooks: TensorFlow's GCE defaults.
        name, tf_watcher = hooked
        device = PlatformDevice[name]
        found.update(clouds.GCE.defaults(dataclasses.replace(env, device=device)))
        watcher_fn = tf_watcher if watcher_fn is None else watcher_fn
    chosen = (signal.SIGTERM, *found["signals"]) if signals is None else signals
    return Defaults(
        watcher_fn=watcher_fn,
        exit_fn=found["exit_fn"] if exit_fn is None else exit_fn,
        grace_period=found["grace_period"] if grace_period is None else grace_period,
        signals=tuple(dict.fromkeys(int(s) for s in chosen)),
        device=device,
    )


def signal_deadlines(env: Environment, unix_now: float) -> tuple:
    """``(deadline, kill)`` of a signal, Unix times, where its scheduler says: when the
    machine goes away (the saves are planned against it), and when the platform ends
    this process, only if it stated that (the exit guard waits for it alone); None
    for each it does not say. Called in the driver thread when a signal arrives;
    never raises."""
    for p in _active(env):
        deadline, kill = p.deadlines(env, unix_now)
        if deadline is not None or kill is not None:
            return deadline, kill
    return None, None


def attach(env: Environment, config: Any) -> dict:
    """Handler construction: every platform checks its options; what each returns, by
    name, is the ``options`` of :func:`after_save`."""
    return {p.NAME: p.attach(env, config) for p in PLATFORMS}


def after_save(env: Environment, options: Mapping[str, Any], recorder: Any) -> Optional[float]:
    """After the final checkpoint, before ``exit_fn``: each platform's step (SLURM: the
    job back in the queue). ``recorder``: the handler's ``records.Recorder``. Returns
    the seconds from now until a platform ends this process, when its step stated
    that (a SLURM requeue), else None."""
    ends = [p.after_save(env, options.get(p.NAME), recorder) for p in _active(env)]
    return next((end for end in ends if end is not None), None)


def resume_fields(env: Environment) -> dict:
    """What a ``resumed`` preemption record says about the platforms."""
    fields: dict = {}
    for p in _active(env):
        fields.update(p.resume_fields(env))
    return fields
