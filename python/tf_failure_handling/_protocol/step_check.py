"""The training thread's check before a step: the one place a notice reaches the step.

``run(fn, *args, **kwargs)`` is native (``HandlerCore.run``, ``src/python/handler.rs``):
with nothing pending it only times the step and calls ``fn``. When a notice needs
attention, a round was agreed, a background thread failed, or the step raised, it calls
back here. The check raises a background thread's error, then asks the resolver
(``_core.before_step``) what this step does: proceed, **publish** the agreed step (the
leader, ``agreement``), or **save** at it (``save``). ``save_checkpoint_if_preempted``
and the hook tf_keras calls (``_check_preemption_and_maybe_checkpoint``) make the same
check. As in TensorFlow, the check and the step are inside the error-reporting scope
(``reporting``): a peer that did not acknowledge, or a failed save, reaches every worker.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from .._native import StepAction


class StepCheck:
    """The check before a step, and the step's failure, for ``run()`` and its kin.

    Reads ``_thread_error`` (and clears it once raised) and ``_state.clock``; publishes
    through ``_publish`` (``agreement``), saves through ``_save_checkpoint_at``
    (``save``), reports through ``_reported`` (``reporting``).
    """

    def _act_before_step(self, args: tuple, kwargs: dict) -> None:
        """The check before a step: raise a background thread's error, publish, or save."""
        error = self._thread_error
        if error is not None:
            self._thread_error = None
            self._core.set_pending(False)
            raise error
        action = self._core.before_step(self._state.clock())
        if isinstance(action, StepAction.Publish):
            self._publish(action.round_key, action.step, action.ack_keys)
            if self._saves_where_it_publishes():
                action = self._core.before_step(self._state.clock())
        if isinstance(action, StepAction.Save):
            self._save_checkpoint_at(action.round_key, action.step, args, kwargs)

    def _check_before_step(self, args: tuple, kwargs: Optional[dict]) -> None:
        """The check before a step of ``run()`` or ``save_checkpoint_if_preempted``, which
        recorded the step's start themselves."""
        try:
            self._act_before_step(args, kwargs or {})
        finally:
            self._core.after_check()

    # ``run(fn, *args, **kwargs)`` is native (HandlerCore.run, src/python/handler.rs):
    # it calls these two only when a notice needs attention or the step failed.

    def _run_with_keywords(
        self, distributed_train_function: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Any:
        """``run(distributed_train_function=f, ...)``: TF's signature, by keyword."""
        return self.run(distributed_train_function, *args, **kwargs)

    def _run_check(self) -> None:
        """The check before ``run()``'s step. As in TF it is inside the reporting scope:
        a peer that did not acknowledge, or a failed save, reaches every worker."""
        try:
            self._check_before_step((), None)
        except BaseException as error:
            replacement = self._reported(error)
            if replacement is None:
                raise
            raise replacement from error

    def _run_failed(self, error: BaseException) -> BaseException:
        """``run()``'s step raised ``error``: not counted, reported; returns what to raise."""
        self._core.step_failed()
        replacement = self._reported(error)
        if replacement is None:
            return error
        replacement.__cause__ = error
        return replacement
