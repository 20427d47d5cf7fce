"""The exit guard: after the last save, an exit that runs past the deadline ends with
the exit code, not the platform's SIGKILL.

The final round keeps a reserve for the exit (``TF_FAILURE_HANDLING_EXIT_RESERVE``), but
an exit can take longer than any reserve: on a loaded host, TensorFlow's teardown under
MultiWorkerMirroredStrategy took 14 s after the last save. A Kubernetes pod still in its
exit at the deadline ends with 137, and a Job's ``podFailurePolicy`` that ignores the
restart code then counts the preemption as a failure.

So ``SaveAndExit`` arms a guard before it calls the default ``exit_fn``: a Rust thread
(``_native.exit_guard``) that, at ``EXIT_GUARD_LEAD`` seconds before the moment the
platform kills the process, ends it with the same code (``_exit``; the checkpoint and
the records' ``exit`` line are written by then) when the process is in its exit by then.
Python's threading shutdown tells it so (a hook the first arming registers), or the
interpreter's finalizing flag does. ``_exit`` skips what is left of the exit (``atexit`` handlers,
logging's flush, non-daemon threads, TensorFlow's teardown), so the moment must be one
the platform stated (``ProtocolCore.kill_deadline``: a notice's kill, never an assumed
deadline; the core decides, ``grace::exit_guard_delay``): none, or one too close, arms
nothing. A process that caught the ``SystemExit`` and trains on is never ended by it:
its next step through any handler, or a new handler (``disarm``), stands every waiting
guard down at once.
"""

from __future__ import annotations

import logging
from typing import Optional

from .._native import exit_guard

log = logging.getLogger("tf_failure_handling")


def arm(deadline: Optional[float], now: float, code: int) -> Optional[float]:
    """Arms the guard for ``deadline`` (the handler's clock, read as ``now``); returns
    the seconds it waits, or None when nothing is armed. Never raises: without the guard
    the exit goes on as TensorFlow's does."""
    try:
        delay = exit_guard(deadline, now, code)
    except Exception as e:  # noqa: BLE001 - the exit goes on unguarded, as TF's
        log.warning("The exit guard could not be armed (%s); the exit is not guarded.", e)
        return None
    if delay is not None:
        log.info(
            "If this process is still in its exit in %.1fs (shortly before the deadline), "
            "it ends then with exit code %d rather than be killed.",
            delay,
            code,
        )
    return delay


def disarm() -> None:
    """Stands every waiting guard down: a new handler means the process trains on."""
    exit_guard()
