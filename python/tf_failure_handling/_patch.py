"""``patch()`` / ``unpatch()``: put this package's classes wherever TensorFlow exports its own.

The targets are found, not listed: every attribute of TensorFlow's generated API
modules and of its ``tensorflow.python.distribute`` modules whose value *is* one of TF's
four classes. What it changes, for tf_keras too, and what it costs:
docs/getting-started/index.md and docs/getting-started/tf-keras.md.
"""

from __future__ import annotations

import importlib
import sys
import threading
import types
from typing import Any, Callable, Optional

#: Where TensorFlow defines each class this package replaces, and where ours lives.
_CLASSES = (
    (
        "tensorflow.python.distribute.failure_handling.failure_handling",
        "PreemptionCheckpointHandler",
        "tf_failure_handling.handler",
    ),
    (
        "tensorflow.python.distribute.failure_handling.failure_handling",
        "TerminationConfig",
        "tf_failure_handling.handler",
    ),
    (
        "tensorflow.python.distribute.failure_handling.preemption_watcher",
        "PreemptionWatcher",
        "tf_failure_handling.watcher",
    ),
    (
        "tensorflow.python.distribute.coordinator.cluster_coordinator",
        "ClusterCoordinator",
        "tf_failure_handling.coordinator",
    ),
)
#: Module name prefixes whose attributes are searched: TF's generated API namespaces
#: (v2, compat.v2, compat.v1) and the ``tf.distribute`` implementation modules.
_SCOPES = ("tensorflow._api.", "tensorflow.python.distribute.")

_TF_KERAS_MODULE = "tf_keras.src.distribute.worker_training_state"
_TF_KERAS_FUNCTION = "support_on_demand_checkpoint_callback"

_lock = threading.RLock()
#: (id of the searched module, attribute) -> (module as found in sys.modules, attribute,
#: TF's class it held).
_saved: dict = {}
#: [(TF's class, ours)], found once.
_pairs: list = []
#: The tf_keras module patched, and the function it had.
_keras_saved: dict = {}
_keras_hook: Optional[_TfKerasHook] = None


def _class_pairs() -> list:
    """``[(TF's class, ours)]`` for the four classes (TF imported here if needed)."""
    if not _pairs:
        pairs = []
        for module_name, name, ours_module in _CLASSES:
            theirs = getattr(importlib.import_module(module_name), name)
            ours = getattr(importlib.import_module(ours_module), name)
            pairs.append((theirs, ours))
        _pairs.extend(pairs)
    return _pairs


def _namespaces() -> list:
    """``[(module as in sys.modules, its real attribute dict)]`` for every module searched.

    ``tf.compat.v1``'s modules are ``TFModuleWrapper`` objects around the real module:
    its dictionary is searched, and the wrapper is what gets written through (it keeps
    its own cache of attributes in step). Dictionaries are read directly so that no
    lazily loaded module is loaded by the search.
    """
    found, seen = [], set()
    for name, module in list(sys.modules.items()):
        if not isinstance(module, types.ModuleType) or not name.startswith(_SCOPES):
            continue
        own = object.__getattribute__(module, "__dict__")
        real = own.get("_tfmw_wrapped_module", module)
        if id(real) in seen:
            continue
        seen.add(id(real))
        found.append((module, object.__getattribute__(real, "__dict__")))
    return found


def _replace(table: dict) -> list:
    """Sets every searched attribute whose value's id is a key of ``table`` to the
    value; returns ``[(module, name, id(real module), previous value)]``."""
    changed = []
    for module, attributes in _namespaces():
        hits = [(k, v) for k, v in list(attributes.items()) if id(v) in table]
        for name, value in hits:
            setattr(module, name, table[id(value)])
            changed.append((module, name, id(attributes), value))
    return changed


def patch() -> None:
    """Makes TensorFlow's names of its four classes this package's classes.

    Every name TF exports ``PreemptionCheckpointHandler``, ``TerminationConfig``,
    ``PreemptionWatcher`` and ``ClusterCoordinator`` under (``tf``, ``tf.compat.v2``,
    ``tf.compat.v1``, the defining modules; see the module docstring) now holds ours,
    and tf_keras' ``BackupAndRestore(save_before_preemption=True)`` works off GCP.
    Idempotent; undone by :func:`unpatch`.
    """
    with _lock:
        table = {id(theirs): ours for theirs, ours in _class_pairs()}
        for module, name, key, original in _replace(table):
            _saved.setdefault((key, name), (module, name, original))
        _patch_tf_keras()


def unpatch() -> None:
    """Restores TensorFlow's own classes everywhere :func:`patch` (or a module imported
    since) put ours, and tf_keras' own check."""
    with _lock:
        for module, name, original in _saved.values():
            setattr(module, name, original)
        _saved.clear()
        if _pairs:
            _replace({id(ours): theirs for theirs, ours in _pairs})
        _unpatch_tf_keras()


# ------------------------------------------------------------------ tf_keras


def _handler_supports(strategy: Any) -> bool:
    """Whether tf_keras may build a handler for ``strategy`` on this platform: the
    strategy tf_keras itself requires (MultiWorkerMirroredStrategy), on any platform."""
    import tensorflow as tf

    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)


def _support_everywhere(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def support_on_demand_checkpoint_callback(strategy: Any) -> Any:
        # tf_keras asks only when the user passed save_before_preemption=True.
        return _handler_supports(strategy) or original(strategy)

    support_on_demand_checkpoint_callback.__doc__ = (
        "tf_failure_handling.patch(): True for MultiWorkerMirroredStrategy on every "
        "platform (tf_keras' own check, kept in `__wrapped__`, requires GCP)."
    )
    support_on_demand_checkpoint_callback.__wrapped__ = original
    return support_on_demand_checkpoint_callback


def _enable_save_before_preemption(module: types.ModuleType) -> None:
    with _lock:
        current = getattr(module, _TF_KERAS_FUNCTION, None)
        if current is None or module.__name__ in _keras_saved:
            return
        _keras_saved[module.__name__] = (module, current)
        setattr(module, _TF_KERAS_FUNCTION, _support_everywhere(current))


class _TfKerasHook:
    """A ``sys.meta_path`` finder that patches tf_keras' module when it is imported.

    It finds nothing itself: for that one module it asks the other finders for the
    spec and wraps its loader's ``exec_module`` to patch the module once it has run.
    """

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != _TF_KERAS_MODULE:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None:
            return spec

        def exec_and_patch(module: types.ModuleType) -> None:
            exec_module(module)
            if _keras_hook is self:  # not unpatched meanwhile
                _enable_save_before_preemption(module)

        # Only this module's loader object is changed (a file loader serves one file).
        loader.exec_module = exec_and_patch
        return spec


def _patch_tf_keras() -> None:
    global _keras_hook
    module = sys.modules.get(_TF_KERAS_MODULE)
    if module is not None:
        _enable_save_before_preemption(module)
    elif _keras_hook is None:
        _keras_hook = _TfKerasHook()
        sys.meta_path.insert(0, _keras_hook)


def _unpatch_tf_keras() -> None:
    global _keras_hook
    if _keras_hook is not None:
        try:
            sys.meta_path.remove(_keras_hook)
        except ValueError:
            pass
        _keras_hook = None
    for module, original in _keras_saved.values():
        setattr(module, _TF_KERAS_FUNCTION, original)
    _keras_saved.clear()
