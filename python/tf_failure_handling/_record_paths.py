"""Where the preemption records are: the folder a handler writes them to, and the file
systems that reach it (a local path through ``os``, any other scheme through
``tf.io.gfile``). ``records`` writes them and ``_record_reading`` reads them, both
through these.
"""

from __future__ import annotations

import os
from typing import Any, Optional

#: Where records go when the handler's ``TerminationConfig`` does not say:
#: this variable, or ``<checkpoint_dir>/preemption_records`` (created at the first
#: notice; none by default when a ``save_fn`` replaces the save). ``off`` disables.
RECORDS_DIR_ENV = "TF_FAILURE_HANDLING_RECORDS_DIR"
DEFAULT_SUBDIR = "preemption_records"


def is_local(path: str) -> bool:
    """Whether ``path`` is on this machine's file system: no scheme, or ``file://``."""
    return "://" not in path or path.startswith("file://")


def _local(path: str) -> str:
    return path[len("file://") :] if path.startswith("file://") else path


def _join(folder: str, *names: str) -> str:
    if is_local(folder):
        return os.path.join(folder, *names)
    return "/".join([folder.rstrip("/"), *names])


def folder_for(checkpoint_dir: Optional[str], configured: Any = None) -> Optional[str]:
    """The records folder: ``configured`` (``False``: none), else the environment
    variable, else beside the checkpoints; None when there is nowhere to write."""
    if configured is False:
        return None
    if configured:
        return os.fspath(configured)
    env = os.environ.get(RECORDS_DIR_ENV)
    if env is not None:
        return None if env.strip().lower() in ("", "off", "0", "false", "none") else env
    if checkpoint_dir:
        return _join(os.fspath(checkpoint_dir), DEFAULT_SUBDIR)
    return None


def _gfile() -> Any:
    """TensorFlow's file system layer, for every path that is not local."""
    try:
        import tensorflow as tf
    except ImportError as e:
        raise OSError(f"a path with a scheme needs TensorFlow's file systems: {e}") from e
    return tf.io.gfile
