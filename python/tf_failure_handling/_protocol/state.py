"""What the handler's parts share: one object, built first, filled in by the handler's
constructor and read by every part (never copied: the clock is read at each call, as a
simulation substitutes it after construction)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from .._native import DEFAULT_GRACE_PERIOD, DEFAULT_PEER_TIMEOUT, now


@dataclass(eq=False)
class HandlerState:
    #: Where this worker sits in its cluster (``_cluster.membership.Membership``).
    membership: Any = None
    #: The platform, cloud and scheduler detected (``_platforms.platform.Environment``).
    environment: Any = None
    #: The coordination service, bounded (``_cluster.coordination.Client``); None alone.
    coordination: Any = None
    cluster_resolver: Any = None
    #: The bound of every wait for peers, in seconds (the core's default until the
    #: handler's constructor sets it).
    peer_timeout: float = DEFAULT_PEER_TIMEOUT
    #: Seconds from a notice to the machine's end (the core's default until set).
    grace_period: float = DEFAULT_GRACE_PERIOD
    #: The clock the protocol reads: notice times, deadlines, save and agreement
    #: durations; the package's one clock (``_native.now``, the binding's, on which
    #: every ``Deadline``, ``Retry`` and ``Writes`` of the package also counts).
    #: Simulations substitute a virtual one; waits for peers stay real.
    clock: Callable[[], float] = now
    #: Set when the handler closes: the driver and reader stop.
    closing: threading.Event = field(default_factory=threading.Event)
    closed: bool = False
