"""The host's memory as the kernel counts it for this process: its cgroups' limits and
usage, and ``/proc/meminfo``'s ``MemAvailable``. Only read here; what they mean for a
copy of a checkpoint is the core's answer (``copy_place``, ``src/host_memory.rs``).

cgroup v2: ``/proc/self/cgroup``'s ``0::<path>``, and ``memory.max``, ``memory.current``
and ``memory.stat``'s ``inactive_file`` in ``/sys/fs/cgroup/<path>`` and each folder
above it. cgroup v1: the ``memory`` controller's ``<path>`` under
``/sys/fs/cgroup/memory``, with ``memory.limit_in_bytes``, ``memory.usage_in_bytes`` and
``total_inactive_file``; a container that sees only its own cgroup has them at the
controller's root. A file that is missing or unreadable is ``None``.
"""

from __future__ import annotations

import os
from typing import Optional

#: Where the cgroup file systems are mounted (the kernel's convention; systemd's too).
CGROUP_ROOT = "/sys/fs/cgroup"

Cgroup = tuple  # (limit, usage, inactive_file), each Optional[int]


def _read(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _number(path: str) -> Optional[int]:
    text = _read(path)
    if text is None:
        return None
    text = text.strip()
    return int(text) if text.isdigit() else None  # "max": no limit


def _stat(path: str, key: str) -> Optional[int]:
    text = _read(path)
    for line in (text or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return None


def _folders(root: str, path: str) -> list:
    """``root/path`` and each folder above it up to ``root``, that exist (own first);
    ``root`` alone when ``path`` is not under it (a container's own cgroup namespace)."""
    folders = []
    parts = [p for p in path.split("/") if p]
    while True:
        folder = os.path.join(root, *parts)
        if os.path.isdir(folder):
            folders.append(folder)
        if not parts:
            break
        parts.pop()
    return folders


def cgroups(proc_cgroup: str = "/proc/self/cgroup", root: str = CGROUP_ROOT) -> list:
    """The memory readings of this process's cgroup and those above it, own first:
    ``[(limit, usage, inactive_file), ...]`` in bytes."""
    text = _read(proc_cgroup) or ""
    v1 = v2 = None
    for line in text.splitlines():
        number, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if number == "0" and controllers == "":
            v2 = path
        elif "memory" in controllers.split(","):
            v1 = path
    found = []
    if v1 is not None:
        for folder in _folders(os.path.join(root, "memory"), v1):
            found.append(
                (
                    _number(os.path.join(folder, "memory.limit_in_bytes")),
                    _number(os.path.join(folder, "memory.usage_in_bytes")),
                    _stat(os.path.join(folder, "memory.stat"), "total_inactive_file"),
                )
            )
    elif v2 is not None:
        for folder in _folders(root, v2):
            if not os.path.exists(os.path.join(folder, "memory.current")):
                continue  # the root's: no memory.max
            found.append(
                (
                    _number(os.path.join(folder, "memory.max")),
                    _number(os.path.join(folder, "memory.current")),
                    _stat(os.path.join(folder, "memory.stat"), "inactive_file"),
                )
            )
    return found


def mem_available(meminfo: str = "/proc/meminfo") -> Optional[int]:
    """``MemAvailable`` of ``/proc/meminfo``, in bytes."""
    for line in (_read(meminfo) or "").splitlines():
        if line.startswith("MemAvailable:"):
            fields = line.split()
            if len(fields) >= 2 and fields[1].isdigit():
                return int(fields[1]) * 1024
    return None


def read() -> tuple:
    """``(cgroups, mem_available)``: what ``copy_place`` takes after the copy's bytes."""
    return cgroups(), mem_available()
