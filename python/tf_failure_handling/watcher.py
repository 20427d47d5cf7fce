"""``PreemptionWatcher``: learn that a preemption is coming, on any platform.

It watches TF's ``TF_DEFAULT_PREEMPTION_NOTICE_KEY`` wherever a coordination service
runs, and this process's own notice sources in local mode: docs/how-it-works.md,
"``PreemptionWatcher``".
"""

from __future__ import annotations

import contextlib
import json
import logging
import numbers
import os
import threading
import weakref
from typing import Any, Iterable, Optional, Sequence

from . import _errors
from ._cluster import coordination as _coordination
from ._native import PREEMPTION_NOTICE_KEY, KeyWatch
from ._platforms import notice_sources as _sources
from ._platforms import platform as _platform
from ._platforms.in_process import notice_message, subscribe, unsubscribe

log = logging.getLogger("tf_failure_handling")

#: The key TF's ``block_until_worker_exit`` waits on (never set: the wait ends
#: when the service goes away with the workers).
BLOCK_TILL_EXIT_KEY = "BLOCK_TILL_EXIT"


def _check_signals(signals: Any) -> Optional[tuple]:
    """``signals`` as a tuple of ints; a TypeError naming the argument otherwise.

    ``int()`` alone would accept ``"15"`` and truncate ``1.5`` to SIGHUP.
    """
    if signals is None:
        return None
    if isinstance(signals, (str, bytes)) or not isinstance(signals, Iterable):
        raise TypeError(
            f"signals must be a sequence of signal numbers, got {type(signals).__name__}"
        )
    checked = []
    for s in signals:
        if isinstance(s, bool) or not isinstance(s, numbers.Integral):
            raise TypeError(f"signals must hold signal numbers (int or signal.Signals), got {s!r}")
        checked.append(int(s))
    return tuple(checked)


def _task_label() -> str:
    try:
        task = json.loads(os.environ.get("TF_CONFIG") or "{}").get("task") or {}
    except (ValueError, AttributeError):
        task = {}
    if isinstance(task, dict) and "type" in task:
        return f"{task.get('type')}:{task.get('index', 0)}"
    return "local"


def _coordination_service() -> Any:
    """The coordination service this thread sees, or None when there is none."""
    service = getattr(_coordination._local, "service", None)
    if service is not None:
        return service
    import sys

    if "tensorflow" not in sys.modules:
        return None
    from tensorflow.python.eager import context

    ctx = context.context()
    if not getattr(ctx, "coordination_service", None):
        return None
    return ctx


class PreemptionWatcher:
    """Watches for a preemption notice and keeps its message.

    Replaces ``tf.distribute.experimental.PreemptionWatcher`` with the same
    constructor, ``preemption_message``, ``platform`` and ``block_until_worker_exit()``.
    Differs in: it works beyond Borg TPUs, in local mode too, and stops at :meth:`close`;
    extras: ``signals`` (keyword-only: the signals that count as a notice, ``()`` for
    none), :meth:`wait`, :meth:`close` and use as a context manager.
    """

    def __init__(self, *, signals: Optional[Sequence[int]] = None) -> None:
        self._preemption_message: Optional[str] = None
        self._received = threading.Event()
        #: Set by a notice or by :meth:`close`: what :meth:`wait` waits for.
        self._done = threading.Event()
        #: Makes "first message wins" and "nothing after close" atomic in ``_receive``.
        self._receive_lock = threading.Lock()
        self._closing = threading.Event()
        #: The notice key's watch (the core's slices; its close bounds the joins).
        self._key_watch = KeyWatch()
        self._closed = False
        signals = _check_signals(signals)
        self._environment = _platform.environment()
        self._platform = self._environment.device
        self._label = _task_label()
        service = _coordination_service()
        self._coordination = None if service is None else _coordination.Client(service)
        defaults = _platform.complete(self._environment, None, None, None, signals)
        self._sources = _sources.NoticeSources(self._environment, defaults.signals)
        subscribe(self)
        # The threads hold only a weak reference to the watcher, so that a watcher
        # the program drops is collected, and its __del__ restores the signals.
        me = weakref.ref(self)
        self._threads = [
            threading.Thread(
                target=_watch_sources,
                args=(me, self._sources),
                name="PreemptionWatcher-sources",
                daemon=True,
            )
        ]
        if self._coordination is not None:
            self._threads.append(
                threading.Thread(
                    target=_watch_key,
                    args=(me, self._coordination, self._key_watch, self._closing, self._received),
                    name="PreemptionWatcher-key",
                    daemon=True,
                )
            )
        for t in self._threads:
            t.start()
        log.info(
            "PreemptionWatcher watching %s (platform %s).",
            "the coordination service and this process's termination sources"
            if self._coordination is not None
            else "this process's termination sources (local mode)",
            self._platform.name,
        )

    @property
    def preemption_message(self) -> Optional[str]:
        """The notice's message once one was seen (not None means a preemption is coming)."""
        return self._preemption_message

    @property
    def platform(self) -> _platform.PlatformDevice:
        """This job's platform, as TF's ``PlatformDevice``."""
        return self._platform

    def wait(self, timeout: Optional[float] = None) -> Optional[str]:
        """Blocks until a notice is seen (its message), ``timeout`` seconds pass or the
        watcher is closed (then the message seen so far, or None)."""
        self._done.wait(timeout)  # a signal interrupts it on the main thread (Ctrl-C)
        return self._preemption_message

    def block_until_worker_exit(self, timeout: Optional[float] = None) -> None:
        """Blocks until the workers exit (Borg TPU only); a no-op elsewhere, as in TF.

        On a Borg TPU it waits, as TF does, for the coordination service to go
        away with the workers, in the core's slices (``KeyWatch``, on this thread);
        ``timeout`` bounds it (TF waits forever).
        """
        if self._platform is not _platform.PlatformDevice.INTERNAL_TPU:
            return
        service = _coordination_service()
        if service is None:
            return
        errors = _errors.module()
        client = _coordination.Client(service)
        watch = KeyWatch(timeout)
        try:
            while (wait := watch.next()) is not None:
                if client.get(BLOCK_TILL_EXIT_KEY, wait) is not None:
                    break
        except errors.InternalError as e:
            if "Coordination service is not enabled." not in str(e):
                raise
        except (errors.AbortedError, errors.CancelledError, errors.UnavailableError):
            pass
        log.info("Workers exited.")

    def close(self) -> None:
        """Stops watching and restores the signal handlers. Idempotent."""
        if self._closed:
            return
        self._closed = True
        with self._receive_lock:
            self._closing.set()
            self._done.set()
        unsubscribe(self)
        self._sources.close()
        join = self._key_watch.close()
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(join)

    def __enter__(self) -> PreemptionWatcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown
            self.close()

    # ----------------------------------------------------------- internals

    def _receive(self, message: str) -> None:
        # publish_local may have listed this watcher just before it was closed.
        with self._receive_lock:
            if self._received.is_set() or self._closing.is_set():
                return
            self._preemption_message = message
            self._received.set()
            self._done.set()
        log.info("Preemption notice received: %s", message)

    def _on_own_notice(self, notice: _sources.Notice) -> None:
        if self._closing.is_set():
            return
        message = notice_message(self._label, notice.source, notice.at)
        self._receive(message)
        if self._coordination is not None:
            try:
                self._coordination.set(PREEMPTION_NOTICE_KEY, message)
            except Exception as e:  # noqa: BLE001 - peers may be gone already
                log.info("Could not publish %s: %s", PREEMPTION_NOTICE_KEY, e)


def _watch_sources(ref: weakref.ref, sources: _sources.NoticeSources) -> None:
    notice = sources.wait()
    watcher = ref()
    if notice is not None and watcher is not None:
        watcher._on_own_notice(notice)


def _watch_key(
    ref: weakref.ref,
    client: _coordination.Client,
    watch: KeyWatch,
    closing: threading.Event,
    received: threading.Event,
) -> None:
    # A daemon thread: each get as long as the watch says, until it is closed.
    while (wait := watch.next()) is not None and not received.is_set() and ref() is not None:
        try:
            value = client.get(PREEMPTION_NOTICE_KEY, wait)
        except Exception as e:  # noqa: BLE001 - the service went away (workers exiting)
            if not closing.is_set():
                log.info("Stopped watching %s: %s", PREEMPTION_NOTICE_KEY, e)
            return
        if value is not None:
            watcher = ref()
            if watcher is not None:
                watcher._receive(value)
            return
