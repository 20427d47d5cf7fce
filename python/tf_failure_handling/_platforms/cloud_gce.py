"""Google Compute Engine (and Cloud TPU VMs): detection and defaults, as TensorFlow
(its notices: ``src/sources/gce.rs``; the page: docs/getting-started/clouds.md), and
TF's ``termination_watcher`` for users who pass it.
"""

from __future__ import annotations

import logging
import os
import threading
import urllib.error
import urllib.request
from typing import Any, Optional

from .._native import GCE_EXIT_CODE as EXIT_CODE
from .._native import GCE_GPU_GRACE_PERIOD as GPU_GRACE_PERIOD  # noqa: F401 - re-exported
from .._native import cloud_defaults
from . import common

log = logging.getLogger("tf_failure_handling")

#: ``host[:port]`` of the metadata server (TF's variable).
METADATA_ENV = "GCE_METADATA_IP"
DEFAULT_BASE = "http://metadata.google.internal"
HEADER = {"Metadata-Flavor": "Google"}
# EXIT_CODE (what GCE's restart tooling recognises, TF's ``gce_exit_fn``'s) and
# GPU_GRACE_PERIOD are the core's (src/sources/clouds.rs's table).

exit_fn = common.exit_for(EXIT_CODE)


def configured_base() -> Optional[str]:
    """``http://`` + ``GCE_METADATA_IP`` (``host[:port]``), or None when unset.

    Raises:
      ValueError: ``GCE_METADATA_IP`` is not ``host[:port]``.
    """
    raw = common.env(METADATA_ENV)
    if raw is None:
        return None
    problem = common.base_url_problem("http://" + raw)
    if problem:
        raise common.bad(METADATA_ENV, os.environ[METADATA_ENV], f"host[:port] ({problem})")
    return "http://" + raw.rstrip("/")


def base() -> str:
    """The metadata server asked now: ``$GCE_METADATA_IP``, else GCE's own."""
    return configured_base() or DEFAULT_BASE


def on_gce(at: Optional[str] = None) -> bool:
    """GCE's one detection, always made, as TF's: the native probe (``gce::probe``:
    the metadata server at ``at``, else :func:`base`, answers ``instance/hostname``
    with the metadata header). Any failure means no."""
    try:
        at = at or base()
    except ValueError as e:  # a bad GCE_METADATA_IP: settings() names it
        log.debug("not on GCE: %s", e)
        return False
    return common.probe(Gce.NAME, at)


class Gce(common.Platform):
    NAME = "gce"
    KIND = "cloud"

    def check(self) -> Optional[str]:
        return configured_base()

    def detect(self, checked: Optional[str]) -> bool:
        return on_gce(checked or DEFAULT_BASE)

    def metadata_base(self, checked: Optional[str]) -> str:
        return checked or DEFAULT_BASE

    def defaults(self, env: Any) -> dict:
        code, grace = cloud_defaults(self.NAME, env.device.name.endswith("GPU"))
        return {"exit_fn": common.exit_for(code), "grace_period": grace}


PLATFORM = Gce()


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


def request_metadata(path: str, timeout: Optional[float] = None, at: Optional[str] = None) -> str:
    """GET ``computeMetadata/v1/<path>`` with the metadata header, bounded by ``timeout``
    (default ``common.METADATA_TIMEOUT``, read now).

    ``at`` defaults to :func:`base` (``GCE_METADATA_IP`` read now).
    """
    url = f"{at or base()}/computeMetadata/v1/{path}"
    if timeout is None:
        timeout = common.METADATA_TIMEOUT

    def fetch() -> str:
        req = urllib.request.Request(url, headers=HEADER)
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


def termination_watcher() -> bool:
    """True when GCE announces host maintenance that terminates this VM (TF's watcher).

    A failed or malformed answer is "no notice", never an exception. Not a default
    (``_native.MetadataWatch`` long-polls GCE); kept for users who pass it. Like TF's,
    reads ``GCE_METADATA_IP`` on every poll.
    """
    try:
        return request_metadata("instance/maintenance-event") == "TERMINATE_ON_HOST_MAINTENANCE"
    except Exception as e:  # noqa: BLE001 - a flaky metadata server must not kill training
        log.debug("GCE maintenance-event poll failed: %s", e)
        return False
