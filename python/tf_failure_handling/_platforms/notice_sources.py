"""Every termination source of this process, as one wait (docs/how-it-works.md, "Where
notices come from").

Signals (Rust, ``src/sources/signals.rs``), the cloud's metadata service (polled by
Rust threads, GCE's long-polled, every request bounded: ``src/sources/watch.rs``; a
poller posts its first notice and each that ends earlier), a user's
``termination_watcher_fn`` (called here when the core's schedule says, once a second)
and :meth:`NoticeSources.trigger` all post into one :class:`_native.Inbox`, which also
carries a handler's step keys and the stop of ``close()``; the protocol driver reads
everything from it. Deadlines are Unix times here; the core converts them once
(``Notice::from_unix``). A handler's sources *own* their signals (``owner=True``): a
handler installed before them is not called while they are open.

At interpreter exit every open ``NoticeSources`` is closed; the binding's own exit hook,
which runs after this module's, then waits (bounded by the core) for every thread to
leave the native waits: a daemon thread caught in one during finalization would abort
the process instead of letting it exit with the code it asked for. The warning signals they
watched (SIGUSR1, SIGUSR2: SLURM's time-limit warning) are then ignored rather than
given back their default action, which would end a process whose work is done with
128 + the signal's number (``_native.SignalWatch.close(at_exit=True)``).
"""

from __future__ import annotations

import atexit
import logging
import signal
import threading
import weakref
from typing import Any, Callable, NamedTuple, Optional, Sequence

from .._native import (
    Inbox,
    MetadataWatch,
    SignalWatch,
    WatcherFnPoll,
)
from . import platform as _platform

log = logging.getLogger("tf_failure_handling")
#: What an inbox holds: a notice, a step key, a key-read failure, the stop.
Input = Inbox.Input

#: Every open NoticeSources, for the exit hook.
_open_sources: weakref.WeakSet = weakref.WeakSet()
_open_sources_lock = threading.RLock()  # RLock: __del__ (GC, any moment) takes it too


def _release_all_at_exit() -> None:
    """Closes every open NoticeSources before finalization, which wakes the threads
    waiting in them; the binding's exit hook (registered when ``_native`` loaded, so it
    runs after this one) waits for them to leave the native waits (``src/python/
    sources.rs``, ``at_exit``): CPython ends a daemon thread that re-takes the GIL
    during finalization with ``pthread_exit``, and one caught inside the native wait
    would abort the process instead of letting it exit with the code it asked for."""
    with _open_sources_lock:
        sources = list(_open_sources)
    # The exit has begun: a time-limit warning now would only turn a finished run into
    # a failed one (SLURM's job FAILED, exit 138), so it is ignored from here on (a
    # closed one gave its signals back already).
    ignored = sorted({n for s in sources for n in s.close(join=False, at_exit=True)})
    if ignored:
        log.debug(
            "At exit, %s ignored (a warning now would end the process with 128 + its number).",
            ", ".join(signal_name(n) for n in ignored),
        )


atexit.register(_release_all_at_exit)


class Notice(NamedTuple):
    """A termination notice: where it came from and when the machine goes away."""

    source: str
    #: Unix time the platform announced, or None when it did not say.
    deadline: Optional[float]
    #: Unix time it arrived (posted into the inbox), or None when not known.
    at: Optional[float] = None
    #: Unix time the platform stated it ends this process, or None when it did not
    #: state one (an assumed deadline, a signal with no scheduler behind it): the exit
    #: guard waits for this alone.
    kill: Optional[float] = None


class KeyReadFailed(NamedTuple):
    """The step-key reader ended: reading ``round_key`` failed for longer than the
    bound; ``error`` is the last failure (TF's type, its message intact)."""

    round_key: str
    error: BaseException


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def signal_numbers(signals: Sequence[int]) -> list[int]:
    if isinstance(signals, (str, bytes)) or not hasattr(signals, "__iter__"):
        raise TypeError(f"signals must be a sequence of signal numbers, got {signals!r}")
    numbers = []
    for s in signals:
        if isinstance(s, bool) or not isinstance(s, int):
            raise TypeError(f"signals must be signal numbers, got {s!r}")
        numbers.append(int(s))
    return numbers


class NoticeSources:
    """Signals, metadata services and a watcher fn behind one :meth:`wait`.

    ``watch_metadata=False`` leaves the metadata service alone (a second watcher
    in a process that already probes it). ``owner=True`` (a handler) holds back
    previously installed signal handlers while open.
    """

    def __init__(
        self,
        env: _platform.Environment,
        signals: Sequence[int],
        watcher_fn: Optional[Callable[[], bool]] = None,
        *,
        watch_metadata: bool = True,
        owner: bool = False,
    ) -> None:
        self._env = env
        self.watcher_fn = watcher_fn
        self._lock = threading.RLock()  # close() may run from __del__ (GC) on any thread
        self._closed = False
        #: Where every source posts; a handler's step-key reader posts here too.
        self.inbox = Inbox()
        #: The reader's last failure per round key, until the driver takes it (the
        #: inbox carries the round only).
        self._read_errors: dict = {}
        #: The signals watched (each once).
        self.signals: list[int] = list(dict.fromkeys(signal_numbers(signals)))
        self._watch = SignalWatch(self.signals, owner=owner, inbox=self.inbox)
        self._metadata: Optional[MetadataWatch] = None
        if watch_metadata and env.cloud is not None and env.metadata_base is not None:
            try:
                self._metadata = MetadataWatch(env.cloud, env.metadata_base, self.inbox)
            except Exception as e:  # noqa: BLE001 - signals still work without it
                log.warning("Not watching the %s metadata service: %s", env.cloud, e)
            else:
                log.info("Watching the %s metadata service at %s.", env.cloud, env.metadata_base)
        #: When the watcher fn is called, and its notice (the core's schedule).
        self._watcher_poll = WatcherFnPoll(self.inbox)
        self._poller: Optional[threading.Thread] = None
        if watcher_fn is not None:
            self._poller = threading.Thread(
                target=self._poll_watcher_fn, name="TerminationWatcherFnPoller", daemon=True
            )
            self._poller.start()
        with _open_sources_lock:
            _open_sources.add(self)

    def trigger(
        self, source: str, deadline: Optional[float] = None, kill: Optional[float] = None
    ) -> bool:
        """Delivers a notice as a source would (``kill``: when it stated this process
        ends, Unix time); False once closed."""
        with self._lock:
            if self._closed:
                return False
        return self.inbox.post(Input.Notice(source, deadline=deadline, kill=kill))

    def read_failed(self, round_key: str, error: BaseException) -> bool:
        """Posts that the step-key reader ended on ``error`` reading ``round_key``;
        False once stopped (the driver will not see it)."""
        self._read_errors[round_key] = error
        return self.inbox.post(Input.KeyReadFailed(round_key))

    def receive(self, timeout: Optional[float] = None) -> Any:
        """The most urgent input: ``Input.Stop`` once closed, then step keys and key-read
        failures (``Inbox.Input``), then notices (as :class:`Notice`); None after
        ``timeout`` seconds (None: wait as long as it takes).

        Blocks with the GIL released (in slices on the main thread, so that Ctrl-C
        still works). Logs a warning, once, when someone replaced the handler of a
        watched signal.
        """
        with self._lock:
            if self._closed:
                return Input.Stop()
        return self._converted(self.inbox.recv(timeout, self._watch))

    def drain(self) -> list:
        """Every input still queued, without waiting, even once closed (what arrived
        before the stop), converted as :meth:`receive` does."""
        return [self._converted(item) for item in self.inbox.drain()]

    def wait(self, timeout: Optional[float] = None) -> Optional[Notice]:
        """The next notice, or None after ``timeout`` seconds or once closed: the
        sources of a watcher or a serving task, which carry nothing else (a handler's
        step-key reader posts into its own)."""
        item = self.receive(timeout)
        return item if isinstance(item, Notice) else None

    def _poll_watcher_fn(self) -> None:
        """Calls the watcher fn whenever the core's schedule says (TF: once a second)
        until it fires or the poll stops; the core times the calls, reports a slow one
        and posts the notice (``src/sources/watcher_fn.rs``).

        It runs in its own thread so that a watcher fn that blocks delays only
        itself: signals and metadata notices are still seen. One that raises is
        logged and called again later; a broken watcher must not kill training.
        """
        fn = self.watcher_fn
        fired = False
        while self._watcher_poll.next(fired):
            try:
                fired = bool(fn())
            except Exception as e:  # noqa: BLE001 - see the docstring
                log.warning("termination_watcher_fn raised %r; polling it again later.", e)
                fired = False

    def stop_watcher_fn(self) -> None:
        """Stops polling the watcher fn (a newer handler of the worker polls its own);
        a call under way that fires is dropped. Signals and metadata stay watched."""
        self._watcher_poll.stop(wait=False)

    def _converted(self, item: Any) -> Any:
        """An input as the driver takes it: a notice as a :class:`Notice`, a reader's
        failure with its exception (:class:`KeyReadFailed`), anything else as is."""
        if isinstance(item, Input.Notice):
            return self._notice_for(item)
        if isinstance(item, Input.KeyReadFailed):
            error = self._read_errors.pop(item.round, None)
            return KeyReadFailed(item.round, error or RuntimeError(f"reading {item.round} failed"))
        return item

    def _notice_for(self, item: Any) -> Notice:
        """A posted ``Input.Notice`` as a :class:`Notice`: a signal is named, and its
        deadline and kill are where the scheduler says (``_platform.signal_deadlines``)."""
        if item.signal is not None:
            deadline, kill = _platform.signal_deadlines(self._env, item.at)
            return Notice(f"signal {signal_name(item.signal)}", deadline, item.at, kill)
        return Notice(item.source, item.deadline, item.at, item.kill)

    def close(self, join: bool = True, at_exit: bool = False) -> list:
        """Stops the inbox (every receive returns ``Input.Stop``), the metadata probes
        and the watcher-fn poller, and restores the signal handlers. Idempotent.

        ``join=False`` (``__del__``, interpreter exit) does not wait for the
        watcher-fn thread and starts nothing. ``at_exit`` (the exit hook): the warning
        signals watched are ignored from now on; returns those (``SignalWatch.close``).
        """
        with self._lock:
            if self._closed:
                return []
            self._closed = True
        with _open_sources_lock:
            _open_sources.discard(self)
        self._watcher_poll.stop(wait=False)
        self.inbox.post(Input.Stop())
        ignored = self._watch.close(at_exit)
        if self._metadata is not None:
            self._metadata.close()
        poller = self._poller
        if join and poller is not None and poller is not threading.current_thread():
            # A watcher fn blocked in a call cannot be interrupted: the core waits for a
            # call under way, bounded; then its daemon thread is left.
            self._watcher_poll.stop()
        return ignored
