"""The protocol's coordination-service keys (TensorFlow's names).

Every bound on the protocol's waits is the core's: each comes out of an action or an
event's answer (``ProtocolCore.handle``).
"""

from __future__ import annotations

from .._native import (
    LAST_RUN_TO_CHECKPOINT,
    PREEMPTION_NOTICE_KEY,
    RUN_TO_CHECKPOINT,
    STOP_WATCHER,
    TERMINATED_WORKER,
)

__all__ = [
    "LAST_RUN_TO_CHECKPOINT",
    "PEER_TIMEOUT_ENV",
    "PREEMPTION_NOTICE_KEY",
    "RUN_TO_CHECKPOINT",
    "STOP_WATCHER",
    "TERMINATED_WORKER",
]

PEER_TIMEOUT_ENV = "TF_FAILURE_HANDLING_PEER_TIMEOUT"
#: Seconds kept between the last save and a platform's deadline for the process's own
#: exit (the core's ``EXIT_RESERVE`` when unset; docs/how-it-works.md).
EXIT_RESERVE_ENV = "TF_FAILURE_HANDLING_EXIT_RESERVE"
