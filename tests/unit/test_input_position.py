"""The input position (issue 49), in one process: what can be positioned, what a resume
decides, and that a replayed iterator goes on where the interrupted one stood.

A dataset object's shuffle reshuffles once per iterator made of it; a second object made
the same way starts again at the first order: so "the interrupted run" and "the restart"
are two dataset objects here, as they are two processes in a real restart
(tests/integration/test_input_position.py does that).
"""

from __future__ import annotations

import logging
import time

import pytest

tf = pytest.importorskip("tensorflow", reason="positions tf.data pipelines")

from tf_failure_handling._integrations import tf_input  # noqa: E402
from tf_failure_handling._protocol import input_position  # noqa: E402


def shuffled(n: int = 32, batch: int = 4, repeat: bool = False):
    ds = tf.data.Dataset.range(n).shuffle(n, seed=5, reshuffle_each_iteration=True)
    return (ds.repeat() if repeat else ds).batch(batch)


def ids(batch) -> list:
    return [int(x) for x in batch.numpy()]


class Runs:
    """The handler's run count, set by the test."""

    def __init__(self) -> None:
        self.value = 0

    def __call__(self) -> int:
        return self.value


def tracker(dataset, runs, **kwargs):
    made = input_position.InputTracker(dataset, 1, "the test's input", runs=runs, **kwargs)
    return made


# ----------------------------------------------------------- what can be positioned


def test_a_seeded_shuffle_can_be_positioned():
    assert tf_input.why_not_positionable(shuffled()) is None


@pytest.mark.parametrize(
    "make,why",
    [
        (
            lambda: tf.data.Dataset.from_generator(
                lambda: iter(range(4)), output_signature=tf.TensorSpec((), tf.int64)
            ),
            "Python code",
        ),
        (lambda: tf.data.Dataset.range(8).shuffle(8), "shuffles with no seed"),
        (
            lambda: tf.data.Dataset.range(8).map(
                lambda x: x, num_parallel_calls=2, deterministic=False
            ),
            "deterministic=False",
        ),
        (
            lambda: tf.data.Dataset.range(8).with_options(_nondeterministic()),
            "deterministic=False",
        ),
        (
            lambda: tf.data.Dataset.range(8).map(lambda x: tf.random.shuffle(tf.stack([x, x]))),
            "tf.random.shuffle and no seed",
        ),
    ],
    ids=["generator", "unseeded-shuffle", "nondeterministic-map", "options", "random-shuffle"],
)
def test_input_whose_order_cannot_be_replayed_is_named_with_why(make, why):
    assert why in tf_input.why_not_positionable(make())


def _nondeterministic():
    options = tf.data.Options()
    options.deterministic = False
    return options


def test_something_that_is_no_dataset_cannot_be_positioned():
    assert "is not a tf.data.Dataset" in tf_input.why_not_positionable([1, 2, 3])


def test_the_warning_comes_when_the_input_is_first_seen_and_names_why(caplog):
    caplog.set_level(logging.WARNING, logger="tf_failure_handling")
    made = tracker(tf.data.Dataset.range(8).shuffle(8), Runs())
    try:
        assert "is not saved: it shuffles with no seed" in caplog.text
        assert made.snapshot()["positioned"] is False
    finally:
        made.close()


# ------------------------------------------------------------ save and replay


def interrupted(dataset, runs: Runs, epochs_done: int, batches: int, **kwargs):
    """Trains ``epochs_done`` whole iterators and ``batches`` of the next; returns the
    snapshot a save would write and what the next batch would have been."""
    made = tracker(dataset, runs, **kwargs)
    try:
        per_epoch = int(dataset.cardinality().numpy())
        for _ in range(epochs_done):
            it = iter(dataset)
            for _ in range(per_epoch):
                next(it)
                runs.value += 1
        it = iter(dataset)
        for _ in range(batches):
            next(it)
            runs.value += 1
        snapshot = made.snapshot()
        following = ids(next(it)) if batches < per_epoch else ids(next(iter(dataset)))
        return snapshot, following
    finally:
        made.close()


@pytest.mark.parametrize("epochs_done,batches", [(0, 3), (1, 2), (2, 5), (1, 8)])
def test_the_first_iterator_after_a_restore_goes_on_where_the_saved_one_stood(epochs_done, batches):
    snapshot, following = interrupted(shuffled(), Runs(), epochs_done, batches)
    assert (snapshot["iteration"], snapshot["batches"]) == (epochs_done, batches)
    restart = shuffled()
    runs = Runs()
    runs.value = 100
    made = tracker(restart, runs)
    try:
        made.resume(input_position.parse(snapshot))
        assert ids(next(iter(restart))) == following
    finally:
        made.close()


def test_the_position_is_counted_in_runs_of_several_batches():
    dataset, runs = shuffled(), Runs()
    made = tracker(dataset, runs, batches_per_run=3)
    try:
        iter(dataset)
        runs.value += 2
        assert made.snapshot()["batches"] == 6
    finally:
        made.close()


def test_an_epoch_shorter_than_the_input_ends_at_steps_per_epoch():
    """A loop that takes 4 of 8 batches per iterator and saved after the 4th: the restart
    makes the next iterator, not the rest of the saved one."""
    saved = {"format": 1, "iteration": 0, "batches": 4, "previous": 0, "workers": 1}
    restart = shuffled()
    made = tracker(restart, Runs(), steps_per_iteration=4)
    reference = shuffled()
    iter(reference)
    try:
        made.resume(saved)
        assert made.resumed_at == (1, 0)
        assert ids(next(iter(restart))) == ids(next(iter(reference)))
    finally:
        made.close()


def test_without_steps_per_epoch_the_previous_iterators_length_tells_an_epochs_end():
    saved = {"format": 1, "iteration": 3, "batches": 4, "previous": 4, "workers": 1}
    made = tracker(shuffled(repeat=True), Runs())
    try:
        made.resume(saved)
        assert made.resumed_at == (4, 0)
    finally:
        made.close()


def test_a_repeated_input_goes_on_across_epochs_in_one_iterator():
    snapshot = {"format": 1, "iteration": 0, "batches": 13, "previous": 0, "workers": 1}
    reference = iter(shuffled(repeat=True))
    for _ in range(13):
        next(reference)
    restart = shuffled(repeat=True)
    made = tracker(restart, Runs())
    try:
        made.resume(snapshot)
        assert ids(next(iter(restart))) == ids(next(reference))
    finally:
        made.close()


def test_another_worker_count_is_warned_about_and_resumed_by_batches(caplog):
    caplog.set_level(logging.WARNING, logger="tf_failure_handling")
    made = input_position.InputTracker(shuffled(), 3, "the test's input", runs=Runs())
    try:
        made.resume({"format": 1, "iteration": 1, "batches": 2, "previous": 8, "workers": 2})
        assert "saved by 2 worker(s), this run has 3" in caplog.text
        assert made.resumed_at == (1, 2)
    finally:
        made.close()


def test_a_save_before_the_first_iterator_keeps_the_restored_position():
    made = tracker(shuffled(), Runs())
    try:
        made.resume({"format": 1, "iteration": 2, "batches": 3, "previous": 8, "workers": 1})
        snapshot = made.snapshot()
        assert (snapshot["iteration"], snapshot["batches"]) == (2, 3)
    finally:
        made.close()


def test_an_unreadable_position_is_refused():
    with pytest.raises(ValueError, match="format"):
        input_position.parse('{"format": 99}')
    with pytest.raises(ValueError, match="lacks 'batches'"):
        input_position.parse('{"format": 1, "iteration": 0, "workers": 1}')


def test_untrack_gives_the_dataset_its_own_class_back():
    dataset = shuffled()
    cls = type(dataset)
    made = tracker(dataset, Runs())
    assert isinstance(dataset, cls) and type(dataset) is not cls
    made.close()
    assert type(dataset) is cls


def by_index(iteration: int, batch: int):
    """A random-access input: iteration ``iteration``'s permutation of 32 ids, in
    batches of 4, from batch ``batch`` on (nothing before it is computed)."""
    return (
        tf.data.Dataset.range(batch * 4, 32)
        .map(
            lambda i: tf.random.experimental.index_shuffle(
                i, seed=tf.constant([5, iteration], tf.int64), max_index=31
            )
        )
        .batch(4)
    )


def test_a_builder_is_called_at_the_saved_iteration_and_batch_and_then_the_next():
    runs = Runs()
    made = input_position.InputTracker(None, 1, "the test's input", runs=runs, builder=by_index)
    try:
        first = [ids(b) for b in made.dataset]
        assert sorted(x for b in first for x in b) == list(range(32))
        it = iter(made.dataset)
        for _ in range(3):
            next(it)
            runs.value += 1
        snapshot = made.snapshot()
        following = ids(next(it))
    finally:
        made.close()
    assert (snapshot["iteration"], snapshot["batches"], snapshot["per_iteration"]) == (1, 3, 8)
    calls = []

    def recording(iteration, batch):
        calls.append((iteration, batch))
        return by_index(iteration, batch)

    restart = input_position.InputTracker(
        None, 1, "the test's input", runs=Runs(), builder=recording
    )
    try:
        restart.resume(input_position.parse(snapshot))
        assert ids(next(iter(restart.dataset))) == following
        iter(restart.dataset)
        assert calls[1:] == [(1, 3), (2, 0)], "(0, 0) once for its length, then as saved"
    finally:
        restart.close()


def test_a_long_replay_logs_a_progress_line_until_the_first_resumed_run(caplog, monkeypatch):
    class Quick:
        """The core's InputTiming of a replay, with a line every 0.02 s."""

        def __init__(self, advance: bool = False) -> None:
            self.start, self.next = time.monotonic(), time.monotonic() + 0.02

        def poll_timeout(self) -> float:
            return max(0.0, self.next - time.monotonic())

        def poll(self):
            now = time.monotonic()
            if now < self.next:
                return None
            self.next = now + 0.02
            return now - self.start

    monkeypatch.setattr(input_position, "InputTiming", Quick)
    caplog.set_level(logging.INFO, logger="tf_failure_handling")
    runs = Runs()
    made = tracker(shuffled(), runs)
    try:
        made.resume({"format": 1, "iteration": 0, "batches": 3, "previous": 0, "workers": 1})
        iter(made.dataset)
        deadline = time.monotonic() + 30
        while "Replaying the input to batch 3 of iterator 0" not in caplog.text:
            assert time.monotonic() < deadline, "no progress line within 30 s"
            time.sleep(0.01)
        runs.value += 1  # the first resumed run: the replay is over
        thread = made._progress
        deadline = time.monotonic() + 30
        while not thread.done():
            assert time.monotonic() < deadline, "the progress lines went on after the first run"
            time.sleep(0.01)
    finally:
        made.close()


def test_a_save_after_a_resume_keeps_the_length_of_the_iterator_before():
    made = tracker(shuffled(), Runs())
    try:
        made.resume({"format": 1, "iteration": 2, "batches": 8, "previous": 8, "workers": 1})
        assert made.resumed_at == (3, 0)
        assert made.snapshot()["previous"] == 8, "the saved iterator, used up, is the one before"
        iter(made.dataset)
        assert made.snapshot()["previous"] == 8, "an iterator made is not the one before itself"
    finally:
        made.close()


# ------------------------------------------------------------ inputs at their edges (issue 60)


def two_sources():
    return [tf.data.Dataset.range(0, 16), tf.data.Dataset.range(100, 116)]


def interrupted_and_restarted(make, epochs_done: int, batches: int) -> tuple:
    """The interrupted run's next batch, and the restart's first (two dataset objects,
    as two processes: see the module's docstring). Each epoch runs its iterator to the
    end (the length may be unknown: a choice among datasets)."""
    dataset, runs = make(), Runs()
    made = tracker(dataset, runs)
    try:
        for _ in range(epochs_done):
            for _ in dataset:
                runs.value += 1
        it = iter(dataset)
        for _ in range(batches):
            next(it)
            runs.value += 1
        snapshot, following = made.snapshot(), ids(next(it))
    finally:
        made.close()
    restart = make()
    made = tracker(restart, Runs())
    try:
        assert made.why_not is None, made.why_not
        made.resume(input_position.parse(snapshot))
        return following, ids(next(iter(restart)))
    finally:
        made.close()


@pytest.mark.parametrize(
    "make",
    [
        lambda: tf.data.Dataset.range(32).shuffle(32, seed=5).cache().batch(4),
        lambda: tf.data.Dataset.range(32).shuffle(32, seed=5).cache().repeat(2).batch(4),
        lambda: (
            tf.data.Dataset.random(seed=3, rerandomize_each_iteration=True)
            .take(32)
            .cache()
            .batch(4)
        ),
    ],
    ids=["shuffle-cache", "shuffle-cache-repeat", "rerandomized-random-cache"],
)
def test_a_cache_in_memory_after_a_reshuffle_cannot_be_positioned(make):
    """Every epoch repeats the first one's order (the cache's); a restart makes its
    earlier iterators unpulled (no cache filled) and so reads another order."""
    why = tf_input.why_not_positionable(make())
    assert why is not None and "cache()" in why and "before shuffle()" in why


@pytest.mark.parametrize(
    "make",
    [
        lambda: tf.data.Dataset.range(32).cache().shuffle(32, seed=5).batch(4),
        lambda: (
            tf.data.Dataset.range(32)
            .shuffle(32, seed=5, reshuffle_each_iteration=False)
            .cache()
            .batch(4)
        ),
    ],
    ids=["cache-shuffle", "shuffle-once-cache"],
)
def test_a_cache_before_the_shuffle_or_of_one_order_stays_positioned_and_exact(make):
    following, first = interrupted_and_restarted(make, epochs_done=1, batches=3)
    assert first == following


def test_a_shuffle_then_cache_restart_without_the_warning_would_be_wrong():
    """What the warning is for: replayed as other inputs are, the restart's batch is not
    the interrupted run's next one (so it is not positioned, and says why)."""
    make = lambda: tf.data.Dataset.range(32).shuffle(32, seed=5).cache().batch(4)  # noqa: E731
    snapshot, following = interrupted(make(), Runs(), 1, 3)
    assert snapshot["positioned"] is False
    restart = make()
    tf_input.advance(restart, 1)
    assert ids(next(iter(restart.skip(3)))) != following


@pytest.mark.parametrize(
    "make,why",
    [
        (lambda: tf.data.Dataset.sample_from_datasets(two_sources()), "at random with no seed"),
        (
            lambda: tf.data.Dataset.sample_from_datasets(two_sources(), weights=[0.3, 0.7]),
            "at random with no seed",
        ),
        (
            lambda: tf.data.Dataset.choose_from_datasets(
                two_sources(), tf.data.Dataset.random().map(lambda x: x % 2)
            ),
            "at random with no seed",
        ),
        (
            lambda: tf.data.Dataset.choose_from_datasets(
                two_sources(),
                tf.data.Dataset.range(32).map(
                    lambda _: tf.random.uniform([], 0, 2, dtype=tf.int64)
                ),
            ),
            "at random with no seed",
        ),
        (
            lambda: tf.data.Dataset.choose_from_datasets(
                two_sources(), tf.data.Dataset.range(2).repeat(16).shuffle(32)
            ),
            "shuffles with no seed",
        ),
    ],
    ids=["sample", "sample-weights", "choose-random", "choose-uniform", "choose-shuffle"],
)
def test_an_unseeded_choice_among_datasets_cannot_be_positioned(make, why):
    found = tf_input.why_not_positionable(make().batch(4))
    assert found is not None and why in found


@pytest.mark.parametrize(
    "make",
    [
        lambda: tf.data.Dataset.sample_from_datasets(two_sources(), seed=1).batch(4),
        lambda: tf.data.Dataset.sample_from_datasets(
            [d.shuffle(16, seed=2) for d in two_sources()],
            weights=[0.3, 0.7],
            seed=1,
            rerandomize_each_iteration=True,
        ).batch(4),
        lambda: tf.data.Dataset.choose_from_datasets(
            two_sources(), tf.data.Dataset.random(seed=4).map(lambda x: x % 2)
        ).batch(4),
    ],
    ids=["sample-seed", "sample-seed-rerandomized", "choose-random-seed"],
)
def test_a_seeded_choice_among_datasets_stays_positioned_and_exact(make):
    for epochs_done, batches in [(0, 2), (1, 3), (2, 1)]:
        following, first = interrupted_and_restarted(make, epochs_done, batches)
        assert first == following, (epochs_done, batches)


@pytest.fixture
def handler(make_handler, tmp_path):
    return make_handler(tf.train.Checkpoint(), tmp_path / "ckpt")


def numbers():
    yield from range(4)


@pytest.mark.parametrize(
    "make",
    [lambda: [1, 2, 3], lambda: __import__("numpy").arange(6), lambda: iter([1, 2]), numbers],
    ids=["list", "numpy", "iterator", "generator"],
)
def test_track_input_returns_an_iterable_it_cannot_position_unchanged_with_the_warning(
    handler, caplog, make
):
    caplog.set_level(logging.WARNING, logger="tf_failure_handling")
    given = make() if make is not numbers else numbers()
    cls = type(given)
    returned = handler.track_input(given)
    assert returned is given and type(returned) is cls
    assert "is not saved: a " + cls.__name__ in caplog.text
    assert handler._input_tracker.snapshot()["positioned"] is False
    handler.close()
    assert type(given) is cls


@pytest.mark.parametrize("value", [None, 3, 2.5], ids=["None", "int", "float"])
def test_track_input_refuses_what_is_not_iterable_with_a_type_error_naming_what_it_takes(
    handler, value
):
    with pytest.raises(TypeError) as raised:
        handler.track_input(value)
    message = str(raised.value)
    assert type(value).__name__ in message
    for accepted in ("tf.data.Dataset", "experimental_distribute_dataset", "builder"):
        assert accepted in message
