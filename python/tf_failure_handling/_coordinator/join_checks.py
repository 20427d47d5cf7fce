"""The open handlers' step checks, made while a coordinator's thread waits.

A ParameterServerStrategy handler registers its step check here; ``ClusterCoordinator``'s
``join()`` and a wait on a closure's result make the checks a ``run()`` would make, so a
notice is acted on while the training thread waits: docs/getting-started/
parameter-server.md.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable, Optional

from .._native import CoordinatorProtocol

Lane = CoordinatorProtocol.Lane

#: The step checks of the open handlers of a ParameterServerStrategy coordinator in
#: this process (each has ``closed`` and ``check_in_join()``), each with its
#: coordinator's protocol object, which times the waits' slices.
_join_checks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_JOIN = Lane.Join()


def register_join(check: Any, protocol: Any) -> None:
    """Called by a coordinator's handler with its step check and its
    ``CoordinatorProtocol``; see :func:`join`."""
    _join_checks[check] = protocol


def unregister_join(check: Any) -> None:
    _join_checks.pop(check, None)


def join(queue: Any) -> None:
    """``ClusterCoordinator.join()``: ``queue.wait()``, and meanwhile, with an open
    handler, the checks a ``run()`` would make (most training happens inside ``join()``)."""
    wait_checked(queue.wait)


def wait_checked(wait: Callable[..., bool], checks: Optional[list] = None) -> None:
    """``wait()`` (no timeout) in slices, with the checks of the open handlers
    (``checks``: those to make, by default every open one) between the slices: a
    termination notice is acted on while this thread waits -- the checkpoint is saved
    and the process exits, as at a ``run()``. Each slice is as long as the first
    check's coordinator protocol says (its join lane's ``poll_timeout``)."""
    while True:
        if checks is None:
            checks_now = [c for c in list(_join_checks) if not c.closed]
        else:
            checks_now = [c for c in checks if not c.closed]
        if not checks_now:
            wait()
            return
        protocol = _join_checks.get(checks_now[0])
        if protocol is None:  # unregistered meanwhile (its handler closed): look again
            continue
        if wait(timeout=protocol.poll_timeout(_JOIN)):
            return
        for check in checks_now:
            check.check_in_join()


def handler_run_index() -> Optional[int]:
    """The index of the open handler's ``run()`` that this thread is inside (calling its
    function), or None: a closure scheduled now is that run, which the handler's run
    count counts (``Closure._tfh_run``)."""
    if not _join_checks:
        return None
    me = threading.get_ident()
    for check in list(_join_checks):
        if check.running_thread == me:
            return check.run_index
    return None


def checks_of_this_trainer() -> list:
    """The open handlers whose training thread this is, and that are not inside their
    ``run()`` here: a wait on a result made by this thread may make their checks
    (``ClosureRemoteValue``'s wait; docs/getting-started/parameter-server.md)."""
    if not _join_checks:
        return []
    me = threading.get_ident()
    return [c for c in list(_join_checks) if c.is_trainer(me) and c.running_thread != me]
