"""Amazon EC2: detection and defaults (its notices: ``src/sources/aws.rs``).

Detected when ``TF_FAILURE_HANDLING_AWS_METADATA_URL`` is set or the DMI tables say
EC2 (``/sys/class/dmi/id/{sys,bios,board}_vendor`` name Amazon, or ``product_name`` /
``bios_version`` contain "amazon", or ``/sys/hypervisor/uuid`` starts with "ec2"), and
IMDS then answers as EC2's does.
"""

from __future__ import annotations

from typing import Optional

from . import common

NAME = "aws"
#: Base URL of the AWS instance metadata service (tests, proxies).
METADATA_ENV = "TF_FAILURE_HANDLING_AWS_METADATA_URL"
#: Where AWS serves instance metadata (link-local, no DNS).
DEFAULT_BASE = "http://169.254.169.254"
#: Xen guests on EC2 (older instance types) have a uuid starting with "ec2" here.
HYPERVISOR_UUID = "/sys/hypervisor/uuid"
#: Seconds: AWS Spot gives two minutes' notice (the notice's own deadline caps it).
GRACE_PERIOD = 120

exit_fn = common.default_exit_fn
EXIT_CODE = common.DEFAULT_EXIT_CODE


def configured_base() -> Optional[str]:
    """``TF_FAILURE_HANDLING_AWS_METADATA_URL`` as ``http://host[:port]``, or None."""
    return common.metadata_url(METADATA_ENV)


def dmi_says_aws() -> bool:
    """True when the DMI tables (or Xen's hypervisor uuid) name Amazon EC2."""
    for name in ("sys_vendor", "bios_vendor", "board_vendor", "product_name", "bios_version"):
        if "amazon" in common.dmi(name).lower():
            return True
    return (common.read_line(HYPERVISOR_UUID) or "").lower().startswith("ec2")


def detected(configured: Optional[str]) -> bool:
    return common.probed_if_named(NAME, configured, DEFAULT_BASE, dmi_says_aws)


def grace_period(gpu: bool) -> float:
    return GRACE_PERIOD
