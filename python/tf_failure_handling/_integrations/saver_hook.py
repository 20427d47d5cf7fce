"""The one hook the package puts on TensorFlow's ``MultiDeviceSaver.save``.

A save of this thread, inside :func:`saving_with`, goes to the function given
(``tf_shares``: a share of the checkpoint; ``tf_reads_only``: every read, no copy);
any other save is TensorFlow's own (:func:`original`). Installed once, at the first
use, and never removed.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional

_local = threading.local()
_lock = threading.Lock()
_original: Optional[Callable[..., Any]] = None


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
