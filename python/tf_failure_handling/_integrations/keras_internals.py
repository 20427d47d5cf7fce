"""Every Keras internal that :mod:`tf_failure_handling.keras` relies on, and nothing else.

Each function names the Keras file and behaviour it relies on ("Relies on", Keras 3.15,
paths under ``keras/src/``); :func:`attach` checks them all when ``fit`` starts and
raises :class:`MissingKerasInternal` naming a missing one. No Keras class is patched:
changes are made to one model or one ``fit`` call's objects and undone by :func:`detach`.
Why they are needed: docs/getting-started/keras3.md, "Keras versions".
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

log = logging.getLogger("tf_failure_handling")

#: The Keras release these internals were read from and are tested with.
TESTED_KERAS = "3.15"
#: Every Keras release the tests run with: :data:`TESTED_KERAS` on Python 3.11 and later,
#: and 3.12, the newest Keras that installs on Python 3.10 (``make test-compat`` runs the
#: Keras tests with it on TensorFlow 2.16 and 2.21).
TESTED_KERAS_RELEASES = ("3.12", TESTED_KERAS)
_warned_version: list = []
#: How far up the stack the callback hook may be from ``fit`` (CallbackList, wrappers).
_MAX_FRAMES = 64
#: Marks the wrappers this module installs, so a later ``fit`` can find and remove them.
_MARK = "_tf_failure_handling_wrapper"


class MissingKerasInternal(RuntimeError):
    """This Keras lacks an internal that ``PreemptionCheckpoint`` relies on."""

    def __init__(self, internal: str, relied_on: str) -> None:
        super().__init__(
            f"tf_failure_handling.keras.PreemptionCheckpoint needs the Keras internal "
            f"{internal} ({relied_on}), and Keras {keras_version()} does not have it. "
            f"PreemptionCheckpoint is written for and tested with Keras {TESTED_KERAS} "
            "(TensorFlow backend); see the README's Keras section."
        )
        self.internal = internal


def keras_version() -> str:
    try:
        import keras
    except ImportError:
        return "(not installed)"
    return str(getattr(keras, "__version__", "(unknown version)"))


def require_tensorflow_backend() -> None:
    """Raises ``ValueError`` unless Keras runs on TensorFlow (public API)."""
    import keras

    backend = keras.backend.backend()
    if backend != "tensorflow":
        raise ValueError(
            "tf_failure_handling.keras.PreemptionCheckpoint needs the TensorFlow backend "
            f"of Keras (KERAS_BACKEND=tensorflow); this process uses {backend!r}."
        )


# ------------------------------------------------------------------ the fit call


def _fit_code() -> Any:
    """The code object of ``TensorFlowTrainer.fit`` (under its traceback filter): the
    TensorFlow backend's fit loop (``keras/src/backend/tensorflow/trainer.py``)."""
    try:
        from keras.src.backend.tensorflow.trainer import TensorFlowTrainer
    except ImportError as e:
        raise MissingKerasInternal(
            "keras.src.backend.tensorflow.trainer.TensorFlowTrainer",
            "the TensorFlow backend's fit loop, whose locals are read",
        ) from e
    fit = inspect.unwrap(getattr(TensorFlowTrainer, "fit", None))
    code = getattr(fit, "__code__", None)
    if code is None:
        raise MissingKerasInternal(
            "TensorFlowTrainer.fit", "a Python function running the fit loop"
        )
    return code


def _fit_locals(model: Any) -> dict:
    """The locals of the ``TensorFlowTrainer.fit`` call of ``model`` on this thread's stack.

    Relies on (Keras 3.15, ``keras/src/backend/tensorflow/trainer.py`` and
    ``keras/src/callbacks/callback_list.py``): callbacks run synchronously inside ``fit``
    (``on_train_begin`` and ``on_epoch_begin`` are never dispatched to another thread).
    """
    code = _fit_code()
    frame = sys._getframe(1)
    for _ in range(_MAX_FRAMES):
        if frame is None:
            break
        if frame.f_code is code and frame.f_locals.get("self") is model:
            return frame.f_locals
        frame = frame.f_back
    raise MissingKerasInternal(
        "the TensorFlowTrainer.fit call on the stack of on_train_begin",
        "callbacks are called synchronously from keras/src/backend/tensorflow/trainer.py fit",
    )


@dataclass
class FitCall:
    """The objects of one ``fit`` call that :func:`attach` changed, to undo in :func:`detach`."""

    model: Any
    epoch_iterator: Any
    callbacks: Any
    train_function: Callable[..., Any]
    initial_epoch_before: Any = None
    initial_epoch_set: bool = False
    undo: list = field(default_factory=list)


def attach(model: Any) -> FitCall:
    """Checks every internal for this ``fit`` of ``model``; call from ``on_train_begin``.

    Returns the call's objects, having changed nothing but the removal of an earlier fit's
    leftovers (:func:`detach_leftovers`). Raises :class:`MissingKerasInternal` naming the
    first internal this Keras lacks; logs a warning (once) on an untested Keras release.
    """
    try:
        from keras.src.trainers.epoch_iterator import EpochIterator
    except ImportError as e:
        raise MissingKerasInternal(
            "keras.src.trainers.epoch_iterator.EpochIterator", "the class of fit's epoch iterator"
        ) from e

    version = keras_version()
    tested = any(version.startswith(release + ".") for release in TESTED_KERAS_RELEASES)
    if not tested and not _warned_version:
        _warned_version.append(version)
        log.warning(
            "PreemptionCheckpoint is tested with Keras %s; this is Keras %s. The internals it "
            "uses are checked when fit starts, but their behaviour is untested with it.",
            " and ".join(TESTED_KERAS_RELEASES),
            version,
        )
    detach_leftovers(model)
    found = _fit_locals(model)
    epoch_iterator = found.get("epoch_iterator")
    if not isinstance(epoch_iterator, EpochIterator):
        raise MissingKerasInternal(
            "TensorFlowTrainer.fit's local 'epoch_iterator' (an EpochIterator)",
            "the iterator whose step numbers fit's batch loop follows",
        )
    for name in ("_enumerate_iterator", "catch_stop_iteration"):
        if not callable(getattr(epoch_iterator, name, None)):
            raise MissingKerasInternal(
                f"EpochIterator.{name}",
                "keras/src/trainers/epoch_iterator.py: the epoch's step generator and the "
                "batch loop's context manager",
            )
    callbacks = found.get("callbacks")
    if not all(callable(getattr(callbacks, n, None)) for n in ("on_epoch_begin", "on_epoch_end")):
        raise MissingKerasInternal(
            "TensorFlowTrainer.fit's local 'callbacks' (a CallbackList)",
            "the list whose epoch hooks fit calls",
        )
    train_function = getattr(model, "train_function", None)
    if not callable(train_function):
        raise MissingKerasInternal(
            "model.train_function",
            "made by make_train_function() before on_train_begin and called once per step",
        )
    if not hasattr(model, "_initial_epoch"):
        raise MissingKerasInternal(
            "model._initial_epoch",
            "keras/src/trainers/trainer.py: the epoch fit starts at, read after on_train_begin",
        )
    return FitCall(model, epoch_iterator, callbacks, train_function)


# ------------------------------------------------------------- the changes


def _marked(fn: Callable[..., Any], original: Any, owner: Any) -> Callable[..., Any]:
    setattr(fn, _MARK, (original, owner))
    return fn


def wrap_train_function(call: FitCall, step: Callable[[Callable[..., Any], Any], Any]) -> None:
    """Makes fit call ``step(original_train_function, iterator)`` for every step.

    Relies on (Keras 3.15, ``keras/src/backend/tensorflow/trainer.py``): fit calls
    ``self.train_function(iterator)`` (an instance attribute, set by
    ``make_train_function()``, which keeps an existing one).
    """
    model, original = call.model, call.train_function

    def train_function(iterator: Any) -> Any:
        return step(original, iterator)

    model.train_function = _marked(train_function, original, call)
    call.undo.append(lambda: _restore_attribute(model, "train_function", original))


def report_errors(call: FitCall, report: Callable[[BaseException, str], None]) -> None:
    """Calls ``report(error, where)`` for an exception that leaves fit's batch loop, a
    callback's epoch hook, or validation, then lets it go on.

    Relies on (Keras 3.15, ``keras/src/backend/tensorflow/trainer.py`` and
    ``keras/src/trainers/epoch_iterator.py``): the batch loop (data,
    ``on_train_batch_begin/end``, ``train_function``)
    runs inside ``epoch_iterator.catch_stop_iteration()``; fit calls
    ``callbacks.on_epoch_begin/on_epoch_end`` and ``self.evaluate`` for validation.
    """
    iterator, callbacks, model = call.epoch_iterator, call.callbacks, call.model
    catch = iterator.catch_stop_iteration

    @contextlib.contextmanager
    def catch_stop_iteration() -> Iterator[None]:
        try:
            with catch():
                yield
        except Exception as e:
            report(e, "a training batch")
            raise

    iterator.catch_stop_iteration = _marked(catch_stop_iteration, catch, call)
    call.undo.append(lambda: _restore_attribute(iterator, "catch_stop_iteration", catch))

    for name in ("on_epoch_begin", "on_epoch_end"):
        hook = getattr(callbacks, name)
        wrapper = _reporting(hook, report, f"a callback's {name}")
        setattr(callbacks, name, _marked(wrapper, hook, call))
        call.undo.append(functools.partial(_restore_attribute, callbacks, name, hook))

    evaluate = model.evaluate
    model.evaluate = _marked(_reporting(evaluate, report, "validation"), evaluate, call)
    call.undo.append(lambda: _restore_attribute(model, "evaluate", evaluate))


def _reporting(
    fn: Callable[..., Any], report: Callable[[BaseException, str], None], where: str
) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            report(e, where)
            raise

    return wrapper


def start_at_epoch(call: FitCall, epoch: int) -> None:
    """Makes this fit start at ``epoch``.

    Relies on (Keras 3.15, ``keras/src/trainers/trainer.py`` and
    ``keras/src/backend/tensorflow/trainer.py``): fit starts at
    ``self._initial_epoch or initial_epoch``, read after ``on_train_begin``.
    """
    model = call.model
    call.initial_epoch_before = model._initial_epoch
    call.initial_epoch_set = True
    model._initial_epoch = epoch


def reset_initial_epoch(call: FitCall) -> None:
    """Puts back the ``_initial_epoch`` fit had; fit has read it once an epoch began."""
    if call.initial_epoch_set:
        call.initial_epoch_set = False
        call.model._initial_epoch = call.initial_epoch_before


def skip_executions(call: FitCall, count: int) -> None:
    """Makes the next epoch of this fit begin after its first ``count`` executions.

    Relies on (Keras 3.15, ``keras/src/trainers/epoch_iterator.py``). Call from
    ``on_epoch_begin``: fit then calls ``iter(epoch_iterator)``, which calls
    ``_enumerate_iterator()`` once; this replaces it, for that one call, with a generator
    that drops the first ``count`` ``(begin_step, end_step, iterator)`` items. No input
    is read for them (the TensorFlow backend's ``train_function`` reads it).
    """
    iterator = call.epoch_iterator
    original = iterator._enumerate_iterator

    def skipping() -> Iterator[Any]:
        del iterator._enumerate_iterator  # once: later epochs use the class's method
        steps = original()
        for _ in range(count):
            if next(steps, None) is None:
                return iter(())
        return steps

    iterator._enumerate_iterator = _marked(skipping, original, call)
    call.undo.append(lambda: _restore_attribute(iterator, "_enumerate_iterator", original))


def detach(call: FitCall) -> None:
    """Undoes every change :func:`attach`'s callers made for this fit. Idempotent."""
    reset_initial_epoch(call)
    while call.undo:
        call.undo.pop()()


def detach_leftovers(model: Any) -> None:
    """Removes the wrappers of an earlier fit of ``model`` that ended with an exception
    (``make_train_function()`` would otherwise keep its wrapped ``train_function``)."""
    for name in ("train_function", "evaluate"):
        fn = model.__dict__.get(name)
        marked = getattr(fn, _MARK, None)
        if marked is not None:
            detach(marked[1])


def _restore_attribute(obj: Any, name: str, original: Any) -> None:
    """Puts ``original`` back as ``obj.name``, or removes the instance attribute when
    ``original`` is what the class gives (a bound method)."""
    current = obj.__dict__.get(name)
    if current is not None and getattr(current, _MARK, None) is None:
        return  # replaced by someone else since: leave theirs
    bound_from_class = getattr(original, "__self__", None) is obj and getattr(
        type(obj), name, None
    ) is getattr(original, "__func__", None)
    if bound_from_class:
        obj.__dict__.pop(name, None)
    else:
        setattr(obj, name, original)


def fit_input(call: FitCall) -> Any:
    """The input fit makes its iterators of.

    Relies on (Keras 3.15, ``keras/src/backend/tensorflow/trainer.py``):
    ``TFEpochIterator._distributed_dataset``, what ``_get_iterator()`` returns and
    ``_enumerate_iterator`` calls ``iter`` on (a ``tf.data.Dataset`` with no strategy).
    """
    dataset = getattr(call.epoch_iterator, "_distributed_dataset", None)
    if dataset is None:
        raise MissingKerasInternal(
            "TFEpochIterator._distributed_dataset", "the input fit makes its iterators of"
        )
    return dataset


def user_steps_per_epoch(call: FitCall) -> Optional[int]:
    """``steps_per_epoch`` as passed to fit (``EpochIterator.steps_per_epoch``)."""
    return getattr(call.epoch_iterator, "steps_per_epoch", None)


def steps_per_execution(model: Any) -> int:
    """Steps per ``train_function`` call (``Trainer.steps_per_execution``, public)."""
    return int(getattr(model, "steps_per_execution", 1) or 1)
