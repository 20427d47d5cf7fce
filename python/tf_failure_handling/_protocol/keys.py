"""The protocol's coordination-service keys (TensorFlow's names) and the bounds on its waits.

Every other bound on the protocol's waits is the core's: each comes out of an action.
"""

from __future__ import annotations

from .._native import (
    LAST_RUN_TO_CHECKPOINT,
    PREEMPTION_NOTICE_KEY,
    RUN_TO_CHECKPOINT,
    SHUTDOWN_WRITE_TIMEOUT,
    STOP_WATCHER,
    TERMINATED_WORKER,
    THREAD_JOIN_TIMEOUT,
)

__all__ = [
    "LAST_RUN_TO_CHECKPOINT",
    "PEER_TIMEOUT_ENV",
    "PREEMPTION_NOTICE_KEY",
    "RUN_TO_CHECKPOINT",
    "SHUTDOWN_WRITE_TIMEOUT",
    "STOP_WATCHER",
    "TERMINATED_WORKER",
    "THREAD_JOIN_TIMEOUT",
]

PEER_TIMEOUT_ENV = "TF_FAILURE_HANDLING_PEER_TIMEOUT"
#: Seconds kept between the last save and a platform's deadline for the process's own
#: exit (the core's ``EXIT_RESERVE`` when unset; docs/how-it-works.md).
EXIT_RESERVE_ENV = "TF_FAILURE_HANDLING_EXIT_RESERVE"
# THREAD_JOIN_TIMEOUT and SHUTDOWN_WRITE_TIMEOUT are the core's (src/step_resolution.rs
# says what each means).
