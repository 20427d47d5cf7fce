"""What the handler's parts share: one object, built first and read by every part (never
copied).

Its configuration (:class:`Settings`: where the worker sits, its platform, the
coordination service and the grace period; the peer timeout is the core's) is worked out once by the
handler's constructor and set in one assignment (:meth:`HandlerState.configure`); no
part changes it. Apart from it is the lifecycle (``closing``, ``closed``), which the
handler's close changes. The clock is the protocol object's (``ProtocolCore``: every
event is taken on it; a simulation substitutes its own with ``configure(clock=...)``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from .._native import DEFAULT_GRACE_PERIOD


@dataclass(frozen=True)
class Settings:
    """The handler's read-only configuration (the defaults stand until it is set)."""

    #: Where this worker sits in its cluster (``_cluster.membership.Membership``).
    membership: Any = None
    #: The platform, cloud and scheduler detected (``_platforms.platform.Environment``).
    environment: Any = None
    #: The coordination service, bounded (``_cluster.coordination.Client``); None alone.
    coordination: Any = None
    cluster_resolver: Any = None
    #: Seconds from a notice to the machine's end.
    grace_period: float = DEFAULT_GRACE_PERIOD
    #: The platform whose defaults apply (``_platforms.platform.Device``).
    device: Any = None
    #: The ``exit_fn`` configured (or the platform's default): the saver's, until the
    #: handler's ``_exit_fn`` view sets another.
    exit_fn: Any = None
    #: Each scheduler's options (SLURM's requeue), for its step after the save
    #: (``_platforms.platform.attach``).
    platform_options: Any = None


def _setting(name: str) -> property:
    return property(lambda self: getattr(self.settings, name), doc=f"``settings.{name}``.")


@dataclass(eq=False)
class HandlerState:
    #: The configuration, set once (:meth:`configure`).
    settings: Settings = field(default_factory=Settings)
    #: Set when the handler closes: the driver and reader stop.
    closing: threading.Event = field(default_factory=threading.Event)
    closed: bool = False
    configured: bool = False

    membership = _setting("membership")
    environment = _setting("environment")
    coordination = _setting("coordination")
    cluster_resolver = _setting("cluster_resolver")
    grace_period = _setting("grace_period")

    def configure(self, settings: Settings) -> None:
        """Sets the configuration, once: a second call is a bug of the caller."""
        if self.configured:
            raise RuntimeError("the handler's settings are set once")
        self.settings, self.configured = settings, True
