"""TensorFlow's cluster as the handler reads it, without TensorFlow:
:class:`InMemoryCoordinationService` (the coordination service's key-value store and
error reporting) and :class:`SimpleClusterResolver` (a cluster resolver). Public
through ``tf_failure_handling.testing``.
"""

from __future__ import annotations

import threading
from typing import Callable, Optional

from .. import _errors


class _Store:
    """The coordination service's key-value store, in memory, with TensorFlow's semantics:
    a set of an existing key fails, a get blocks until the key is set, and an error
    reported to the cluster fails every get (those blocked and those to come)."""

    def __init__(self) -> None:
        self._values: dict = {}
        #: The first error reported to the cluster: ``(code, message)``.
        self.error: Optional[tuple] = None
        #: Notified on every set, delete and error report: what blocked gets wait for.
        self._changed = threading.Condition()

    def set(self, key: str, value: str) -> bool:
        """Sets ``key``; False (and nothing changes) when it already exists."""
        with self._changed:
            if key in self._values:
                return False
            self._values[key] = value
            self._changed.notify_all()
            return True

    def get(self, key: str, timeout: Optional[float]) -> tuple:
        """Blocks until ``key`` is set, an error is reported, or ``timeout`` seconds
        (None: no limit) pass: ``("ok", value)``, ``("error", (code, message))`` or
        ``("timeout", None)``."""

        def found() -> bool:
            return self.error is not None or key in self._values

        if timeout is not None and timeout > threading.TIMEOUT_MAX:
            timeout = None  # too long for a lock's wait: no limit
        with self._changed:
            if not self._changed.wait_for(found, timeout):
                return "timeout", None
            if self.error is not None:
                return "error", self.error
            return "ok", self._values[key]

    def try_get(self, key: str) -> Optional[str]:
        with self._changed:
            return self._values.get(key)

    def delete(self, key: str) -> None:
        with self._changed:
            self._values.pop(key, None)
            self._changed.notify_all()

    def keys(self) -> list:
        with self._changed:
            return sorted(self._values)

    def report_error(self, code: int, message: str) -> None:
        """Records an error for the whole cluster (the first one wins)."""
        with self._changed:
            if self.error is None:
                self.error = (code, message)
            self._changed.notify_all()


class InMemoryCoordinationService:
    """TensorFlow's coordination-service key-value API, in memory.

    Methods have the names and arguments of ``tf``'s ``context.context()``, so
    the same object also stands in for TF's context in tests of TF's own handler.
    Setting an existing key raises ``AlreadyExistsError``; a get blocks until the key is
    set or its timeout passes (``DeadlineExceededError``); ``report_error_to_cluster``
    fails every blocked get with the reported error.
    ``fail_next_set`` / ``fail_next_get`` inject one failure (a
    ``tf.errors.UnavailableError``) into the next matching call.
    """

    def __init__(self) -> None:
        _errors.module()  # resolve TF's error classes in this thread, once
        self._store = _Store()
        self._error_listeners: list = []
        self._faults_lock = threading.Lock()
        self._set_faults: dict = {}
        self._get_faults: dict = {}

    # TF's API -------------------------------------------------------------

    def set_config_key_value(self, key: str, value: str) -> None:
        self._maybe_fail(self._set_faults, key, "set")
        if not self._store.set(str(key), str(value)):
            raise _errors.make("AlreadyExistsError", f"Config key {key} already exists.")

    def get_config_key_value(self, key: str, timeout_in_ms: Optional[int] = None) -> str:
        """Blocks until ``key`` is set; ``timeout_in_ms`` 0 means forever, as in TF (whose
        default it is; None, the default here, is the same)."""
        self._maybe_fail(self._get_faults, key, "get")
        timeout = None if not timeout_in_ms else timeout_in_ms / 1000
        status, payload = self._store.get(str(key), timeout)
        if status == "ok":
            return payload
        if status == "timeout":
            raise _errors.make(
                "DeadlineExceededError",
                f"GetKeyValue() timed out with key: {key} and duration: {timeout_in_ms}ms",
            )
        code, message = payload
        raise _errors.from_code(code, message)

    def delete_config_key_value(self, key: str) -> None:
        self._store.delete(str(key))

    def report_error_to_cluster(self, error_code: int, error_message: str) -> None:
        self._store.report_error(int(error_code), str(error_message))
        for listener in list(self._error_listeners):
            listener()

    # Inspection and fault injection ----------------------------------------

    def keys(self) -> list:
        """Every key set, sorted."""
        return self._store.keys()

    def value(self, key: str) -> Optional[str]:
        """The value of ``key`` or None, without blocking."""
        return self._store.try_get(key)

    @property
    def error(self) -> Optional[tuple]:
        """The first error reported to the cluster, as ``(code, message)``."""
        return self._store.error

    def fail_next_set(self, key: str) -> None:
        """The next set of ``key`` raises ``UnavailableError``."""
        with self._faults_lock:
            self._set_faults[key] = self._set_faults.get(key, 0) + 1

    def fail_next_get(self, key: str) -> None:
        """The next get of ``key`` raises ``UnavailableError``."""
        with self._faults_lock:
            self._get_faults[key] = self._get_faults.get(key, 0) + 1

    def faults_left(self) -> dict:
        """Injected failures not yet raised: ``{("set" or "get", key): count}``, zeros omitted."""
        with self._faults_lock:
            left = {("set", k): v for k, v in self._set_faults.items() if v}
            left.update({("get", k): v for k, v in self._get_faults.items() if v})
        return left

    def _maybe_fail(self, faults: dict, key: str, what: str) -> None:
        with self._faults_lock:
            if faults.get(key, 0) <= 0:
                return
            faults[key] -= 1
        raise _errors.make("UnavailableError", f"injected failure of {what}({key!r})")

    def _on_error(self, listener: Callable[[], None]) -> None:
        self._error_listeners.append(listener)


class _ClusterSpec:
    """The part of ``tf.train.ClusterSpec`` the handler reads."""

    def __init__(self, spec: dict) -> None:
        self._spec = {k: list(v) for k, v in spec.items()}

    @property
    def jobs(self) -> list:
        return list(self._spec)

    def as_dict(self) -> dict:
        return {k: list(v) for k, v in self._spec.items()}


class SimpleClusterResolver:
    """A cluster resolver without TensorFlow: ``cluster_spec()``, ``task_type``, ``task_id``."""

    def __init__(
        self, cluster_spec: dict, task_type: Optional[str] = None, task_id: Optional[int] = None
    ) -> None:
        self._spec = _ClusterSpec(cluster_spec)
        self.task_type = task_type
        self.task_id = task_id

    def cluster_spec(self) -> _ClusterSpec:
        return self._spec
