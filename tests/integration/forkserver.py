"""Test clusters' Python processes forked from one that already imported TensorFlow.

Most of a test worker's CPU time is ``import tensorflow``: 3-4.5 s of the 4.4-5.8 s one
``mwms_worker.py`` process uses in ``test_sigterm_saves_at_agreed_step_and_resumes``,
and ``make test`` starts hundreds of them on two cores. TensorFlow's own multi-process
tests do not pay it per process either: ``multi_process_lib`` forks every task from an
absl forkserver whose preloaded ``__main__`` imported TensorFlow. This module does the
same for our harnesses: :func:`popen` is ``subprocess.Popen`` for ``[sys.executable,
SCRIPT, *ARGS]``, and the process it starts is a fork of a server (one per interpreter
and import environment, below) that ran ``import tensorflow`` once. The child then does
what ``python SCRIPT ARGS`` does: its own argv, environment, working directory, standard
streams and ``sys.path[0]``, the script run as ``__main__``, and the interpreter's normal
exit (atexit hooks, non-daemon threads joined, the exit code or the signal).

What a fork cannot change is read at import: the environment variables TensorFlow, Keras
and Python read while ``import tensorflow`` runs (``TF_CPP_MIN_LOG_LEVEL``,
``KERAS_BACKEND``, ``TF_USE_LEGACY_KERAS``, ``PYTHONUNBUFFERED`` ...). The server is
chosen by them (:func:`import_key`): a request with other values gets its own server.
The package itself (``tf_failure_handling``) is never imported by the server, so each
child imports it, and calls ``patch()``, as a fresh process would.

Anything else (another program, ``python -c``, a pipe to the child's stdin or from its
stderr, other ``Popen`` options) goes to ``subprocess.Popen``; so does everything when
``TFH_TEST_FORKSERVER=0``, the switch to compare against (docs/development.md, "Writing
a test").
"""

from __future__ import annotations

import atexit
import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

#: Set to 0 to start every process with ``subprocess.Popen``.
SWITCH_ENV = "TFH_TEST_FORKSERVER"
#: How long a server may take to import TensorFlow and listen (a bound on a hang, not
#: an expectation: 4 s idle, tens of seconds with twelve jobs on two cores; at 180 s a
#: make test run with other work beside its twelve jobs, load 22 on 2 cores, killed a
#: server still importing, and three PS tests failed for it).
START_BOUND = 600.0
#: How long the server may take to fork one child and say its pid.
FORK_BOUND = 60.0
#: Variables read only after the import (by the scripts, our package or TF's runtime):
#: they differ per process and never choose a server.
PER_PROCESS = ("TF_CONFIG",)
#: Prefixes of the variables that do choose a server: what TensorFlow, Keras and the
#: interpreter may read during ``import tensorflow``.
IMPORT_PREFIXES = ("TF_", "KERAS", "PYTHON", "CUDA", "OMP_", "KMP_", "MALLOC", "LD_", "XLA_")
#: Our own variables are read by the package, which the server never imports.
OWN_PREFIXES = ("TF_FAILURE_HANDLING", "TFH_")
MAX_SERVERS = 4
#: Seconds between two looks at the server's children when no SIGCHLD woke it.
REAP_EVERY = 1.0
_HEADER = struct.Struct("!I")


def enabled() -> bool:
    return os.environ.get(SWITCH_ENV, "1") != "0"


def import_key(env: dict) -> tuple:
    """The environment variables of ``env`` that ``import tensorflow`` may read."""
    return tuple(
        sorted(
            (name, value)
            for name, value in env.items()
            if name.startswith(IMPORT_PREFIXES)
            and not name.startswith(OWN_PREFIXES)
            and name not in PER_PROCESS
        )
    )


# -- the client: a Popen-like handle on a forked child --------------------------------


class ForkedProcess:
    """What a test uses of ``subprocess.Popen``: ``pid``, ``args``, ``returncode``,
    ``poll``, ``wait``, ``send_signal``, ``terminate``, ``kill`` and ``stdout`` (with
    ``stdout=subprocess.PIPE``). The child is the server's: the server reaps it and sends
    its exit status (Popen's convention: ``-N`` for signal N) over this connection."""

    def __init__(self, args, conn: socket.socket, pid: int, stdout):
        self.args = args
        self.pid = pid
        self.stdout = stdout
        self.stderr = None
        self.stdin = None
        self.returncode: int | None = None
        self._conn = conn
        self._buffer = b""
        self._lock = threading.Lock()

    def _read_status(self, timeout: float | None) -> None:
        # Called with the lock held; sets returncode when the server's line came.
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self._conn], [], [], left)
            if not ready:
                return
            chunk = self._conn.recv(4096)
            if not chunk:
                raise RuntimeError(
                    f"the fork server of pid {self.pid} ({self.args[1]}) went away before "
                    "sending its exit status"
                )
            self._buffer += chunk
            if b"\n" in self._buffer:
                self.returncode = int(self._buffer.split(b"\n", 1)[0])
                self._conn.close()

    def poll(self) -> int | None:
        if self.returncode is None and self._lock.acquire(blocking=False):
            try:
                self._read_status(0.0)
            finally:
                self._lock.release()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._lock.acquire(timeout=-1 if timeout is None else timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        try:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            self._read_status(left)
        finally:
            self._lock.release()
        if self.returncode is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.stdout is not None:
            self.stdout.close()
        self.wait()

    def __repr__(self) -> str:
        return f"<ForkedProcess pid={self.pid} returncode={self.returncode} args={self.args!r}>"


class _Server:
    """One running server: its process, its socket's path, its control connection."""

    def __init__(self, python: str, env: dict):
        self.dir = Path(tempfile.mkdtemp(prefix="tfh-forkserver-"))
        self.path = str(self.dir / "sock")
        self.log = self.dir / "server.stderr"
        control, theirs = socket.socketpair()
        with open(self.log, "wb") as err:
            self.proc = subprocess.Popen(
                [python, str(Path(__file__).resolve()), self.path, str(theirs.fileno())],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                env=env,
                pass_fds=(theirs.fileno(),),
            )
        theirs.close()
        # Kept open for the server's life: its end reads EOF when this process is gone,
        # and the server then kills what it forked and exits.
        self.control = control
        control.settimeout(START_BOUND)
        try:
            line = control.recv(64)
        except TimeoutError:
            line = b""
        if line != b"ready\n":
            control.close()  # not left to the garbage collector (a ResourceWarning)
            self.proc.kill()
            self.proc.wait(timeout=10)
            raise RuntimeError(
                f"the fork server did not start within {START_BOUND:g} s (waiting for it to "
                f"import TensorFlow and listen); exit {self.proc.poll()}, its stderr:\n"
                + "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])
            )

    def fork(
        self, args, env: dict, cwd: str, fds: list[int], session: bool = False
    ) -> tuple[socket.socket, int]:
        request = json.dumps(
            {"argv": list(args), "env": env, "cwd": cwd, "session": session}
        ).encode()
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.settimeout(FORK_BOUND)
        try:
            conn.connect(self.path)
            socket.send_fds(conn, [_HEADER.pack(len(request)) + request], fds)
            line = b""
            while not line.endswith(b"\n"):
                chunk = conn.recv(64)
                if not chunk:
                    break
                line += chunk
        except (TimeoutError, OSError) as e:
            conn.close()
            raise RuntimeError(
                f"the fork server (pid {self.proc.pid}) did not start {args[1]} within "
                f"{FORK_BOUND:g} s: {e!r}"
            ) from None
        if not line.endswith(b"\n"):
            conn.close()
            raise RuntimeError(
                f"the fork server (pid {self.proc.pid}, exit {self.proc.poll()}) closed the "
                f"connection before starting {args[1]}; its stderr:\n"
                + "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])
            )
        conn.settimeout(None)
        return conn, int(line)

    def close(self) -> None:
        self.control.close()  # the server kills its children and exits
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)


_servers: dict[tuple, _Server] = {}
_servers_lock = threading.Lock()


def _server(python: str, env: dict) -> _Server:
    key = (python, import_key(env))
    with _servers_lock:
        server = _servers.pop(key, None)
        if server is not None and server.proc.poll() is None:
            _servers[key] = server  # the most recently used last
            return server
        if server is not None:
            server.close()
        if len(_servers) >= MAX_SERVERS:
            _servers.pop(next(iter(_servers))).close()
        server_env = {k: v for k, v in env.items() if k not in PER_PROCESS}
        server = _servers[key] = _Server(python, server_env)
        return server


@atexit.register
def close_servers() -> None:
    with _servers_lock:
        while _servers:
            _servers.popitem()[1].close()


def _fd_for(spec, std: int, opened: list[int], kept: list) -> int:
    if spec is None:
        return std
    if spec == subprocess.DEVNULL:
        fd = os.open(os.devnull, os.O_RDWR)
        opened.append(fd)
        return fd
    if spec == subprocess.PIPE:
        read, write = os.pipe()
        opened.append(write)
        kept.append(read)
        return write
    return spec if isinstance(spec, int) else spec.fileno()


def popen(
    args,
    *,
    stdin=None,
    stdout=None,
    stderr=None,
    env=None,
    cwd=None,
    text=False,
    start_new_session=False,
    **kw,
):
    """``subprocess.Popen(args, ...)``, through a fork server when ``args`` runs a Python
    script with this interpreter (module docstring); the options are Popen's
    (``stderr=subprocess.STDOUT`` and ``start_new_session`` included)."""
    args = [str(a) for a in args]
    if (
        kw
        or not enabled()
        or len(args) < 2
        or args[0] != sys.executable
        or args[1].startswith("-")
        or stdin == subprocess.PIPE
        or stderr == subprocess.PIPE
        or (stderr == subprocess.STDOUT and stdout == subprocess.PIPE)
    ):
        return subprocess.Popen(
            args,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            env=env,
            cwd=cwd,
            text=text,
            start_new_session=start_new_session,
            **kw,
        )
    env = dict(os.environ if env is None else env)
    opened: list[int] = []
    kept: list[int] = []
    try:
        fds = [_fd_for(stdin, 0, opened, []), _fd_for(stdout, 1, opened, kept)]
        fds.append(fds[1] if stderr == subprocess.STDOUT else _fd_for(stderr, 2, opened, []))
        conn, pid = _server(args[0], env).fork(
            args, env, str(cwd or os.getcwd()), fds, start_new_session
        )
    except BaseException:
        for fd in kept:
            os.close(fd)
        raise
    finally:
        for fd in opened:
            os.close(fd)
    out = None
    if kept:
        out = open(kept[0], "r" if text else "rb", closefd=True)
    return ForkedProcess(args, conn, pid, out)


# -- the server ------------------------------------------------------------------------


def _recv_request(conn: socket.socket) -> tuple[dict, list[int]]:
    conn.settimeout(FORK_BOUND)
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
    if len(data) < _HEADER.size:
        raise OSError("short request")
    (size,) = _HEADER.unpack(data[: _HEADER.size])
    data = data[_HEADER.size :]
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise OSError("request cut short")
        data += chunk
    return json.loads(data), fds


def _serve(path: str, control: socket.socket):
    """The server's loop; returns (in a forked child only) the request to run."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    os.set_blocking(wake_r, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    # A signal mask is inherited across exec: a SIGCHLD blocked in the thread that
    # started this server would never wake the loop below.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
    children: dict[int, socket.socket] = {}
    control.sendall(b"ready\n")
    while True:
        try:
            # The look at the children also comes every REAP_EVERY seconds: a make test
            # run saw a child a zombie for 60 s, its exit status never sent (no wake-up
            # came for its SIGCHLD).
            ready, _, _ = select.select([listener, wake_r, control], [], [], REAP_EVERY)
        except InterruptedError:
            continue
        if wake_r in ready:
            try:
                while os.read(wake_r, 512):
                    pass
            except BlockingIOError:
                pass
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = children.pop(pid, None)
            if conn is not None:
                try:
                    conn.sendall(b"%d\n" % os.waitstatus_to_exitcode(status))
                except OSError:
                    pass  # the client is gone; nobody asks any more
                conn.close()
        if control in ready and not control.recv(64):
            # The test process is gone: nobody can reap or kill what it started.
            for pid in children:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            os._exit(0)
        if listener in ready:
            conn, _ = listener.accept()
            try:
                request, fds = _recv_request(conn)
            except (OSError, ValueError) as e:
                print(f"forkserver: a bad request: {e!r}", file=sys.stderr, flush=True)
                conn.close()
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                for sock in (listener, control, conn, *children.values()):
                    sock.close()
                os.close(wake_r)
                os.close(wake_w)
                return request, fds
            for fd in fds:
                os.close(fd)
            try:
                conn.sendall(b"%d\n" % pid)
                conn.settimeout(None)
                children[pid] = conn
            except OSError:
                conn.close()


def _become(request: dict, fds: list[int]) -> None:
    """In the forked child: be ``python SCRIPT ARGS`` with the request's environment."""
    import ctypes
    import faulthandler
    import runpy

    server = os.getppid()
    # Killed with the server (PR_SET_PDEATHSIG = 1): nobody else could reap us.
    ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != server:
        os._exit(1)
    if request.get("session"):
        os.setsid()  # Popen's start_new_session
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in set(fds):
        if fd > 2:
            os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    script = request["argv"][1]
    sys.argv = request["argv"][1:]
    sys.path[0] = os.path.dirname(os.path.realpath(script))
    if os.environ.get("PYTHONFAULTHANDLER"):
        faulthandler.enable()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    # The server: `python forkserver.py SOCKET_PATH CONTROL_FD`, started by _Server.
    _path, _control_fd = sys.argv[1], int(sys.argv[2])
    import tensorflow  # noqa: F401  (the point of the server)

    _control = socket.socket(fileno=_control_fd)
    _child = _serve(_path, _control)
    del _path, _control_fd, _control
    _become(*_child)
