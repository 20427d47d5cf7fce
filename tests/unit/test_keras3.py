"""``tf_failure_handling.keras.PreemptionCheckpoint`` in this process, without a strategy.

A termination notice is delivered before a chosen batch (as a termination source
would, and the test waits until the handler handled it, so no race decides where it
lands); the default ``exit_fn`` raises ``SystemExit(42)``. Success for a preemption
test: fit exits with 42 after saving at a position between the notice and the end;
the next fit (fresh model, same directory) restores it, starts at that epoch and
batch, ends with ``optimizer.iterations == epochs * steps`` and with weights equal
(bit for bit) to those of one uninterrupted plain ``fit``. MirroredStrategy and
MultiWorkerMirroredStrategy runs are in ``tests/integration/test_keras3.py``.

The Keras internals of ``_integrations/keras_internals.py`` are tested here too: each
one, and the error that names it when a Keras version lacks it.
"""

from __future__ import annotations

import logging
import sys
import time

import numpy as np
import pytest

keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")

from tf_failure_handling._integrations import keras_internals as _keras_internals  # noqa: E402
from tf_failure_handling.keras import (  # noqa: E402
    FitPosition,
    MissingKerasInternal,
    PreemptionCheckpoint,
    saved_position,
)

EPOCHS, STEPS = 3, 5
BATCH = 8
NOTICE_AT = 7  # the notice arrives before the 8th batch of the first attempt (epoch 1)
HANG = 60.0  # bound on waiting for the handler to handle a notice


def make_model(steps_per_execution: int = 1):
    model = keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(3, kernel_initializer=keras.initializers.RandomNormal(seed=3)),
            keras.layers.BatchNormalization(),
            keras.layers.Dense(2, kernel_initializer=keras.initializers.RandomNormal(seed=4)),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
        loss="mse",
        steps_per_execution=steps_per_execution,
    )
    return model


def batches(count: int = EPOCHS * STEPS):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((count, BATCH, 4)).astype(np.float32)
    y = rng.standard_normal((count, BATCH, 2)).astype(np.float32)
    return x, y


def dataset(varying: bool = False, skip: int = 0):
    x, y = batches()
    if varying:
        ds = tf.data.Dataset.from_tensor_slices((x, y))
    else:
        ds = tf.data.Dataset.from_tensors((x[0], y[0]))
    return ds.repeat().skip(skip)


class NoticeAt(keras.callbacks.Callback):
    """Delivers a termination notice before this fit's batch number ``at`` (counted from 0)."""

    def __init__(self, checkpoint: PreemptionCheckpoint, at: int) -> None:
        super().__init__()
        self.checkpoint, self.at, self.seen = checkpoint, at, 0

    def on_train_batch_begin(self, batch, logs=None):
        if self.seen == self.at:
            handler = self.checkpoint.handler
            before = handler._notices_handled
            handler._notify_termination()
            deadline = time.monotonic() + HANG
            while handler._notices_handled == before:
                assert time.monotonic() < deadline, "the handler did not handle the notice"
                time.sleep(0.001)
        self.seen += 1


class Recorder(keras.callbacks.Callback):
    """What one fit trained: its first (epoch, batch), its batch count, its start iterations."""

    def __init__(self) -> None:
        super().__init__()
        self.first = None
        self.batches = 0
        self.start_iterations = None
        self.epoch = None

    def on_train_begin(self, logs=None):
        self.start_iterations = int(self.model.optimizer.iterations.numpy())

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if self.first is None:
            self.first = (self.epoch, batch)
        self.batches += 1


@pytest.fixture
def checkpoints(tmp_path):
    """``make()`` -> a PreemptionCheckpoint on ``tmp_path/train/ckpt``; all closed at teardown
    (a fit that exited through ``SystemExit`` leaves its handler open, as in a real exit)."""
    made = []

    def make(**kwargs) -> PreemptionCheckpoint:
        callback = PreemptionCheckpoint(tmp_path / "train" / "ckpt", **kwargs)
        made.append(callback)
        return callback

    yield make
    for callback in made:
        callback._finish(completed=False)


def plain_fit(model=None, data=None, **fit):
    model = model or make_model()
    fit.setdefault("steps_per_epoch", STEPS)
    if "x" not in fit:
        fit["x"] = dataset() if data is None else data
    model.fit(epochs=EPOCHS, verbose=0, shuffle=False, **fit)
    return model


def preempt(checkpoints, model, data, at: int = NOTICE_AT, **fit) -> FitPosition:
    """Fit with a notice before batch ``at``: exits 42 after saving; returns the position."""
    callback = checkpoints()
    fit.setdefault("steps_per_epoch", STEPS)
    with pytest.raises(SystemExit) as exited:
        model.fit(
            data,
            epochs=EPOCHS,
            verbose=0,
            shuffle=False,
            callbacks=[callback, NoticeAt(callback, at)],
            **fit,
        )
    assert exited.value.code == 42
    position = saved_position(callback.checkpoint_dir)
    assert position is not None, "no checkpoint after the preemption exit"
    return position


def assert_same_weights(actual, expected) -> None:
    for a, e in zip(actual.get_weights(), expected.get_weights()):
        assert a.shape == e.shape
        diff = float(np.max(np.abs(a - e))) if a.size else 0.0
        assert np.array_equal(a, e), f"max abs difference {diff} from the uninterrupted run"


def index(position: FitPosition, steps: int = STEPS) -> int:
    return position.epoch * steps + position.batch


# ------------------------------------------------------------------ resuming


def test_preempted_fit_resumes_at_the_saved_batch_with_the_uninterrupted_weights(checkpoints):
    reference = plain_fit()

    first = make_model()
    position = preempt(checkpoints, first, dataset())
    done = index(position)
    assert NOTICE_AT <= done < EPOCHS * STEPS, position
    assert int(first.optimizer.iterations.numpy()) == done  # saved before the next step

    second, recorder, callback = make_model(), Recorder(), checkpoints()
    second.fit(
        dataset(),
        epochs=EPOCHS,
        steps_per_epoch=STEPS,
        verbose=0,
        shuffle=False,
        callbacks=[callback, recorder],
    )
    assert callback.restored_position == position
    assert recorder.start_iterations == done
    assert recorder.first == (position.epoch, position.batch)
    assert recorder.batches == EPOCHS * STEPS - done
    assert int(second.optimizer.iterations.numpy()) == EPOCHS * STEPS
    assert_same_weights(second, reference)
    # Completed: the checkpoint is gone, so a later fit starts afresh.
    assert saved_position(callback.checkpoint_dir) is None
    assert callback.handler is None


def test_varying_batches_resume_at_the_saved_position_with_nothing_skipped_by_hand(checkpoints):
    """fit's input is positioned by the callback (issue 49): the resumed fit, given the
    same input as the interrupted one, trains the batches an uninterrupted fit would."""
    reference = plain_fit(data=dataset(varying=True))
    position = preempt(checkpoints, make_model(), dataset(varying=True))
    assert index(position) > 0

    resumed = make_model()
    resumed.fit(
        dataset(varying=True),
        epochs=EPOCHS,
        steps_per_epoch=STEPS,
        verbose=0,
        shuffle=False,
        callbacks=[checkpoints()],
    )
    assert int(resumed.optimizer.iterations.numpy()) == EPOCHS * STEPS
    assert_same_weights(resumed, reference)


def test_the_same_model_fits_again_in_the_same_process_after_the_exit(checkpoints):
    """The exit left fit's wrappers on the model; the next fit removes them, resumes, and
    leaves a plain train_function behind."""
    reference = plain_fit()
    model = make_model()
    position = preempt(checkpoints, model, dataset())
    assert getattr(model.train_function, _keras_internals._MARK, None) is not None

    recorder = Recorder()
    model.fit(
        dataset(),
        epochs=EPOCHS,
        steps_per_epoch=STEPS,
        verbose=0,
        shuffle=False,
        callbacks=[checkpoints(), recorder],
    )
    assert recorder.first == (position.epoch, position.batch)
    assert int(model.optimizer.iterations.numpy()) == EPOCHS * STEPS
    assert_same_weights(model, reference)
    assert getattr(model.train_function, _keras_internals._MARK, None) is None
    assert "evaluate" not in model.__dict__
    assert model._initial_epoch is None


def test_steps_per_execution_resumes_at_an_execution_boundary(checkpoints):
    per_call, steps = 2, 4  # steps_per_epoch a multiple of steps_per_execution, as Keras needs
    reference = plain_fit(make_model(per_call), steps_per_epoch=steps)
    position = preempt(checkpoints, make_model(per_call), dataset(), at=3, steps_per_epoch=steps)
    assert position.batch % per_call == 0, position

    resumed, recorder = make_model(per_call), Recorder()
    resumed.fit(
        dataset(),
        epochs=EPOCHS,
        steps_per_epoch=steps,
        verbose=0,
        shuffle=False,
        callbacks=[checkpoints(), recorder],
    )
    assert recorder.first == (position.epoch, position.batch)
    assert recorder.batches * per_call == EPOCHS * steps - index(position, steps)
    assert int(resumed.optimizer.iterations.numpy()) == EPOCHS * steps
    assert_same_weights(resumed, reference)


def test_steps_per_epoch_none_with_a_known_length_runs_the_remaining_batches(checkpoints):
    """Arrays (length known up front): the resumed epoch runs its remaining batches."""
    x, y = batches(STEPS)
    x = np.repeat(x[:1], STEPS, axis=0).reshape(-1, 4)  # equal batches
    y = np.repeat(y[:1], STEPS, axis=0).reshape(-1, 2)
    arrays = {"x": x, "y": y, "batch_size": BATCH, "steps_per_epoch": None}
    reference = plain_fit(**arrays)
    model = make_model()
    callback = checkpoints()
    with pytest.raises(SystemExit):
        model.fit(
            epochs=EPOCHS,
            verbose=0,
            shuffle=False,
            callbacks=[callback, NoticeAt(callback, 6)],
            **arrays,
        )
    position = saved_position(callback.checkpoint_dir)

    resumed, recorder = make_model(), Recorder()
    resumed.fit(
        epochs=EPOCHS, verbose=0, shuffle=False, callbacks=[checkpoints(), recorder], **arrays
    )
    assert recorder.first == (position.epoch, position.batch)
    assert int(resumed.optimizer.iterations.numpy()) == EPOCHS * STEPS
    assert_same_weights(resumed, reference)


@pytest.mark.filterwarnings("ignore:Your input ran out of data:UserWarning")  # Keras', per epoch
def test_steps_per_epoch_none_with_an_unknown_length_resumes_at_the_saved_batch(checkpoints):
    """The input's length is unknown to Keras, but its position is saved: the resumed
    epoch runs its remaining batches, and the weights are an uninterrupted fit's."""
    unknown = dataset(varying=True).take(STEPS).filter(lambda x, y: True)
    assert unknown.cardinality() == tf.data.UNKNOWN_CARDINALITY
    plain = plain_fit(x=unknown, steps_per_epoch=None)
    plain_steps = int(plain.optimizer.iterations.numpy())
    position = preempt(checkpoints, make_model(), unknown, at=8, steps_per_epoch=None)
    assert position.batch > 0, position  # saved inside an epoch

    resumed, recorder = make_model(), Recorder()
    resumed.fit(
        unknown, epochs=EPOCHS, verbose=0, shuffle=False, callbacks=[checkpoints(), recorder]
    )
    assert recorder.first == (position.epoch, position.batch)
    assert int(resumed.optimizer.iterations.numpy()) == plain_steps
    assert_same_weights(resumed, plain)


@pytest.mark.filterwarnings("ignore:Your input ran out of data:UserWarning")  # Keras', per epoch
def test_an_input_that_cannot_be_positioned_restarts_an_epoch_of_unknown_length(
    checkpoints, caplog
):
    """A generator (not positioned, and warned about): with its length unknown the epoch
    restarts at batch 0, and says so; its batches trained before the save run again."""
    x, y = batches(STEPS)

    def generate():
        yield from zip(x, y)

    spec = (tf.TensorSpec((BATCH, 4), tf.float32), tf.TensorSpec((BATCH, 2), tf.float32))
    unknown = tf.data.Dataset.from_generator(generate, output_signature=spec)
    plain = plain_fit(x=unknown, steps_per_epoch=None)
    plain_steps = int(plain.optimizer.iterations.numpy())
    with caplog.at_level(logging.WARNING, logger="tf_failure_handling"):
        position = preempt(checkpoints, make_model(), unknown, at=8, steps_per_epoch=None)
    assert any("it runs Python code" in r.message for r in caplog.records)
    assert position.batch > 0, position

    resumed, recorder = make_model(), Recorder()
    with caplog.at_level(logging.WARNING, logger="tf_failure_handling"):
        resumed.fit(
            unknown, epochs=EPOCHS, verbose=0, shuffle=False, callbacks=[checkpoints(), recorder]
        )
    assert recorder.first == (position.epoch, 0)
    assert int(resumed.optimizer.iterations.numpy()) == plain_steps + position.batch
    assert any("starts again at its first batch" in r.message for r in caplog.records)


def test_a_fit_without_a_notice_trains_as_plain_fit_and_leaves_no_checkpoint(checkpoints):
    reference = plain_fit()
    model, callback = make_model(), checkpoints()
    plain_fit(model, callbacks=[callback])
    assert_same_weights(model, reference)
    assert callback.restored_position is None
    assert saved_position(callback.checkpoint_dir) is None


# ------------------------------------------------------------------ errors


def test_an_error_in_another_callback_leaves_fit_unchanged_in_local_mode(checkpoints):
    class Failing(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 2:
                raise KeyError("callback failure")

    callback = checkpoints()
    with pytest.raises(KeyError, match="callback failure"):
        plain_fit(callbacks=[callback, Failing()])
    assert callback.handler is not None  # fit raised: on_train_end was not called


def test_an_unbuilt_model_is_refused_with_what_to_do(checkpoints):
    model = keras.Sequential([keras.layers.Dense(2)])  # no input shape: built at the first step
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(ValueError, match="needs a built model"):
        model.fit(
            dataset(),
            epochs=1,
            steps_per_epoch=2,
            verbose=0,
            shuffle=False,
            callbacks=[checkpoints()],
        )
    assert "train_function" not in model.__dict__ or not hasattr(
        model.train_function, _keras_internals._MARK
    )


def test_constructor_checks_its_arguments():
    with pytest.raises(TypeError, match="checkpoint_dir"):
        PreemptionCheckpoint(3)
    with pytest.raises(ValueError, match="empty"):
        PreemptionCheckpoint("")


def test_only_the_tensorflow_backend_is_accepted(checkpoints, monkeypatch):
    monkeypatch.setattr(keras.backend, "backend", lambda: "jax")
    with pytest.raises(ValueError, match="TensorFlow backend"):
        plain_fit(callbacks=[checkpoints()])


# ------------------------------------------------------------------ internals


def test_keras_version_is_the_tested_one():
    """The internals were read from these releases; a new one needs them re-read. Python
    3.11 and later run the release they were written for (the Makefile's pin); 3.10, which
    Keras 3.13 and later do not support, runs 3.12 (``make test-compat``)."""
    expected = _keras_internals.TESTED_KERAS if sys.version_info >= (3, 11) else "3.12"
    assert expected in _keras_internals.TESTED_KERAS_RELEASES
    assert keras.__version__.startswith(expected + "."), keras.__version__


def test_an_untested_keras_release_is_warned_about_once(checkpoints, monkeypatch, caplog):
    monkeypatch.setattr(keras, "__version__", "3.99.0")
    monkeypatch.setattr(_keras_internals, "_warned_version", [])
    with caplog.at_level(logging.WARNING, logger="tf_failure_handling"):
        plain_fit(callbacks=[checkpoints()])
        plain_fit(callbacks=[checkpoints()])
    warned = [r.message for r in caplog.records if "this is Keras 3.99.0" in r.message]
    assert len(warned) == 1, caplog.records


def test_attach_finds_the_fit_call_and_detach_undoes_every_change():
    seen = {}

    class Probe(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            call = _keras_internals.attach(self.model)
            seen["call"] = call
            original_train = self.model.train_function
            _keras_internals.wrap_train_function(call, lambda fn, it: fn(it))
            _keras_internals.report_errors(call, lambda e, where: None)
            _keras_internals.start_at_epoch(call, 1)
            assert self.model.train_function is not original_train
            assert "catch_stop_iteration" in call.epoch_iterator.__dict__
            assert "on_epoch_begin" in call.callbacks.__dict__
            assert "evaluate" in self.model.__dict__

        def on_epoch_begin(self, epoch, logs=None):
            seen.setdefault("epochs", []).append(epoch)

        def on_train_end(self, logs=None):
            _keras_internals.detach(seen["call"])

    model = make_model()
    plain_fit(model, callbacks=[Probe()])
    call = seen["call"]
    assert seen["epochs"] == list(range(1, EPOCHS))  # _initial_epoch was read
    assert int(model.optimizer.iterations.numpy()) == (EPOCHS - 1) * STEPS
    assert getattr(model.train_function, _keras_internals._MARK, None) is None
    assert "evaluate" not in model.__dict__
    assert "catch_stop_iteration" not in call.epoch_iterator.__dict__
    assert "on_epoch_begin" not in call.callbacks.__dict__
    assert model._initial_epoch is None


def test_skip_executions_drops_step_numbers_not_input():
    seen = []

    class Skip(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.call = _keras_internals.attach(self.model)

        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 0:
                _keras_internals.skip_executions(self.call, 3)

        def on_train_batch_begin(self, batch, logs=None):
            seen.append(batch)

    model = make_model()
    x, y = batches()
    data = tf.data.Dataset.from_tensor_slices((x, y)).repeat()
    model.fit(data, epochs=2, steps_per_epoch=STEPS, verbose=0, shuffle=False, callbacks=[Skip()])
    assert seen == [3, 4, 0, 1, 2, 3, 4]  # the skip held for the first epoch only
    # 7 steps, on the first 7 batches of the input: as a plain fit of 7 steps.
    reference = make_model()
    reference.fit(data, epochs=1, steps_per_epoch=7, verbose=0, shuffle=False)
    assert_same_weights(model, reference)


def test_report_errors_reports_what_leaves_the_batch_loop_and_epoch_hooks():
    reports = []

    class Attach(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            call = _keras_internals.attach(self.model)
            _keras_internals.report_errors(call, lambda e, where: reports.append((e, where)))

    class FailAtEpochEnd(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            raise LookupError("epoch hook")

    with pytest.raises(LookupError):
        plain_fit(callbacks=[Attach(), FailAtEpochEnd()])
    assert [(type(e).__name__, w) for e, w in reports] == [
        ("LookupError", "a callback's on_epoch_end")
    ]

    reports.clear()

    class FailInBatch(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            raise ArithmeticError("batch hook")

    with pytest.raises(ArithmeticError):
        plain_fit(callbacks=[Attach(), FailInBatch()])
    assert [(type(e).__name__, w) for e, w in reports] == [("ArithmeticError", "a training batch")]

    reports.clear()

    class FailInValidation(keras.callbacks.Callback):
        def on_test_batch_end(self, batch, logs=None):
            raise FloatingPointError("validation hook")

    with pytest.raises(FloatingPointError):
        plain_fit(
            callbacks=[Attach(), FailInValidation()],
            validation_data=dataset().take(2),
        )
    assert [(type(e).__name__, w) for e, w in reports] == [("FloatingPointError", "validation")]


# Keras 3.12 (Python 3.10's, TESTED_KERAS_RELEASES) converts a keras Variable whose
# __array__ takes no copy= keyword, which NumPy 2 (TF 2.21's) reports; Keras 3.15 does not.
@pytest.mark.filterwarnings("ignore:__array__ implementation doesn't accept a copy keyword")
def test_end_of_input_passes_through_the_wrapped_train_step(checkpoints):
    """A dataset shorter than steps_per_epoch: Keras' end-of-input handling still works
    (the warning is Keras'), and nothing is reported."""
    short = dataset().take(STEPS + 2)
    model = make_model()
    with pytest.warns(UserWarning, match="ran out of data"):
        model.fit(
            short,
            epochs=2,
            steps_per_epoch=STEPS,
            verbose=0,
            shuffle=False,
            callbacks=[checkpoints()],
        )
    assert int(model.optimizer.iterations.numpy()) == STEPS + 2


# A Keras version without an internal: each is removed in turn, and fit fails at once
# with MissingKerasInternal naming it (before any step ran).


def _fit_expecting_missing(checkpoints, model=None) -> MissingKerasInternal:
    model = model or make_model()
    with pytest.raises(MissingKerasInternal) as raised:
        plain_fit(model, callbacks=[checkpoints()])
    assert int(model.optimizer.iterations.numpy()) == 0
    return raised.value


def test_missing_epoch_iterator_method_is_named(checkpoints, monkeypatch):
    from keras.src.trainers.epoch_iterator import EpochIterator

    monkeypatch.delattr(EpochIterator, "_enumerate_iterator")
    error = _fit_expecting_missing(checkpoints)
    assert error.internal == "EpochIterator._enumerate_iterator"
    assert "Keras 3.15" in str(error) and "EpochIterator._enumerate_iterator" in str(error)


def test_missing_initial_epoch_is_named(checkpoints):
    model = make_model()
    del model._initial_epoch
    error = _fit_expecting_missing(checkpoints, model)
    assert error.internal == "model._initial_epoch"


def test_missing_train_function_is_named(checkpoints, monkeypatch):
    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer

    made = []

    def make_later(self, force=False):
        made.append(self)  # a Keras that makes train_function after on_train_begin

    monkeypatch.setattr(TensorFlowTrainer, "make_train_function", make_later)
    error = _fit_expecting_missing(checkpoints)
    assert made and error.internal == "model.train_function"


def test_a_fit_loop_not_on_the_stack_is_named(checkpoints):
    """A Keras whose fit is not TensorFlowTrainer.fit, or calls callbacks elsewhere."""
    callback = checkpoints()
    callback.set_model(make_model())
    with pytest.raises(MissingKerasInternal, match=r"TensorFlowTrainer\.fit call"):
        callback.on_train_begin()
    assert callback.handler is None
