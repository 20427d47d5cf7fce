"""One handler per worker acts on its notices: the newest one built.

tf_keras leaves the handler of an earlier ``fit`` open when it builds the next: both
would see every notice of the worker. The newest open handler of a worker owns them; an
older one that is still open hands every notice that arrived after its successor took
over to it (the driver, ``notices``), stops polling its own ``termination_watcher_fn``
(the successor polls its own), stops acknowledging step keys (``step_keys``) and writes
nothing at ``close()``. A notice that arrived before the successor was built is acted on
by neither, whenever the older one's driver takes it: a signal reaches only the handlers
installed when it comes, as TensorFlow's (its tests send one at the end of a test, and
the next test's handler must not see it).
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any, Optional

from .._native import Event, ProtocolCore
from .state import HandlerState

log = logging.getLogger("tf_failure_handling")

#: The handler that owns the notices of each worker of this process, keyed by
#: (coordination service, worker id): the newest one built. An older one that is
#: still open hands every notice it sees to it and acts on none.
_owners_lock = threading.RLock()  # RLock: __del__ (GC, any moment) takes it too
_owners: dict = {}


class Ownership:
    """Which handler of a worker owns its notices: this one, or a newer one it hands
    them to (``successor``). ``sources`` is this handler's inbox, set once built."""

    def __init__(self, state: HandlerState, core: ProtocolCore) -> None:
        self._state = state
        #: This handler's protocol object: it stamps the take-over and tells a notice
        #: that came after it (:meth:`came_after`).
        self._core = core
        self.successor: Optional[weakref.ref] = None
        self.sources: Any = None

    def _key(self) -> tuple:
        coordination = self._state.coordination
        service = None if coordination is None else id(coordination.service)
        return (service, self._state.membership.id_in_cluster)

    def take_over(self) -> None:
        """Makes this handler the one that acts on its worker's notices.

        An older handler of the same worker that is still open (tf_keras leaves
        the handler of an earlier ``fit`` open) stops acting on notices and
        watching the step keys; any notice it still sees is handed to this one,
        whose resolver ignores one it already has.
        """
        key = self._key()
        # Stamped before any older handler learns of this one: a notice that arrived
        # before it is the older one's (:meth:`came_after`).
        self._core.handle(Event.TakeOver())
        with _owners_lock:
            ref = _owners.get(key)
            _owners[key] = weakref.ref(self)
        older = None if ref is None else ref()
        if older is not None and older is not self and not older._state.closed:
            older.successor = weakref.ref(self)
            # The watcher fn is the older handler's own configuration, not a notice of
            # the process (a signal) or the machine (metadata): the newer handler polls
            # its own. TensorFlow's tests give each handler a watcher fn of its own test.
            if older.sources is not None:
                older.sources.stop_watcher_fn()
            log.info(
                "A new PreemptionCheckpointHandler of worker %s takes over termination "
                "notices from an earlier one that is still open (close() it when done); "
                "the earlier one's termination_watcher_fn is no longer polled.",
                self._state.membership.id_in_cluster,
            )

    def give_up(self) -> None:
        key = self._key()
        with _owners_lock:
            ref = _owners.get(key)
            if ref is not None and ref() in (self, None):
                del _owners[key]

    def current_owner(self) -> Optional[Ownership]:
        """The newer handler's ownership that owns the notices now, or None when this
        handler does."""
        successor = None if self.successor is None else self.successor()
        while successor is not None and successor.successor is not None:
            later = successor.successor()
            if later is None:
                break
            successor = later
        return successor

    def came_after(self, at: Optional[float]) -> bool:
        """Whether a notice that arrived at ``at`` (Unix time; None: not known) came
        after this handler took over: one that came before reached the handlers open
        then, as TensorFlow's signal handlers, and is not this one's."""
        return self._core.handle(Event.Arrived(at))

    def hand_on(self, source: str, deadline: Optional[float], kill: Optional[float]) -> None:
        """A notice this (older) handler saw goes to the owner's inbox, with its kill."""
        if self.sources is not None:
            self.sources.trigger(source, deadline, kill)
