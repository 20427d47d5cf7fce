"""TensorFlow's platform hooks, when someone replaced them.

TensorFlow's handler asks ``failure_handling_util.detect_platform()`` where it runs and,
on GCE, polls ``failure_handling_util.termination_watcher_function_gce`` for a
maintenance event. Tests replace both to act out a GCE preemption without a VM:
TensorFlow's own (``gce_failure_handler_test.py`` patches them with
``mock.patch.object``), and users' tests of their training scripts copy that pattern.
This package detects the platform by its own probe and watches the metadata service
natively, so it called neither: such a test's notice never reached it, training ran to
its end, and whether the test passed depended on how fast the machine was.

So when ``detect_platform`` is not TensorFlow's own function, its answer is taken as
TensorFlow takes it: on ``GCE_GPU`` and ``GCE_CPU`` the watcher fn the user left unset
is TensorFlow's GCE one (read at construction, as TensorFlow reads it, so a patch in
force then is the one polled), with GCE's exit code, and on GCE_GPU its grace period
(``clouds``). When it is TensorFlow's own, nothing here calls it: its metadata
request would only repeat the probe of ``clouds``.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Callable, Optional

log = logging.getLogger("tf_failure_handling")

_UTIL = "tensorflow.python.distribute.failure_handling.failure_handling_util"


def _util() -> Any:
    """TensorFlow's ``failure_handling_util`` when TensorFlow is imported, else None
    (nothing can have replaced a hook of a module not imported)."""
    if "tensorflow" not in sys.modules:
        return None
    try:
        from tensorflow.python.distribute.failure_handling import failure_handling_util
    except ImportError:
        return None
    return failure_handling_util


def replaced(fn: Any, util: Any) -> bool:
    """Whether ``fn``, found on ``util``, is not TensorFlow's own (a lambda, a mock, a
    function of another module)."""
    return getattr(fn, "__module__", None) != getattr(util, "__name__", _UTIL) or (
        getattr(fn, "__name__", None) == "<lambda>"
    )


def gce_watcher() -> Optional[tuple[str, Callable[[], bool]]]:
    """``(device name, TF's GCE watcher fn)`` when a replaced ``detect_platform`` says
    GCE_GPU or GCE_CPU; else None. Never raises: a hook that fails is logged and the
    package's own detection stands."""
    util = _util()
    if util is None:
        return None
    detect = getattr(util, "detect_platform", None)
    if detect is None or not replaced(detect, util):
        return None
    try:
        device = detect()
    except Exception as e:  # noqa: BLE001 - the package's own detection stands
        log.warning("failure_handling_util.detect_platform was replaced and raised %r", e)
        return None
    name = getattr(device, "name", str(device))
    if name not in ("GCE_GPU", "GCE_CPU"):
        return None
    watcher = getattr(util, "termination_watcher_function_gce", None)
    if not callable(watcher):
        return None
    log.info(
        "failure_handling_util.detect_platform was replaced and says %s: polling "
        "failure_handling_util.termination_watcher_function_gce, as TensorFlow does.",
        name,
    )
    return name, watcher
