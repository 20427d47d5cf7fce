"""Network namespaces for the partition trials: a veth pair that a trial can cut.

Linux only, and only where this process may create namespaces (root, or
CAP_NET_ADMIN). :func:`netns_unavailable` says why not, once per process.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
import time
from typing import Optional

from ci import is_ci

_NETNS_PROBE: Optional[tuple] = None
_PARTITION_IDS = itertools.count()
#: Bound on one ``ip`` command (it takes milliseconds; only turns a hang into a failure).
IP_BOUND = 30.0
#: The ``ip`` commands of one :class:`Partition`, in sequence, for a test's pytest-timeout:
#: 8 to set it up, 2 to cut it, 2 to remove it; the probe (once a process): 8 + 2.
PARTITION_LIFE_BOUND = 12 * IP_BOUND
PROBE_BOUND = 10 * IP_BOUND


def netns_missing(result, what: str) -> bool:
    """Whether a trial that needs network namespaces cannot make them: then under
    ``CI=true`` a violation (``CI=true and <what>: <why>``), never a skip; elsewhere
    ``result`` is skipped with the reason."""
    why = netns_unavailable()
    if not why:
        return False
    if is_ci():
        result.violations.append(f"CI=true and {what}: {why}")
    else:
        result.skipped = why
    return True


def netns_unavailable() -> Optional[str]:
    """None if this process may create network namespaces and veth pairs, else why not."""
    global _NETNS_PROBE
    if _NETNS_PROBE is None:
        _NETNS_PROBE = (_probe_netns(),)
    return _NETNS_PROBE[0]


def _probe_netns() -> Optional[str]:
    if not sys.platform.startswith("linux"):
        return f"network namespaces are Linux-only (platform {sys.platform})"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    try:
        with Partition(probe=True):
            pass
    except PartitionError as e:
        return f"cannot create a network namespace with a veth pair here: {e}"
    return None


class PartitionError(RuntimeError):
    pass


class Partition:
    """A network namespace joined to this one by a veth pair, removed on exit.

    The namespace and both veth ends exist only inside this machine (sandbox): the
    two addresses are the trial's own hosts, nothing is routed anywhere else.
    Names and the /30 subnet are unique per trial (process id and a counter).
    """

    def __init__(self, probe: bool = False):
        n = next(_PARTITION_IDS)
        tag = f"{os.getpid() % 100000}{'p' if probe else ''}{n}"
        self.namespace = f"tfh-trial-{tag}"
        self.host_link = f"tfh{tag}h"[:15]
        self.ns_link = f"tfh{tag}n"[:15]
        # 10.213.0.0/16, one /30 per partition: .1 this side, .2 in the namespace.
        block = (os.getpid() * 7 + n) % 16384
        base = f"10.213.{block // 64}.{(block % 64) * 4}"
        prefix, last = base.rsplit(".", 1)
        self.host_address = f"{prefix}.{int(last) + 1}"
        self.ns_address = f"{prefix}.{int(last) + 2}"
        self.created: list = []

    def _ip(self, *args: str, namespace: Optional[str] = None) -> None:
        cmd = ["ip", *args]
        if namespace is not None:
            cmd = ["ip", "netns", "exec", namespace, *cmd]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=IP_BOUND)
        if proc.returncode != 0:
            raise PartitionError(f"`{' '.join(cmd)}` failed: {proc.stderr.strip()}")

    def __enter__(self) -> Partition:
        try:
            self._ip("netns", "add", self.namespace)
            self.created.append("netns")
            self._ip("link", "add", self.host_link, "type", "veth", "peer", "name", self.ns_link)
            self.created.append("veth")
            self._ip("link", "set", self.ns_link, "netns", self.namespace)
            self._ip("addr", "add", f"{self.host_address}/30", "dev", self.host_link)
            self._ip("link", "set", self.host_link, "up")
            ns = self.namespace
            self._ip("addr", "add", f"{self.ns_address}/30", "dev", self.ns_link, namespace=ns)
            self._ip("link", "set", self.ns_link, "up", namespace=ns)
            self._ip("link", "set", "lo", "up", namespace=ns)
        except BaseException:
            self.remove()
            raise
        return self

    def env(self) -> dict:
        """Variables that keep a process's gRPC off any proxy for the two addresses."""
        no_proxy = f"127.0.0.1,localhost,{self.host_address},{self.ns_address}"
        env = {"NO_PROXY": no_proxy, "no_proxy": no_proxy}
        for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "grpc_proxy"):
            env[var] = ""
        return env

    def cut(self) -> float:
        """Takes the link down on both sides; returns the time.time() of the cut."""
        at = time.time()
        self._ip("link", "set", self.host_link, "down")
        self._ip("link", "set", self.ns_link, "down", namespace=self.namespace)
        return at

    def remove(self) -> None:
        if "veth" in self.created:
            subprocess.run(
                ["ip", "link", "del", self.host_link], capture_output=True, timeout=IP_BOUND
            )
        if "netns" in self.created:
            subprocess.run(
                ["ip", "netns", "del", self.namespace], capture_output=True, timeout=IP_BOUND
            )
        self.created.clear()

    def __exit__(self, *exc) -> None:
        self.remove()
