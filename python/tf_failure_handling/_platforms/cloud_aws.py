"""Amazon EC2: detection and defaults (its notices: ``src/sources/aws.rs``; the page:
docs/getting-started/clouds.md)."""

from __future__ import annotations

from typing import Any, Optional

from .._native import AWS_GRACE_PERIOD as GRACE_PERIOD  # noqa: F401 - re-exported
from .._native import cloud_defaults
from . import common

#: Base URL of the AWS instance metadata service (tests, proxies).
METADATA_ENV = "TF_FAILURE_HANDLING_AWS_METADATA_URL"
#: Where AWS serves instance metadata (link-local, no DNS).
DEFAULT_BASE = "http://169.254.169.254"
#: Xen guests on EC2 (older instance types) have a uuid starting with "ec2" here.
HYPERVISOR_UUID = "/sys/hypervisor/uuid"
# GRACE_PERIOD and the exit code are the core's (src/sources/clouds.rs's table).


def dmi_says_aws() -> bool:
    """True when the DMI tables (or Xen's hypervisor uuid) name Amazon EC2."""
    for name in ("sys_vendor", "bios_vendor", "board_vendor", "product_name", "bios_version"):
        if "amazon" in common.dmi(name).lower():
            return True
    return (common.read_line(HYPERVISOR_UUID) or "").lower().startswith("ec2")


class Aws(common.Platform):
    """Detected when its variable is set or the DMI tables say EC2, and IMDS then
    answers as EC2's does."""

    NAME = "aws"
    KIND = "cloud"

    def check(self) -> Optional[str]:
        return common.metadata_url(METADATA_ENV)

    def detect(self, checked: Optional[str]) -> bool:
        return common.probed_if_named(self.NAME, checked, DEFAULT_BASE, dmi_says_aws)

    def metadata_base(self, checked: Optional[str]) -> str:
        return checked or DEFAULT_BASE

    def defaults(self, env: Any) -> dict:
        code, grace = cloud_defaults(self.NAME, env.device.name.endswith("GPU"))
        return {"exit_fn": common.exit_for(code), "grace_period": grace}


PLATFORM = Aws()
