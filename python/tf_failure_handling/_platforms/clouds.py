"""The clouds (GCE and Cloud TPU VMs, Amazon EC2, Azure): one :class:`Cloud` per cloud's
row of the core's table (``_native.platforms``, from ``src/sources/clouds.rs``: the
variable naming its metadata service, its default base, its exit code and grace periods,
its probe; the sysfs lines that name its machines are checked there, with its probe),
and TF's GCE ``termination_watcher`` for users who pass it. Their notices are the core's
too (``_native.MetadataWatch``); the page: docs/getting-started/clouds.md.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Optional

from . import common

log = logging.getLogger("tf_failure_handling")

#: Where the kernel shows the machine (the DMI tables, Xen's hypervisor uuid): the
#: core's sysfs lines for each cloud are below it.
SYSFS = "/sys"


class Cloud(common.Platform):
    """A cloud of the core's table: its variable (or, where its row names them, the
    sysfs lines that name its machines) makes its metadata service probed, and it is
    this cloud when that service answers as this cloud's does. TensorFlow's GCE is
    probed always."""

    KIND = "cloud"

    def __init__(self, row: dict) -> None:
        self.NAME = row["name"]
        #: The variable naming its metadata service.
        self.variable = row["variable"]
        self._host_port = row["host_port"]
        #: Its metadata service when the variable is unset.
        self.default_base = row["default_base"]
        #: Its default ``exit_fn`` (its row's exit code).
        self.exit_fn = common.exit_for(row["exit_code"])
        self._grace_period = row["grace_period"]
        #: Its metadata service's probe (the core's: ``probe(base, timeout=None, *,
        #: terminating=False, sysfs=None)``).
        self.probe = row["probe"]

    def check(self) -> Optional[str]:
        if not self._host_port:
            return common.metadata_url(self.variable)
        # TensorFlow's GCE_METADATA_IP: host[:port], no scheme.
        raw = common.env(self.variable)
        if raw is None:
            return None
        problem = common.base_url_problem("http://" + raw)
        if problem:
            raise common.bad(self.variable, os.environ[self.variable], f"host[:port] ({problem})")
        return "http://" + raw.rstrip("/")

    def detect(self, checked: Optional[str]) -> bool:
        """Its probe; without its variable, only when :data:`SYSFS` names its machines
        (the core's lines; TensorFlow's GCE: always)."""
        sysfs = None if checked is not None else SYSFS
        return common.probe(self.probe, self.NAME, self.metadata_base(checked), sysfs)

    def metadata_base(self, checked: Optional[str]) -> str:
        return checked or self.default_base

    def defaults(self, env: Any) -> dict:
        gpu = env.device.name.endswith("GPU")
        return {"exit_fn": self.exit_fn, "grace_period": self._grace_period[gpu]}


#: Every cloud, in detection order (GCE first, as TF).
CLOUDS: tuple = tuple(Cloud(row) for row in common.TABLE.values() if row["kind"] == "cloud")
GCE, AWS, AZURE = CLOUDS


def gce_base() -> str:
    """GCE's metadata server asked now: ``$GCE_METADATA_IP``, else GCE's own.

    Raises:
      ValueError: ``GCE_METADATA_IP`` is not ``host[:port]``.
    """
    return GCE.metadata_base(GCE.check())


def on_gce() -> bool:
    """GCE's one detection, as TF's, at :func:`gce_base` (a bad ``GCE_METADATA_IP``
    is no: ``settings()`` names it)."""
    try:
        return GCE.detect(GCE.check())
    except ValueError as e:
        log.debug("not on GCE: %s", e)
        return False


def termination_watcher() -> bool:
    """True when GCE announces host maintenance that terminates this VM (TF's watcher).

    A failed or malformed answer is "no notice", never an exception. Not a default
    (``_native.MetadataWatch`` long-polls GCE); kept for users who pass it. Like TF's,
    reads ``GCE_METADATA_IP`` on every poll. The request is the core's, bounded there
    (``sources::gce_terminating``).
    """
    try:
        return bool(GCE.probe(gce_base(), terminating=True))
    except Exception as e:  # noqa: BLE001 - a flaky metadata server must not kill training
        log.debug("GCE maintenance-event poll failed: %s", e)
        return False
