"""``tests/portserver.py``: TensorFlow's tests' ports come from one port server.

In CI, ``gce_failure_handler_test`` ``test_basic_run`` (MWMS) failed with "Could not
start gRPC server": its port, picked by portpicker with no server, was of the kernel's
ephemeral range, which any outgoing connection can take before the task binds it.
Success here: with no server portpicker does hand out such a port (the cause, shown);
under ``portserver.py`` two processes picking at once get ports of the pool, all
different; a nested run shares the outer server; a named server that does not answer
is an error that says so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("portpicker")

TESTS = Path(__file__).resolve().parents[1]
SCRIPT = TESTS / "portserver.py"
sys.path.insert(0, str(TESTS))

from portserver import ADDRESS_ENV, POOL  # noqa: E402

#: The bound on each command here: the server starts in about a second.
BOUND = 120

PICK = (
    "import json, os, portpicker; "
    "print(json.dumps({'address': os.environ.get('PORTSERVER_ADDRESS'), "
    "'ports': [portpicker.pick_unused_port() for _ in range(int(os.environ['N']))]}))"
)


def _env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != ADDRESS_ENV}
    env.update(extra)
    return env


def _under_server(code: str, env: dict) -> subprocess.CompletedProcess:
    """``python -c code`` run by ``portserver.py --``, its output captured."""
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--", sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=BOUND,
    )


def _ephemeral_low() -> int:
    return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])


def test_without_a_server_portpicker_hands_out_a_port_of_the_ephemeral_range():
    out = subprocess.run(
        [sys.executable, "-c", PICK],
        env=_env(N="1"),
        capture_output=True,
        text=True,
        timeout=BOUND,
        check=True,
    )
    (port,) = json.loads(out.stdout)["ports"]
    assert port >= _ephemeral_low(), (port, "the kernel's choice for bind(0)")


def test_processes_under_one_server_get_different_ports_of_the_pool():
    low, high = (int(x) for x in POOL.split("-"))
    # Two pickers at once, under one server; each prints its ports.
    inner = (
        "import subprocess, sys; "
        f"procs = [subprocess.Popen([sys.executable, '-c', {PICK!r}], "
        "stdout=subprocess.PIPE, text=True) for _ in range(2)]; "
        "print('\\n'.join(p.communicate()[0].strip() for p in procs))"
    )
    out = _under_server(inner, _env(N="40"))
    assert out.returncode == 0, out.stderr
    runs = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(runs) == 2
    assert runs[0]["address"] and runs[0]["address"] == runs[1]["address"]
    ports = runs[0]["ports"] + runs[1]["ports"]
    assert len(set(ports)) == 80, "a port handed out twice"
    assert all(low <= p <= high for p in ports), ports
    assert high < _ephemeral_low()


def test_a_nested_run_shares_the_outer_server():
    inner = [sys.executable, str(SCRIPT), "--", sys.executable, "-c", PICK]
    outer = (
        "import os, subprocess; "
        "print(os.environ['PORTSERVER_ADDRESS']); "
        f"subprocess.run({inner!r}, check=True)"
    )
    out = _under_server(outer, _env(N="1"))
    assert out.returncode == 0, out.stderr
    first, second = out.stdout.splitlines()
    assert json.loads(second)["address"] == first


def test_a_named_server_that_does_not_answer_is_an_error():
    out = _under_server(
        "print('ran')", _env(**{ADDRESS_ENV: "@tf-failure-handling-no-such-server"})
    )
    assert out.returncode != 0
    assert "ran" not in out.stdout
    assert "does not answer" in out.stderr
