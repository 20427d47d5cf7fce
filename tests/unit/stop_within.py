"""A test double of the coordinator's protocol object whose stop bound is short."""

from __future__ import annotations


class StopWithin:
    """The coordinator's protocol object with a stop bound of ``bound`` seconds (the
    core's is seconds long): the stop's lock wait, as the core's action gives it."""

    def __init__(self, protocol, bound: float) -> None:
        self._protocol, self._bound = protocol, bound

    def poll(self, lane):
        from tf_failure_handling import coordinator

        action = self._protocol.poll(lane)
        if isinstance(action, coordinator.CoordinatorAction.StopRecovery):
            return coordinator.CoordinatorAction.StopRecovery(self._bound)
        return action

    def __getattr__(self, name):
        return getattr(self._protocol, name)
