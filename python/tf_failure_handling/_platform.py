"""Platform detection and the defaults each platform gets.

As TensorFlow: a machine is on Google Compute Engine when its metadata server
answers ``instance/hostname``; GPUs or TPUs come from TF's logical devices.
Unlike TensorFlow every metadata request has a short timeout (TF's GCE watcher
has none), the answer is computed once per process, and GCE CPU and TPU VMs are
supported rather than rejected.
"""

from __future__ import annotations

import enum
import functools
import logging
import os
import sys
import threading
import urllib.error
import urllib.request
from typing import Optional

log = logging.getLogger("tf_failure_handling")

GCE_METADATA_ENV = "GCE_METADATA_IP"
GCE_HEADER = {"Metadata-Flavor": "Google"}
#: Exit code GCE's restart tooling recognises (TF's ``gce_exit_fn``).
GCE_EXIT_CODE = 143
#: TF's default grace period on GCE GPU VMs, in seconds.
GCE_GPU_GRACE_PERIOD = 3600
#: The exit code Borg and TF's default ``exit_fn`` use.
DEFAULT_EXIT_CODE = 42
#: Seconds a metadata request may take, DNS included.
METADATA_TIMEOUT = 1.0


class PlatformDevice(enum.Enum):
    """Same members and values as TF's ``failure_handling_util.PlatformDevice``."""

    INTERNAL_CPU = "internal_CPU"
    INTERNAL_GPU = "internal_GPU"
    INTERNAL_TPU = "internal_TPU"
    GCE_GPU = "GCE_GPU"
    GCE_TPU = "GCE_TPU"
    GCE_CPU = "GCE_CPU"
    UNSUPPORTED = "unsupported"


def _gce_base() -> str:
    return "http://" + os.environ.get(GCE_METADATA_ENV, "metadata.google.internal")


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


def request_gce_metadata(path: str, timeout: float = METADATA_TIMEOUT) -> str:
    """GET ``computeMetadata/v1/<path>`` with the metadata header, bounded by ``timeout``."""
    url = f"{_gce_base()}/computeMetadata/v1/{path}"

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


def on_gce() -> bool:
    """True when the GCE metadata server answers 200 (any failure means no)."""
    try:
        request_gce_metadata("instance/hostname")
    except Exception as e:  # noqa: BLE001 - off GCE anything can come back
        log.debug("not on GCE: %s", e)
        return False
    return True


def gce_termination_watcher() -> bool:
    """True when GCE announces host maintenance that terminates this VM (TF's watcher).

    A failed or malformed answer is "no notice", never an exception.
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


def _devices(kind: str) -> bool:
    # A process that has not imported TensorFlow has no TF devices in use; do
    # not pay TF's import (seconds) to learn that.
    if "tensorflow" not in sys.modules:
        return False
    from tensorflow.python.eager import context

    return bool(context.context().list_logical_devices(kind))


@functools.lru_cache(maxsize=1)
def detect() -> PlatformDevice:
    """The platform of this process (computed once)."""
    gce = on_gce()
    if _devices("GPU"):
        return PlatformDevice.GCE_GPU if gce else PlatformDevice.INTERNAL_GPU
    if _devices("TPU"):
        return PlatformDevice.GCE_TPU if gce else PlatformDevice.INTERNAL_TPU
    return PlatformDevice.GCE_CPU if gce else PlatformDevice.INTERNAL_CPU


def complete(platform: PlatformDevice, watcher_fn, exit_fn, grace_period: Optional[float]):
    """Fills what the user left unset with the platform's defaults.

    Returns ``(watcher_fn, exit_fn, grace_period)`` as TF's
    ``_complete_config_for_environment`` would, except that GCE CPU and TPU get
    the GCE watcher and exit code instead of being rejected.
    """
    if platform is PlatformDevice.GCE_GPU:
        return (
            watcher_fn or gce_termination_watcher,
            exit_fn or gce_exit_fn,
            GCE_GPU_GRACE_PERIOD if grace_period is None else grace_period,
        )
    if platform in (PlatformDevice.GCE_CPU, PlatformDevice.GCE_TPU):
        return (watcher_fn or gce_termination_watcher, exit_fn or gce_exit_fn, grace_period or 0)
    return (watcher_fn, exit_fn or default_exit_fn, grace_period or 0)
