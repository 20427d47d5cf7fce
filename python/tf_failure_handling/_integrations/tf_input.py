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
    """
    seen: set = set()
    stack = [dataset]
    while stack:
        part = stack.pop()
        if id(part) in seen:
            continue
        seen.add(id(part))
        if getattr(part, "_deterministic", None) == "false":
            yield f"its {type(part).__name__.strip('_')} has deterministic=False"
        if part.__class__.__name__ == "_ShuffleDataset" and (
            getattr(part, "_seed", 0),
            getattr(part, "_seed2", 0),
        ) in ((None, None), (0, 0)):
            yield (
                "it shuffles with no seed (Dataset.shuffle(..., seed=None) and no "
                "tf.random.set_seed), a new order in every run"
            )
        for function in part._functions():
            concrete = getattr(function, "function", None)
            graph = getattr(concrete, "graph", None)
            if graph is not None:
                yield from _graph_reasons(graph.as_graph_def())
        stack.extend(part._inputs())


def _graph_reasons(graph: Any) -> Iterator[str]:
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
        if node.op in _SHUFFLE_OPS and _seeds(node, constants) == (0, 0):
            yield (
                "it shuffles with no seed (Dataset.shuffle(..., seed=None) and no "
                "tf.random.set_seed), a new order in every run"
            )


def _attr_seeds(node: Any) -> tuple:
    return tuple(node.attr[name].i if name in node.attr else None for name in ("seed", "seed2"))


def _seeds(node: Any, constants: dict) -> Optional[tuple]:
    values = []
    for name in list(node.input)[2:4]:
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
