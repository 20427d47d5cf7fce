"""The last whole step of a MultiWorkerMirroredStrategy worker, held for a survivor's save.

A step that fails on a lost peer can leave this worker's variables torn: with two
all-reduces in a step, the update fed by the first is applied and the one fed by the
second is not (``dev/torn_step_probe.py``: TF 2.21, ``a = 12, b = 10``); or the step is
applied whole although it raised. The survivors' save (issue 62) therefore writes the
state as it was when the last ``run()`` returned, not the variables as it finds them.

:class:`LastStep` holds that state. After each step that returned, ``hold`` reads every
variable the checkpoint saves, one local copy of each (a distributed variable's own
components, no collective), in one ``tf.function`` call. A read shares the variable's
buffer: the copy is made by TensorFlow's next update of that variable (its copy on
write, in C++), so a variable the step does not change costs nothing, and at most one
more copy of the model is held, in the memory the variables live in. ``restore`` writes
the held values back into the variables, component by component, before the save.

The variables are looked up again at each hold until the set is the same twice in a
row (an optimizer makes its slots at its first step); ``restore`` refuses, naming them,
when the checkpoint has variables the hold did not see.

:func:`local_reads` is the save's other half: during it, a ``SyncOnRead`` variable
(tf_keras BatchNorm's moving statistics, a metric) is saved from this worker's own
value, where TensorFlow would all-reduce it across the workers, one of which is gone.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Iterator, Optional

log = logging.getLogger("tf_failure_handling")

#: The name of a survivors' save in the checkpoint folder, before ``<worker>-<run count>``.
SURVIVORS_PREFIX = "ckpt-survivor"


def _variables(checkpoint: Any) -> list:
    """``(name, component)`` of every variable ``checkpoint`` saves: a distributed
    variable's local components (``name/replica_i``), any other variable itself."""
    import tensorflow as tf
    from tensorflow.python.distribute import values as values_lib

    found = []
    seen: set = set()
    for obj in tf.train.TrackableView(checkpoint).descendants():
        if not isinstance(obj, tf.Variable) or id(obj) in seen:
            continue
        seen.add(id(obj))
        name = getattr(obj, "name", "?")
        if isinstance(obj, values_lib.DistributedValues):
            for i, component in enumerate(obj.values):
                found.append((f"{name}/replica_{i}", component))
        else:
            found.append((name, obj))
    return found


def sync_on_read(checkpoint: Any) -> list:
    """Names of the ``SyncOnRead`` variables ``checkpoint`` saves (their saved value is
    an all-reduce across the workers)."""
    import tensorflow as tf
    from tensorflow.python.distribute import values as values_lib

    names = []
    for obj in tf.train.TrackableView(checkpoint).descendants():
        policy = getattr(obj, "_policy", None)
        if isinstance(obj, values_lib.SyncOnReadVariable) or isinstance(
            policy, values_lib.OnReadPolicy
        ):
            names.append(getattr(obj, "name", "?"))
    return sorted(set(names))


class LastStep:
    """The variables as the last ``run()`` that returned left them."""

    def __init__(self, checkpoint: Any) -> None:
        self._checkpoint = checkpoint
        self._components: Optional[list] = None
        self._read: Any = None
        #: Holds in a row that found the same variables (2: they are settled).
        self._same = 0
        self._values: Optional[list] = None
        #: The run count the values are of (None: nothing held).
        self.run_count: Optional[int] = None
        #: Why holding stopped, when it did (a warning said so once).
        self.broken: Optional[str] = None

    def hold(self, run_count: int) -> None:
        """Holds the variables as they are now, the state after run ``run_count``.
        Never raises: a hold that fails stops holding, with a warning (the survivors then
        cannot save)."""
        if self.broken is not None:
            return
        import tensorflow as tf

        if not tf.executing_eagerly():
            return  # run() traced into a graph: no step has run yet
        try:
            if self._same < 2:
                self._look_up()
            self._values = self._read()
            self.run_count = run_count
        except Exception as e:  # noqa: BLE001 - training must not fail for the copy
            self.broken = f"{type(e).__name__}: {e}"
            self._values, self.run_count = None, None
            log.warning(
                "Cannot hold the last whole step for a save by the survivors of a lost "
                "worker (%s): a worker lost without notice costs the steps since the last "
                "checkpoint.",
                self.broken,
            )

    def _look_up(self) -> None:
        import tensorflow as tf

        components = _variables(self._checkpoint)
        if self._components is not None and [id(c) for _, c in components] == [
            id(c) for _, c in self._components
        ]:
            self._same += 1
            return
        self._components, self._same = components, 1
        variables = [c for _, c in components]
        self._read = tf.function(lambda: [v.read_value() for v in variables])

    def restore(self) -> list:
        """Writes the held values back into the variables. Returns the names of the
        variables the checkpoint saves that nothing was held for (then nothing is
        written back, and the caller must not save)."""
        if self._values is None or self._components is None:
            return ["(nothing held)"]
        held = {id(c) for _, c in self._components}
        # The checkpoint's count of its saves, made at its first save (a preemption's
        # round may make it after the last hold): the survivors' save counts itself.
        counter = getattr(self._checkpoint, "_save_counter", None)
        held.update(id(c) for c in getattr(counter, "values", None) or (counter,))
        missing = [name for name, c in _variables(self._checkpoint) if id(c) not in held]
        if missing:
            return missing
        for (_, component), value in zip(self._components, self._values):
            component.assign(value)
        return []


@contextlib.contextmanager
def local_reads() -> Iterator[None]:
    """During the block, a ``SyncOnRead`` variable read across replicas (as a save reads
    it) gives this worker's own value: no all-reduce with a worker that is gone."""
    from tensorflow.python.distribute import values as values_lib
    from tensorflow.python.ops import array_ops

    def own(var: Any) -> Any:
        return array_ops.identity(var._get_on_device_or_primary())

    patched = [
        (values_lib.SyncOnReadVariable, "_get_cross_replica", lambda self: own(self)),
        (values_lib.OnReadPolicy, "_get_cross_replica", lambda self, var: own(var)),
    ]
    saved = [(cls, name, cls.__dict__.get(name)) for cls, name, _ in patched]
    try:
        for cls, name, fn in patched:
            setattr(cls, name, fn)
        yield
    finally:
        for cls, name, original in saved:
            if original is None:
                delattr(cls, name)
            else:
                setattr(cls, name, original)
