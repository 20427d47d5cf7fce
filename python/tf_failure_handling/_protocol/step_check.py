"""The training thread's check before a step: the one place a notice reaches the step.

``run(fn, *args, **kwargs)`` is native (``HandlerCore.run``, ``src/python/handler.rs``):
with nothing pending it only times the step and calls ``fn``. When a notice needs
attention, a round was agreed, a background thread failed, or the step raised, it calls
back here. The check raises a background thread's error, then asks the resolver
(``Event.BeforeStep``) what this step does: proceed, **publish** the agreed step (the
leader, ``agreement``), or **save** at it (``save``). ``save_checkpoint_if_preempted``
and the hook tf_keras calls (``_check_preemption_and_maybe_checkpoint``) make the same
check. As in TensorFlow, the check and the step are inside the error-reporting scope
(``reporting``): a peer that did not acknowledge, or a failed save, reaches every worker.
"""

from __future__ import annotations

import threading
from typing import Optional

from .._native import Action, Event
from .agreement import Agreement
from .context import Context
from .save import SaveAndExit


class StepCheck:
    """The check before a step, and the step's failure, for ``run()`` and its kin."""

    def __init__(self, ctx: Context, agreement: Agreement, saver: SaveAndExit) -> None:
        self._ctx = ctx
        self._state, self._core = ctx.state, ctx.core
        self._errors, self._records = ctx.errors, ctx.records
        self._agreement = agreement
        self._saver = saver

    @property
    def closed(self) -> bool:
        return self._state.closed

    @property
    def running_thread(self) -> int:
        """The thread inside this handler's ``run()`` now (``threading.get_ident()``), 0
        when none."""
        return self._core.threads[0]

    @property
    def run_index(self) -> int:
        """The index of the ``run()`` in progress (the run count before it completes)."""
        return self._core.run_counter

    def is_trainer(self, thread: int) -> bool:
        """Whether ``thread`` is this handler's training thread: the one that called
        ``run()`` last (before the first ``run()``, the main thread)."""
        trainer = self._core.threads[1]
        return thread == (trainer or threading.main_thread().ident)

    def _act(self, args: tuple, kwargs: dict) -> None:
        """The check before a step: raise a background thread's error, publish, or save."""
        self._errors.raise_pending()
        action = self._core.handle(Event.BeforeStep())
        # After a publish the core is asked again: a PS coordinator saves at the step
        # it published, and a final round may be due already (both rounds at once).
        for _ in range(2):
            if not isinstance(action, Action.Publish):
                break
            self._agreement.publish(action.round, action.step)
            action = self._core.handle(Event.BeforeStep())
        if isinstance(action, Action.Save):
            self._saver.save_at(action, args, kwargs)

    def check(self, args: tuple, kwargs: Optional[dict]) -> None:
        """The check before a step of ``run()`` or ``save_checkpoint_if_preempted``, which
        recorded the step's start themselves."""
        try:
            self._act(args, kwargs or {})
        finally:
            self._core.handle(Event.ChecksDone())

    def check_now(self, args: tuple = (), kwargs: Optional[dict] = None) -> None:
        """The check of a library that counts its own steps (tf_keras), or of
        ``ClusterCoordinator.join()``: the time since the last check is a step time."""
        self._core.begin_step()
        self.check(args, kwargs)

    def check_in_join(self) -> None:
        """What ``run()`` checks before a step, made by ``ClusterCoordinator.join()``
        while it waits (the only place a notice can be seen once everything is
        scheduled)."""
        if self._core.attention or self._errors.pending is not None:
            self.check_now()

    def run_check(self) -> None:
        """The check before ``run()``'s step. As in TF it is inside the reporting scope:
        a peer that did not acknowledge, or a failed save, reaches every worker."""
        try:
            self.check((), None)
        except BaseException as error:
            replacement = self._errors.reported(error)
            if replacement is None:
                raise
            raise replacement from error

    def run_failed(self, error: BaseException) -> BaseException:
        """``run()``'s step raised ``error``: not counted, reported; returns what to raise."""
        action = self._errors.step_failed(error)
        replacement = self._errors.reported(error, action)
        if replacement is None:
            return error
        replacement.__cause__ = error
        return replacement
