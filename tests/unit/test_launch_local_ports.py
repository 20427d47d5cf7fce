"""The port allocator of ``examples/launch_local.py``, which every multi-process test
uses: ports below the kernel's ephemeral range, consecutive, never handed out twice
while reserved, and never one that is in use."""

from __future__ import annotations

import os
import socket
import time

import pytest
from integration.mwms_worker import example

launch_local = example("launch_local")


@pytest.fixture
def reserved(tmp_path, monkeypatch):
    monkeypatch.setattr(launch_local, "RESERVED", tmp_path / "ports")
    return tmp_path / "ports"


class Picks:
    """Stands in for ``random.SystemRandom``: the starts the allocator tries, in order."""

    def __init__(self, starts):
        self.starts = list(starts)

    def randrange(self, lo, hi):
        start = self.starts.pop(0)
        assert lo <= start < hi, (lo, start, hi)
        return start


def test_ports_are_consecutive_below_the_ephemeral_range_and_free(reserved):
    low = launch_local._ephemeral_low()
    ports = launch_local.free_ports(4)
    assert ports == list(range(ports[0], ports[0] + 4))
    assert launch_local.LOWEST_PORT <= ports[0] and ports[-1] < low
    for port in ports:
        with socket.socket() as s:
            s.bind(("", port))
        assert (reserved / str(port)).exists()


def test_no_port_is_handed_out_twice_while_reserved(reserved):
    seen = [p for _ in range(300) for p in launch_local.free_ports(2)]
    assert len(seen) == len(set(seen))


def _a_bound_port() -> tuple:
    """A listening socket on a port of the allocator's range, and that port. Not a fixed
    port: the other jobs of ``make test`` take ports of this range all the time."""
    for port in range(launch_local.LOWEST_PORT + 110, launch_local.LOWEST_PORT + 3000, 37):
        busy = socket.socket()
        try:
            busy.bind(("127.0.0.1", port))
        except OSError:
            busy.close()
            continue
        busy.listen()
        return busy, port
    raise AssertionError("no port of the allocator's range could be bound")


def test_a_reserved_or_bound_port_is_skipped(reserved, monkeypatch):
    busy, port = _a_bound_port()
    start = port - 10
    reserved.mkdir()
    (reserved / str(start)).touch()  # another caller's, a moment ago
    with busy:  # port = start + 10 is in use
        # After the reserved start and the busy one, starts 20 apart: another job of the
        # suite may hold one of them too, and the allocator skips it as well.
        later = list(range(start + 20, start + 400, 20))
        picks = Picks([start, start + 9, *later])
        monkeypatch.setattr(launch_local.random, "SystemRandom", lambda: picks)
        ports = launch_local.free_ports(2)
        assert ports[0] in later and ports == [ports[0], ports[0] + 1], ports
        assert len(picks.starts) < len(later), "the reserved and the busy start were taken"


def test_a_stale_reservation_is_taken_again(reserved, monkeypatch):
    busy, start = _a_bound_port()  # a port nobody else holds: released just before use
    busy.close()
    reserved.mkdir()
    old = reserved / str(start)
    old.touch()
    stale = time.time() - launch_local.RESERVED_FOR - 1
    os.utime(old, (stale, stale))
    monkeypatch.setattr(launch_local.random, "SystemRandom", lambda: Picks([start]))
    assert launch_local.free_ports(1) == [start]
    assert old.stat().st_mtime > stale


def test_with_no_room_below_the_ephemeral_range_ports_come_from_above(reserved, monkeypatch):
    monkeypatch.setattr(launch_local, "_ephemeral_low", lambda: 1024)
    ports = launch_local.free_ports(3)
    assert launch_local.LOWEST_PORT <= ports[0] and ports[-1] < 65536
    assert ports == list(range(ports[0], ports[0] + 3))
