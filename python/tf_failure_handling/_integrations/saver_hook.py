"""The one hook the package puts on TensorFlow's ``MultiDeviceSaver.save``.

A save of this thread, inside :func:`saving_with`, goes to the function given
(``tf_shares``: a share of the checkpoint; ``tf_reads_only``: every read, no copy);
any other save is TensorFlow's own (:func:`original`). Installed once, at the first
use, and never removed.

Both modes call private names of TensorFlow's saver (:func:`missing` lists them; their
code is pinned per release by ``tests/unit/tf_internals.py``). :func:`missing` tells, once,
when a mode is installed, whether this TensorFlow has them all: a TensorFlow that does
not gets TensorFlow's own save (``_protocol/non_chief_saves.py``), never a save that
leaves out the reads the other workers' collectives wait for.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional

_local = threading.local()
_lock = threading.Lock()
_original: Optional[Callable[..., Any]] = None

#: The fields of ``sharding_util.ShardableTensor`` the sharding callbacks read.
_SHARDABLE_FIELDS = ("checkpoint_key", "slice_spec", "tensor", "dtype", "shape")


@contextmanager
def saving_with(save: Callable[[Any, Any, Any], Any]) -> Iterator[None]:
    """Inside the block, this thread's ``MultiDeviceSaver.save(saver, file_prefix,
    options)`` calls ``save(saver, file_prefix, options)``."""
    _install()
    previous = getattr(_local, "save", None)
    _local.save = save
    try:
        yield
    finally:
        _local.save = previous


def original(saver: Any, file_prefix: Any, options: Any = None) -> Any:
    """TensorFlow's own ``MultiDeviceSaver.save``."""
    return _original(saver, file_prefix, options)


def as_str(prefix: Any) -> str:
    """A save's ``file_prefix`` (a string tensor or a string) as a string."""
    value = prefix.numpy() if hasattr(prefix, "numpy") else prefix
    return value.decode() if isinstance(value, bytes) else str(value)


def missing(mode: str) -> Optional[str]:
    """The first private name of TensorFlow's saver that ``mode`` (``"memory"`` or
    ``"shares"``) uses and this TensorFlow lacks, or None when it has them all.

    In ``functional_saver``: ``MultiDeviceSaver.save`` (replaced by the hook, and
    TensorFlow's own save for the savers the modes cannot take: :func:`original`);
    ``MultiDeviceSaver._get_shards_by_task`` (every tensor read, in the chief's order:
    the collectives match); ``_registered_savers`` and ``_num_unique_tasks``, which
    ``MultiDeviceSaver.__init__`` sets (which savers the modes cannot take:
    ``tf_reads_only.cannot_skip``); ``_single_shard_save`` (a worker's share written:
    ``shares`` only). In ``sharding_util``: the fields of ``ShardableTensor`` the
    sharding callbacks read.
    """
    import dataclasses

    try:
        from tensorflow.python.checkpoint import functional_saver
    except ImportError:
        return "tensorflow.python.checkpoint.functional_saver"
    saver = getattr(functional_saver, "MultiDeviceSaver", None)
    if saver is None:
        return "functional_saver.MultiDeviceSaver"
    for method in ("save", "_get_shards_by_task"):
        if not callable(getattr(saver, method, None)):
            return f"functional_saver.MultiDeviceSaver.{method}"
    try:
        # A saver of no tensors: what __init__ sets on every saver.
        empty = saver({})
    except Exception as e:  # noqa: BLE001 - any failure is a differing __init__
        return f"functional_saver.MultiDeviceSaver.__init__ ({type(e).__name__}: {e})"
    for attribute in ("_registered_savers", "_num_unique_tasks"):
        if not hasattr(empty, attribute):
            return f"functional_saver.MultiDeviceSaver.{attribute}"
    try:
        from tensorflow.python.checkpoint.sharding import sharding_util

        fields = {f.name for f in dataclasses.fields(sharding_util.ShardableTensor)}
    except (ImportError, AttributeError, TypeError):
        return "sharding_util.ShardableTensor"
    for field in _SHARDABLE_FIELDS:
        if field not in fields:
            return f"sharding_util.ShardableTensor.{field}"
    if mode == "shares" and not callable(getattr(functional_saver, "_single_shard_save", None)):
        return "functional_saver._single_shard_save"
    return None


def _install() -> None:
    global _original
    from tensorflow.python.checkpoint import functional_saver

    with _lock:
        if _original is None:
            _original = functional_saver.MultiDeviceSaver.save
            functional_saver.MultiDeviceSaver.save = _hooked


def _hooked(self: Any, file_prefix: Any, options: Any = None) -> Any:
    save = getattr(_local, "save", None)
    if save is None:
        return _original(self, file_prefix, options)
    return save(self, file_prefix, options)
