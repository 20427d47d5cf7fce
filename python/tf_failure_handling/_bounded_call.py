"""A call on a daemon thread of its own, which the caller waits for at most a bound.

For calls that take no timeout (a coordination-service write, an RPC to a task that may
be stopped): a call given up on is left to finish on its thread. The bound holds only
while the call releases the GIL (docs/how-it-works.md, "What is bounded").
"""

from __future__ import annotations

import threading
from typing import Any, Callable


class BoundedCall:
    """``fn()`` on a daemon thread named ``name``: :meth:`wait`, then :meth:`result`."""

    def __init__(self, fn: Callable[[], Any], name: str) -> None:
        self._outcome: tuple = ()
        self.thread = threading.Thread(target=self._run, args=(fn,), name=name, daemon=True)

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self._outcome = (True, fn())
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            self._outcome = (False, e)

    def wait(self, timeout: float) -> bool:
        """Starts the call; whether it returned within ``timeout`` seconds."""
        self.thread.start()
        self.thread.join(max(0.0, timeout))
        return not self.thread.is_alive()

    def result(self) -> Any:
        """What the call returned, or its exception raised."""
        ok, value = self._outcome
        if not ok:
            raise value
        return value
