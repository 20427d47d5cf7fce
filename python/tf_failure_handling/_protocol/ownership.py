"""One handler per worker acts on its notices: the newest one built.

tf_keras leaves the handler of an earlier ``fit`` open when it builds the next: both
would see every notice of the worker. The newest open handler of a worker owns them; an
older one that is still open hands every notice it sees to its successor (the driver,
``notices``), stops acknowledging step keys (``step_keys``) and writes nothing at
``close()``.
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Optional

log = logging.getLogger("tf_failure_handling")

#: The handler that owns the notices of each worker of this process, keyed by
#: (coordination service, worker id): the newest one built. An older one that is
#: still open hands every notice it sees to it and acts on none.
_owners_lock = threading.RLock()  # RLock: __del__ (GC, any moment) takes it too
_owners: dict = {}


class NoticeOwnership:
    """Which handler of a worker owns its notices.

    Owns ``_successor`` (the newer handler that took over, if any); reads
    ``_state.coordination``, ``_id_in_cluster`` and ``_state.closed``.
    """

    def _owner_key(self) -> tuple:
        service = None if self._state.coordination is None else id(self._state.coordination.service)
        return (service, self._id_in_cluster)

    def _take_over_notices(self) -> None:
        """Makes this handler the one that acts on its worker's notices.

        An older handler of the same worker that is still open (tf_keras leaves
        the handler of an earlier ``fit`` open) stops acting on notices and
        watching the step keys; any notice it still sees is handed to this one,
        whose resolver ignores one it already has.
        """
        key = self._owner_key()
        with _owners_lock:
            ref = _owners.get(key)
            _owners[key] = weakref.ref(self)
        older = None if ref is None else ref()
        if older is not None and older is not self and not older._closed:
            older._successor = weakref.ref(self)
            log.info(
                "A new PreemptionCheckpointHandler of worker %s takes over termination "
                "notices from an earlier one that is still open (close() it when done).",
                self._id_in_cluster,
            )

    def _give_up_ownership(self) -> None:
        key = self._owner_key()
        with _owners_lock:
            ref = _owners.get(key)
            if ref is not None and ref() in (self, None):
                del _owners[key]

    def _current_owner(self) -> Optional[NoticeOwnership]:
        """The newer handler that owns the notices now, or None when this one does."""
        successor = None if self._successor is None else self._successor()
        while successor is not None and successor._successor is not None:
            later = successor._successor()
            if later is None:
                break
            successor = later
        return successor
