"""What the handler's parts share: one object, built first, filled in by the handler's
constructor and read by every part (never copied: the clock is read at each call, as a
simulation substitutes it after construction)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass(eq=False)
class HandlerState:
    #: Where this worker sits in its cluster (``_cluster.membership.Membership``).
    membership: Any = None
    #: The platform, cloud and scheduler detected (``_platforms.platform.Environment``).
    environment: Any = None
    #: The coordination service, bounded (``_cluster.coordination.Client``); None alone.
    coordination: Any = None
    cluster_resolver: Any = None
    #: The bound of every wait for peers, in seconds.
    peer_timeout: float = 0.0
    grace_period: float = 0.0
    #: The clock the protocol reads: notice times, deadlines, save and agreement
    #: durations. Simulations substitute a virtual one; waits for peers stay real.
    clock: Callable[[], float] = time.monotonic
    #: Set when the handler closes: the driver and reader stop.
    closing: threading.Event = field(default_factory=threading.Event)
    closed: bool = False
