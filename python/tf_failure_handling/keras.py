"""Preemption checkpointing for Keras 3 ``model.fit``: :class:`PreemptionCheckpoint`.

Keras 3's ``BackupAndRestore`` has no ``save_before_preemption``. This callback runs every
training step of ``fit`` inside a :class:`~tf_failure_handling.PreemptionCheckpointHandler`:
on a notice to any worker every worker saves at one agreed step and exits, and the next
``fit`` with the same callback resumes at the saved epoch and batch, its input at the
element after the last one trained (docs/input-position.md). Requires the TensorFlow backend; the
Keras internals it needs are checked when ``fit`` starts.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, NamedTuple, Optional, Union

import keras
import tensorflow as tf

from . import _errors
from ._integrations import keras_internals as _keras_internals
from ._integrations.keras_internals import MissingKerasInternal
from ._protocol import input_position as _input
from .handler import PreemptionCheckpointHandler, TerminationConfig

__all__ = [
    "FitPosition",
    "MissingKerasInternal",
    "PreemptionCheckpoint",
    "saved_position",
]

log = logging.getLogger("tf_failure_handling")

#: Where the fit position is stored in the checkpoint (a ``PythonState`` string).
POSITION_KEY = "fit_position/.ATTRIBUTES/py_state"
#: Version of the position's JSON layout.
_POSITION_FORMAT = 1
#: Set on an exception once it was reported to the cluster, so it is reported once.
_REPORTED = "_tf_failure_handling_reported"


class FitPosition(NamedTuple):
    """Where a checkpoint was saved: ``batch`` batches of epoch ``epoch`` were trained."""

    epoch: int
    batch: int


class _Position(tf.train.experimental.PythonState):
    """The fit position in the checkpoint, written at save time (no per-step cost)."""

    def __init__(self, steps_per_epoch: Optional[int]) -> None:
        self.epoch = 0
        self.batch = 0
        self.steps_per_epoch = steps_per_epoch
        self.restored: Optional[FitPosition] = None
        self.restored_steps_per_epoch: Optional[int] = None
        #: The input's position (``_protocol.input_position``), saved with the fit's.
        self.input: Optional[_input.InputTracker] = None
        self.restored_input: Optional[dict] = None

    def serialize(self) -> str:
        return json.dumps(
            {
                "format": _POSITION_FORMAT,
                "epoch": self.epoch,
                "batch": self.batch,
                "steps_per_epoch": self.steps_per_epoch,
                "input": self.input.snapshot() if self.input is not None else None,
            }
        )

    def deserialize(self, string_value: Any) -> None:
        position, steps = _parse_position(string_value)
        self.restored, self.restored_steps_per_epoch = position, steps
        data = json.loads(
            string_value.decode() if isinstance(string_value, bytes) else string_value
        )
        try:
            self.restored_input = _input.parse(data["input"]) if data.get("input") else None
        except ValueError as e:
            log.warning("The input position in the checkpoint cannot be read (%s).", e)
            self.restored_input = None


def _parse_position(value: Any) -> tuple[FitPosition, Optional[int]]:
    if isinstance(value, bytes):
        value = value.decode("utf-8")
    data = json.loads(value)
    if data.get("format") != _POSITION_FORMAT:
        raise ValueError(f"Unknown fit position format in the checkpoint: {value!r}")
    return FitPosition(int(data["epoch"]), int(data["batch"])), data.get("steps_per_epoch")


def saved_position(checkpoint_dir: Union[str, os.PathLike]) -> Optional[FitPosition]:
    """The position of the latest checkpoint :class:`PreemptionCheckpoint` saved in
    ``checkpoint_dir``, or None when there is none (a fresh start).

    fit's input needs no skipping for it: :class:`PreemptionCheckpoint` starts the
    resumed fit's input after the last element trained (docs/input-position.md); an
    input skipped by hand as well would skip twice.
    """
    path = tf.train.latest_checkpoint(os.fspath(checkpoint_dir))
    if path is None:
        return None
    reader = tf.train.load_checkpoint(path)
    if not reader.has_tensor(POSITION_KEY):
        raise ValueError(f"{path} was not written by PreemptionCheckpoint: it has no fit position")
    return _parse_position(reader.get_tensor(POSITION_KEY))[0]


class _EndOfInput:
    """``train_function`` ran out of input: not a failed step, and not reported."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


def _is_end_of_input(error: BaseException) -> bool:
    return isinstance(error, (StopIteration, tf.errors.OutOfRangeError))


def _step(train_function: Any, iterator: Any) -> Any:
    try:
        return train_function(iterator)
    except (StopIteration, tf.errors.OutOfRangeError) as e:
        return _EndOfInput(e)


class PreemptionCheckpoint(keras.callbacks.Callback):
    """Saves at one agreed step on a termination notice, exits, and resumes ``fit`` there.

    ``checkpoint_dir`` is where the chief writes (other workers write to
    ``workertemp_<task_id>`` next to it and delete it before exiting, as TensorFlow's
    handler does); ``termination_config`` is a :class:`~tf_failure_handling.TerminationConfig`
    (or TF's), passed to the handler::

        with strategy.scope():  # MultiWorkerMirroredStrategy, MirroredStrategy, or none
            model = ...
            model.compile(...)
        model.fit(dataset, epochs=E, steps_per_epoch=S,
                  callbacks=[PreemptionCheckpoint(checkpoint_dir)])

    When ``fit`` starts, the latest checkpoint in ``checkpoint_dir`` (if any) is restored
    and ``fit`` continues at its epoch and batch: the first epoch runs its remaining
    batches only, so the restarted run and the interrupted one together make
    ``epochs * steps_per_epoch`` optimizer steps. When ``fit`` completes, the checkpoint
    is deleted (as Keras' ``BackupAndRestore`` does), so a later ``fit`` starts afresh.

    With ``steps_per_epoch=None`` the epoch's length is the input's: when Keras knows
    it up front (arrays, a dataset of known cardinality) the resumed epoch runs its
    remaining batches; when it does not, the resumed epoch starts at its first batch
    (the batches of it that were trained before the save are trained again).

    An exception in the training step, the batch loop, a callback's epoch hook or
    validation is reported to the cluster before it leaves ``fit`` (as the handler's
    ``run()`` does for a step's ``OpError``), so the other workers stop with an error
    while this one is still alive.
    """

    def __init__(
        self,
        checkpoint_dir: Union[str, os.PathLike],
        termination_config: Optional[TerminationConfig] = None,
    ) -> None:
        super().__init__()
        if not isinstance(checkpoint_dir, (str, os.PathLike)):
            raise TypeError(
                f"checkpoint_dir must be a path string, got {type(checkpoint_dir).__name__}"
            )
        checkpoint_dir = os.fspath(checkpoint_dir)
        if not checkpoint_dir:
            raise ValueError("checkpoint_dir must not be empty")
        self.checkpoint_dir: str = checkpoint_dir
        self.termination_config = termination_config
        self._handler: Optional[PreemptionCheckpointHandler] = None
        self._call: Optional[_keras_internals.FitCall] = None
        self._position: Optional[_Position] = None
        self._restored: Optional[FitPosition] = None
        #: (epoch, first batch, executions to skip) for the first epoch of a resumed fit.
        self._resume: Optional[tuple[int, int, int]] = None

    @property
    def handler(self) -> Optional[PreemptionCheckpointHandler]:
        """The handler of the ``fit`` under way (None outside ``fit``)."""
        return self._handler

    @property
    def restored_position(self) -> Optional[FitPosition]:
        """Where the current (or last) ``fit`` resumed, or None if it started afresh."""
        return self._restored

    # ------------------------------------------------------------ callback hooks

    def on_train_begin(self, logs: Optional[dict] = None) -> None:
        _keras_internals.require_tensorflow_backend()
        self._finish(completed=False)  # this callback's earlier fit ended by an exception
        call = _keras_internals.attach(self.model)
        try:
            self._start(call)
        except BaseException:
            _keras_internals.detach(call)
            self._finish(completed=False)
            raise

    def on_epoch_begin(self, epoch: int, logs: Optional[dict] = None) -> None:
        call, position = self._call, self._position
        if call is None or position is None:
            return
        _keras_internals.reset_initial_epoch(call)
        first_batch = 0
        if self._resume is not None:
            resume_epoch, resume_batch, skip = self._resume
            self._resume = None
            if epoch == resume_epoch and skip:
                _keras_internals.skip_executions(call, skip)
                first_batch = resume_batch
        position.epoch, position.batch = epoch, first_batch

    def on_train_batch_begin(self, batch: int, logs: Optional[dict] = None) -> None:
        # The batch about to run is the number of this epoch's batches done: what a
        # save inside the coming step records.
        if self._position is not None:
            self._position.batch = batch

    def on_train_end(self, logs: Optional[dict] = None) -> None:
        self._finish(completed=True)

    # ------------------------------------------------------------------ internals

    def _start(self, call: _keras_internals.FitCall) -> None:
        model = self.model
        _build(model)
        steps = self.params.get("steps") if self.params else None
        position = _Position(steps)
        checkpoint = tf.train.Checkpoint(
            model_variables=list(model.variables),
            optimizer_variables=list(model.optimizer.variables),
            fit_position=position,
        )
        resolver = getattr(model.distribute_strategy, "cluster_resolver", None)
        self._call, self._position = call, position
        self._handler = PreemptionCheckpointHandler(
            resolver,
            checkpoint,
            checkpoint_dir=self.checkpoint_dir,
            termination_config=self.termination_config,
        )
        self._restored = position.restored
        position.input = _input.InputTracker(
            _keras_internals.fit_input(call),
            max(1, self._handler._state.membership.num_workers or 1),
            "model.fit's input",
            runs=lambda: self._handler._run_counter if self._handler is not None else 0,
            batches_per_run=_keras_internals.steps_per_execution(model),
        )
        if position.restored is not None:
            self._plan_resume(call, position, steps)
        _keras_internals.wrap_train_function(call, self._train_step)
        _keras_internals.report_errors(call, self._report)

    def _plan_resume(
        self, call: _keras_internals.FitCall, position: _Position, steps: Optional[int]
    ) -> None:
        epoch, batch = position.restored
        per_call = _keras_internals.steps_per_execution(self.model)
        tracker = position.input
        positioned = (
            tracker is not None and tracker.why_not is None and position.restored_input is not None
        )
        if position.restored_steps_per_epoch != steps:
            log.warning(
                "The checkpoint in %s was saved by a fit with steps_per_epoch=%s; this fit "
                "has %s: it resumes at epoch %d, batch %d all the same.",
                self.checkpoint_dir,
                position.restored_steps_per_epoch,
                steps,
                epoch,
                batch,
            )
        if batch and steps is None and not positioned:
            log.warning(
                "The input's length is unknown (steps_per_epoch=None): epoch %d starts again "
                "at its first batch, and its %d batch(es) trained before the save are trained "
                "again. Pass steps_per_epoch to resume at the saved batch.",
                epoch,
                batch,
            )
            skip = 0
        else:
            skip = batch // per_call
            if batch % per_call:
                log.warning(
                    "Saved at batch %d, not a multiple of steps_per_execution=%d: epoch %d "
                    "resumes at batch %d.",
                    batch,
                    per_call,
                    epoch,
                    skip * per_call,
                )
        _keras_internals.start_at_epoch(call, epoch)
        self._resume = (epoch, skip * per_call, skip)
        if positioned:
            # Without steps_per_epoch fit makes an iterator per epoch; with it, one goes on
            # until the input ends (its length decides then).
            fresh_per_epoch = _keras_internals.user_steps_per_epoch(call) is None
            tracker.resume(
                position.restored_input,
                first_used=0,
                new_iteration=(skip == 0) if fresh_per_epoch else None,
            )
        log.info(
            "PreemptionCheckpoint: fit resumes at epoch %d, batch %d (checkpoint in %s, "
            "%d step run(s) before it).",
            epoch,
            skip * per_call,
            self.checkpoint_dir,
            self._handler._run_counter,
        )

    def _train_step(self, train_function: Any, iterator: Any) -> Any:
        handler = self._handler
        if handler is None:  # not inside this callback's fit
            return train_function(iterator)
        try:
            result = handler.run(_step, train_function, iterator)
        except tf.errors.OpError as e:
            _mark_reported(e)  # run() reported it (outside local mode)
            raise
        if isinstance(result, _EndOfInput):
            raise result.error
        return result

    def _report(self, error: BaseException, where: str) -> None:
        """Reports ``error`` (which is leaving fit) to every worker, once."""
        handler = self._handler
        if handler is None or handler._local_mode or getattr(error, _REPORTED, False):
            return
        if _is_end_of_input(error):
            return
        if isinstance(error, tf.errors.OpError):
            reported = error
        else:
            reported = _errors.make(
                "UnknownError",
                f"Worker {handler._id_in_cluster}: {type(error).__name__} in {where} of "
                f"model.fit: {error}",
            )
        log.error("An error left model.fit on worker %s: %r", handler._id_in_cluster, error)
        handler._propagate_error(reported)
        _mark_reported(error)

    def _finish(self, completed: bool) -> None:
        """Undoes this fit's changes and closes its handler; after a completed fit, deletes
        the checkpoint (chief) or this worker's temp dir (others)."""
        call, handler = self._call, self._handler
        if self._position is not None and self._position.input is not None:
            self._position.input.close()
        self._call, self._handler, self._position, self._resume = None, None, None, None
        if call is not None:
            _keras_internals.detach(call)
        if handler is None:
            return
        try:
            if completed:
                _delete_checkpoints(handler)
        finally:
            handler.close()


def _build(model: Any) -> None:
    """Makes sure every variable to checkpoint exists before the restore.

    Under a strategy, fit has built the model, its metrics and its optimizer already.
    Without one, Keras builds them at the first step: the model must then be built by
    the user (``keras.Input``, ``model.build``), and the optimizer is built here, as its
    first ``apply`` would (``optimizer.build(model.trainable_variables)``).
    """
    if not model.built:
        raise ValueError(
            "PreemptionCheckpoint needs a built model when fit starts, to restore its "
            "weights: give it an input shape (keras.Input, or model.build(input_shape)) "
            "or call it on a batch before fit."
        )
    optimizer = model.optimizer
    if not optimizer.built:
        with model.distribute_strategy.scope():
            optimizer.build(model.trainable_variables)


def _mark_reported(error: BaseException) -> None:
    try:
        setattr(error, _REPORTED, True)
    except (AttributeError, TypeError):  # an exception type without a __dict__
        pass


def _delete_checkpoints(handler: PreemptionCheckpointHandler) -> None:
    """Removes what the handler's saves left: the chief's checkpoints in ``checkpoint_dir``
    (the state file first, so no reader finds a half-deleted one), a non-chief's temp dir."""
    if not handler._is_chief:
        handler._checkpoints.remove_worker_temp(False)
        return
    manager = handler._write_checkpoint_manager
    directory = manager.directory
    state = os.path.join(directory, "checkpoint")
    prefixes = list(manager.checkpoints)
    if not prefixes and not tf.io.gfile.exists(state):
        return
    if tf.io.gfile.exists(state):
        tf.io.gfile.remove(state)
    for prefix in prefixes:
        for path in tf.io.gfile.glob(prefix + ".*"):
            tf.io.gfile.remove(path)
    log.info("PreemptionCheckpoint: fit completed; deleted its checkpoint in %s.", directory)
    if "://" not in directory:
        try:
            os.rmdir(directory)  # only if empty: the directory may hold the user's files
        except OSError:
            pass
