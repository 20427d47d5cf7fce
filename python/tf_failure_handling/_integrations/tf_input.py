"""Every ``tf.data`` and ``tf.distribute`` input internal the input position relies on.

A position is replayed, never read back from a buffer: an input made with the same
seeds yields the same elements in the same order for its ``n``-th iterator, where ``n``
counts every iterator made of it (a shuffle's seed generator advances once per iterator
made, pulled or not; ``skip`` shares it). So an iterator is positioned by making the
iterators the interrupted run had made before it, unpulled, and then making it over
``dataset.skip(batches)``. Relies on (TensorFlow 2.16-2.21):

- ``tensorflow/python/distribute/input_lib.py``: ``DistributedDataset._cloned_datasets``
  and ``DistributedDatasetsFromFunction._datasets``, one ``tf.data.Dataset`` per input
  worker of this process, read by ``__iter__`` each time it is called;
- ``tensorflow/python/data/ops/``: ``DatasetV2._inputs()`` and ``_functions()`` (the
  pipeline's parts and their traced functions), ``_ShuffleDataset._seed``/``_seed2``
  and the parallel ops' ``_deterministic``, read for what makes the order impossible
  to replay.

Why and what it costs: docs/input-position.md.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable, Iterator, Optional

log = logging.getLogger("tf_failure_handling")

#: Attributes of the distributed dataset classes that hold the per-input-worker datasets.
_PER_WORKER_ATTRIBUTES = ("_cloned_datasets", "_datasets")
#: Ops whose order depends on a Python function (a generator, ``py_function``).
_PYTHON_OPS = frozenset({"PyFunc", "PyFuncStateless", "EagerPyFunc"})
#: Shuffle ops, whose inputs 2 and 3 are the seeds (both 0: a new order every run).
_SHUFFLE_OPS = frozenset(
    {
        "ShuffleDataset",
        "ShuffleDatasetV2",
        "ShuffleDatasetV3",
        "ShuffleAndRepeatDatasetV2",
        "ShuffleAndRepeatDataset",
    }
)
#: Random ops whose ``seed`` and ``seed2`` attributes both 0 give a new result every run
#: (``tf.random.shuffle``: fit's shuffle of arrays).
_RANDOM_ORDER_OPS = frozenset({"RandomShuffle"})
#: Stateful random ops: with ``seed`` and ``seed2`` both 0, a choice among datasets
#: made with them (``choose_from_datasets``' ``choice_dataset``) differs every run.
_RANDOM_OPS = frozenset(
    {
        "RandomUniform",
        "RandomUniformInt",
        "RandomStandardNormal",
        "TruncatedNormal",
        "Multinomial",
        "RandomGamma",
        "RandomPoisson",
        "RandomPoissonV2",
    }
)
#: ``Dataset.random``'s ops, whose inputs 0 and 1 are the seeds.
_RANDOM_DATASET_OPS = frozenset({"RandomDataset", "RandomDatasetV2", "ExperimentalRandomDataset"})
_UNSEEDED = ((None, None), (0, 0))
_UNSEEDED_SHUFFLE = (
    "it shuffles with no seed (Dataset.shuffle(..., seed=None) and no "
    "tf.random.set_seed), a new order in every run"
)
_UNSEEDED_CHOICE = (
    "it picks among datasets at random with no seed (sample_from_datasets(..., "
    "seed=None), or choose_from_datasets with a choice_dataset made at random with no "
    "seed, and no tf.random.set_seed), a new order in every run"
)
_CACHED_REORDER = (
    "it keeps in a cache() in memory the order of a shuffle (or Dataset.random) that "
    "changes each epoch: every epoch repeats the order of the first full pass, which a "
    "restart cannot replay (cache() before shuffle() can be positioned)"
)
#: The subclass made for each class of tracked dataset (see :func:`track`).
_TRACKING_CLASSES: dict = {}


class NotPositionable(Exception):
    """The input's order cannot be replayed: the message says why."""


def is_plain_dataset(obj: Any) -> bool:
    import tensorflow as tf

    return isinstance(obj, tf.data.Dataset)


def per_worker_datasets(obj: Any) -> list:
    """The ``tf.data.Dataset`` objects this process's iterators of ``obj`` are made of."""
    if is_plain_dataset(obj):
        return [obj]
    for name in _PER_WORKER_ATTRIBUTES:
        found = getattr(obj, "__dict__", {}).get(name)
        if isinstance(found, list) and found and all(is_plain_dataset(d) for d in found):
            return found
    raise NotPositionable(
        f"a {type(obj).__name__} is not a tf.data.Dataset nor a dataset distributed by "
        "experimental_distribute_dataset or distribute_datasets_from_function"
    )


def is_input(obj: Any) -> bool:
    """Whether ``obj`` is an input :func:`track` can count iterators of (positioned or
    not): a ``tf.data.Dataset`` or a distributed one."""
    try:
        per_worker_datasets(obj)
    except NotPositionable:
        return False
    return True


def _swap_per_worker(obj: Any, datasets: list) -> Callable[[], None]:
    for name in _PER_WORKER_ATTRIBUTES:
        if isinstance(obj.__dict__.get(name), list):
            before = obj.__dict__[name]
            obj.__dict__[name] = datasets
            return lambda: obj.__dict__.__setitem__(name, before)
    raise NotPositionable(f"{type(obj).__name__} has no per-worker datasets")


def why_not_positionable(obj: Any) -> Optional[str]:
    """Why the order of ``obj``'s elements cannot be replayed, or None when it can."""
    try:
        datasets = per_worker_datasets(obj)
    except NotPositionable as e:
        return str(e)
    original = getattr(obj, "__dict__", {}).get("_original_dataset")
    dataset = original if is_plain_dataset(original) else datasets[0]
    try:
        if dataset.options().deterministic is False:
            return "its tf.data.Options have deterministic=False"
    except Exception:  # noqa: BLE001 - an input without options: nothing found there
        pass
    try:
        for why in _reasons(dataset):
            return why
    except Exception as e:  # noqa: BLE001 - a pipeline whose parts cannot be read
        return f"its pipeline cannot be read ({type(e).__name__}: {e})"
    return None


def _reasons(dataset: Any) -> Iterator[str]:
    """Why each part of ``dataset``'s pipeline cannot be replayed (none: it can).

    The pipeline is walked as Python objects (``_inputs()``), and the graphs of its
    functions (``map``, ``flat_map``, ...) are read, not the whole pipeline's graph: that
    would copy every tensor it holds (arrays given to ``fit``, ``from_tensor_slices``).
    Each part is seen with two facts of the parts above it: whether it decides which
    dataset an element comes from (``sample_from_datasets``'s and
    ``choose_from_datasets``'s choices), and whether a ``cache()`` in memory keeps what
    it gives.
    """
    seen: set = set()
    stack = [(dataset, False, False)]
    while stack:
        part, chooses, cached = stack.pop()
        if (id(part), chooses, cached) in seen:
            continue
        seen.add((id(part), chooses, cached))
        name = type(part).__name__.strip("_")
        if getattr(part, "_deterministic", None) == "false":
            yield f"its {name} has deterministic=False"
        if name == "ShuffleDataset":
            if _python_seeds(part) in _UNSEEDED:
                yield _UNSEEDED_SHUFFLE
            elif cached and _flag(part, "_reshuffle_each_iteration", default=True):
                yield _CACHED_REORDER
        if name == "RandomDataset":
            if chooses and _python_seeds(part) in _UNSEEDED:
                yield _UNSEEDED_CHOICE
            elif cached and _flag(part, "_rerandomize", default=False):
                yield _CACHED_REORDER
        if chooses and name == "VariantDataset":
            # choose_from_datasets' choice, rewritten: only its graph is left.
            yield from _graph_reasons(_serialized(part), chooses=True)
        for function in part._functions():
            concrete = getattr(function, "function", None)
            graph = getattr(concrete, "graph", None)
            if graph is not None:
                yield from _graph_reasons(graph.as_graph_def(), chooses)
        selector = getattr(part, "_selector_input", None)  # sample/choose_from_datasets
        cached = cached or _caches_in_memory(part)
        stack.extend((p, chooses or p is selector, cached) for p in part._inputs())


def _flag(part: Any, name: str, default: bool) -> bool:
    value = getattr(part, name, None)
    return default if value is None else bool(value)


def _python_seeds(part: Any) -> tuple:
    """A shuffle's or ``Dataset.random``'s two seeds (None: not known before running)."""
    import tensorflow as tf

    values = []
    for name in ("_seed", "_seed2"):
        value = getattr(part, name, None)
        value = None if value is None else tf.get_static_value(value)
        values.append(None if value is None else int(value))
    return tuple(values)


def _caches_in_memory(part: Any) -> bool:
    """Whether ``part`` is a ``cache()`` in memory (a cache to a file outlives the run)."""
    import tensorflow as tf

    if type(part).__name__.strip("_") != "CacheDataset":
        return False
    filename = getattr(part, "_filename", None)
    value = None if filename is None else tf.get_static_value(filename)
    return value is None or value in (b"", "")


def _serialized(part: Any) -> Any:
    """The graph of the pipeline ending at ``part`` (small: a choice among datasets)."""
    import tensorflow as tf
    from tensorflow.core.framework import graph_pb2

    graph = graph_pb2.GraphDef()
    policy = tf.data.experimental.ExternalStatePolicy.IGNORE
    graph.ParseFromString(part._as_serialized_graph(external_state_policy=policy).numpy())
    return graph


def _graph_reasons(graph: Any, chooses: bool = False) -> Iterator[str]:
    """:func:`_reasons` of the ops of a function's graph, its library included."""
    constants = {n.name: n for n in graph.node if n.op == "Const"}
    nodes = list(graph.node) + [n for f in graph.library.function for n in f.node_def]
    for node in nodes:
        if node.op in _PYTHON_OPS:
            yield (
                "it runs Python code (Dataset.from_generator, py_function or "
                "numpy_function), whose order cannot be replayed"
            )
        deterministic = node.attr.get("deterministic")
        if deterministic is not None and deterministic.s == b"false":
            yield f"its {node.op} has deterministic=False"
        if node.op in _RANDOM_ORDER_OPS and _attr_seeds(node) == (0, 0):
            yield (
                "it reorders its elements with tf.random.shuffle and no seed (fit's "
                "shuffle=True of arrays with no keras.utils.set_random_seed), a new order "
                "in every run"
            )
        if node.op in _SHUFFLE_OPS and _seeds(node, constants, 2) == (0, 0):
            yield _UNSEEDED_SHUFFLE
        if chooses and (
            (node.op in _RANDOM_OPS and _attr_seeds(node) == (0, 0))
            or (node.op in _RANDOM_DATASET_OPS and _seeds(node, constants, 0) == (0, 0))
        ):
            yield _UNSEEDED_CHOICE


def _attr_seeds(node: Any) -> tuple:
    return tuple(node.attr[name].i if name in node.attr else None for name in ("seed", "seed2"))


def _seeds(node: Any, constants: dict, first: int) -> Optional[tuple]:
    """The constant seeds a dataset op takes as its inputs ``first`` and ``first + 1``."""
    values = []
    for name in list(node.input)[first : first + 2]:
        const = constants.get(name.split(":")[0].lstrip("^"))
        if const is None:
            return None
        tensor = const.attr["value"].tensor
        values.append(tensor.int64_val[0] if tensor.int64_val else None)
    return tuple(values) if len(values) == 2 else None


def batches_per_iteration(obj: Any) -> Optional[int]:
    """How many elements one iterator of ``obj`` yields on this worker (None: unknown or
    infinite)."""
    try:
        datasets = per_worker_datasets(obj)
        count = int(datasets[0].cardinality().numpy())
    except Exception:  # noqa: BLE001 - unknown is an answer
        return None
    return count if count >= 0 else None


def advance(obj: Any, count: int) -> None:
    """Makes ``count`` iterators of every per-worker dataset of ``obj`` and drops them
    unpulled: what the interrupted run's earlier iterators did to the seeds."""
    for dataset in per_worker_datasets(obj):
        for _ in range(count):
            iterator = iter(dataset)
            del iterator


@contextlib.contextmanager
def skipping(obj: Any, batches: int) -> Iterator[Any]:
    """Within the block, iterators of ``obj`` start after its first ``batches`` elements.

    Yields the object to call ``iter`` on: ``obj.skip(batches)`` for a plain dataset, and
    ``obj`` itself, its per-worker datasets swapped, for a distributed one.
    """
    if batches <= 0:
        yield obj
        return
    if is_plain_dataset(obj):
        yield obj.skip(batches)
        return
    undo = _swap_per_worker(obj, [d.skip(batches) for d in per_worker_datasets(obj)])
    try:
        yield obj
    finally:
        undo()


def track(obj: Any, on_iter: Callable[[Any, Callable[[], Any]], Any]) -> None:
    """Makes ``iter(obj)`` call ``on_iter(obj, make)``, where ``make()`` is the
    iterator ``obj``'s own class would return; ``obj`` keeps its class's behaviour
    otherwise (its class becomes a subclass, so ``isinstance`` holds). Undone by
    :func:`untrack`."""
    cls = type(obj)
    base = getattr(cls, "_tfh_tracked_base", cls)
    sub = _TRACKING_CLASSES.get(base)
    if sub is None:

        def __iter__(self: Any) -> Any:
            hook = self.__dict__.get("_tfh_on_iter")
            make = super(sub, self).__iter__
            if hook is None:
                return make()
            return hook(self, make)

        sub = type(base.__name__, (base,), {"__iter__": __iter__, "_tfh_tracked_base": base})
        sub.__module__ = base.__module__
        sub.__qualname__ = base.__qualname__
        _TRACKING_CLASSES[base] = sub
    obj.__dict__["_tfh_on_iter"] = on_iter
    obj.__class__ = sub


def untrack(obj: Any) -> None:
    """Gives ``obj`` back its own class (see :func:`track`)."""
    base = getattr(type(obj), "_tfh_tracked_base", None)
    obj.__dict__.pop("_tfh_on_iter", None)
    if base is not None:
        obj.__class__ = base


def iterate(obj: Any) -> Any:
    """``iter(obj)`` by ``obj``'s own class (for an object made by :func:`skipping`)."""
    base = getattr(type(obj), "_tfh_tracked_base", None)
    if base is not None:
        return base.__iter__(obj)
    return iter(obj)
