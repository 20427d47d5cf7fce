"""The file operations of the checkpoint managers' folders: through TensorFlow's file
systems (``tf.io.gfile``: ``gs://``, ``s3://``, ``ram://``...) when TensorFlow is
present, ``os`` otherwise (the fakes of :mod:`tf_failure_handling.testing`)."""

from __future__ import annotations

import contextlib
import os
import shutil
from typing import Optional

from .. import _errors


def make_dirs(path: str) -> None:
    try:
        from tensorflow.python.lib.io import file_io
    except ImportError:
        os.makedirs(path, exist_ok=True)
    else:
        file_io.recursive_create_dir_v2(path)


def delete_recursively(path: str) -> None:
    try:
        from tensorflow.python.platform import gfile
    except ImportError:
        shutil.rmtree(path, ignore_errors=True)
    else:
        if gfile.Exists(path):
            gfile.DeleteRecursively(path)


def delete_file(path: str) -> None:
    """Removes the file ``path`` if it is there (TF's file systems when TF is present)."""
    try:
        from tensorflow.python.platform import gfile
    except ImportError:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
    else:
        with contextlib.suppress(Exception):
            gfile.Remove(path)


def read_or_none(path: str) -> Optional[str]:
    """The text of ``path``, or None when it cannot be read (not there, not yet)."""
    from tensorflow.python.lib.io import file_io

    try:
        return file_io.read_file_to_string(path)
    except Exception:  # noqa: BLE001 - any failure to read is "not seen"
        return None


def writable_dir(path: str) -> None:
    """Raises a TF error now if checkpoints could not be written under ``path`` later.

    TF's own handler fails at construction with ``FailedPreconditionError`` when
    the directory is a file; this also covers a path below a file and a local
    directory without write permission (``PermissionDeniedError``). Nothing is
    created: the manager creates the directory at its first save, as in TF.
    Remote paths (``gs://``...) are left to the first save.
    """
    path = os.fspath(path)
    if "://" in path:
        return
    existing = os.path.abspath(path)
    while not os.path.exists(existing):
        parent = os.path.dirname(existing)
        if parent == existing:
            break
        existing = parent
    if not os.path.isdir(existing):
        raise _errors.make(
            "FailedPreconditionError",
            f"{existing} is not a directory: checkpoints cannot be written to {path}",
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise _errors.make(
            "PermissionDeniedError", f"{existing}: no permission to write checkpoints to {path}"
        )
