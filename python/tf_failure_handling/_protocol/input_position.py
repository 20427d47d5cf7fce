"""The input pipeline's position, saved with the agreed step and replayed at the restore.

A position is a few integers: which iterator of the input was in use (the ``n``-th made
of it, counted across restarts) and how many batches it had given when the checkpoint
was saved. Every worker computes the same numbers at the agreed step (each makes the
same iterators and trains the same steps), so whichever worker's copy reaches storage
holds them. At the restore, :class:`InputTracker` makes the next iterator the
interrupted run would have used, at its next batch (``_integrations.tf_input``).

Where the position comes from: ``fit`` reports every step's iterator (:meth:`step`);
a custom loop's ``handler.track_input`` counts the handler's runs since the iterator in
use was made (:meth:`InputTracker.batches`). Docs: docs/input-position.md.
"""

from __future__ import annotations

import collections.abc
import json
import logging
import numbers
from typing import Any, Callable, Optional

from .._integrations import tf_input, tf_keras_fit
from .._native import InputResume

#: The core's timing of a resume's slow part (``InputResume.Timing``).
InputTiming = InputResume.Timing

log = logging.getLogger("tf_failure_handling")

#: Version of the position's JSON layout.
FORMAT = 1
#: The attribute the position is saved under in a ``tf.train.Checkpoint`` (custom loops
#: and tf_keras; Keras 3's ``PreemptionCheckpoint`` keeps it in its own fit position).
STATE_NAME = "tf_failure_handling_input"
#: Its key in the checkpoint file.
STATE_KEY = f"{STATE_NAME}/.ATTRIBUTES/py_state"
# How often a replay is logged, and how slow an advance must be to be logged, are the
# core's (src/input_position.rs: REPLAY_PROGRESS_EVERY, ADVANCE_LOGGED_AFTER; the
# InputTiming of each).


def parse(value: Any) -> dict:
    """The position saved as ``value`` (JSON, str or bytes); ``ValueError`` if unreadable."""
    if isinstance(value, bytes):
        value = value.decode("utf-8")
    data = json.loads(value) if isinstance(value, str) else dict(value)
    if data.get("format") != FORMAT:
        raise ValueError(f"Unknown input position format in the checkpoint: {value!r}")
    for name in ("iteration", "batches", "workers"):
        if not isinstance(data.get(name), int):
            raise ValueError(f"The input position in the checkpoint lacks {name!r}: {value!r}")
    return data


def is_builder(obj: Any) -> bool:
    """Whether ``track_input`` was given a function that builds the input (random
    access), not the input itself."""
    if not callable(obj):
        return False
    try:
        tf_input.per_worker_datasets(obj)
    except tf_input.NotPositionable:
        return True
    return False


def read_saved(path: Optional[str]) -> Optional[dict]:
    """The position in the checkpoint at ``path`` (its prefix), or None if it has none."""
    if not path:
        return None
    import tensorflow as tf

    reader = tf.train.load_checkpoint(path)
    if not reader.has_tensor(STATE_KEY):
        return None
    return parse(reader.get_tensor(STATE_KEY))


def read_saved_or_warn(path: Optional[str]) -> Optional[dict]:
    """:func:`read_saved`, with a warning (and None) for a position that cannot be read:
    the input then starts at its first element, as with no position."""
    try:
        return read_saved(path)
    except (ValueError, KeyError) as e:
        log.warning(
            "The input position in %s cannot be read (%s): the input starts at its first element.",
            path,
            e,
        )
        return None


def _state_class() -> Any:
    import tensorflow as tf

    class InputState(tf.train.experimental.PythonState):
        """The position in a checkpoint: written by the tracker at save time."""

        def __init__(self) -> None:
            self.tracker: Optional[InputTracker] = None
            self.restored: Optional[dict] = None

        def serialize(self) -> str:
            tracker = self.tracker
            return json.dumps(tracker.snapshot() if tracker is not None else {"format": FORMAT})

        def deserialize(self, string_value: Any) -> None:
            try:
                self.restored = parse(string_value)
            except ValueError:
                self.restored = None

    return InputState


_STATE_CLASS: list = []


def new_state() -> Any:
    """A ``PythonState`` for a checkpoint's :data:`STATE_NAME` attribute."""
    if not _STATE_CLASS:
        _STATE_CLASS.append(_state_class())
    return _STATE_CLASS[0]()


class InputTracker:
    """The position of one input (a ``tf.data.Dataset`` or a distributed dataset).

    ``runs`` returns the handler's run count (``run()`` calls, or ``fit``'s steps): the
    iterator made last is the one in use, and each run since it was made drew
    ``batches_per_run`` batches from it (``fit``: ``steps_per_execution``).
    """

    def __init__(
        self,
        dataset: Any,
        workers: int,
        where: str,
        runs: Callable[[], int],
        batches_per_run: int = 1,
        steps_per_iteration: Optional[int] = None,
        builder: Optional[Callable[[int, int], Any]] = None,
    ) -> None:
        #: ``builder(iteration, batch)`` makes the input of that iteration from that batch
        #: (random access: nothing replayed); ``dataset`` is then a :class:`BuiltInput`.
        self._builder = builder
        if builder is not None:
            dataset = BuiltInput(self)
        self.dataset = dataset
        self.workers = workers
        self._runs = runs
        self._batches_per_run = batches_per_run
        self._steps_per_iteration = steps_per_iteration
        #: Why the input's order cannot be replayed (None: it can).
        self.why_not = None if builder else tf_input.why_not_positionable(dataset)
        #: Elements one iterator yields on this worker (None: unknown or infinite).
        self.per_iteration = (
            tf_input.batches_per_iteration(builder(0, 0))
            if builder
            else None
            if self.why_not
            else tf_input.batches_per_iteration(dataset)
        )
        if self.why_not:
            log.warning(
                "The input position of %s is not saved: %s. After a restart this input "
                "starts again at its first element, as with TensorFlow's handler (the "
                "batches of the interrupted epoch trained before the save are trained "
                "again). docs/input-position.md says which inputs can be positioned.",
                where,
                self.why_not,
            )
        #: Iterators this process made of the input.
        self.made = 0
        #: The iteration number of this process's first iterator (the advance at a resume).
        self._offset = 0
        #: (iterator number in this process, batches to skip) of a resume, until used.
        self._plan: Optional[tuple[int, int]] = None
        self._advance = 0
        #: [iteration, first batch, run count when made] of the iterator in use.
        self._current: Optional[list] = None
        self._previous = 0
        #: Called once before the first iterator is made (a resume planned late).
        self.before_first: Optional[Callable[[], None]] = None
        self._progress: Optional[_Progress] = None
        #: The position restored (for logs and tests), and the resume made of it.
        self.restored: Optional[dict] = None
        self.resumed_at: Optional[tuple[int, int]] = None
        #: Whether ``iter(dataset)`` is counted: anything but a dataset (a list, an
        #: array, an iterator) is left as it is, not positioned.
        self._tracked = builder is None and tf_input.is_input(dataset)
        if self._tracked:
            tf_input.track(dataset, self._on_iter)

    def close(self) -> None:
        if self._tracked:
            tf_input.untrack(self.dataset)
        if self._progress is not None:
            self._progress.stop()

    # ----------------------------------------------------------------- saving

    def batches(self) -> int:
        """Batches the iterator in use has given at this moment."""
        current = self._current
        if current is None:
            return 0
        return InputResume.batches_given(
            current[1], max(0, self._runs()), current[2], self._batches_per_run
        )

    def snapshot(self) -> dict:
        """The position to save now (the agreed step's)."""
        if self._current is None:
            planned = self.resumed_at or (-1, 0)
            iteration, batches = planned
        else:
            iteration, batches = self._current[0], self.batches()
        return {
            "format": FORMAT,
            "iteration": int(iteration),
            "batches": int(batches),
            "previous": int(self._previous),
            "per_iteration": self.per_iteration,
            "workers": int(self.workers),
            "positioned": self.why_not is None,
        }

    # -------------------------------------------------------------- resuming

    def resume(
        self, saved: Optional[dict], first_used: int = 0, new_iteration: Optional[bool] = None
    ) -> None:
        """Plans the restore of ``saved``: this process's iterator number ``first_used``
        (the first it trains from) is made as the interrupted run's next one.

        ``new_iteration`` says whether the resumed loop starts a new iterator rather
        than going on with the saved one (None: the input's length, the loop's
        ``steps_per_iteration`` or the previous iterator's length decides).
        """
        self.restored = saved
        if saved is None or self.why_not is not None:
            return
        if not saved.get("positioned", True):
            return
        if saved["workers"] != self.workers:
            log.warning(
                "The checkpoint was saved by %d worker(s), this run has %d: each worker's "
                "input resumes after the same number of batches of its own. With "
                "AutoShardPolicy.DATA (the default for input without files) and the same "
                "global batch, that is the interrupted run's next global batch; with files "
                "sharded per worker, or distribute_datasets_from_function, the elements "
                "differ from an uninterrupted run's (docs/input-position.md).",
                saved["workers"],
                self.workers,
            )
        resume = InputResume.of(
            saved["iteration"],
            saved["batches"],
            int(saved.get("previous") or 0),
            self.per_iteration,
            self._steps_per_iteration,
            new_iteration,
            first_used,
        )
        if isinstance(resume, InputResume.Fresh):
            return
        iteration, batches = resume.iteration, resume.batches
        if isinstance(resume, InputResume.Unreachable):
            log.warning(
                "The input position (iterator %d, batch %d) cannot be reached: this run "
                "makes more iterators before training. The input starts at its first element.",
                iteration,
                batches,
            )
            return
        offset = resume.advance
        self._offset = offset
        self._advance = 0 if self._builder is not None else offset
        # The iterator before the resumed one, for a later save's "previous".
        same = iteration == saved["iteration"]
        self._previous = int(saved.get("previous") or 0) if same else saved["batches"]
        self._plan = (first_used, batches)
        self.resumed_at = (iteration, batches)
        log.info(
            "The input resumes at batch %d of its iterator %d (saved: batch %d of iterator %d).",
            batches,
            iteration,
            saved["batches"],
            saved["iteration"],
        )

    def _on_iter(self, dataset: Any, make: Callable[[], Any]) -> Any:
        if self.before_first is not None:
            before, self.before_first = self.before_first, None
            before()
        number = self.made
        self.made += 1
        if self._advance:
            advance, self._advance = self._advance, 0
            _timed_advance(dataset, advance)
        skip = 0
        if self._plan is not None and self._plan[0] == number:
            skip = self._plan[1]
            self._plan = None
        iteration = number + self._offset
        if self._builder is not None:
            iterator = iter(self._builder(iteration, skip))
            skip_logged = False
        else:
            with tf_input.skipping(dataset, skip) as source:
                iterator = make() if source is dataset else tf_input.iterate(source)
            skip_logged = bool(skip)
        if self._current is not None and self.batches() > 0:
            self._previous = self.batches()  # an iterator made and left unused is not one
        self._current = [iteration, skip, self._runs()]
        if skip_logged:
            self._progress = _Progress(self, iteration, skip)
        return iterator


class BuiltInput:
    """What ``track_input(builder)`` returns: each ``iter()`` is the iterator of
    ``builder(iteration, batch)`` -- the next iteration from its first batch, or, first
    after a restore, the saved iteration from its next batch."""

    def __init__(self, tracker: InputTracker) -> None:
        self._tracker = tracker

    def __iter__(self) -> Any:
        return self._tracker._on_iter(self, lambda: None)

    @property
    def tracker(self) -> InputTracker:
        return self._tracker


class _Progress:
    """Logs a line every interval of the core's (``InputTiming``) while a resumed
    iterator replays its skipped batches (TensorFlow skips them inside the first step:
    nothing to count)."""

    def __init__(self, tracker: InputTracker, iteration: int, skip: int) -> None:
        import threading

        self._tracker, self._runs = tracker, tracker._runs()
        self._stopped = threading.Event()
        self._what = f"batch {skip} of iterator {iteration}"
        self._thread = threading.Thread(target=self._log, name="tfh-input-replay", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def done(self) -> bool:
        return not self._thread.is_alive()

    def _log(self) -> None:
        replay = InputTiming()
        while not self._stopped.wait(replay.poll_timeout()):
            try:
                moved = self._tracker._runs() != self._runs
            except Exception:  # noqa: BLE001 - a closed handler: nothing more to report
                return
            if moved:
                return
            so_far = replay.poll()
            if so_far is not None:
                log.info(
                    "Replaying the input to %s: %.0fs so far (the first resumed step starts "
                    "when it is reached).",
                    self._what,
                    so_far,
                )


def _timed_advance(dataset: Any, count: int) -> None:
    making = InputTiming(advance=True)
    tf_input.advance(dataset, count)
    took = making.poll()  # None: too quick to be worth a line
    if took is not None:
        log.info("Made %d earlier iterator(s) of the input in %.1fs.", count, took)


def track_tf_keras_fit(
    checkpoints: Any, workers: int, runs: Callable[[], int]
) -> Optional[InputTracker]:
    """Tracks the input of the tf_keras ``fit`` that is making this handler
    (``BackupAndRestore(save_before_preemption=True)``), or returns None.

    tf_keras counts one run per execution of ``steps_per_execution`` batches. It makes
    one iterator before the first epoch and, when each epoch makes its own, trains from
    the second: a resumed epoch that starts at batch 0 starts a new iterator.
    """
    fit = tf_keras_fit.fit_on_stack(checkpoints.read._checkpoint)
    if fit is None:
        return None
    state = checkpoints.attach_state(STATE_NAME, new_state)
    tracker = InputTracker(
        fit.dataset,
        workers,
        "model.fit's input",
        runs=runs,
        batches_per_run=fit.steps_per_execution(),
    )
    state.tracker = tracker
    saved = read_saved_or_warn(checkpoints.restored_path)

    def plan() -> None:  # fit has set the restored epoch and batch by now
        if fit.recreates_iterator():
            tracker.resume(saved, first_used=1, new_iteration=fit.initial_step() == 0)
        else:
            tracker.resume(saved, first_used=0, new_iteration=False)

    tracker.before_first = plan
    return tracker


def track_input(
    checkpoints: Any,
    workers: int,
    dataset: Any,
    steps_per_epoch: Optional[int],
    batches_per_run: int,
    runs: Callable[[], int],
) -> InputTracker:
    """``handler.track_input(dataset, steps_per_epoch, batches_per_run)``: checks the two
    counts, then tracks ``dataset`` in place of the input the handler tracked before (if
    any), resumed at the position saved in the restored checkpoint.

    Raises:
      TypeError: ``dataset`` is neither an input, a builder nor iterable.
      ValueError: a count is not a positive integer.
    """
    if not (is_builder(dataset) or isinstance(dataset, collections.abc.Iterable)):
        raise TypeError(
            "track_input takes a tf.data.Dataset, what strategy.experimental_distribute_"
            "dataset or distribute_datasets_from_function returned, or a function "
            "builder(iteration, batch) returning the input of that iteration; another "
            "iterable (a list, an array, an iterator) is returned unchanged, not "
            f"positioned. Got {type(dataset).__name__}: {dataset!r:.80}"
        )
    for name, value in (
        ("steps_per_epoch", steps_per_epoch),
        ("batches_per_run", batches_per_run),
    ):
        if value is None and name == "steps_per_epoch":
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    state = checkpoints.attach_state(STATE_NAME, new_state)
    if state.tracker is not None:
        log.warning(
            "track_input: this handler already tracks an input; its position is no "
            "longer saved (one input per handler: the one the training steps read)."
        )
        state.tracker.close()
    builder = dataset if is_builder(dataset) else None
    tracker = InputTracker(
        dataset,
        workers,
        "the input given to track_input",
        runs=runs,
        batches_per_run=int(batches_per_run),
        steps_per_iteration=steps_per_epoch,
        builder=builder,
    )
    state.tracker = tracker
    tracker.resume(read_saved_or_warn(checkpoints.restored_path))
    return tracker
