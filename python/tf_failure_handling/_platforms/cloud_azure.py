"""Azure: detection and defaults (its notices: ``src/sources/azure.rs``; the page:
docs/getting-started/clouds.md)."""

from __future__ import annotations

from typing import Any, Optional

from .._native import AZURE_GRACE_PERIOD as GRACE_PERIOD  # noqa: F401 - re-exported
from .._native import cloud_defaults
from . import common

#: Base URL of the Azure instance metadata service (tests, proxies).
METADATA_ENV = "TF_FAILURE_HANDLING_AZURE_METADATA_URL"
#: Where Azure serves instance metadata (link-local, no DNS).
DEFAULT_BASE = "http://169.254.169.254"
#: Azure's ``chassis_asset_tag`` (Microsoft's documented way to tell Azure VMs).
ASSET_TAG = "7783-7084-3265-9085-8269-3286-77"
# GRACE_PERIOD and the exit code are the core's (src/sources/clouds.rs's table).


def dmi_says_azure() -> bool:
    """True when the DMI tables describe an Azure VM."""
    if common.dmi("chassis_asset_tag") == ASSET_TAG:
        return True
    return common.dmi("sys_vendor") == "Microsoft Corporation" and common.dmi("product_name") == (
        "Virtual Machine"
    )


class Azure(common.Platform):
    """Detected when its variable is set or the DMI tables say Azure, and IMDS then
    answers as Azure's does."""

    NAME = "azure"
    KIND = "cloud"

    def check(self) -> Optional[str]:
        return common.metadata_url(METADATA_ENV)

    def detect(self, checked: Optional[str]) -> bool:
        return common.probed_if_named(self.NAME, checked, DEFAULT_BASE, dmi_says_azure)

    def metadata_base(self, checked: Optional[str]) -> str:
        return checked or DEFAULT_BASE

    def defaults(self, env: Any) -> dict:
        code, grace = cloud_defaults(self.NAME, env.device.name.endswith("GPU"))
        return {"exit_fn": common.exit_for(code), "grace_period": grace}


PLATFORM = Azure()
