"""Where this process runs, and the defaults each platform gets.

:func:`environment` answers, once per process (cached):

* **cloud** — ``"gce"``, ``"aws"``, ``"azure"`` or None, tried in that order, first
  hit wins:

  - ``TF_FAILURE_HANDLING_CLOUD`` = ``gce`` | ``aws`` | ``azure`` | ``none`` forces
    the answer without any probe (anything else is a ValueError).
  - GCE as TensorFlow detects it: the metadata server answers
    ``instance/hostname`` (:func:`on_gce`, the native probe) at ``http://$GCE_METADATA_IP``, else
    ``http://metadata.google.internal``. Always probed, as TF does; off GCE the name
    does not resolve, which usually fails in milliseconds (bounded by
    :data:`METADATA_TIMEOUT` even when name resolution hangs).
  - AWS: IMDS (``_native.probe_metadata("aws", …)``) at
    ``TF_FAILURE_HANDLING_AWS_METADATA_URL``, else ``http://169.254.169.254`` —
    probed only when that variable is set or the DMI tables say EC2
    (``/sys/class/dmi/id/{sys,bios,board}_vendor`` name Amazon, or ``product_name`` /
    ``bios_version`` contain "amazon", or ``/sys/hypervisor/uuid`` starts with "ec2").
  - Azure: IMDS (``_native.probe_metadata("azure", …)``) at
    ``TF_FAILURE_HANDLING_AZURE_METADATA_URL``, else ``http://169.254.169.254`` —
    probed only when that variable is set or DMI says Azure (``chassis_asset_tag``
    is Azure's, or a Microsoft "Virtual Machine").

  A probe that fails in any way means "not that cloud". Every probe is bounded by
  :data:`METADATA_TIMEOUT`; off-cloud, with no variables set, detection reads a few
  small sysfs files and costs milliseconds (the GCE name lookup aside).
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
which died with it), except :func:`gce_termination_watcher`, which, like TF's,
reads ``GCE_METADATA_IP`` on every poll and treats any failure as "no notice".

Unlike TensorFlow, every metadata request has a short timeout (TF's GCE watcher
has none), the answer is computed once per process, GCE CPU and TPU VMs are
supported rather than rejected, and AWS and Azure are known.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import ipaddress
import logging
import math
import os
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Callable, Optional, Sequence

from . import registry

log = logging.getLogger("tf_failure_handling")

GCE_METADATA_ENV = "GCE_METADATA_IP"
GCE_HEADER = {"Metadata-Flavor": "Google"}
#: Exit code GCE's restart tooling recognises (TF's ``gce_exit_fn``).
GCE_EXIT_CODE = 143
#: TF's default grace period on GCE GPU VMs, in seconds.
GCE_GPU_GRACE_PERIOD = 3600
#: The exit code Borg and TF's default ``exit_fn`` use.
DEFAULT_EXIT_CODE = 42
#: Seconds a metadata request (or probe) may take, DNS included.
METADATA_TIMEOUT = 1.0

#: Forces the cloud: ``gce``, ``aws``, ``azure`` or ``none`` (no probe at all).
CLOUD_ENV = "TF_FAILURE_HANDLING_CLOUD"
#: Base URL of the AWS instance metadata service (tests, proxies).
AWS_METADATA_ENV = "TF_FAILURE_HANDLING_AWS_METADATA_URL"
#: Base URL of the Azure instance metadata service (tests, proxies).
AZURE_METADATA_ENV = "TF_FAILURE_HANDLING_AZURE_METADATA_URL"
#: Seconds Kubernetes leaves between SIGTERM and SIGKILL for this pod.
KUBERNETES_GRACE_ENV = "TF_FAILURE_HANDLING_KUBERNETES_GRACE_PERIOD"
#: Kubernetes' default ``terminationGracePeriodSeconds``.
KUBERNETES_DEFAULT_GRACE_PERIOD = 30.0
#: Set by SLURM >= 23.02: the job's end time, in Unix seconds.
SLURM_END_TIME_ENV = "SLURM_JOB_END_TIME"

#: Where AWS and Azure serve instance metadata (link-local, no DNS).
AWS_DEFAULT_METADATA_BASE = "http://169.254.169.254"
AZURE_DEFAULT_METADATA_BASE = "http://169.254.169.254"
#: The DMI tables the kernel exposes (world-readable files of one line each).
DMI_DIR = "/sys/class/dmi/id"
#: Xen guests on EC2 (older instance types) have a uuid starting with "ec2" here.
HYPERVISOR_UUID = "/sys/hypervisor/uuid"
#: Azure's ``chassis_asset_tag`` (Microsoft's documented way to tell Azure VMs).
AZURE_ASSET_TAG = "7783-7084-3265-9085-8269-3286-77"

#: Default grace periods in seconds: AWS Spot gives two minutes' notice (the
#: notice's own deadline caps the countdown); Azure Spot's Preempt event 30 s.
AWS_GRACE_PERIOD = 120
AZURE_GRACE_PERIOD = 30

CLOUDS = ("gce", "aws", "azure")


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
    #: ``http://`` + ``GCE_METADATA_IP``, else GCE's metadata server.
    gce_base: str
    #: ``TF_FAILURE_HANDLING_AWS_METADATA_URL`` as ``http://host[:port]``, or None.
    aws_base: Optional[str]
    #: ``TF_FAILURE_HANDLING_AZURE_METADATA_URL`` as ``http://host[:port]``, or None.
    azure_base: Optional[str]
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

#: A host name's bytes, as the native client accepts them (``http::BaseUrl``).
_HOST_NAME_BYTES = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._")


def _bad(name: str, raw: str, expected: str) -> ValueError:
    return ValueError(f"{name}={raw!r}: expected {expected}")


def _env(name: str) -> Optional[str]:
    """The variable's value, stripped; None when unset or blank."""
    value = os.environ.get(name, "").strip()
    return value or None


def _base_url_problem(url: str) -> Optional[str]:
    """Why ``url`` is not ``http://host[:port]`` (one trailing slash allowed), or None.

    The same rules as the native client's ``BaseUrl::parse`` (``src/sources/http.rs``), which
    checks again when the metadata watch starts; here the error can name the variable.
    """
    if url[:7].lower() != "http://":
        return "the scheme must be http://"
    rest = url[7:-1] if url.endswith("/") else url[7:]
    if any(c in rest for c in "/?#@"):
        return "no path, query, fragment or user info is allowed"
    if rest.startswith("["):
        host, bracket, port = rest[1:].partition("]")
        if not bracket:
            return "unclosed ["
        if not _is_ip(host, ipaddress.IPv6Address):
            return "invalid IPv6 literal"
    else:
        host, colon, port = rest.partition(":")
        port = colon + port
        name = 0 < len(host) <= 253 and set(host.encode()) <= _HOST_NAME_BYTES
        if not (name or _is_ip(host, ipaddress.IPv4Address)):
            return "invalid host"
    if port and not port.startswith(":"):
        return "unexpected text after the host"
    digits = port[1:]
    if port and not (digits.isascii() and digits.isdigit() and len(digits) <= 5):
        return "invalid port"
    if port and not 0 < int(digits) < 65536:
        return "invalid port"
    return None


def _is_ip(text: str, kind: Callable[[str], Any]) -> bool:
    try:
        kind(text)
    except ValueError:
        return False
    return True


def _metadata_url(name: str) -> Optional[str]:
    """The variable as ``http://host[:port]`` (``http://`` added if no scheme), or None."""
    raw = _env(name)
    if raw is None:
        return None
    url = raw if "://" in raw else "http://" + raw
    problem = _base_url_problem(url)
    if problem:
        raise _bad(name, os.environ[name], f"[http://]host[:port] ({problem})")
    return url.rstrip("/")


def _gce_base() -> str:
    """``http://`` + ``GCE_METADATA_IP`` (``host[:port]``), else GCE's metadata server.

    Raises:
      ValueError: ``GCE_METADATA_IP`` is not ``host[:port]``.
    """
    raw = _env(GCE_METADATA_ENV)
    if raw is None:
        return "http://metadata.google.internal"
    problem = _base_url_problem("http://" + raw)
    if problem:
        raise _bad(GCE_METADATA_ENV, os.environ[GCE_METADATA_ENV], f"host[:port] ({problem})")
    return "http://" + raw.rstrip("/")


def _seconds(name: str, minimum: Optional[float] = None) -> Optional[float]:
    """The variable as a finite number (at least ``minimum``); None when unset or blank."""
    raw = _env(name)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or (minimum is not None and value < minimum):
        at_least = "" if minimum is None else f" >= {minimum:g}"
        raise _bad(name, os.environ[name], f"a finite number of seconds{at_least}")
    return value


def settings() -> Settings:
    """Reads and checks every environment variable this module uses (not cached).

    Raises:
      ValueError: a variable holds something it cannot mean; the message names the
        variable and its value (see the module docstring for what each accepts).
    """
    forced = _env(CLOUD_ENV)
    if forced is not None:
        forced = forced.lower()
        if forced not in (*CLOUDS, "none"):
            raise _bad(CLOUD_ENV, os.environ[CLOUD_ENV], "one of gce, aws, azure, none")
    scheduler = registry.detect()
    grace = _seconds(KUBERNETES_GRACE_ENV, minimum=0.0)
    return Settings(
        forced_cloud=forced,
        gce_base=_gce_base(),
        aws_base=_metadata_url(AWS_METADATA_ENV),
        azure_base=_metadata_url(AZURE_METADATA_ENV),
        scheduler=scheduler,
        slurm_end_time=_seconds(SLURM_END_TIME_ENV),
        kubernetes_grace_period=KUBERNETES_DEFAULT_GRACE_PERIOD if grace is None else grace,
    )


# ------------------------------------------------------------------ GCE (as TF)


def _bounded(fn, timeout: float, what: str):
    """Runs ``fn`` in a daemon thread and gives up after ``timeout`` seconds.

    ``urllib``'s timeout does not cover name resolution; this does.
    """
    box: list = []

    def target() -> None:
        try:
            box.append((True, fn()))
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            box.append((False, e))

    t = threading.Thread(target=target, name=f"tfh-{what}", daemon=True)
    t.start()
    t.join(timeout)
    if not box:
        raise TimeoutError(f"{what} did not answer within {timeout:g} s")
    ok, value = box[0]
    if not ok:
        raise value
    return value


def request_gce_metadata(
    path: str, timeout: float = METADATA_TIMEOUT, base: Optional[str] = None
) -> str:
    """GET ``computeMetadata/v1/<path>`` with the metadata header, bounded by ``timeout``.

    ``base`` defaults to ``http://$GCE_METADATA_IP`` (read now), else GCE's server.
    """
    url = f"{base or _gce_base()}/computeMetadata/v1/{path}"

    def fetch() -> str:
        req = urllib.request.Request(url, headers=GCE_HEADER)
        try:
            resp = urllib.request.urlopen(req, timeout=timeout)
        except urllib.error.HTTPError as e:
            e.close()  # an HTTPError holds the connection open until closed
            raise
        with resp:
            if resp.status != 200:
                raise ValueError(f"{url} answered HTTP {resp.status}")
            return resp.read(1 << 16).decode("utf-8", "replace")

    return _bounded(fetch, timeout, "GCE metadata request")


def on_gce(base: Optional[str] = None) -> bool:
    """True when the GCE metadata server (at ``base``, else ``$GCE_METADATA_IP`` or GCE's
    own) answers ``instance/hostname`` with the metadata header, as TF detects GCE.

    The native probe asks (``_native.probe_metadata("gce", …)``, ``src/sources/gce.rs``),
    as for AWS and Azure: one detection per platform. Any failure means no.
    """
    try:
        base = base or _gce_base()
    except ValueError as e:  # a bad GCE_METADATA_IP: settings() names it
        log.debug("not on GCE: %s", e)
        return False
    return _probe("gce", base)


def gce_termination_watcher() -> bool:
    """True when GCE announces host maintenance that terminates this VM (TF's watcher).

    A failed or malformed answer is "no notice", never an exception. Not a default
    any more (``_native.MetadataWatch`` long-polls GCE); kept for users who pass it.
    """
    try:
        return request_gce_metadata("instance/maintenance-event") == "TERMINATE_ON_HOST_MAINTENANCE"
    except Exception as e:  # noqa: BLE001 - a flaky metadata server must not kill training
        log.debug("GCE maintenance-event poll failed: %s", e)
        return False


def gce_exit_fn() -> None:
    sys.exit(GCE_EXIT_CODE)


def default_exit_fn() -> None:
    sys.exit(DEFAULT_EXIT_CODE)


def exit_code(exit_fn: Any) -> Optional[int]:
    """The code ``exit_fn`` exits with, when it is one of the defaults; else None."""
    if exit_fn is default_exit_fn:
        return DEFAULT_EXIT_CODE
    if exit_fn is gce_exit_fn:
        return GCE_EXIT_CODE
    return None


# ------------------------------------------------------------------ AWS, Azure


def _read_line(path: str) -> Optional[str]:
    """The stripped first line of a small sysfs file; None if it cannot be read."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.readline(4096).strip()
    except OSError:
        return None


def _dmi(name: str) -> str:
    return _read_line(os.path.join(DMI_DIR, name)) or ""


def dmi_says_aws() -> bool:
    """True when the DMI tables (or Xen's hypervisor uuid) name Amazon EC2."""
    for name in ("sys_vendor", "bios_vendor", "board_vendor", "product_name", "bios_version"):
        if "amazon" in _dmi(name).lower():
            return True
    return (_read_line(HYPERVISOR_UUID) or "").lower().startswith("ec2")


def dmi_says_azure() -> bool:
    """True when the DMI tables describe an Azure VM."""
    if _dmi("chassis_asset_tag") == AZURE_ASSET_TAG:
        return True
    return _dmi("sys_vendor") == "Microsoft Corporation" and _dmi("product_name") == (
        "Virtual Machine"
    )


def _probe(cloud: str, base: str) -> bool:
    """``_native.probe_metadata``, with any failure meaning "not that cloud"."""
    try:
        from .._native import probe_metadata

        return bool(probe_metadata(cloud, base, METADATA_TIMEOUT))
    except Exception as e:  # noqa: BLE001 - off that cloud anything can come back
        log.debug("not on %s (%s): %s", cloud, base, e)
        return False


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
    aws_base = s.aws_base or AWS_DEFAULT_METADATA_BASE
    azure_base = s.azure_base or AZURE_DEFAULT_METADATA_BASE
    if s.forced_cloud is not None:
        bases = {"gce": s.gce_base, "aws": aws_base, "azure": azure_base, "none": None}
        return (None if s.forced_cloud == "none" else s.forced_cloud), bases[s.forced_cloud]
    if on_gce(s.gce_base):
        return "gce", s.gce_base
    if (s.aws_base is not None or dmi_says_aws()) and _probe("aws", aws_base):
        return "aws", aws_base
    if (s.azure_base is not None or dmi_says_azure()) and _probe("azure", azure_base):
        return "azure", azure_base
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


def _default_grace_period(env: Environment) -> float:
    if env.cloud == "gce":
        return GCE_GPU_GRACE_PERIOD if env.device is PlatformDevice.GCE_GPU else 0
    if env.cloud == "aws":
        return AWS_GRACE_PERIOD
    if env.cloud == "azure":
        return AZURE_GRACE_PERIOD
    return 0


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
    if exit_fn is None:
        exit_fn = gce_exit_fn if env.cloud == "gce" else default_exit_fn
    if grace_period is None:
        grace_period = _default_grace_period(env)
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
