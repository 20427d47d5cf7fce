"""The coordinator's calls to a PS or worker task, over TensorFlow's own RPCs.

:class:`TaskControl` is what ``serve()`` registers in TF's ``py_func`` registry; the
coordinator runs a ``PyFunc`` op on each task's CPU (:func:`remote_call`) to ask it, each
call bounded (:class:`_Caller`). The requests and the bounds: docs/getting-started/
parameter-server.md, "Preemption under ParameterServerStrategy".
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import threading
from typing import Any, Callable, Optional

from .._bounded_call import BoundedCall
from .._native import CoordinatorProtocol, TaskProtocol

# Imported for what it does at import: the keepalive is in TF_GRPC_DEFAULT_OPTIONS before
# TensorFlow creates a channel, so a call to a stopped task fails instead of stalling.
from . import grpc_keepalive  # noqa: F401

#: A call to a task did not return within its bound (the coordinator's protocol
#: object's error: its calls' bounds are its decisions).
CallTimeout = CoordinatorProtocol.CallTimeout

log = logging.getLogger("tf_failure_handling")

#: The key of :class:`TaskControl` in TF's ``py_func`` registry: the served task's
#: protocol object's (src/ps_control.rs).
TOKEN = TaskProtocol.TOKEN

#: The control of this process (strongly referenced: TF's registry holds weak ones).
_installed: Optional[TaskControl] = None


class TaskControl:
    """What a served PS or worker process answers the coordinator with: the answers are
    its protocol object's (``TaskProtocol``, ``src/ps_control/task.rs``)."""

    def __init__(self, job: str, task: int, peer_timeout: Optional[float] = None) -> None:
        self.job = job
        self.task = task
        #: The task's protocol object: its notice, the coordinator's calls, its release,
        #: how long it serves (``peer_timeout``, None: the core's default, bounds it
        #: when the notice names no deadline and there is no grace period).
        self.protocol = TaskProtocol(
            job, task, f"{os.getpid()}-{secrets.token_hex(8)}", peer_timeout
        )
        #: Set once a release is accepted: wakes the serving thread.
        self.released = threading.Event()

    @property
    def incarnation(self) -> str:
        """Differs between two runs of the same task (a restart)."""
        return self.protocol.state()["incarnation"]

    @property
    def release_reason(self) -> Optional[str]:
        return self.protocol.state()["released"]

    @property
    def last_asked(self) -> Optional[float]:
        """When (Unix time) the coordinator last asked this task anything (None: never)."""
        return self.protocol.state()["last_asked"]

    def set_notice(
        self, source: str, deadline: Optional[float], grace_period: Optional[float] = None
    ) -> None:
        """The task's notice (the first counts), with the grace period then in effect."""
        self.protocol.handle(TaskProtocol.Event.Notice(source, deadline, grace_period))

    def __call__(self, request: Any) -> bytes:
        """The body of the ``PyFunc`` op the coordinator runs on this task."""
        try:
            message = json.loads(bytes(request).decode())
        except ValueError:
            message = None
        answer = self.protocol.answer(message)
        if answer.get("released"):
            self.released.set()
        elif "why" in answer:
            log.warning(
                "%s %d: a release was refused (%s): only the coordinator that saw this "
                "task's notice releases it.",
                self.job,
                self.task,
                answer["why"],
            )
        return json.dumps(answer).encode()

    def install(self) -> None:
        """Registers this control in TF's ``py_func`` registry of this process."""
        global _installed
        from tensorflow.python.ops import script_ops

        _installed = self
        script_ops._py_funcs._funcs[TOKEN] = self


def remote_call(task: str, request: dict) -> dict:
    """Runs ``request`` against :class:`TaskControl` of ``task`` (``/job:ps/replica:0/task:0``),
    unbounded (:class:`_Caller` bounds it); raises what TF raises (naming :data:`TOKEN` when the
    task does not run ``serve()``)."""
    from tensorflow.python.eager import context
    from tensorflow.python.framework import constant_op, dtypes, ops
    from tensorflow.python.ops import array_ops, gen_script_ops

    # The request is made, and the answer read, on this process's CPU; only the
    # PyFunc op runs on the task. A tensor created under the task's device scope is
    # copied there while its constructor holds the GIL: a task that does not answer
    # (SIGSTOP) would freeze every Python thread of the coordinator. The op's
    # execution, and the copies of its input and output, release the GIL.
    local = f"{context.context().host_address_space()}/device:CPU:0"
    with ops.device(local):
        message = constant_op.constant(json.dumps(request))
    with ops.device(f"{task}/device:CPU:0"):
        out = gen_script_ops.py_func(input=[message], token=TOKEN, Tout=[dtypes.string])
    with ops.device(local):
        answer = array_ops.identity(out[0])
    return json.loads(answer.numpy().decode())


class CallRefused(CallTimeout):
    """A call not started: the task's earlier call has not returned (the coordinator's
    protocol object's ``start_call``). A :class:`CallTimeout`, so callers that do not
    care see one."""


class _Caller:
    """Bounded calls to the tasks (:class:`BoundedCall`), each within the ``timeout``
    its action gives. Whether a call may start, and which unreturned one it abandons,
    is the coordinator's protocol object's (``protocol``, a ``CoordinatorProtocol``;
    None: one of the caller's own, on the monotonic clock); a refused call raises
    :class:`CallRefused` at once."""

    def __init__(
        self, transport: Callable[[str, dict], dict] = remote_call, protocol: Any = None
    ) -> None:
        self._transport = transport
        self._calls = CoordinatorProtocol([]) if protocol is None else protocol

    def __call__(self, task: str, request: dict, timeout: float) -> dict:
        try:
            call, abandoned = self._calls.start_call(task)
        except CallTimeout as e:
            raise CallRefused(str(e)) from None
        if abandoned is not None:
            log.warning(
                "%s: a call has not returned for %.0fs; it is abandoned (%d of at most %d) "
                "and the task is asked again.",
                task,
                abandoned.age,
                abandoned.count,
                abandoned.max,
            )
        bounded = BoundedCall(lambda: self._run(task, call, request), f"TaskCall {task}")
        try:
            returned = bounded.wait(timeout)
        except BaseException:
            if not bounded.thread.is_alive():
                self._calls.call_returned(task, call)  # never started: nothing will report it
            raise
        if not returned:
            raise CallTimeout(f"{task} did not answer {request.get('op')!r} within {timeout:.1f}s")
        return bounded.result()

    def _run(self, task: str, call: int, request: dict) -> dict:
        try:
            return self._transport(task, request)
        finally:
            self._calls.call_returned(task, call)
