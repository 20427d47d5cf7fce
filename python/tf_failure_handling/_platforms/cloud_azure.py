"""Azure: detection and defaults (its notices: ``src/sources/azure.rs``).

Detected when ``TF_FAILURE_HANDLING_AZURE_METADATA_URL`` is set or the DMI tables say
Azure (``chassis_asset_tag`` is Azure's, or a Microsoft "Virtual Machine"), and IMDS
then answers as Azure's does.
"""

from __future__ import annotations

from typing import Optional

from . import common

NAME = "azure"
#: Base URL of the Azure instance metadata service (tests, proxies).
METADATA_ENV = "TF_FAILURE_HANDLING_AZURE_METADATA_URL"
#: Where Azure serves instance metadata (link-local, no DNS).
DEFAULT_BASE = "http://169.254.169.254"
#: Azure's ``chassis_asset_tag`` (Microsoft's documented way to tell Azure VMs).
ASSET_TAG = "7783-7084-3265-9085-8269-3286-77"
#: Seconds: Azure Spot's Preempt event comes 30 s ahead.
GRACE_PERIOD = 30

exit_fn = common.default_exit_fn
EXIT_CODE = common.DEFAULT_EXIT_CODE


def configured_base() -> Optional[str]:
    """``TF_FAILURE_HANDLING_AZURE_METADATA_URL`` as ``http://host[:port]``, or None."""
    return common.metadata_url(METADATA_ENV)


def dmi_says_azure() -> bool:
    """True when the DMI tables describe an Azure VM."""
    if common.dmi("chassis_asset_tag") == ASSET_TAG:
        return True
    return common.dmi("sys_vendor") == "Microsoft Corporation" and common.dmi("product_name") == (
        "Virtual Machine"
    )


def detected(configured: Optional[str]) -> bool:
    return common.probed_if_named(NAME, configured, DEFAULT_BASE, dmi_says_azure)


def grace_period(gpu: bool) -> float:
    return GRACE_PERIOD
