"""Notices between the handlers and the watchers of this process.

A ``PreemptionWatcher`` learns of a notice from its own sources, from the coordination
service's ``TF_DEFAULT_PREEMPTION_NOTICE_KEY``, and from this module: a handler of the
same process that leads the response to a notice publishes its message here, and every
open watcher receives it. Both write the same message (:func:`notice_message`).
"""

from __future__ import annotations

import datetime
import threading
import weakref
from typing import Any

_subscribers_lock = threading.Lock()
_subscribers: weakref.WeakSet = weakref.WeakSet()


def notice_message(worker: str, source: str, at: float) -> str:
    """The preemption message this package writes: who, what, and when (UTC): ``at``, the
    Unix time the notice arrived (the inbox's stamp, ``Notice.at``)."""
    when = datetime.datetime.fromtimestamp(at, datetime.timezone.utc)
    return f"worker {worker}: termination notice from {source} at {when:%Y-%m-%dT%H:%M:%S.%fZ}"


def subscribe(watcher: Any) -> None:
    """``watcher._receive(message)`` is called for every message published from now on,
    until :func:`unsubscribe` (or until the watcher is collected)."""
    with _subscribers_lock:
        _subscribers.add(watcher)


def unsubscribe(watcher: Any) -> None:
    with _subscribers_lock:
        _subscribers.discard(watcher)


def publish_local(message: str) -> None:
    """Hands ``message`` to every open watcher of this process."""
    with _subscribers_lock:
        watchers = list(_subscribers)
    for w in watchers:
        w._receive(message)
