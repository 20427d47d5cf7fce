"""The host's memory as read for a non-chief's whole copy (issue 50): the cgroup files
of v1 and v2 (own cgroup and those above it), ``MemAvailable``, and the core's answer
(``copy_place``, table tests in ``src/host_memory.rs``)."""

from __future__ import annotations

from tf_failure_handling._native import copy_place
from tf_failure_handling._protocol import host_memory

GIB = 2**30


def _write(path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_v2_reads_its_own_and_each_above(tmp_path):
    proc = tmp_path / "cgroup"
    proc.write_text("0::/kubepods/pod1/ctr\n")
    root = tmp_path / "sys"
    for folder, limit, usage, inactive in (
        ("kubepods/pod1/ctr", "max", 3 * GIB, 2 * GIB),
        ("kubepods/pod1", str(4 * GIB), 3 * GIB, 0),
        ("kubepods", "max", 5 * GIB, 0),
    ):
        _write(root / folder / "memory.max", limit + "\n")
        _write(root / folder / "memory.current", f"{usage}\n")
        _write(root / folder / "memory.stat", f"anon 1\ninactive_file {inactive}\nactive_file 0\n")
    found = host_memory.cgroups(str(proc), str(root))
    assert found == [
        (None, 3 * GIB, 2 * GIB),
        (4 * GIB, 3 * GIB, 0),
        (None, 5 * GIB, 0),
    ]
    # The pod's limit binds: 1 GiB of room, a 1 GiB copy needs more.
    assert copy_place(GIB, found, 16 * GIB)[0] == "storage"
    assert copy_place(GIB // 4, found, 16 * GIB)[0] == "memory"


def test_cgroup_v1_in_a_container_reads_the_controllers_root(tmp_path):
    proc = tmp_path / "cgroup"
    proc.write_text("5:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n0::/\n")
    root = tmp_path / "sys"
    memory = root / "memory"  # the container's own cgroup, mounted at the root
    _write(memory / "memory.limit_in_bytes", f"{2 * GIB}\n")
    _write(memory / "memory.usage_in_bytes", f"{GIB}\n")
    _write(memory / "memory.stat", "cache 5\ntotal_inactive_file 268435456\n")
    assert host_memory.cgroups(str(proc), str(root)) == [(2 * GIB, GIB, 256 * 2**20)]


def test_nothing_to_read_is_none(tmp_path):
    assert host_memory.cgroups(str(tmp_path / "none"), str(tmp_path)) == []
    assert host_memory.mem_available(str(tmp_path / "none")) is None
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24684032 kB\nMemAvailable:    1024 kB\n")
    assert host_memory.mem_available(str(meminfo)) == 1024 * 1024
    # Nothing known: the copy stays in memory, as before the check.
    assert copy_place(GIB, [], None) == ("memory", GIB * 3 // 2 + 64 * 2**20, None)


def test_this_host_reads_without_error():
    cgroups, available = host_memory.read()
    assert all(len(c) == 3 for c in cgroups)
    assert available is None or available > 0
