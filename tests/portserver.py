"""One port server for every TensorFlow test process of a run: ``portserver.py -- CMD``.

TensorFlow's own tests pick their tasks' ports with ``portpicker.pick_unused_port``
(``test_util.pick_unused_port``, through ``multi_worker_test_base.create_cluster_spec``).
Without a port server, portpicker first asks the kernel for a free port (it binds port 0),
and such a port is in the kernel's range for outgoing connections' local ports: between
the pick and the task's ``bind`` (seconds, a process start), any outgoing connection on
the machine, one of the many gRPC connections of the test clusters running beside it,
can take it, and the task fails with ``UnknownError: Could not start gRPC server``. So
it failed in CI (``gce_failure_handler_test`` ``test_basic_run`` on MWMS, twelve jobs
on two cores). Two processes picking at once can also be handed the same port.

portpicker's remedy, the one TensorFlow's own CI uses, is its port server: a process
that hands each asker (by pid) a port of a fixed pool, never the same one twice while
the asker lives, and that checks the port is free before handing it out. Every
``pick_unused_port`` asks it when ``PORTSERVER_ADDRESS`` is set. This module runs
portpicker's ``portserver.py`` (installed with portpicker, beside the interpreter) on
the pool :data:`POOL`, below the ephemeral range and below the ports our own tests take
(``examples/launch_local.py``, ``free_ports``: from 25000 up), sets
``PORTSERVER_ADDRESS`` for ``CMD`` and stops the server when ``CMD`` ends.

``make test`` runs its parallel jobs under one server, so that no two jobs are handed
the same port; each TensorFlow suite's own target runs under this too, which reuses a
server named by ``PORTSERVER_ADDRESS`` if one answers (and fails if a named one does
not), and starts one otherwise.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ADDRESS_ENV = "PORTSERVER_ADDRESS"
#: portpicker's own range for random ports, below the ephemeral range (32768-60999
#: by default) and below ``free_ports``' lowest port (25000).
POOL = "15000-24999"
#: How long the server has to answer its first request (it imports asyncio and psutil).
START_BOUND = 60.0


def ask(address: str, pid: int | None = None, timeout: float = 10.0) -> int | None:
    """A port from the server at ``address`` for ``pid`` (this process by default),
    ``None`` when it does not answer or has none: portpicker's protocol, the pid in
    ASCII and a newline, answered by the port and a newline. (portpicker's own client,
    ``get_port_from_port_server``, prints to stderr at each failure, which the wait for
    a starting server would fill.)"""
    path = "\0" + address[1:] if address.startswith("@") else address
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(path)
            s.sendall(f"{os.getpid() if pid is None else pid}\n".encode())
            with s.makefile("rb") as answer:
                reply = answer.readline()
    except OSError:
        return None
    try:
        port = int(reply.decode().strip())
    except ValueError:
        return None
    return port or None


def _script() -> Path:
    """portpicker's ``portserver.py``: pip installs it beside the interpreter."""
    here = Path(sys.executable).parent / "portserver.py"
    if here.is_file():
        return here
    raise SystemExit(
        f"portserver: portpicker's portserver.py is not beside {sys.executable}; "
        "the test virtualenv has it (make .venv installs portpicker, TF_TEST_DEPS)"
    )


@contextlib.contextmanager
def serving():
    """Yields the address of a port server: the one ``PORTSERVER_ADDRESS`` names (it
    must answer), or one started here and stopped on leaving."""
    named = os.environ.get(ADDRESS_ENV)
    if named:
        if ask(named) is None:
            raise SystemExit(
                f"portserver: {ADDRESS_ENV}={named} does not answer a port request "
                "(is its server still running?)"
            )
        yield named
        return
    address = f"@tf-failure-handling-ports-{os.getpid()}"
    log_path = Path(tempfile.gettempdir()) / f"tf-failure-handling-portserver-{os.getpid()}.log"
    with open(log_path, "wb") as log:
        server = subprocess.Popen(
            [
                sys.executable,
                str(_script()),
                f"--portserver_address={address}",
                f"--portserver_static_pool={POOL}",
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + START_BOUND
        while ask(address, timeout=2.0) is None:
            if server.poll() is not None:
                raise SystemExit(
                    f"portserver: the port server exited with {server.returncode} before "
                    f"it answered (its log: {log_path})"
                )
            if time.monotonic() > deadline:
                raise SystemExit(
                    f"portserver: the port server did not answer a port request within "
                    f"{START_BOUND:.0f} s (its log: {log_path})"
                )
            time.sleep(0.1)
        yield address
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    log_path.unlink(missing_ok=True)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print("usage: portserver.py -- CMD [ARGS...]", file=sys.stderr)
        return 2
    with serving() as address:
        child = subprocess.Popen(argv, env=dict(os.environ, **{ADDRESS_ENV: address}))
        # A SIGTERM or SIGINT to this process goes to CMD, whose exit ends this one
        # (the server is stopped on the way out).
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, _frame: child.send_signal(signum))
        return child.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
